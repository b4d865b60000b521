"""network and firewall refuse bad input before any change, naming the host and the variable.

The roles run with the real ansible-playbook against a throw-away inventory whose one node is
the controller itself (connection local) in check mode, so nothing could change even if a
check wrongly passed; the recap must still show no change and no task after the check ran.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which('ansible-playbook') is None, reason='needs ansible-playbook (make setup)')]

PLAYBOOK = """
- hosts: cluster
  gather_facts: false
  roles:
    - role: gpucluster.multinode.%s
"""

STATIC = {'interface': None, 'address': '192.168.77.10/24', 'gateway': '192.168.77.1', 'dns': ['192.168.77.1']}


def real_interface():
    return next(name for _index, name in socket.if_nameindex() if name != 'lo')


def run_role(tmp_path, role, host_vars, env_extra=None):
    inventory = {'all': {
        'vars': {'cluster_cidr': '192.168.77.0/24'},
        'children': {'cluster': {'children': {
            'head': {'hosts': {'ctl-node': dict({'ansible_connection': 'local', 'ansible_host': '192.168.77.10',
                                                 'ansible_python_interpreter': shutil.which('python3')}, **host_vars)}},
            'workers': {'hosts': {}}}}}}}
    (tmp_path / 'hosts.yml').write_text(json.dumps(inventory))
    (tmp_path / 'play.yml').write_text(PLAYBOOK % role)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'), **(env_extra or {}))
    cmd = ['ansible-playbook', '--check', '-i', str(tmp_path / 'hosts.yml'), str(tmp_path / 'play.yml'),
           '-e', 'network_hosts_file=%s' % (tmp_path / 'hosts')]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    recap = out[out.index('PLAY RECAP'):]
    assert re.findall(r'changed=(\d+)', recap) == ['0'], recap
    return proc.returncode, ' '.join(out.split())


@pytest.mark.parametrize('change, expected', [
    ({'address': '10.0.0.7/24', 'gateway': '10.0.0.1'},
     'host ctl-node: network_static.address 10.0.0.7/24 is outside cluster_cidr 192.168.77.0/24'),
    ({'address': '192.168.77.10/33'},
     'host ctl-node: network_static.address 192.168.77.10/33: prefix length 33 is out of range (1-32)'),
    ({'interface': 'gpuclusternope0'},
     'host ctl-node: network_static.interface gpuclusternope0 does not exist on this node'),
    ({'gateway': '192.168.78.1'},
     "host ctl-node: network_static.gateway 192.168.78.1 is outside the node's subnet 192.168.77.0/24"),
])
def test_bad_static_address_fails_before_any_change(tmp_path, change, expected):
    static = dict(STATIC, interface=real_interface())
    static.update(change)
    rc, out = run_role(tmp_path, 'network', {'network_static': static})
    assert rc != 0
    assert expected in out
    assert 'TASK [gpucluster.multinode.network : Set the hostname to network_hostname]' not in out
    assert not (tmp_path / 'hosts').exists()


def test_admin_networks_that_lock_the_controller_out_are_refused(tmp_path):
    rc, out = run_role(tmp_path, 'firewall', {'firewall_admin_networks': ['10.8.0.0/24']},
                       env_extra={'SSH_CLIENT': '172.16.0.9 50123 22'})
    assert rc != 0
    assert ("host ctl-node: firewall_admin_networks 10.8.0.0/24 excludes the controller's own address 172.16.0.9"
            in out)
    assert 'Install ufw' not in out and 'Install firewalld' not in out
