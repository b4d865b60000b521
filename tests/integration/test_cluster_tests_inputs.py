"""The cluster test playbooks on three "nodes" that are the controller itself (connection local),
each with its own loopback address: the real iperf3 measures the matrix, and bad input fails
with one message before anything starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which('ansible-playbook') is None, reason='needs ansible-playbook (make setup)'),
              pytest.mark.skipif(shutil.which('iperf3') is None, reason='needs iperf3 (make setup installs it)')]

INVENTORY = """
all:
  vars:
    cluster_cidr: 127.0.0.0/24
    ansible_connection: local
    ansible_python_interpreter: %s
  children:
    cluster:
      children:
        head:
          hosts:
            n1: {cluster_address: 127.0.0.11}
        workers:
          hosts:
            n2: {cluster_address: 127.0.0.12}
            n3: {cluster_address: 127.0.0.13}
"""


def own_process_name():
    """The name the kernel gives this test process (python, or pytest when started as pytest)."""
    with open('/proc/self/comm') as comm:
        return comm.read().strip()


def free_port():
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def play(tmp_path, playbook, extra, path=None):
    (tmp_path / 'hosts.yml').write_text(INVENTORY % sys.executable)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'))
    if path is not None:
        env['PATH'] = path
    settings = dict(cluster_tests_dir=str(tmp_path / 'scripts'), cluster_tests_env_path=sys.prefix,
                    cluster_tests_bandwidth_duration=1, cluster_tests_bandwidth_port=free_port())
    settings.update(extra)
    proc = subprocess.run(['ansible-playbook', '-i', str(tmp_path / 'hosts.yml'),
                           os.path.join(ROOT, 'playbooks', playbook), '-e', json.dumps(settings)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    return proc.returncode, ' '.join((proc.stdout + proc.stderr).split())


def iperf3_servers():
    return subprocess.run(['pgrep', '-f', 'iperf3 -s -p'], capture_output=True, text=True, check=False).stdout.split()


def test_the_matrix_of_three_nodes_has_every_pair_and_no_server_is_left(tmp_path):
    # Loopback links on a busy machine differ a lot; this test is about the matrix and the servers,
    # so only a link under 1% of the median counts as slow (slow links: the cluster_tests scenario).
    # The report directory does not exist yet: it is made (as mkdir -p would) before the test.
    reports = tmp_path / 'reports' / 'not' / 'yet'
    rc, out = play(tmp_path, 'bandwidth.yml', {'cluster_tests_bandwidth_relative_threshold': 0.01,
                                               'cluster_tests_report_dir': str(reports)})
    assert rc == 0, out
    assert json.loads((reports / 'bandwidth.json').read_text())['lines']
    assert 'bandwidth matrix, Gbit/s (row sends to column), 3 node(s), 3 link(s) measured, 3 round(s)' in out
    for node in ('n1', 'n2', 'n3'):
        assert "'node %s: links 2, min " % node in out
    assert 'no slow or failed link' in out
    assert iperf3_servers() == []


@pytest.mark.parametrize('extra,message', [
    ({'cluster_tests_bandwidth_threshold_gbps': 'fast'},
     "cluster_tests_bandwidth_threshold_gbps must be a positive number, got 'fast' (str)"),
    ({'cluster_tests_bandwidth_threshold_gbps': -2},
     'cluster_tests_bandwidth_threshold_gbps must be a positive number, got -2'),
    ({'cluster_tests_bandwidth_relative_threshold': 0},
     'cluster_tests_bandwidth_relative_threshold must be a positive number, got 0'),
    ({'cluster_tests_bandwidth_pairs': [['n1', 'gpu-worker-9']]},
     'cluster_tests_bandwidth_pairs[0] names gpu-worker-9, which is not a node of the inventory (n1, n2, n3)'),
])
def test_bad_bandwidth_settings_fail_before_anything_starts(tmp_path, extra, message):
    rc, out = play(tmp_path, 'bandwidth.yml', extra)
    assert rc != 0
    assert "'bandwidth test: nothing was started' - " + message in out
    assert 'Start the iperf3 servers' not in out


def holder_message(out, start, port_name):
    """The refusal that starts with start and ends with the port's name, e.g. "host n2: port 5201 is
    in use by pid 42 (<its command line>) (the bandwidth test port)"."""
    found = re.search(re.escape(start) + r'[^)]*\) ' + re.escape('(%s)' % port_name), out)
    assert found, out[-3000:]
    return found.group(0)


def test_a_bandwidth_port_in_use_names_the_node_and_the_process(tmp_path):
    port = free_port()
    holder = socket.socket()
    holder.bind(('127.0.0.12', port))
    holder.listen()
    try:
        rc, out = play(tmp_path, 'bandwidth.yml', {'cluster_tests_bandwidth_port': port})
    finally:
        holder.close()
    assert rc != 0
    holder_line = holder_message(out, 'host n2: port %d is in use by pid %d (' % (port, os.getpid()),
                                 'the bandwidth test port')
    assert own_process_name() in holder_line
    assert 'Start the iperf3 servers' not in out


def test_iperf3_missing_names_the_nodes_and_the_package(tmp_path):
    # a PATH with every tool of /usr/bin and /bin but iperf3
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    for directory in ('/usr/bin', '/bin'):
        for name in os.listdir(directory):
            if name != 'iperf3' and not (bin_dir / name).exists():
                os.symlink(os.path.join(directory, name), bin_dir / name)
    rc, out = play(tmp_path, 'bandwidth.yml', {}, path='%s:%s' % (os.path.dirname(sys.executable), bin_dir))
    assert rc != 0
    for node in ('n1', 'n2', 'n3'):
        assert 'host %s: iperf3 is not installed (install the package iperf3)' % node in out


@pytest.mark.parametrize('sizes,message', [
    ([], 'cluster_tests_collective_sizes is empty; give at least one message size, e.g. [1M, 64M]'),
    (['1M', '64K'], 'cluster_tests_collective_sizes must be increasing: cluster_tests_collective_sizes[1] = 65536 '
                    'bytes does not exceed cluster_tests_collective_sizes[0] = 1048576 bytes'),
    (['1M', 'lots'], "cluster_tests_collective_sizes[1] must be a size in bytes (like 1048576 or 1M), got 'lots' (str)"),
])
def test_bad_message_sizes_fail_before_anything_starts(tmp_path, sizes, message):
    rc, out = play(tmp_path, 'collective.yml', {'cluster_tests_collective_sizes': sizes})
    assert rc != 0
    assert "['collective test: nothing was started', %r]" % message in out


def test_a_threshold_for_a_size_not_tested_is_refused(tmp_path):
    rc, out = play(tmp_path, 'collective.yml', {'cluster_tests_collective_sizes': ['1M'],
                                                'cluster_tests_collective_thresholds': {'64M': 'x'}})
    assert rc != 0
    assert ("cluster_tests_collective_thresholds: size '64M' (67108864 bytes) is not one of the sizes tested (1048576)"
            in out)


def test_a_rendezvous_port_in_use_on_the_head_names_the_process(tmp_path):
    port = free_port()
    holder = socket.socket()
    holder.bind(('0.0.0.0', port))
    holder.listen()
    try:
        rc, out = play(tmp_path, 'smoke.yml', {'cluster_tests_master_port': port})
    finally:
        holder.close()
    assert rc != 0
    holder_line = holder_message(out, 'host n1: port %d is in use by pid %d (' % (port, os.getpid()),
                                 'the rendezvous port, master_port')
    assert own_process_name() in holder_line
