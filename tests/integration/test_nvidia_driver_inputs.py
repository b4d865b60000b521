"""nvidia_driver refuses what cannot work before it changes anything, and skips a node without a GPU.

Runs the role against the controller itself (connection local): this machine has no NVIDIA
device, so the role must skip it with one line, and bad settings must fail before any task that
could change it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which('ansible-playbook') is None, reason='needs ansible-playbook (make setup)'),
              pytest.mark.skipif(any(open(os.path.join(d, 'vendor')).read().strip() == '0x10de'
                                     for d in (os.path.join('/sys/bus/pci/devices', n)
                                               for n in (os.listdir('/sys/bus/pci/devices')
                                                         if os.path.isdir('/sys/bus/pci/devices') else []))
                                     if os.path.exists(os.path.join(d, 'vendor'))),
                                 reason='this controller has an NVIDIA device')]

PLAYBOOK = """
- hosts: cluster
  gather_facts: false
  roles:
    - role: gpucluster.multinode.nvidia_driver
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


def run_role(tmp_path, *extra):
    (tmp_path / 'play.yml').write_text(PLAYBOOK)
    (tmp_path / 'hosts.yml').write_text(INVENTORY % shutil.which('python3'))
    args = []
    for item in extra:
        args += ['-e', item]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'))
    before = sorted(os.listdir('/etc/apt/sources.list.d')) if os.path.isdir('/etc/apt/sources.list.d') else []
    proc = subprocess.run(['ansible-playbook', '-i', str(tmp_path / 'hosts.yml'), str(tmp_path / 'play.yml')] + args,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    after = sorted(os.listdir('/etc/apt/sources.list.d')) if os.path.isdir('/etc/apt/sources.list.d') else []
    assert before == after, 'the role changed the apt sources of the controller'
    assert not os.path.exists('/etc/modprobe.d/gpucluster-blacklist-nouveau.conf')
    return proc.returncode, ' '.join((proc.stdout + proc.stderr).split())


def test_a_branch_that_is_not_a_number(tmp_path):
    rc, out = run_role(tmp_path, 'nvidia_driver_branch=latest')
    assert rc != 0
    assert "host ctl-head: nvidia_driver_branch latest is not a driver branch number (three digits, e.g. \"580\")" in out
    assert 'Find the NVIDIA devices on the PCI bus' not in out


def test_a_cuda_toolkit_the_branch_cannot_run(tmp_path):
    rc, out = run_role(tmp_path, 'nvidia_driver_branch=535', 'nvidia_driver_cuda_toolkit=true',
                       'nvidia_driver_cuda_toolkit_version=12.8')
    assert rc != 0
    assert ('host ctl-head: nvidia_driver_cuda_toolkit_version 12.8 needs driver branch 570 or newer; '
            'nvidia_driver_branch 535 cannot run it') in out


def test_a_pinned_version_outside_the_branch(tmp_path):
    rc, out = run_role(tmp_path, 'nvidia_driver_version=570.86.15')
    assert rc != 0
    assert 'host ctl-head: nvidia_driver_version 570.86.15 is not in nvidia_driver_branch 580' in out


def test_a_wrong_type_is_refused_by_the_argument_spec(tmp_path):
    rc, out = run_role(tmp_path, 'nvidia_driver_expected_gpus=eight')
    assert rc != 0
    assert 'nvidia_driver_expected_gpus' in out and "eight" in out


def test_a_node_without_an_nvidia_device_is_skipped_with_one_line(tmp_path):
    rc, out = run_role(tmp_path)
    assert rc == 0, out
    assert ('host ctl-head: no NVIDIA device on the PCI bus (/sys/bus/pci/devices), nvidia_driver skipped; '
            'nvidia_driver_force=true installs the driver anyway') in out
    assert 'changed=0' in out and 'failed=0' in out
