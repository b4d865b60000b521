"""Node-side readers of the health probe: storage in bounded children, the listener, the profile."""

from __future__ import annotations

import os
import socket
import time

from ansible_collections.gpucluster.multinode.plugins.module_utils import health_probes

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'health')


def hang_on(path, real):
    """A reader that blocks forever on path, as statvfs does on a hard NFS mount whose server is gone."""
    def reader(p, *args):
        if p == path:
            time.sleep(3600)
        return real(p, *args)
    return reader


def test_a_hung_disk_path_is_a_timeout_naming_node_and_path(monkeypatch, tmp_path):
    monkeypatch.setattr(health_probes, 'disk', hang_on('/mnt/hung', health_probes.disk))
    paths = ['/', '/mnt/hung', str(tmp_path), '/no/such/path']
    start = time.monotonic()
    children = health_probes.start_storage(None, paths)
    shared, clock, disks = health_probes.collect_storage(children, None, paths, start + 1.5, 1.5, 'node-7')
    took = time.monotonic() - start
    assert 1.4 < took < 5
    assert shared is None and clock is None
    assert [d['path'] for d in disks] == ['/', '/mnt/hung', str(tmp_path)]   # a missing path is skipped
    hung = disks[1]
    assert hung['timeout'] is True and hung['free_pct'] is None
    assert hung['error'] == 'no answer from /mnt/hung on node-7 within 1.5 s (a hung mount?)'
    assert disks[0]['timeout'] is False and 0 < disks[0]['free_pct'] <= 100


def test_an_answer_given_in_time_counts_when_the_probe_collects_it_after_the_bound(monkeypatch, tmp_path):
    # the probe reads names, versions and the kernel log before it collects the storage children; on a
    # loaded node that took longer than storage_timeout, and every node's disks were called hung
    monkeypatch.setattr(health_probes, 'disk', hang_on('/mnt/hung', health_probes.disk))
    paths = [str(tmp_path), '/mnt/hung']
    start = time.monotonic()
    children = health_probes.start_storage(None, paths)
    time.sleep(1.0)                       # the probe's other reads, past the bound below
    shared, clock, disks = health_probes.collect_storage(children, None, paths, start + 0.3, 0.3, 'node-3')
    assert time.monotonic() - start < 3
    assert disks[0]['path'] == str(tmp_path) and disks[0]['timeout'] is False and 0 < disks[0]['free_pct'] <= 100
    assert disks[1]['timeout'] is True
    assert disks[1]['error'] == 'no answer from /mnt/hung on node-3 within 0.3 s (a hung mount?)'


def test_the_hung_child_is_killed(monkeypatch):
    monkeypatch.setattr(health_probes, 'disk', hang_on('/mnt/hung', health_probes.disk))
    children = health_probes.start_storage(None, ['/mnt/hung'])
    pid = children['disk0'][0]
    health_probes.collect_storage(children, None, ['/mnt/hung'], time.monotonic() + 0.5, 0.5, 'n')
    for _ in range(50):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done == pid:
            break
        time.sleep(0.05)
    assert done == pid


def test_shared_storage_on_a_plain_directory(tmp_path):
    args = (str(tmp_path), 'tok-9', True, False, 'node-1')
    start = time.monotonic()
    children = health_probes.start_storage(args, [])
    shared, clock, disks = health_probes.collect_storage(children, args, [], start + 10, 10, 'node-1')
    assert time.monotonic() - start < 5
    assert shared['exists'] is True and shared['writable'] is True and shared['timeout'] is False
    assert shared['token_read'] == 'tok-9' and shared['mounted'] is False
    assert abs(clock['offset_s']) < 1 and disks == []
    assert (tmp_path / '.gpucluster-health' / 'clock-node-1').exists()


def test_a_missing_shared_path(tmp_path):
    args = (str(tmp_path / 'nope'), '', False, True, 'n')
    shared, clock, _ = health_probes.collect_storage(health_probes.start_storage(args, []), args, [],
                                                     time.monotonic() + 10, 10, 'n')
    assert shared['exists'] is False and clock['error'] == '%s does not exist' % (tmp_path / 'nope')


def test_an_exception_in_a_child_is_an_error_not_a_timeout(monkeypatch):
    def broken(path):
        raise OSError(5, 'Input/output error')
    monkeypatch.setattr(health_probes, 'disk', broken)
    children = health_probes.start_storage(None, ['/x'])
    _, _, disks = health_probes.collect_storage(children, None, ['/x'], time.monotonic() + 10, 10, 'n')
    assert disks == [{'path': '/x', 'free_pct': None, 'inodes_free_pct': None, 'free_bytes': None,
                      'timeout': False, 'error': 'OSError: [Errno 5] Input/output error'}]


def test_listener_holds_a_free_port_and_names_the_holder_of_a_used_one():
    with socket.socket() as s:
        s.bind(('0.0.0.0', 0))
        s.listen(1)
        port = s.getsockname()[1]
        used = health_probes.listen(port, 5, 1, lambda p: [{'pid': 42, 'cmdline': 'python train.py'}])
    assert used == {'port': port, 'in_use': True, 'holders': [{'pid': 42, 'cmdline': 'python train.py'}],
                    'listener_pid': None}
    held = health_probes.listen(port, 10, 1, lambda p: [])
    assert held['in_use'] is False
    assert health_probes.connect('127.0.0.1', port, 2)['result'] == 'connected'
    # one connection expected: the listener has gone, the port is free again
    for _ in range(50):
        if health_probes.connect('127.0.0.1', port, 1)['result'] == 'refused':
            break
        time.sleep(0.1)
    assert health_probes.connect('127.0.0.1', port, 1)['result'] == 'refused'


def test_release_tells_the_listener_to_go():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    assert health_probes.listen(port, 30, 0, lambda p: [])['in_use'] is False
    assert health_probes.release(port) is True
    for _ in range(50):
        if health_probes.connect('127.0.0.1', port, 1)['result'] == 'refused':
            break
        time.sleep(0.1)
    assert health_probes.connect('127.0.0.1', port, 1)['result'] == 'refused'
    assert health_probes.release(port) is False


def test_nccl_env_of_the_profile_script(tmp_path):
    assert health_probes.nccl_env(os.path.join(FIX, 'gpucluster-nccl.sh')) == (
        True, {'NCCL_SOCKET_IFNAME': 'eth0', 'GLOO_SOCKET_IFNAME': 'eth0'})
    assert health_probes.nccl_env(str(tmp_path / 'none.sh')) == (False, {})
