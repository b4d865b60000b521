"""ray_preflight: the head holds its port for the workers' test; a worker says why it cannot connect.
ray_node (through env_versions): the installed Ray version is read from the package metadata on disk."""

from __future__ import annotations

import socket
import time

from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions
from ansible_collections.gpucluster.multinode.plugins.modules import ray_preflight


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_held_port_answers_any_number_of_times_until_released():
    port = free_port()
    assert ray_preflight.hold('127.0.0.1', port, 30) is True
    # a worker's Ray still calling an earlier head connects too: the test of every worker still works
    for _ in range(4):
        assert ray_preflight.connect('127.0.0.1', port, 5) == 'connected'
    assert ray_preflight.release('127.0.0.1', port) is True
    deadline = time.time() + 10
    while time.time() < deadline and ray_preflight.connect('127.0.0.1', port, 1) == 'connected':
        time.sleep(0.2)
    assert ray_preflight.connect('127.0.0.1', port, 1).startswith('connection refused')
    assert ray_preflight.release('127.0.0.1', port) is False       # nobody holds it: no error


def test_a_held_port_goes_away_by_itself_at_the_end_of_its_time():
    port = free_port()
    assert ray_preflight.hold('127.0.0.1', port, 2) is True
    deadline = time.time() + 15
    while time.time() < deadline and ray_preflight.connect('127.0.0.1', port, 1) == 'connected':
        time.sleep(0.2)
    assert ray_preflight.connect('127.0.0.1', port, 1).startswith('connection refused')


def test_a_port_in_use_is_not_held():
    busy = socket.socket()
    busy.bind(('127.0.0.1', 0))
    busy.listen(1)
    try:
        assert ray_preflight.hold('127.0.0.1', busy.getsockname()[1], 5) is False
    finally:
        busy.close()


def test_a_socket_without_a_visible_owner_is_ray_s_only_when_the_unit_s_account_holds_it_while_it_runs():
    ray_socket = {'pid': None, 'uid': 2001, 'cmdline': '', 'job_id': None, 'address': '10.0.0.1'}
    assert ray_preflight.is_ours(ray_socket, {77, 78}, 2001) is True
    assert ray_preflight.is_ours(dict(ray_socket, uid=0), {77, 78}, 2001) is False
    assert ray_preflight.is_ours(ray_socket, set(), None) is False        # the unit has no process
    assert ray_preflight.is_ours(dict(ray_socket, pid=77, uid=0), {77}, None) is True
    assert ray_preflight.is_ours(dict(ray_socket, pid=812), {77}, 2001) is False


def test_ray_version_from_metadata(tmp_path):
    meta = tmp_path / 'lib' / 'python3.11' / 'site-packages' / 'ray-2.60.0.dist-info'
    meta.mkdir(parents=True)
    (meta / 'METADATA').write_text('Metadata-Version: 2.1\nName: ray\nVersion: 2.60.0\n')
    assert env_versions.ray_version(str(tmp_path)) == '2.60.0'
    assert env_versions.ray_version(str(tmp_path / 'none')) == ''
