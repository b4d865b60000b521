"""The hosts of a job and their slots read from the inventory (plugin_utils/inventory.py)."""

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import inventory


# --- slots_of and mixed slots (node_slots) -------------------------------------------------------

MIXED = {
    'alpha': {'inventory_hostname': 'alpha', 'group_names': ['cluster', 'head'], 'cluster_address': '10.99.0.11',
              'node_slots': 2},
    'bravo-2': {'inventory_hostname': 'bravo-2', 'group_names': ['cluster', 'workers'], 'ansible_host': '10.99.0.12',
                'gpu_slots': 1, 'ansible_facts': {'gpu_facts': {'gpu_count': 4}}},
    'charlie': {'inventory_hostname': 'charlie', 'group_names': ['cluster', 'workers'], 'ansible_host': '10.99.0.13',
                'ansible_facts': {'gpu_facts': {'gpu_count': 1}}},
    'delta': {'inventory_hostname': 'delta', 'group_names': ['cluster', 'workers'], 'ansible_host': '10.99.0.14',
              'ansible_facts': {'gpu_facts': {'gpu_count': 0}}},
}


def test_slots_of_prefers_node_slots_then_gpu_slots_then_detected_gpus_then_one():
    assert inventory.slots_of(MIXED['alpha']) == 2
    assert inventory.slots_of(MIXED['bravo-2']) == 1            # gpu_slots wins over the 4 detected
    assert inventory.slots_of(MIXED['charlie']) == 1
    assert inventory.slots_of(MIXED['delta']) == 1              # no GPU: one rank
    assert inventory.slots_of({'gpu_slots': 2, 'node_slots': '3'}) == 3
    assert inventory.slots_of({}, detected_gpus=8) == 8


@pytest.mark.parametrize('hv,var', [({'node_slots': 'two'}, 'node_slots'), ({'node_slots': 0}, 'node_slots'),
                                    ({'gpu_slots': -1}, 'gpu_slots')])
def test_slots_of_names_the_host_and_the_variable(hv, var):
    with pytest.raises(hf.HostfileError, match='host bravo-2: %s must' % var):
        inventory.slots_of(dict(hv, inventory_hostname='bravo-2'))


def test_one_renderer_gives_every_node_its_own_slots_on_a_2_1_1_1_cluster():
    hosts = inventory.hosts_from_inventory(['delta', 'charlie', 'bravo-2', 'alpha'], MIXED)
    assert hf.render(hosts, 'deepspeed') == 'alpha slots=2\nbravo-2 slots=1\ncharlie slots=1\ndelta slots=1\n'
    assert hf.render(hosts, 'openmpi', use_address=True).splitlines()[0] == '10.99.0.11 slots=2'
    assert hf.world_size(hosts) == 5
    assert hf.rank_layout(hosts) == {'alpha': [0, 1], 'bravo-2': [2, 2], 'charlie': [3, 3], 'delta': [4, 4]}
    assert hf.node_of_rank(hosts, 1) == 'alpha' and hf.node_of_rank(hosts, 4) == 'delta'
    assert hf.node_of_rank(hosts, 5) is None
    assert hf.describe_layout(hosts) == '5 rank(s): alpha 2 (0-1), bravo-2 1 (2), charlie 1 (3), delta 1 (4)'
