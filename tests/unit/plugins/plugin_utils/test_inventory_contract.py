import os

import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import inventory_contract as contract

INVENTORIES = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'integration', 'inventories')


def load(name):
    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[os.path.join(INVENTORIES, name)])
    vm = VariableManager(loader=loader, inventory=inv)
    groups = {g: [h.name for h in inv.groups[g].get_hosts()] for g in inv.groups}
    hostvars = {h.name: vm.get_vars(host=h, include_hostvars=False) for h in inv.get_hosts()}
    return groups, hostvars


def test_home_lan_inventory_is_sound_and_ranked_head_first():
    groups, hostvars = load('good.yml')
    assert contract.contract_errors(groups, hostvars) == []
    manifest = contract.cluster_manifest(groups, hostvars)
    assert manifest['head'] == 'gpu-master'
    assert manifest['master_addr'] == '192.168.1.100'
    assert manifest['master_port'] == 29500
    assert [(n['name'], n['rank']) for n in manifest['nodes']] == [
        ('gpu-master', 0), ('gpu-worker-1', 1), ('gpu-worker-2', 2)]
    assert manifest['spares'] == []


def test_the_manifest_lists_the_spares_apart_with_no_rank():
    groups = {'cluster': ['h', 'w1', 's1'], 'head': ['h'], 'workers': ['w1'], 'spares': ['s1']}
    hostvars = {'h': {'ansible_host': '10.0.0.1'}, 'w1': {'ansible_host': '10.0.0.2'}, 's1': {'ansible_host': '10.0.0.9'}}
    manifest = contract.cluster_manifest(groups, hostvars)
    assert [n['name'] for n in manifest['nodes']] == ['h', 'w1']
    assert manifest['spares'] == [{'name': 's1', 'address': '10.0.0.9', 'role': 'spare'}]


def test_every_problem_is_reported_once_with_host_and_variable():
    groups = {'all': ['a', 'b', 'c'], 'ungrouped': [], 'cluster': ['a', 'b', 'c'],
              'head': ['a'], 'workers': ['b']}
    hostvars = {
        'a': {'cluster_cidr': '10.0.0.0/24', 'ansible_host': '10.0.0.1', 'cluster_master_port': 70000},
        'b': {'cluster_cidr': '10.0.0.0/24', 'ansible_host': 'node-b.example', 'cluster_user': 'Bad User'},
        'c': {'cluster_cidr': '10.0.0.0/24', 'ansible_host': '10.0.0.1', 'gpu_slots': True},
    }
    errors = contract.contract_errors(groups, hostvars)
    assert "host c: is in 'cluster' but in neither 'head' nor 'workers' (nor 'spares')" in errors
    assert 'host a: cluster_master_port must be from 1 to 65535, got 70000' in errors
    assert any(e.startswith("host b: ansible_host 'node-b.example' is not an IP address") for e in errors)
    assert any(e.startswith('host b: cluster_user must be a POSIX user name') for e in errors)
    assert 'host c: cluster_address 10.0.0.1 is already used by host a' in errors
    assert any(e.startswith('host c: gpu_slots must be an integer') for e in errors)
    assert len(errors) == 6


def test_natural_order_puts_worker_2_before_worker_10():
    groups = {'head': ['m'], 'workers': ['w-10', 'w-2', 'w-1']}
    assert contract.ordered_nodes(groups) == ['m', 'w-1', 'w-2', 'w-10']


@pytest.mark.parametrize('value', ['8', 8])
def test_numeric_strings_from_ini_inventories_are_accepted(value):
    groups = {'cluster': ['a'], 'head': ['a'], 'workers': []}
    hostvars = {'a': {'cluster_cidr': '10.0.0.0/24', 'ansible_host': '10.0.0.1', 'gpu_slots': value}}
    assert contract.contract_errors(groups, hostvars) == []


def test_shipped_home_lan_example_is_sound():
    loader = DataLoader()
    path = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'inventories', 'example-home-lan')
    inv = InventoryManager(loader=loader, sources=[path])
    vm = VariableManager(loader=loader, inventory=inv)
    groups = {g: [h.name for h in inv.groups[g].get_hosts()] for g in inv.groups}
    hostvars = {h.name: vm.get_vars(host=h, include_hostvars=False) for h in inv.get_hosts()}
    assert contract.contract_errors(groups, hostvars) == []
    assert contract.cluster_manifest(groups, hostvars)['master_addr'] == '192.168.1.100'


def _one(host_vars, name='a'):
    groups = {'cluster': [name], 'head': [name], 'workers': []}
    base = {'cluster_cidr': '10.0.0.0/24', 'ansible_host': '10.0.0.1'}
    return contract.contract_errors(groups, {name: dict(base, **host_vars)})


@pytest.mark.parametrize('cidr', ['0.0.0.0/0', '::/0'])
def test_the_whole_internet_is_never_a_cluster_network(cidr):
    errors = _one({'cluster_cidr': cidr, 'cluster_cidr_allow_wide': True})
    assert any(e.startswith('host a: cluster_cidr %s is every address there is' % cidr) for e in errors), errors


def test_a_wide_network_needs_the_switch():
    errors = _one({'cluster_cidr': '10.0.0.0/8'})
    assert errors == ["host a: cluster_cidr 10.0.0.0/8 holds 16777216 addresses, wider than /16; the firewall trusts "
                      "all of it. Narrow it to the nodes' network, or set cluster_cidr_allow_wide: true if it really "
                      "is that wide"]
    assert _one({'cluster_cidr': '10.0.0.0/8', 'cluster_cidr_allow_wide': 'true'}) == []
    assert _one({'cluster_cidr': '10.0.0.0/16'}) == []


def test_multicast_is_not_a_cluster_network():
    assert _one({'cluster_cidr': '224.0.0.0/24', 'ansible_host': '224.0.0.1'})[0].startswith(
        'host a: cluster_cidr 224.0.0.0/24 is a multicast')


def test_cluster_cidr_is_one_value_for_the_cluster():
    groups = {'cluster': ['h', 'w1', 'w2'], 'head': ['h'], 'workers': ['w1', 'w2']}
    hostvars = {'h': {'cluster_cidr': '10.0.0.0/24', 'ansible_host': '10.0.0.1'},
                'w1': {'cluster_cidr': '10.0.0.0/16', 'ansible_host': '10.0.0.2'},
                'w2': {'cluster_cidr': '10.0.0.0/24', 'ansible_host': '10.0.0.3'}}
    assert contract.contract_errors(groups, hostvars) == [
        "host w1: cluster_cidr 10.0.0.0/16 differs from 10.0.0.0/24 (the head's); the cluster has one network, "
        "set cluster_cidr once for all nodes"]


@pytest.mark.parametrize('name', ['bad_head', 'my node', '-head', 'x' * 64])
def test_inventory_names_must_be_host_names(name):
    errors = _one({}, name)
    assert errors and errors[0].startswith('host %s: the inventory name %r is not a valid host name (RFC 1123' % (name, name))


@pytest.mark.parametrize('var, value, expected', [
    ('gpu_slots', 'two', "host a: gpu_slots must be an integer from 0 to 1024, got 'two' (str)"),
    ('node_slots', 'two', "host a: node_slots must be an integer from 1 to 1024, got 'two' (str)"),
    ('node_slots', 0, 'host a: node_slots must be from 1 to 1024, got 0'),
    ('gpu_slots', -1, 'host a: gpu_slots must be from 0 to 1024, got -1'),
    ('node_slots', 2.5, 'host a: node_slots must be an integer from 1 to 1024, got 2.5 (float)'),
])
def test_slots_are_integers_in_range(var, value, expected):
    assert _one({var: value}) == [expected]


def test_node_slots_from_an_ini_inventory_is_accepted():
    assert _one({'node_slots': '2', 'gpu_slots': '0'}) == []


def _two_nodes(a_vars, b_vars):
    groups = {'all': ['a', 'b'], 'ungrouped': [], 'cluster': ['a', 'b'], 'head': ['a'], 'workers': ['b']}
    base = {'cluster_cidr': '10.0.0.0/24'}
    return groups, {'a': dict(base, ansible_host='10.0.0.1', **a_vars), 'b': dict(base, ansible_host='10.0.0.2', **b_vars)}


@pytest.mark.parametrize('value', ['/data', '/mnt/filer/shared'])
def test_a_shared_dir_elsewhere_is_taken(value):
    assert contract.contract_errors(*_two_nodes({'cluster_shared_dir': value}, {'cluster_shared_dir': value})) == []


@pytest.mark.parametrize('value', ['data', '/', '/data/', '/data/../x', '/my data', '/a:b', 42])
def test_a_shared_dir_that_is_no_clean_absolute_path_is_refused_naming_host_and_variable(value):
    errors = contract.contract_errors(*_two_nodes({}, {'cluster_shared_dir': value}))
    assert len(errors) == 1
    assert errors[0].startswith('host b: cluster_shared_dir must be an absolute path like /shared')
    assert repr(value) in errors[0]


def test_nodes_that_see_the_shared_storage_at_different_paths_are_refused():
    errors = contract.contract_errors(*_two_nodes({'cluster_shared_dir': '/data'}, {'cluster_shared_dir': '/shared'}))
    assert errors == ['hosts a, b: cluster_shared_dir differs between nodes (/data, /shared); every node must see the '
                      'shared storage at the same path (the launchers, hostfiles and checkpoints name it), set it '
                      'once for all']


def test_the_cluster_wide_environment_values_are_taken():
    every = {'cluster_env_path': '/data/envs/train', 'cluster_nccl_profile': '/etc/profile.d/site-nccl.sh',
             'cluster_torch_version': '2.12.1', 'cluster_deepspeed_version': '0.18.0', 'cluster_user_uid': '3000',
             'python_env_path': '/data/envs/train', 'ssh_trust_uid': 3000}
    assert contract.contract_errors(*_two_nodes(every, every)) == []


@pytest.mark.parametrize('name,value,example', [
    ('cluster_env_path', 'envs/train', '/opt/gpucluster/env'),
    ('cluster_env_path', '/opt/env/', '/opt/gpucluster/env'),
    ('cluster_nccl_profile', 7, '/etc/profile.d/gpucluster-nccl.sh'),
])
def test_a_cluster_wide_path_that_is_no_clean_absolute_path_is_refused(name, value, example):
    errors = contract.contract_errors(*_two_nodes({}, {name: value}))
    assert len(errors) == 1 and errors[0].startswith('host b: %s must be an absolute path like %s' % (name, example))
    assert repr(value) in errors[0]


def test_a_pin_that_is_no_version_string_is_refused_with_the_yaml_hint():
    errors = contract.contract_errors(*_two_nodes({'cluster_torch_version': 2.13}, {'cluster_torch_version': 2.13}))
    assert errors == ["host a: cluster_torch_version must be a version like 2.13.0 (a string: quote it in YAML), "
                      "got 2.13 (float)",
                      "host b: cluster_torch_version must be a version like 2.13.0 (a string: quote it in YAML), "
                      "got 2.13 (float)"]


@pytest.mark.parametrize('name,a,b', [
    ('cluster_torch_version', '2.13.0', '2.12.1'),
    ('cluster_deepspeed_version', None, '0.18.0'),
    ('cluster_user_uid', 2000, '3000'),
])
def test_a_value_that_must_be_the_same_everywhere_and_differs_names_the_nodes_and_values(name, a, b):
    errors = contract.contract_errors(*_two_nodes({name: a} if a is not None else {}, {name: b}))
    assert len(errors) == 1
    assert errors[0].startswith('hosts a, b: %s differs between nodes (' % name)
    assert 'it must be the same on every node' in errors[0]


def test_a_uid_out_of_range_is_refused():
    assert contract.contract_errors(*_two_nodes({'cluster_user_uid': 0}, {'cluster_user_uid': 0}))[0] == \
        'host a: cluster_user_uid must be from 1 to 65533, got 0'


@pytest.mark.parametrize('role_var,value,cluster_var,default', [
    ('python_env_path', '/data/env', 'cluster_env_path', '/opt/gpucluster/env'),
    ('python_env_torch_version', '2.12.1', 'cluster_torch_version', '2.13.0'),
    ('nccl_env_profile_path', '/etc/profile.d/x.sh', 'cluster_nccl_profile', '/etc/profile.d/gpucluster-nccl.sh'),
    ('ssh_trust_uid', 3000, 'cluster_user_uid', '2000'),
    ('python_env_find_links', ['/opt/wheelhouse'], 'cluster_pip_find_links', '[]'),
    ('python_env_offline', True, 'cluster_pip_offline', 'false'),
    ('container_runtime', 'podman', 'cluster_container_runtime', 'none'),
    ('container_mounts', ['/data'], 'cluster_container_mounts', '[/shared]'),
    ('ray_enabled', 'yes', 'cluster_ray_enabled', 'false'),
    ('ray_port', 7000, 'cluster_ray_port', '6379'),
    ('ssh_trust_all_to_all', True, 'cluster_ssh_all_to_all', 'false'),
])
def test_a_role_variable_set_alone_where_a_cluster_wide_one_took_its_place_is_refused(role_var, value, cluster_var, default):
    """Set alone, the other roles would not follow it (training would look for the environment at the default)."""
    errors = contract.contract_errors(*_two_nodes({role_var: value}, {}))
    shown = '[%s]' % ', '.join(value) if isinstance(value, list) else {True: 'true', 'yes': 'true'}.get(value, value)
    assert len(errors) == 1
    assert errors[0].startswith('host a: %s is %s but %s is %s; ' % (role_var, shown, cluster_var, default))
    assert errors[0].endswith('set %s: %s instead' % (cluster_var, shown))


def test_the_same_value_under_the_old_name_is_accepted_whatever_its_spelling():
    """A role variable equal to the cluster-wide value (true and "yes", 6379 and "6379") is no conflict."""
    assert contract.contract_errors(*_two_nodes({'ray_enabled': 'yes', 'cluster_ray_enabled': True, 'ray_port': '6379',
                                                 'python_env_find_links': ['/w'], 'cluster_pip_find_links': ['/w']},
                                                {'cluster_ray_enabled': True, 'cluster_pip_find_links': ['/w']})) == []


@pytest.mark.parametrize('name,value,problem', [
    ('cluster_pip_offline', 'maybe', "cluster_pip_offline must be true or false, got 'maybe' (str)"),
    ('cluster_pip_find_links', '/opt/wheelhouse',
     "cluster_pip_find_links must be a list of non-empty strings, got '/opt/wheelhouse' (str)"),
    ('cluster_ray_port', 70000, 'cluster_ray_port must be a port from 1 to 65535, got 70000 (int)'),
    ('cluster_launcher', 'srun', "cluster_launcher must be one of deepspeed, torchrun, mpirun, slurm, got 'srun' (str)"),
    ('cluster_container_runtime', 'docker',
     "cluster_container_runtime must be one of none, podman, apptainer, singularity, enroot, got 'docker' (str)"),
    ('cluster_ninja_version', 1.13, 'cluster_ninja_version must be a version like 1.13.2'),
])
def test_a_cluster_wide_setting_of_the_wrong_kind_is_refused_naming_host_and_variable(name, value, problem):
    errors = contract.contract_errors(*_two_nodes({name: value}, {name: value}))
    assert len(errors) == 2 and errors[0].startswith('host a: ' + problem), errors


def test_a_cluster_wide_setting_that_differs_between_nodes_is_refused_naming_both():
    errors = contract.contract_errors(*_two_nodes({'cluster_launcher': 'torchrun'}, {}))
    assert errors == ['hosts a, b: cluster_launcher differs between nodes (deepspeed, torchrun); it must be the same on '
                      'every node, set it once for all']


def test_an_env_path_that_differs_between_nodes_is_refused():
    errors = contract.contract_errors(*_two_nodes({'cluster_env_path': '/srv/env'}, {}))
    assert errors == ['hosts a, b: cluster_env_path differs between nodes (/opt/gpucluster/env, /srv/env); it must be the '
                      'same on every node, set it once for all']


def test_container_mounts_set_on_one_node_only_are_refused_and_follow_the_shared_dir_otherwise():
    assert contract.contract_errors(*_two_nodes({'cluster_container_mounts': ['/data']}, {})) == [
        'hosts a, b: cluster_container_mounts differs between nodes ([/data], [/shared]); it must be the same on every '
        'node, set it once for all']
    assert contract.contract_errors(*_two_nodes({'cluster_shared_dir': '/data'}, {'cluster_shared_dir': '/data'})) == []


def test_a_training_account_set_for_one_role_alone_is_refused():
    errors = contract.contract_errors(*_two_nodes({'container_user': 'alice'}, {}))
    assert errors == ["host a: container_user is alice but cluster_user is train; cluster_user is what training and "
                      "health read, not container_user: set cluster_user: alice instead"]


def test_a_spare_is_a_cluster_node_outside_head_and_workers():
    hostvars = {h: {'cluster_cidr': '10.0.0.0/24', 'ansible_host': '10.0.0.%d' % i} for i, h in enumerate('abs', 1)}
    groups = {'cluster': ['a', 'b', 's'], 'head': ['a'], 'workers': ['b'], 'spares': ['s']}
    assert contract.contract_errors(groups, hostvars) == []
    assert contract.ordered_nodes(groups) == ['a', 'b']  # a spare runs no job until a restart takes it
    both = dict(groups, workers=['b', 's'])
    assert "host s: is in 'spares' and in 'workers'; a spare runs no job until it replaces a node" in \
        contract.contract_errors(both, hostvars)
    outside = dict(groups, cluster=['a', 'b'])
    assert any(e.startswith("host s: is in group 'spares' but not in group 'cluster'")
               for e in contract.contract_errors(outside, hostvars))


def test_the_nodes_to_check_are_the_job_nodes_then_the_spares():
    groups = {'cluster': ['a', 'b', 's2', 's10'], 'head': ['a'], 'workers': ['b'], 'spares': ['s10', 's2']}
    assert contract.cluster_nodes(groups) == ['a', 'b', 's2', 's10']


def test_a_static_address_outside_cluster_cidr_is_refused_by_the_contract_before_any_node_is_read():
    static = {'interface': 'eth0', 'address': '10.9.0.7/24', 'gateway': '10.9.0.1'}
    assert _one({'network_static': static}) == ['host a: network_static.address 10.9.0.7/24 is outside cluster_cidr '
                                                '10.0.0.0/24']
    # what only the node can say (its interfaces) is the network step's; the rest of a sound one passes here
    assert _one({'network_static': dict(static, interface='nosuch0', address='10.0.0.1/24', gateway='10.0.0.254')}) == []
    assert _one({'network_static': {'interface': 'eth0', 'address': '10.0.0.1/24', 'gateway': '10.0.1.1'}}) == [
        "host a: network_static.gateway 10.0.1.1 is outside the node's subnet 10.0.0.0/24 (from network_static.address "
        "10.0.0.1/24)"]
