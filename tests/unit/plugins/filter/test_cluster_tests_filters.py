"""Plans checked before anything starts, and the RDMA pairing, as the role's tasks use them."""

from ansible_collections.gpucluster.multinode.plugins.filter.cluster_tests import (
    bandwidth_plan,
    collective_plan,
    pairs_with_device,
)

HOSTVARS = {
    'head': {'ansible_host': '10.0.0.1'},
    'w1': {'ansible_host': '192.168.9.2', 'cluster_address': '10.0.0.2'},
    'w2': {'ansible_host': '10.0.0.3'},
    'w3': {'ansible_host': '10.0.0.4'},
}


def test_plan_carries_cluster_addresses_and_disjoint_rounds():
    plan = bandwidth_plan(['head', 'w1', 'w2', 'w3'], HOSTVARS)
    assert plan['problems'] == [] and plan['pairs'] == 6 and len(plan['rounds']) == 3
    first = plan['rounds'][0][0]
    assert (first['client'], first['client_address']) == ('head', '10.0.0.1')
    assert {p['server_address'] for r in plan['rounds'] for p in r if p['server'] == 'w1'} <= {'10.0.0.2'}


def test_plan_gathers_every_problem_with_the_variable_named():
    plan = bandwidth_plan(['head', 'w1'], HOSTVARS, pairs=[['head', 'w7']], threshold_gbps='fast',
                          relative_threshold=1.5)
    assert plan['problems'] == [
        "cluster_tests_bandwidth_threshold_gbps must be a positive number, got 'fast' (str)",
        'cluster_tests_bandwidth_relative_threshold must be a fraction of the fleet median below 1 (e.g. 0.7), got 1.5',
        'cluster_tests_bandwidth_pairs[0] names w7, which is not a node of the inventory (head, w1)',
    ]
    assert plan['rounds'] == []


def test_collective_plan_reports_the_size_problem():
    assert collective_plan(['64K', '1M'], {'1M': 0.5}) == {'problems': [], 'sizes': [65536, 1048576],
                                                           'thresholds': {'1048576': 0.5}}
    assert collective_plan([])['problems'] == [
        'cluster_tests_collective_sizes is empty; give at least one message size, e.g. [1M, 64M]']


def test_rdma_pairs_need_a_device_of_that_index_on_both_ends():
    hv = {'a': {'__cluster_tests_bw_check': {'rdma_devices': ['mlx5_0', 'mlx5_1']}},
          'b': {'__cluster_tests_bw_check': {'rdma_devices': ['mlx5_0']}},
          'c': {'__cluster_tests_bw_check': {'rdma_devices': []}},
          'd': {'__cluster_tests_bw_check': {'rdma_devices': ['mlx5_0', 'mlx5_1']}}}
    pairs = [{'client': 'a', 'server': 'b'}, {'client': 'c', 'server': 'd'}]
    assert pairs_with_device(pairs, hv, 0) == [{'client': 'a', 'server': 'b'}]
    assert pairs_with_device(pairs, hv, 1) == []
