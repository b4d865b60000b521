"""The k8s scenario's cluster DNS stand-in (molecule/k8s/cluster_dns.py): a name not published yet is
NXDOMAIN, as glibc's resolver reads it, and every other name is passed on."""
import importlib.util
import json
import os
import struct

PATH = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'molecule', 'k8s', 'cluster_dns.py')
spec = importlib.util.spec_from_file_location('cluster_dns', PATH)
cluster_dns = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cluster_dns)


def query(name, ident=0x1234, qtype=1):
    labels = b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\0'
    return struct.pack('!HHHHHH', ident, 0x0100, 1, 0, 0, 0) + labels + struct.pack('!HH', qtype, 1)


def test_the_answer_to_a_name_not_published_yet_is_nxdomain_with_the_querys_id_and_question():
    q = query('trainer-0.trainer.mol.svc.cluster.local', qtype=28)
    assert cluster_dns.question_name(q) == 'trainer-0.trainer.mol.svc.cluster.local'
    answer = cluster_dns.nxdomain(q)
    ident, flags, qd, an, ns, ar = struct.unpack('!HHHHHH', answer[:12])
    assert (ident, flags & 0x8000, flags & 0x0100, flags & 0xF, qd, an, ns, ar) == (0x1234, 0x8000, 0x0100, 3, 1, 0, 0, 0)
    assert answer[12:] == q[12:]


def test_a_name_is_hidden_until_its_time_with_or_without_a_search_domain(tmp_path):
    publish = tmp_path / 'publish.json'
    publish.write_text(json.dumps({'trainer-1.trainer.mol.svc.cluster.local.': 100.0}))
    pub = cluster_dns.Publisher(str(publish))
    assert pub.hidden('trainer-1.trainer.mol.svc.cluster.local', now=99)
    assert pub.hidden('trainer-1.trainer.mol.svc.cluster.local.dns.podman', now=99)
    assert not pub.hidden('trainer-1.trainer.mol.svc.cluster.local', now=100)
    assert not pub.hidden('trainer-10.trainer.mol.svc.cluster.local', now=99)
    publish.write_text('{}')
    os.utime(publish, ns=(1, 1))
    assert not pub.hidden('trainer-1.trainer.mol.svc.cluster.local', now=99)
