"""nfs_server / nfs_client on bad settings and on a server that does not answer.

The runs are forced to a local connection in check mode, against the inventory of the
contract tests; the only traffic is the client's probe of 127.0.0.1:2049, where nothing
listens. Each must fail before any change with one message naming the host and the variable.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORY = os.path.join(ROOT, 'tests', 'integration', 'inventories', 'good.yml')
PLAYBOOK = os.path.join(ROOT, 'tests', 'integration', 'playbooks', 'nfs_roles.yml')

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which('ansible-playbook') is None,
                                 reason='ansible-playbook is not on PATH (source scripts/env.sh)')]


def run(*extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'))
    cmd = ['ansible-playbook', PLAYBOOK, '-i', INVENTORY, '--check', '-e', 'ansible_connection=local',
           '-e', 'ansible_python_interpreter=' + shutil.which('python3'),
           '-e', 'nfs_client_server=127.0.0.1'] + list(extra)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def nothing_changed(output):
    recap = output[output.index('PLAY RECAP'):]
    changed = re.findall(r'changed=(\d+)', recap)
    return bool(changed) and all(c == '0' for c in changed)


@pytest.mark.parametrize('extra, expected', [
    (['-e', '{"nfs_server_export_clients": ["*"]}'],
     'host gpu-master: nfs_server_export_clients: * exports to every host; name networks inside cluster_cidr 192.168.1.0/24'),
    (['-e', '{"nfs_server_export_clients": ["10.0.0.0/8"]}'],
     'host gpu-master: nfs_server_export_clients: 10.0.0.0/8 is outside or wider than cluster_cidr 192.168.1.0/24'),
    (['-e', 'nfs_server_export_path=srv/nfs'],
     "host gpu-master: nfs_server_export_path: 'srv/nfs' is not an absolute path"),
    (['-e', '{"nfs_server_export_options": ["rw", "no_root_squash"]}'],
     'host gpu-master: nfs_server_export_options: no_root_squash is set with nfs_server_no_root_squash: true'),
])
def test_bad_export_settings_fail_before_any_change(extra, expected):
    rc, out, _ = run(*extra)
    assert rc != 0
    assert expected in out, out[-3000:]
    assert 'Install the kernel NFS server' not in out
    assert nothing_changed(out)


def test_relative_client_path_fails_naming_host_and_variable():
    rc, out, _ = run('-e', 'nfs_client_path=shared', '--limit', 'workers')
    assert rc != 0
    assert 'host gpu-worker-1: nfs_client_path: shared is not an absolute path' in out, out[-3000:]
    assert nothing_changed(out)


def test_a_server_that_does_not_answer_fails_within_seconds():
    with socket.socket() as sock:
        if sock.connect_ex(('127.0.0.1', 2049)) == 0:
            pytest.skip('something listens on 127.0.0.1:2049 here')
    rc, out, elapsed = run('--limit', 'gpu-worker-1', '-e', 'nfs_client_probe_timeout=3')
    assert rc != 0
    assert ('host gpu-worker-1: nfs_client_server 127.0.0.1 does not answer on TCP port 2049 within 3 s'
            in out), out[-3000:]
    assert 'Install the NFS client' not in out
    assert elapsed < 60
    assert nothing_changed(out)
