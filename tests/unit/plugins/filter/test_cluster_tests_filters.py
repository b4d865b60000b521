"""Plans checked before anything starts, and the RDMA pairing, as the role's tasks use them."""

import pytest

from ansible.errors import AnsibleFilterError
from ansible_collections.gpucluster.multinode.plugins.filter.cluster_tests import (
    bandwidth_plan,
    collective_plan,
    collective_summary,
    dist_check_report,
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
    devices = {'a': ['mlx5_0', 'mlx5_1'], 'b': ['mlx5_0'], 'c': [], 'd': ['mlx5_0', 'mlx5_1']}
    pairs = [{'client': 'a', 'server': 'b'}, {'client': 'c', 'server': 'd'}]
    assert pairs_with_device(pairs, devices, 0) == [{'client': 'a', 'server': 'b'}]
    assert pairs_with_device(pairs, devices, 1) == []
    assert pairs_with_device(pairs, {}, 0) == []   # a node that did not answer has none


def test_reports_take_the_registered_results_as_given():
    ok = {'ok': True, 'stage': 'done', 'joined': ['h', 'w'], 'backend': 'gloo', 'world_size': 3, 'slots': 2,
          'rendezvous': '10.0.0.1:29500', 'sum': 6.0, 'expected': 6.0}
    report = dist_check_report({'h': ok, 'w': dict(ok, slots=1, joined=None), 'x': {'skipped': True}}, ['h', 'w'])
    assert report['ok'] and report['ranks'] == {'h': 2, 'w': 1}
    skipped = dist_check_report({'h': ok, 'w': {'skipped': True, 'changed': False}}, ['h', 'w'])
    assert not skipped['ok'] and skipped['problems'][0]['node'] == 'w'
    with pytest.raises(AnsibleFilterError, match='results must be a dict'):
        collective_summary(['h'], ['h'])
