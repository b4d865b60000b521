import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.filter.hostfile import hostfile_hosts
from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf


def hostfile(names, hostvars, format='deepspeed', default_slots=1, include=None, exclude=None, use_address=False):
    """The hostfile text of the host list the filter returns (what the launchers write)."""
    return hf.render(hostfile_hosts(names, hostvars, default_slots, include, exclude), format, use_address)


def hostvars():
    return {
        'gpu-worker-10': {'group_names': ['cluster', 'workers'], 'ansible_host': '10.0.0.10',
                          'ansible_facts': {'gpu': {'gpu_count': 8}}},
        'gpu-worker-2': {'group_names': ['cluster', 'workers'], 'ansible_host': '10.0.0.2',
                         'cluster_address': '10.1.0.2', 'ansible_facts': {'gpu': {'gpu_count': 8}}},
        'gpu-master': {'group_names': ['cluster', 'head'], 'ansible_host': '10.0.0.1', 'gpu_slots': '4',
                       'ansible_facts': {'gpu': {'gpu_count': 8}}},
        'cpu-node': {'group_names': ['cluster', 'workers'], 'ansible_host': '10.0.0.9',
                     'ansible_facts': {'gpu': {'gpu_count': 0}}},
        'no-facts': {'group_names': ['cluster', 'workers'], 'ansible_host': '10.0.0.8'},
    }


CLUSTER = ['gpu-worker-10', 'gpu-worker-2', 'gpu-master', 'cpu-node', 'no-facts']


def test_deepspeed_hostfile_from_inventory_and_gpu_facts():
    assert hostfile(CLUSTER, hostvars(), format='deepspeed') == (
        'gpu-master slots=4\ncpu-node slots=1\ngpu-worker-2 slots=8\ngpu-worker-10 slots=8\nno-facts slots=1\n')


def test_addresses_come_from_cluster_address_then_ansible_host():
    assert hostfile(CLUSTER, hostvars(), format='plain', use_address=True, exclude=['cpu-node', 'no-facts']) == (
        '10.0.0.1\n10.1.0.2\n10.0.0.10\n')


def test_host_list_for_the_module():
    hosts = hostfile_hosts(CLUSTER, hostvars(), include=['gpu-master', 'gpu-worker-2'])
    assert hosts == [{'name': 'gpu-master', 'address': '10.0.0.1', 'slots': 4},
                     {'name': 'gpu-worker-2', 'address': '10.1.0.2', 'slots': 8}]


@pytest.mark.parametrize('host,var,value,message', [
    ('gpu-worker-2', 'gpu_slots', -1, 'host gpu-worker-2: gpu_slots must be from 1 to 1024, got -1'),
    ('gpu-worker-2', 'gpu_slots', 'all', "host gpu-worker-2: gpu_slots must be a whole number of 1 or more, got 'all' (str)"),
    ('cpu-node', 'ansible_facts', {'gpu': {'gpu_count': 'x'}},
     "host cpu-node: ansible_facts.gpu.gpu_count must be a whole number of 0 or more, got 'x' (str)"),
])
def test_bad_host_variables_fail_naming_host_and_variable(host, var, value, message):
    hv = hostvars()
    hv[host][var] = value
    with pytest.raises(AnsibleFilterError) as err:
        hostfile(CLUSTER, hv)
    assert str(err.value) == message


def test_unknown_exclude_is_named():
    with pytest.raises(AnsibleFilterError, match='exclude names gpu-worker-3, which is not in the host list'):
        hostfile(CLUSTER, hostvars(), exclude=['gpu-worker-3'])


def gpu_facts_hostvars():
    """The layout of gpucluster.multinode.gpu_facts: ansible_facts.gpu_facts.gpu_count."""
    return {
        'gpu-master': {'group_names': ['cluster', 'head'], 'ansible_host': '192.168.1.100',
                       'ansible_facts': {'gpu_facts': {'gpu_count': 1}}},
        'gpu-worker-1': {'group_names': ['cluster', 'workers'], 'ansible_host': '192.168.1.101',
                         'ansible_facts': {'gpu_facts': {'gpu_count': 8}}},
        'gpu-worker-2': {'group_names': ['cluster', 'workers'], 'ansible_host': '192.168.1.102',
                         'gpu_slots': 2, 'ansible_facts': {'gpu_facts': {'gpu_count': 4}}},
    }


def test_slots_from_gpu_facts_heterogeneous_and_overridden():
    names = ['gpu-worker-2', 'gpu-worker-1', 'gpu-master']
    assert hostfile(names, gpu_facts_hostvars(), format='openmpi') == (
        'gpu-master slots=1\ngpu-worker-1 slots=8\ngpu-worker-2 slots=2\n')
    assert hostfile(names, gpu_facts_hostvars(), format='mpich') == 'gpu-master:1\ngpu-worker-1:8\ngpu-worker-2:2\n'


def test_a_bad_gpu_facts_count_names_the_fact():
    hv = gpu_facts_hostvars()
    hv['gpu-worker-1']['ansible_facts']['gpu_facts']['gpu_count'] = 'many'
    with pytest.raises(AnsibleFilterError) as err:
        hostfile(['gpu-master', 'gpu-worker-1'], hv)
    assert str(err.value) == ("host gpu-worker-1: ansible_facts.gpu_facts.gpu_count must be a whole number "
                              "of 0 or more, got 'many' (str)")
