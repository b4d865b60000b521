"""ssh_trust refuses a uid or gid another account already holds, before it changes anything.

Runs the role's checks against the controller itself (connection local) in check mode: the
controller's own accounts stand in for a node's. daemon has uid and gid 1 on every Debian,
Ubuntu and EL machine; the account under test is given a name nobody uses.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER = 'gpc-clash-probe'

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which('ansible-playbook') is None, reason='needs ansible-playbook (make setup)')]

PLAYBOOK = """
- hosts: cluster
  gather_facts: false
  roles:
    - role: gpucluster.multinode.ssh_trust
"""

INVENTORY = """
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: %s
    cluster_cidr: 127.0.0.0/24
  children:
    cluster:
      children:
        head:
          hosts:
            ctl-head: {ansible_host: 127.0.0.1}
        workers:
          hosts:
            ctl-worker-1: {ansible_host: 127.0.0.2}
"""


def run_role(tmp_path, **extra):
    (tmp_path / 'play.yml').write_text(PLAYBOOK)
    (tmp_path / 'hosts.yml').write_text(INVENTORY % shutil.which('python3'))
    settings = dict(ssh_trust_user=USER, ssh_trust_home=str(tmp_path / 'home'), ssh_trust_harden_sshd='false',
                    ssh_trust_pdsh='false')
    settings.update(extra)
    args = []
    for key, value in settings.items():
        args += ['-e', '%s=%s' % (key, value)]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'))
    # --check: even a broken check could not create the account on the controller.
    proc = subprocess.run(['ansible-playbook', '--check', '-i', str(tmp_path / 'hosts.yml'), str(tmp_path / 'play.yml')]
                          + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def recap_changed(out):
    return [line for line in out.splitlines() if ' : ok=' in line and 'changed=0' not in line]


@pytest.fixture(autouse=True)
def _probe_account_is_free():
    with pytest.raises(KeyError):
        pwd.getpwnam(USER)


def test_a_uid_another_account_holds_fails_naming_each_node_and_the_variable(tmp_path):
    daemon = pwd.getpwuid(1).pw_name
    rc, out = run_role(tmp_path, ssh_trust_uid='1', ssh_trust_gid='64999')
    text = ' '.join(out.split())
    assert rc != 0, out
    assert 'ssh_trust: 2 problem(s) with the account; nothing was changed' in text
    for node in ('ctl-head', 'ctl-worker-1'):
        assert 'host %s: cluster_user_uid 1 is already the uid of account %s' % (node, daemon) in text
    # It stopped at the check: no task that would change anything ran, on any node.
    assert 'Make the account' not in out
    assert recap_changed(out) == [], out
    assert not (tmp_path / 'home').exists()


def test_a_gid_another_group_holds_fails_naming_the_variable(tmp_path):
    rc, out = run_role(tmp_path, ssh_trust_uid='64999', ssh_trust_gid='1')
    text = ' '.join(out.split())
    assert rc != 0, out
    assert 'host ctl-head: ssh_trust_gid 1 is already the gid of group' in text
    assert 'cluster_user_uid 64999' not in text
    assert recap_changed(out) == [], out


def test_a_free_uid_and_gid_pass_the_check(tmp_path):
    # Stops later (no sshd/pdsh needed), but not at the account check.
    rc, out = run_role(tmp_path, ssh_trust_uid='64999', ssh_trust_gid='64999')
    assert 'problem(s) with the account' not in out
    assert 'Make the account with the same uid on every node' in out
