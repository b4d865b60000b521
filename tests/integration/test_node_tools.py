"""What the node_tools role installs where: the choice made from the inventory (head or worker,
launcher, RDMA devices, pins), rendered by ansible-playbook from the role's own vars files."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from play_output import ROOT, first_task_msgs

ROLE = os.path.join(ROOT, 'roles', 'node_tools')

pytestmark = pytest.mark.skipif(shutil.which('ansible-playbook') is None, reason='needs ansible-playbook (make setup)')

INVENTORY = """
all:
  vars: {ansible_connection: local, ansible_python_interpreter: python3}
  children:
    cluster:
      children:
        head: {hosts: {h1: {}}}
        workers: {hosts: {w1: {}, w2: {}}}
"""

PLAY = """
- hosts: cluster
  gather_facts: false
  vars_files: [{role}/defaults/main.yml, {role}/vars/main.yml, {role}/vars/{os}.yml]
  tasks:
    - name: Show the choice
      ansible.builtin.debug:
        msg: "{{{{ {{'groups': __node_tools_groups, 'specs': __node_tools_specs}} }}}}"
"""


def choice(tmp_path, os_file='Debian_12', extra=None, hostvars=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / 'hosts.yml').write_text(INVENTORY)
    (tmp_path / 'play.yml').write_text(PLAY.format(role=ROLE, os=os_file))
    if hostvars:
        (tmp_path / 'host_vars').mkdir()
        for host, values in hostvars.items():
            (tmp_path / 'host_vars' / (host + '.yml')).write_text(json.dumps(values))
    return first_task_msgs(tmp_path, extra)


def test_defaults_give_iperf3_and_the_build_tools_everywhere_and_pdsh_on_the_head_only(tmp_path):
    got = choice(tmp_path)
    assert got['h1']['groups'] == ['iperf3', 'pdsh', 'build']
    assert got['w1']['groups'] == ['iperf3', 'build']
    assert 'pdsh' in got['h1']['specs'] and 'pdsh' not in got['w1']['specs']
    assert not [s for s in got['w2']['specs'] if 'openmpi' in s or 'perftest' in s]


def test_open_mpi_follows_the_launcher_and_nccl_tests_over_several_nodes(tmp_path):
    assert 'openmpi' in choice(tmp_path / 'a', extra={'cluster_launcher': 'mpirun'})['w2']['groups']
    assert 'openmpi' in choice(tmp_path / 'b', extra={'cluster_deepspeed_launcher': 'openmpi'})['w1']['groups']
    assert 'openmpi' in choice(tmp_path / 'c', extra={'cluster_nccl_tests_dir': '/opt/nccl-tests/build'})['h1']['groups']
    assert 'openmpi' not in choice(tmp_path / 'd', extra={'cluster_launcher': 'mpirun', 'node_tools_openmpi': 'never'})['h1']['groups']


def test_pins_take_the_package_managers_own_form_and_only_what_is_chosen(tmp_path):
    pins = {'iperf3': '3.12-1', 'openmpi-bin': '4.1.4*'}
    deb = choice(tmp_path / 'deb', extra={'node_tools_versions': pins, 'node_tools_build': False})
    assert deb['w1']['specs'] == ['iperf3=3.12-1']   # no Open MPI chosen: its pin is not installed
    el = choice(tmp_path / 'el', os_file='RedHat_9', extra={'node_tools_versions': {'iperf3': '3.9-13.el9'},
                                                            'cluster_launcher': 'mpirun'})
    assert 'iperf3-3.9-13.el9' in el['h1']['specs']
    assert {'pdsh', 'pdsh-rcmd-ssh', 'openmpi', 'openmpi-devel', 'gcc-c++', 'python3-devel'} <= set(el['h1']['specs'])


def test_perftest_only_on_a_node_with_rdma_devices(tmp_path):
    found = {'__node_tools_ib': {'files': [{'path': '/sys/class/infiniband/mlx5_0'}]}}
    got = choice(tmp_path, hostvars={'w2': found})
    assert 'perftest' in got['w2']['groups'] and 'perftest' in got['w2']['specs']
    assert 'perftest' not in got['w1']['groups']
