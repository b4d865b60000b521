import itertools

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import netbench


def nodes(n):
    return ['node-%d' % i for i in range(1, n + 1)]


@pytest.mark.parametrize('n', [2, 4, 7, 8, 32])
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n):
    names = nodes(n)
    rounds = netbench.round_robin(names)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = []
    for pairs in rounds:
        in_round = [node for pair in pairs for node in pair]
        assert len(in_round) == len(set(in_round)), 'a node is in two pairs of one round'
        assert len(pairs) == n // 2
        seen.extend(frozenset(pair) for pair in pairs)
    assert len(seen) == len(set(seen)), 'a pair is tested twice'
    assert set(seen) == {frozenset(p) for p in itertools.combinations(names, 2)}


def test_odd_count_gives_each_node_exactly_one_bye():
    names = nodes(7)
    byes = []
    for pairs in netbench.round_robin(names):
        busy = {node for pair in pairs for node in pair}
        byes.extend(set(names) - busy)
    assert sorted(byes) == sorted(names)


def test_round_robin_input_is_checked():
    with pytest.raises(ValueError, match='repeated: a'):
        netbench.round_robin(['a', 'b', 'a'])
    with pytest.raises(ValueError, match='at least 2'):
        netbench.round_robin(['a'])


def planted(n, slow, fast=22.0, slow_rate=0.9, both_directions=True):
    """Results of a full round robin where every link touching `slow` runs at slow_rate."""
    results = []
    for pairs in netbench.round_robin(nodes(n)):
        for a, b in pairs:
            for client, server in ([(a, b), (b, a)] if both_directions else [(a, b)]):
                rate = slow_rate if slow in (a, b) else fast + (hash((a, b)) % 7) / 10.0
                results.append({'client': client, 'server': server, 'gbps': rate})
    return results


@pytest.mark.parametrize('n', [3, 4, 7, 8, 32])
def test_planted_slow_node_is_named_and_no_other(n):
    report = netbench.bandwidth_matrix(planted(n, 'node-3'))
    flags = netbench.flag_slow_links(report, relative=0.5)
    assert flags['culprits'] == ['node-3']
    assert len(flags['slow_links']) == n - 1
    assert all('node-3' in (link['a'], link['b']) for link in flags['slow_links'])


def test_absolute_threshold_and_node_summary():
    report = netbench.bandwidth_matrix(planted(4, 'node-2', slow_rate=5.0))
    assert report['nodes'] == nodes(4)
    assert report['node_summary']['node-2'] == {'min': 5.0, 'median': 5.0, 'max': 5.0, 'links': 3}
    assert report['node_summary']['node-1']['min'] == 5.0 and report['node_summary']['node-1']['max'] > 20
    assert report['matrix'][0][0] is None and report['matrix'][1][0] == 5.0
    assert netbench.flag_slow_links(report, threshold_gbps=4.0)['slow_links'] == []
    assert netbench.flag_slow_links(report, threshold_gbps=10.0)['culprits'] == ['node-2']


def test_two_slow_nodes_are_both_named():
    results = planted(6, 'node-2')
    for r in results:
        if 'node-5' in (r['client'], r['server']):
            r['gbps'] = 0.9
    flags = netbench.flag_slow_links(netbench.bandwidth_matrix(results), relative=0.5)
    assert flags['culprits'] == ['node-2', 'node-5']


def test_one_slow_link_names_the_link_but_no_culprit():
    results = planted(4, 'nobody')
    for r in results:
        if {r['client'], r['server']} == {'node-1', 'node-4'}:
            r['gbps'] = 1.0
    flags = netbench.flag_slow_links(netbench.bandwidth_matrix(results), relative=0.5)
    assert [(f['a'], f['b']) for f in flags['slow_links']] == [('node-1', 'node-4')]
    assert flags['culprits'] == []


def test_a_link_is_as_slow_as_its_slower_direction():
    results = [{'client': 'a', 'server': 'b', 'gbps': 20.0}, {'client': 'b', 'server': 'a', 'gbps': 2.0}]
    report = netbench.bandwidth_matrix(results)
    assert report['links'][0]['gbps'] == 2.0
    assert report['links'][0]['directions'] == {'a -> b': 20.0, 'b -> a': 2.0}


def test_failed_tests_are_flagged_with_their_error():
    results = planted(4, 'nobody')
    results = [r for r in results if 'node-4' not in (r['client'], r['server'])]
    results += [{'client': 'node-%d' % i, 'server': 'node-4', 'ok': False,
                 'error': 'unable to connect to server: Connection refused'} for i in (1, 2, 3)]
    flags = netbench.flag_slow_links(netbench.bandwidth_matrix(results), threshold_gbps=1.0)
    assert flags['culprits'] == ['node-4']
    assert all(f['reason'].startswith('failed: node-') and 'Connection refused' in f['reason']
               for f in flags['slow_links'])


def test_bad_results_are_named():
    with pytest.raises(ValueError, match=r'results\[0\] \(a -> b\) needs gbps'):
        netbench.bandwidth_matrix([{'client': 'a', 'server': 'b', 'gbps': 'fast'}])
    with pytest.raises(ValueError, match=r'results\[0\] has no server'):
        netbench.bandwidth_matrix([{'client': 'a'}])
    with pytest.raises(ValueError, match='threshold_gbps'):
        netbench.flag_slow_links({'links': []})
