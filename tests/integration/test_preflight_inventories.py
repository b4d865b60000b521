"""site.yml on bad inventories: one clear message naming the host and the variable, nothing changed.

These run the real ansible-playbook. The nodes in the inventories are never contacted: the
contract is checked on the controller first, and the runs are forced to a local connection in
check mode, so a contract that wrongly passed could neither reach a network nor change a file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORIES = os.path.join(ROOT, 'tests', 'integration', 'inventories')
PLAYBOOK = os.path.join(ROOT, 'playbooks', 'site.yml')

pytestmark = pytest.mark.skipif(shutil.which('ansible-playbook') is None,
                                reason='ansible-playbook is not on PATH (source scripts/env.sh)')


def run_site(inventory, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'))
    cmd = ['ansible-playbook', PLAYBOOK, '-i', os.path.join(INVENTORIES, inventory)] + list(extra)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def guarded(inventory):
    return run_site(inventory, '--check', '-e', 'ansible_connection=local')


def assert_nothing_changed(output):
    recap = output[output.index('PLAY RECAP'):]
    changed = re.findall(r'changed=(\d+)', recap)
    assert changed and all(c == '0' for c in changed), recap


@pytest.mark.parametrize('inventory, expected', [
    ('two_heads.yml', "group 'head' must hold exactly one host, it holds 2: gpu-master, gpu-worker-1"),
    ('no_head.yml', "group 'head' is empty"),
    ('duplicate_address.yml', 'host gpu-worker-2: cluster_address 192.168.1.101 is already used by host gpu-worker-1'),
    ('outside_cidr.yml', 'host gpu-worker-2: cluster_address 10.0.0.7 is outside cluster_cidr 192.168.1.0/24'),
    ('no_group.yml', 'host stray-box: is in no group'),
    ('wrong_type.yml', "host gpu-master: gpu_slots must be an integer from 0 to 1024, got 'eight' (str)"),
    ('bad_cidr.yml', "cluster_cidr must be a network in CIDR form like 192.168.1.0/24, got '192.168.1.0/33'"),
])
def test_bad_inventory_fails_in_preflight(inventory, expected):
    rc, out = guarded(inventory)
    assert rc != 0
    assert 'inventory contract:' in out
    assert expected in out
    # The contract task is the first one that fails and no node task ran.
    assert 'TASK [gpucluster.multinode.preflight : Reach every node]' not in out
    assert_nothing_changed(out)


def test_nodes_that_do_not_answer_are_named():
    rc, out = run_site('unreachable.yml')
    assert rc != 0
    assert "2 node(s) do not answer; nothing was changed" in out
    assert 'host gpu-worker-1 (127.0.0.2)' in out
    assert 'host gpu-worker-2 (127.0.0.3)' in out
    assert 'host gpu-master' not in out.split('do not answer')[1].split('PLAY RECAP')[0]
    assert 'Read the GPUs' not in out
    assert_nothing_changed(out)
