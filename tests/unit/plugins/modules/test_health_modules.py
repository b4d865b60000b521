"""health_report and health_probe run as Ansible runs them: a subprocess reading a JSON args file."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')
FIX = os.path.join(ROOT, 'tests', 'unit', 'fixtures', 'health')


def run(module, tmp_path, check=False, **args):
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=check, _ansible_tmpdir=str(tmp_path))}
    args_file = tmp_path / ('args-%s.json' % module)
    args_file.write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'plugins', 'modules', module + '.py'), str(args_file)],
                          capture_output=True, text=True, env=env, check=False, timeout=120)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))


def records(torch_on_worker='2.13.0+cpu'):
    return [
        {'node': 'n1', 'check': 'version.torch', 'status': 'ok', 'value': '2.13.0+cpu', 'threshold': '== 2.13.0+cpu',
         'detail': '', 'remedy': ''},
        {'node': 'n2', 'check': 'version.torch', 'status': 'ok' if torch_on_worker == '2.13.0+cpu' else 'fail',
         'value': torch_on_worker, 'threshold': '== 2.13.0+cpu', 'detail': 'torch differs',
         'remedy': 'reinstall the environment on n2'},
        {'node': 'n2', 'check': 'disk_free', 'status': 'ok', 'value': 61.5, 'threshold': 'warn < 15%', 'detail': '',
         'remedy': ''},
    ]


def test_report_history_changes_and_rotation(tmp_path):
    rdir = tmp_path / 'reports'
    first = run('health_report', tmp_path, report_dir=str(rdir), records=records(), keep=2)
    assert first['changed'] is True and first['changes'] == [] and first['previous_report'] is None
    time.sleep(0.01)
    second = run('health_report', tmp_path, report_dir=str(rdir), records=records('2.12.0+cpu'), keep=2)
    assert second['changes'] == ['n2 version.torch: ok -> fail (2.13.0+cpu -> 2.12.0+cpu)']
    assert second['previous_report'] == first['report_file']
    assert any(line.startswith('FAIL n2 version.torch') for line in second['summary'])
    latest = json.loads((rdir / 'latest-quick.json').read_text())
    assert latest['counts']['fail'] == 1 and latest['changes'] == second['changes']
    junit = ET.parse(str(rdir / 'junit-quick.xml')).getroot()
    assert junit.get('failures') == '1'
    prom = (rdir / 'gpucluster_health_quick.prom').read_text()
    assert 'gpucluster_health_check_status{tier="quick",node="n2",check="version.torch"} 2' in prom
    time.sleep(0.01)
    third = run('health_report', tmp_path, report_dir=str(rdir), records=records(), keep=2)
    assert third['removed'] == [first['report_file']]
    assert len(os.listdir(str(rdir / 'history'))) == 2


def test_check_mode_writes_nothing(tmp_path):
    rdir = tmp_path / 'reports'
    res = run('health_report', tmp_path, check=True, report_dir=str(rdir), records=records())
    assert res['changed'] is False and not rdir.exists()


def test_an_unwritable_directory_is_refused(tmp_path):
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    res = run('health_report', tmp_path, state='validated', report_dir=str(blocker / 'reports'))
    assert res['failed'] is True
    assert res['msg'] == 'report directory %s/reports cannot be written: Not a directory' % blocker


def test_a_bad_status_is_refused(tmp_path):
    bad = records()
    bad[0]['status'] = 'broken'
    res = run('health_report', tmp_path, report_dir=str(tmp_path / 'r'), records=bad)
    assert res['failed'] is True and "status 'broken'" in res['msg']


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_probe_on_this_machine(tmp_path):
    shared = tmp_path / 'shared'
    shared.mkdir()
    nccl = tmp_path / 'nccl.sh'
    with open(os.path.join(FIX, 'gpucluster-nccl.sh')) as f:
        nccl.write_text(f.read())
    port = free_port()
    head = run('health_probe', tmp_path, listen_port=port, listen_seconds=20, listen_expect=1,
               shared_path=str(shared), shared_token='tok-1', shared_token_write=True, disk_paths=[],
               kernel_log=False)
    assert head['listen']['in_use'] is False
    res = run('health_probe', tmp_path, nccl_env_file=str(nccl),
              resolve=[{'name': 'localhost', 'address': '127.0.0.1'}], connect_host='127.0.0.1',
              connect_port=port, shared_path=str(shared), shared_token='tok-1', shared_must_be_mount=False,
              disk_paths=['/', '/no/such/path'], python=sys.executable, kernel_log=False)
    assert res['connect']['result'] == 'connected'
    assert res['nccl_env'] == {'NCCL_SOCKET_IFNAME': 'eth0', 'GLOO_SOCKET_IFNAME': 'eth0'}
    assert res['shared']['writable'] is True and res['shared']['token_read'] == 'tok-1'
    assert abs(res['clock']['offset_s']) < 1.0
    assert [d['path'] for d in res['disks']] == ['/']
    assert 'lo' in [i['name'] for i in res['interfaces']]
    assert res['resolve'][0]['addresses'][:1] in (['127.0.0.1'], ['::1'])
    # the listener has had its one connection and is gone: the port is free again
    time.sleep(0.5)
    again = run('health_probe', tmp_path, connect_host='127.0.0.1', connect_port=port, connect_timeout=2,
                disk_paths=[], kernel_log=False)
    assert again['connect']['result'] == 'refused'


def test_names_are_resolved_together_and_reported_in_order(tmp_path):
    # resolved at once in threads (a broken DNS costs one timeout, not one per node); the
    # answers keep the order of the cluster's nodes, and an unknown name is an error, not a failure
    names = [{'name': 'localhost', 'address': '127.0.0.1'}, {'name': 'no-such-node.invalid', 'address': '10.0.0.9'},
             {'name': '127.0.0.1', 'address': '127.0.0.1'}]
    res = run('health_probe', tmp_path, resolve=names, disk_paths=[], kernel_log=False)
    assert [r['name'] for r in res['resolve']] == ['localhost', 'no-such-node.invalid', '127.0.0.1']
    assert res['resolve'][1]['addresses'] == [] and res['resolve'][1]['error']
    assert res['resolve'][2]['addresses'] == ['127.0.0.1'] and res['resolve'][2]['error'] is None


def test_a_hung_shared_path_is_a_timeout_and_the_rest_is_reported(tmp_path):
    """The clock file is a FIFO: opening it for writing blocks as a hung NFS server does. The
    probe gives up on that path after storage_timeout, names it, and reports everything else."""
    shared = tmp_path / 'shared'
    marker = shared / '.gpucluster-health'
    marker.mkdir(parents=True)
    node = re.sub(r'[^A-Za-z0-9_.-]', '_', socket.gethostname())
    os.mkfifo(str(marker / ('clock-' + node)))
    start = time.time()
    res = run('health_probe', tmp_path, shared_path=str(shared), shared_must_be_mount=False, disk_paths=['/'],
              storage_timeout=2, resolve=[{'name': 'localhost', 'address': '127.0.0.1'}], kernel_log=False)
    took = time.time() - start
    assert 2 <= took < 15
    assert res['shared']['timeout'] is True
    assert res['shared']['write_error'] == 'no answer from %s on %s within 2.0 s (a hung mount?)' % (shared, socket.gethostname())
    assert res['clock']['offset_s'] is None and 'no answer from' in res['clock']['error']
    assert [d['path'] for d in res['disks']] == ['/'] and res['disks'][0]['free_pct'] > 0
    assert res['resolve'][0]['addresses'] and res['interfaces']


def test_a_bad_storage_timeout_is_refused(tmp_path):
    res = run('health_probe', tmp_path, storage_timeout=0, disk_paths=[], kernel_log=False)
    assert res['failed'] is True and 'storage_timeout' in res['msg']


def fake_env(root, system_site=False):
    """A venv on disk with torch (CUDA 12.8 build), DeepSpeed and NCCL's wheel recorded."""
    import glob as _glob
    (root / 'bin').mkdir(parents=True)
    os.symlink(sys.executable, str(root / 'bin' / 'python'))
    (root / 'pyvenv.cfg').write_text('home = %s\ninclude-system-site-packages = %s\nversion = %d.%d.%d\n'
                                     % ((os.path.dirname(sys.executable), 'true' if system_site else 'false')
                                        + tuple(sys.version_info[:3])))
    site = root / 'lib' / ('python%d.%d' % sys.version_info[:2]) / 'site-packages'
    for name, dist, version in (('torch', 'torch', '2.7.1+cu128'), ('deepspeed', 'deepspeed', '0.17.2'),
                                ('nvidia-nccl-cu12', 'nvidia_nccl_cu12', '2.26.2')):
        d = site / ('%s-%s.dist-info' % (dist, version))
        d.mkdir(parents=True)
        (d / 'METADATA').write_text('Metadata-Version: 2.1\nName: %s\nVersion: %s\n' % (name, version))
    (site / 'torch').mkdir()
    (site / 'torch' / 'version.py').write_text("__version__ = '2.7.1+cu128'\ncuda: Optional[str] = '12.8'\n")
    assert _glob.glob(str(site / '*.dist-info'))
    return str(root / 'bin' / 'python')


@pytest.mark.parametrize('system_site', [False, True])
def test_versions_of_an_environment(tmp_path, system_site):
    # read from the distributions on disk; a venv that also sees the system's packages is asked
    # through its own interpreter: both give the same answer
    python = fake_env(tmp_path / 'env', system_site)
    res = run('health_probe', tmp_path, python=python, disk_paths=[], kernel_log=False)
    assert res['versions_error'] is None
    versions = dict(res['versions'])
    versions.pop('kernel')
    assert versions == {'python': '%d.%d.%d' % sys.version_info[:3], 'torch': '2.7.1+cu128', 'deepspeed': '0.17.2',
                        'nccl_wheel': '2.26.2', 'torch_cuda': '12.8', 'torch_nccl': None, 'ray': None}


def test_a_held_port_names_its_process(tmp_path):
    with socket.socket() as s:
        s.bind(('0.0.0.0', 0))
        s.listen(1)
        port = s.getsockname()[1]
        res = run('health_probe', tmp_path, listen_port=port, disk_paths=[], kernel_log=False)
    assert res['listen']['in_use'] is True
    assert os.getpid() in [h['pid'] for h in res['listen']['holders']]


def test_release_stops_the_listener(tmp_path):
    port = free_port()
    run('health_probe', tmp_path, listen_port=port, listen_seconds=60, disk_paths=[], kernel_log=False)
    assert run('health_probe', tmp_path, release_port=port)['released'] is True
    time.sleep(0.5)
    with socket.socket() as s:
        assert s.connect_ex(('127.0.0.1', port)) != 0
