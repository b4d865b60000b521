"""Input checks, port owners, probes and reports of the cluster tests."""

import os
import socket
from itertools import combinations

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_tests as ct

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'cluster_tests')


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


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


# --- ports, interfaces, probes ---

def test_port_users_name_the_process_from_ss():
    out = fixture('ss-Hltnp-iperf3.txt')
    users = ct.port_users(out, 5298)
    assert [(u['process'], u['address']) for u in users] == [('iperf3', '127.0.0.12')]
    assert ct.describe_users(users).startswith('iperf3 (pid ')
    assert ct.port_users(out, 5298, address='127.0.0.13') == []  # bound to another address
    assert ct.port_users(out, 2024, address='10.0.0.1')[0]['address'] == '0.0.0.0'  # every address
    assert ct.port_users(out, 5201) == []


def test_probe_tells_a_closed_port_from_an_unknown_name():
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    closed = ct.probe_tcp('127.0.0.1', port, timeout=2)
    assert not closed['ok'] and closed['cause'].startswith('port closed')
    unknown = ct.probe_tcp('no-such-node.invalid', port, timeout=2)
    assert not unknown['ok'] and unknown['cause'] == 'name not resolvable'
    listener = socket.socket()
    listener.bind(('127.0.0.1', 0))
    listener.listen()
    try:
        assert ct.probe_tcp('127.0.0.1', listener.getsockname()[1])['ok']
    finally:
        listener.close()


# --- reports ---

def both_ways(a, b, gbps):
    return [{'client': a, 'server': b, 'gbps': gbps}, {'client': b, 'server': a, 'gbps': gbps}]


def test_a_throttled_node_has_exactly_its_links_flagged():
    nodes = ['head', 'w1', 'w2', 'w3']
    results = []
    for a, b in combinations(nodes, 2):
        results += both_ways(a, b, 0.9 if 'w2' in (a, b) else 20.0)
    report = ct.bandwidth_report(results, nodes, relative=0.5)
    flagged = sorted(tuple(sorted((f['a'], f['b']))) for f in report['slow_links'])
    assert flagged == [('head', 'w2'), ('w1', 'w2'), ('w2', 'w3')]
    assert report['culprits'] == ['w2'] and not report['ok']
    assert report['matrix'][0][2] == 0.9 and report['matrix'][0][1] == 20.0
    assert 'slow node(s): w2 (on every flagged link of its group)' in report['lines']


def test_an_absolute_threshold_and_a_failed_link():
    results = both_ways('a', 'b', 9.4) + [{'client': 'a', 'server': 'c', 'error': 'unable to connect to server'},
                                          {'client': 'c', 'server': 'a', 'gbps': 9.3}] + both_ways('b', 'c', 9.2)
    report = ct.bandwidth_report(results, ['a', 'b', 'c'], threshold_gbps=9.25)
    reasons = {(f['a'], f['b']): f['reason'] for f in report['slow_links']}
    assert reasons[('b', 'c')] == 'slow'
    assert reasons[('a', 'c')].startswith('failed: a -> c: unable to connect')
    assert report['threshold_gbps'] == 9.25


def test_no_threshold_flags_only_failed_links():
    report = ct.bandwidth_report(both_ways('a', 'b', 1.0) + both_ways('a', 'c', 50.0) + both_ways('b', 'c', 50.0),
                                 ['a', 'b', 'c'])
    assert report['ok'] and report['slow_links'] == []


def test_report_refuses_a_bad_threshold():
    with pytest.raises(ct.ClusterTestError, match="threshold_gbps must be a positive number, got 'x'"):
        ct.bandwidth_report([], ['a', 'b'], threshold_gbps='x')


def test_allreduce_rows_use_the_nccl_tests_formulas():
    rows = ct.allreduce_rows([{'size': 1 << 20, 'count': 1 << 18, 'time_us': 1000.0, 'wrong': 0}], 4)
    assert rows[0]['algbw_gbs'] == pytest.approx((1 << 20) / 1e-3 / 1e9)
    assert rows[0]['busbw_gbs'] == pytest.approx(rows[0]['algbw_gbs'] * 2 * 3 / 4)


def torch_result(**extra):
    rows = ct.allreduce_rows([{'size': 65536, 'count': 16384, 'time_us': 800.0, 'wrong': 0},
                              {'size': 1 << 20, 'count': 1 << 18, 'time_us': 5000.0, 'wrong': 0}], 3)
    result = {'reporter': True, 'method': 'torch', 'algorithm': 'torch.distributed all_reduce (gloo)',
              'backend': 'gloo', 'world_size': 3, 'nnodes': 3, 'rows': rows, 'correct': True,
              'avg_busbw_gbs': 0.1, 'max_busbw_gbs': rows[-1]['busbw_gbs'], 'below_threshold': [], 'ok': True}
    result.update(extra)
    return result


def test_collective_summary_names_the_algorithm_and_the_sizes_under_threshold():
    ok = ct.collective_summary({'h': torch_result(), 'w': {'reporter': False, 'ok': True}}, ['h', 'w'])
    assert ok['ok'] and ok['lines'][0] == 'collective: torch.distributed all_reduce (gloo), 3 rank(s) on 3 node(s), method torch'
    assert ok['lines'][-1].startswith('busbw at the largest size (1M): ')
    slow = ct.collective_summary({'h': torch_result(below_threshold=[{'size': 1 << 20, 'busbw_gbs': 0.28,
                                                                       'threshold_gbs': 1.0}])}, ['h'])
    assert not slow['ok'] and slow['problems'] == ['size 1M: busbw 0.2800 GB/s is under its threshold 1.0000 GB/s']


def test_collective_summary_names_a_node_whose_run_failed():
    bad = ct.collective_summary({'h': {'reporter': True, 'ok': False, 'rows': [], 'error': 'torchrun on h exited 1'},
                                 'w': {'reporter': False, 'ok': False, 'error': 'torchrun on w exited 1'}}, ['h', 'w'])
    assert not bad['ok'] and bad['problems'][:2] == ['host h: torchrun on h exited 1', 'host w: torchrun on w exited 1']


def test_dist_check_report_names_who_joined_and_why_the_others_did_not():
    nodes = ['head', 'w1', 'w2']
    results = {
        'head': {'ok': False, 'stage': 'store', 'joined': ['head', 'w1'], 'cause': 'waited 60 s for w2',
                 'error': 'not every node reached the rendezvous'},
        'w1': {'ok': False, 'stage': 'init', 'cause': 'process group did not form', 'error': 'timeout'},
        'w2': {'ok': False, 'stage': 'connect', 'cause': 'port closed (connection refused: nothing listens, '
               'or a firewall rejects it)', 'error': '10.0.0.1:29500: [Errno 111] Connection refused'},
    }
    report = ct.dist_check_report(results, nodes)
    assert not report['ok'] and report['joined'] == ['head', 'w1'] and report['missing'] == ['w2']
    assert report['lines'][0] == 'dist_check: 2 of 3 node(s) joined (head, w1); did not join: w2'
    assert report['lines'][1].startswith('host w2: port closed')


def test_dist_check_report_counts_a_node_ansible_could_not_run():
    report = ct.dist_check_report({'head': {'ok': False, 'stage': 'store', 'joined': ['head']}, 'w1': None},
                                  ['head', 'w1'])
    assert report['missing'] == ['w1']
    assert any(line.startswith('host w1: Ansible did not run the check there') for line in report['lines'])


def test_dist_check_report_puts_the_node_with_a_wrong_interface_first():
    nodes = ['head', 'w1', 'w2']
    waited = {'ok': False, 'stage': 'init', 'cause': 'process group did not form', 'error': 'wait timeout'}
    results = {
        'head': dict(waited, joined=nodes),
        'w1': dict(waited),
        'w2': {'ok': False, 'stage': 'init', 'cause': 'interface mismatch: socket interface eth9 does not exist '
               'here (eth0 holds 10.0.0.3)', 'error': 'Unable to find address for: eth9'},
    }
    report = ct.dist_check_report(results, nodes)
    assert report['missing'] == [] and report['at_fault'] == ['w2']
    assert report['lines'][0] == 'dist_check: 3 of 3 node(s) reached the rendezvous but the check failed at w2'
    assert report['lines'][1] == ('host w2: interface mismatch: socket interface eth9 does not exist here '
                                  '(eth0 holds 10.0.0.3) (at init): Unable to find address for: eth9')
    assert report['lines'][2].startswith('host head: process group did not form (at init)')
