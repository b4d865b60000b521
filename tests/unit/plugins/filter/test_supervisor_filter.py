import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.filter.supervisor import supervisor_inventory

ROOT = Path(__file__).resolve().parents[4]

HOSTVARS = {
    'head': {'inventory_hostname': 'head', 'ansible_host': '203.0.113.10', 'cluster_address': '10.0.0.10',
             'ansible_user': 'admin', 'ansible_become': True, 'ansible_ssh_private_key_file': '/home/me/.ssh/id',
             'ansible_python_interpreter': '/usr/bin/python3', 'node_slots': 2, 'cluster_cidr': '10.0.0.0/24',
             'cluster_user': 'train', 'training_env': {'DS_ACCELERATOR': 'cpu'}, 'group_names': ['cluster', 'head'],
             '__training_status': {'x': 1}, 'training_local_jobs_dir': '/home/me/lab/jobs', 'ansible_facts': {},
             'nvidia_driver_state': 'no-gpu', 'cluster_tests_bandwidth': {'gbps': 9.4}, 'node_tools_os_name': 'Debian'},
    'w1': {'inventory_hostname': 'w1', 'ansible_host': '10.0.0.11', 'ansible_user': 'admin',
           'ansible_python_interpreter': '/usr/bin/python3', 'cluster_cidr': '10.0.0.0/24', 'cluster_user': 'train',
           'training_env': {'DS_ACCELERATOR': 'cpu'}, 'group_names': ['cluster', 'workers']},
    'other': {'inventory_hostname': 'other', 'ansible_host': '192.0.2.1'},
}
GROUPS = {'all': ['head', 'w1', 'other'], 'ungrouped': ['other'], 'cluster': ['head', 'w1'], 'head': ['head'],
          'workers': ['w1'], 'unrelated': ['other']}


def render():
    return supervisor_inventory(HOSTVARS, GROUPS, ['head', 'w1'], '/etc/gpucluster/supervisor/id_ed25519',
                                '/etc/gpucluster/supervisor/known_hosts')


def test_every_node_is_reached_by_its_cluster_address_as_root_with_the_supervisors_key_and_pinned_host_keys():
    inv = render()
    common = inv['all']['vars']
    assert common['ansible_user'] == 'root' and 'ansible_become' not in common  # the roles' own become_user must win
    assert common['ansible_ssh_private_key_file'] == '/etc/gpucluster/supervisor/id_ed25519'
    assert 'StrictHostKeyChecking=yes' in common['ansible_ssh_common_args']
    assert 'UserKnownHostsFile=/etc/gpucluster/supervisor/known_hosts' in common['ansible_ssh_common_args']
    # the head is reached on its cluster address, not the address the controller used
    assert inv['all']['children']['head']['hosts']['head']['ansible_host'] == '10.0.0.10'
    assert inv['all']['children']['workers']['hosts']['w1']['ansible_host'] == '10.0.0.11'


def test_the_cluster_settings_are_kept_and_the_controllers_connection_facts_and_results_are_not():
    inv = render()
    text = yaml.safe_dump(inv)
    assert inv['all']['vars']['cluster_cidr'] == '10.0.0.0/24'
    assert inv['all']['vars']['training_env'] == {'DS_ACCELERATOR': 'cpu'}
    assert inv['all']['vars']['ansible_python_interpreter'] == '/usr/bin/python3'
    assert inv['all']['children']['head']['hosts']['head']['node_slots'] == 2
    # what a site.yml run computed is no setting: the file is the same from a run of its supervisor step alone
    for gone in ('admin', '/home/me/.ssh/id', '__training_status', 'training_local_jobs_dir', 'group_names',
                 'ansible_facts', '203.0.113.10', 'nvidia_driver_state', 'cluster_tests_bandwidth', 'node_tools_os_name'):
        assert gone not in text


def test_hosts_outside_the_cluster_and_their_groups_are_left_out():
    inv = render()
    assert set(inv['all']['children']) == {'cluster', 'head', 'workers'}
    assert 'other' not in yaml.safe_dump(inv)


def test_a_host_that_is_not_in_the_inventory_is_refused_by_name():
    with pytest.raises(AnsibleFilterError, match='host ghost'):
        supervisor_inventory(HOSTVARS, GROUPS, ['head', 'ghost'], 'k', 'kh')


def test_the_supervisor_installs_the_collections_pinned_ansible_core_and_the_training_role_finds_it_there():
    pin = re.search(r'^ansible-core==(\S+)$', (ROOT / 'requirements/controller.txt').read_text(), re.M).group(1)
    sup = yaml.safe_load((ROOT / 'roles/supervisor/defaults/main.yml').read_text())
    training = yaml.safe_load((ROOT / 'roles/training/defaults/main.yml').read_text())
    assert sup['supervisor_ansible_core_version'] == pin
    assert training['training_supervise_dir'] == sup['supervisor_dir']
    assert training['training_supervise_config_dir'] == sup['supervisor_config_dir']
    lab = yaml.safe_load((ROOT / 'lab/roles/lab/defaults/main.yml').read_text())
    assert 'ansible-core==%s' % pin in lab['lab_wheelhouse_packages']
