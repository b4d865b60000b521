"""Reports of the cluster tests: the bandwidth matrix, the collective table, the smoke test verdict."""

from itertools import combinations

import pytest

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import cluster_test_reports as ct
from ansible_collections.gpucluster.multinode.plugins.module_utils.cluster_test_inputs import ClusterTestError


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
    with pytest.raises(ClusterTestError, match="threshold_gbps must be a positive number, got 'x'"):
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


def test_collective_summary_says_how_many_ranks_ran_where_on_a_2_1_1_cluster():
    ranks = [{'node': 'alpha', 'slots': 2, 'first_rank': 0}, {'node': 'bravo-2', 'slots': 1, 'first_rank': 2},
             {'node': 'charlie', 'slots': 1, 'first_rank': 3}]
    head = torch_result(world_size=4, nnodes=3, ranks=ranks)
    report = ct.collective_summary({'alpha': head, 'bravo-2': {'reporter': False, 'ok': True},
                                    'charlie': {'reporter': False, 'ok': True}}, ['alpha', 'bravo-2', 'charlie'])
    assert report['ok'] and report['ranks'] == ranks
    assert report['lines'][0] == ('collective: torch.distributed all_reduce (gloo), 4 rank(s) on 3 node(s) '
                                  '(alpha 2, bravo-2 1, charlie 1), method torch')


def test_collective_summary_fails_a_run_that_ended_before_every_size():
    head = torch_result(ok=False, missing_sizes=[1 << 24], error='nccl-tests exited 124 (timed out after 600 s); '
                        'size(s) 16M missing from the output',
                        below_threshold=[{'size': 1 << 24, 'busbw_gbs': None, 'threshold_gbs': 2.0}])
    report = ct.collective_summary({'h': head}, ['h'])
    assert not report['ok'] and report['missing_sizes'] == [1 << 24]
    assert report['problems'] == [
        'host h: nccl-tests exited 124 (timed out after 600 s); size(s) 16M missing from the output',
        'size 16M: no result, so not at its threshold 2.0000 GB/s']


def test_dist_check_report_counts_the_ranks_of_each_node():
    nodes = ['alpha', 'bravo-2', 'charlie', 'delta']
    done = {'ok': True, 'stage': 'done', 'backend': 'gloo', 'world_size': 5, 'rendezvous': '10.99.0.11:29500',
            'sum': 15.0, 'expected': 15.0}
    results = {n: dict(done, slots=2 if n == 'alpha' else 1) for n in nodes}
    results['alpha']['joined'] = nodes
    report = ct.dist_check_report(results, nodes)
    assert report['ok'] and report['world_size'] == 5
    assert report['ranks'] == {'alpha': 2, 'bravo-2': 1, 'charlie': 1, 'delta': 1}
    assert report['lines'] == ['dist_check: 4 of 4 node(s) joined one gloo group of 5 rank(s) (alpha 2, bravo-2 1, '
                               'charlie 1, delta 1) through 10.99.0.11:29500; all-reduce sum 15.0 (expected 15.0) '
                               'on every rank']
