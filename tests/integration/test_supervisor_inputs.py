"""site.yml's supervisor step refuses, in its checks, an offline wheelhouse that lacks ansible-core at the pin or
one of its requirements: pip failed there after the supervisor's directories were made.

The role's checks (tasks/validate.yml, what site.yml's preflight runs) against the controller itself (connection
local) in check mode, with a scratch wheelhouse of empty files named as pip names wheels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which('ansible-playbook') is None, reason='needs ansible-playbook (make setup)')]

PLAYBOOK = """
- hosts: cluster
  gather_facts: false
  tasks:
    - name: The supervisor step's checks
      ansible.builtin.include_role:
        name: gpucluster.multinode.supervisor
        tasks_from: validate
"""

INVENTORY = """
all:
  children:
    cluster:
      children:
        head:
          hosts:
            ctl-head: {ansible_connection: local, ansible_python_interpreter: %s}
        workers:
          hosts: {}
"""

WHEELS = ['ansible_core-2.19.14-py3-none-any.whl', 'jinja2-3.1.6-py3-none-any.whl',
          'MarkupSafe-3.0.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl',
          'PyYAML-6.0.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl',
          'cryptography-46.0.3-cp311-abi3-manylinux_2_34_x86_64.whl', 'cffi-2.0.0-cp311-cp311-manylinux2014_x86_64.whl',
          'pycparser-2.23-py3-none-any.whl', 'packaging-25.0-py3-none-any.whl', 'resolvelib-1.2.0-py3-none-any.whl']
REFUSAL = 'host ctl-head: cluster_pip_find_links %s holds no wheel of '


def run_checks(tmp_path, wheels):
    wheelhouse = tmp_path / 'wheelhouse'
    wheelhouse.mkdir()
    for name in wheels:
        (wheelhouse / name).write_text('')
    (tmp_path / 'play.yml').write_text(PLAYBOOK)
    (tmp_path / 'hosts.yml').write_text(INVENTORY % sys.executable)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'))
    args = ['-e', json.dumps({'cluster_pip_offline': True, 'cluster_pip_find_links': [str(wheelhouse)],
                              'supervisor_python': sys.executable, 'supervisor_dir': str(tmp_path / 'supervisor')})]
    proc = subprocess.run(['ansible-playbook', '--check', '-i', str(tmp_path / 'hosts.yml'), str(tmp_path / 'play.yml')]
                          + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, ' '.join((proc.stdout + proc.stderr).split()), str(wheelhouse)


def test_a_wheelhouse_without_ansible_core_is_refused_naming_the_directory_what_lacks_and_the_download(tmp_path):
    rc, out, wheelhouse = run_checks(tmp_path, [w for w in WHEELS if not w.startswith(('ansible_core', 'cffi'))]
                                     + ['ansible_core-2.18.3-py3-none-any.whl'])
    assert rc != 0
    assert (REFUSAL % wheelhouse + 'ansible-core==2.19.14, cffi (the supervisor step installs them offline, '
            'cluster_pip_offline); add them: pip download -d %s ansible-core==2.19.14 (' % wheelhouse) in out


def test_a_wheelhouse_that_holds_them_all_passes_this_check(tmp_path):
    rc, out, wheelhouse = run_checks(tmp_path, WHEELS)
    assert REFUSAL % wheelhouse not in out
    assert 'TASK [gpucluster.multinode.supervisor : Refuse an offline wheelhouse without one of ansible-core' in out
    # the checks went on past it (the scratch directory under /tmp is then refused for being writable by all)
    assert 'Read who owns the supervisor' in out


def test_a_venv_that_holds_the_pin_needs_no_wheel(tmp_path):
    python = tmp_path / 'supervisor' / 'ansible' / 'bin' / 'python'
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho 2.19.14\n')
    python.chmod(0o755)
    rc, out, wheelhouse = run_checks(tmp_path, [])
    assert REFUSAL % wheelhouse not in out and 'Read who owns the supervisor' in out
