"""Inputs of the cluster tests: message sizes, thresholds, pairs of nodes."""

from itertools import combinations

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_test_inputs as ct


# --- sizes and thresholds ---

def test_sizes_take_bytes_and_binary_suffixes():
    assert ct.check_sizes([1024, '64K', '1M', '1GiB']) == [1024, 65536, 1 << 20, 1 << 30]


@pytest.mark.parametrize('sizes,message', [
    ([], 'sizes is empty; give at least one message size, e.g. [1M, 64M]'),
    (['1M', '64K'], 'sizes must be increasing: sizes[1] = 65536 bytes does not exceed sizes[0] = 1048576 bytes'),
    (['1M', '1M'], 'sizes must be increasing: sizes[1] = 1048576 bytes does not exceed sizes[0] = 1048576 bytes'),
    (['1M', 'big'], "sizes[1] must be a size in bytes (like 1048576 or 1M), got 'big' (str)"),
    ([0], 'sizes[0] must be above 0 bytes, got 0'),
    ('1M', "sizes must be a list of message sizes, got '1M' (str)"),
])
def test_bad_size_lists_are_refused(sizes, message):
    with pytest.raises(ct.ClusterTestError) as err:
        ct.check_sizes(sizes)
    assert str(err.value) == message


def test_sizes_must_hold_whole_float32_elements():
    with pytest.raises(ct.ClusterTestError, match=r'sizes\[0\] 6 is not a multiple of 4 bytes'):
        ct.check_sizes([6], multiple_of=4)


@pytest.mark.parametrize('value,message', [
    ('fast', "threshold must be a positive number, got 'fast' (str)"),
    (0, 'threshold must be a positive number, got 0'),
    (-3.5, 'threshold must be a positive number, got -3.5'),
    (True, 'threshold must be a positive number, got True (bool)'),
    ([1], 'threshold must be a positive number, got [1] (list)'),
])
def test_thresholds_must_be_positive_numbers(value, message):
    with pytest.raises(ct.ClusterTestError) as err:
        ct.check_positive(value, 'threshold')
    assert str(err.value) == message


def test_threshold_strings_from_extra_vars_are_numbers():
    assert ct.check_positive('9.5', 'threshold') == 9.5
    assert ct.check_positive('', 'threshold') is None


def test_per_size_thresholds_must_name_a_tested_size():
    assert ct.check_thresholds({'64M': 2}, [1 << 20, 64 << 20]) == {64 << 20: 2.0}
    with pytest.raises(ct.ClusterTestError, match=r"size '32M' \(33554432 bytes\) is not one of the sizes tested"):
        ct.check_thresholds({'32M': 2}, [1 << 20, 64 << 20])


# --- pairs ---

@pytest.mark.parametrize('count', [2, 3, 4, 5, 8])
def test_round_robin_plan_covers_every_pair_once_in_disjoint_rounds(count):
    nodes = ['n%d' % i for i in range(count)]
    plan = ct.plan_pairs(nodes)
    seen = [frozenset(p) for rnd in plan['rounds'] for p in rnd]
    assert sorted(map(sorted, seen)) == sorted(map(sorted, map(frozenset, combinations(nodes, 2))))
    assert len(seen) == len(set(seen)) == plan['pairs']
    for rnd in plan['rounds']:
        ends = [n for p in rnd for n in p]
        assert len(ends) == len(set(ends))  # a node is in one pair per round
    assert len(plan['rounds']) == (count - 1 if count % 2 == 0 else count)


def test_sequential_schedule_is_one_pair_per_round():
    plan = ct.plan_pairs(['a', 'b', 'c', 'd'], schedule='sequential')
    assert len(plan['rounds']) == 6 and all(len(r) == 1 for r in plan['rounds'])


def test_given_pairs_are_scheduled_disjointly():
    plan = ct.plan_pairs(['a', 'b', 'c', 'd'], pairs=[['a', 'b'], ['c', 'd'], ['a', 'c']])
    assert plan['pairs'] == 3
    assert sorted(len(r) for r in plan['rounds']) == [1, 2]


@pytest.mark.parametrize('pairs,message', [
    ([['a', 'z']], 'pairs[0] names z, which is not a node of the inventory (a, b, c)'),
    ([['a', 'a']], 'pairs[0] pairs a with itself'),
    ([['a', 'b'], ['b', 'a']], 'pairs[1] b-a is listed twice'),
    ([['a']], "pairs[0] must be a list of two node names, got ['a']"),
])
def test_bad_pairs_are_refused(pairs, message):
    with pytest.raises(ct.ClusterTestError) as err:
        ct.plan_pairs(['a', 'b', 'c'], pairs=pairs)
    assert str(err.value) == message


def test_one_node_cannot_make_a_pair():
    with pytest.raises(ct.ClusterTestError, match='needs at least 2 nodes, got 1 \\(a\\)'):
        ct.plan_pairs(['a'])
