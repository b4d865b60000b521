"""rank_failure: the first failing rank's own error among every node's tracebacks (read with rank_errors
from the recorded logs of tests/unit/fixtures/rank_errors) and its lines."""

import os

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import rank_errors as re_
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import rank_failure as rfail

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures')


def errors_of(*parts, **kw):
    with open(os.path.join(FIXTURES, *parts)) as handle:
        return re_.bound(re_.parse(handle.read(), **kw))


def test_the_culprits_root_error_is_chosen_never_a_follow_on():
    head = errors_of('rank_errors', 'deepspeed-head-log-rank0-permission-error.txt')
    for e in head:
        e['node'] = e['host']
    results = [{'node': 'lab-head', 'errors': head}, {'node': 'lab-worker-1', 'errors': []}]
    error = rfail.first_error(rfail.node_errors(results), ['lab-head', 'lab-worker-1'])
    assert error['type'] == 'PermissionError' and error['node'] == 'lab-head' and error['rank'] == 0


def test_a_culprit_with_only_follow_on_errors_gives_way_to_the_earliest_root_error_of_any_node():
    # the verdict named the worker first (its launcher reported first), but only the head's rank 0 raised
    # an error of its own: the worker's gloo error is a follow-on of it
    worker = errors_of('rank_errors', 'torchrun-rank1-stderr.log')
    head = errors_of('rank_errors', 'torchrun-agent-rank0-permission-error.log')
    results = [{'node': 'lab-head', 'errors': head}, {'node': 'lab-worker-1', 'errors': worker}]
    error = rfail.first_error(rfail.node_errors(results), ['lab-worker-1', 'lab-head'])
    assert error['type'] == 'PermissionError' and error['node'] == 'lab-head'


def test_only_follow_ons_everywhere_gives_the_culprits_last_traceback():
    killed = errors_of('pdsh', 'deepspeed-head-log-rank-killed-on-worker-1.txt')
    for e in killed:
        e['node'] = e['host']
    error = rfail.first_error(rfail.node_errors([{'node': 'lab-head', 'errors': killed}]),
                              ['lab-worker-2', 'lab-head'])
    assert error['node'] == 'lab-worker-2' and error['follow_on'] and error['rank'] == 3
    lines = rfail.failure_lines(error, {'lab-worker-2': 1})
    assert lines[0].startswith('first failure: lab-worker-2 rank 3 (exit 1): RuntimeError: ')
    assert 'a follow-on: a peer reset its connection' in lines[0]


def test_the_rank_the_launchers_report_names_fills_an_error_without_one():
    error = {'error': 'ValueError: bad shard', 'type': 'ValueError', 'follow_on': False, 'rank': None, 'lines': []}
    chosen = rfail.first_error([('w1', error)], ['w1'], rank_failure={'rank': 5, 'exit_code': 1})
    assert chosen['rank'] == 5
    assert rfail.failure_lines(chosen, {'w1': 1}) == ['first failure: w1 rank 5 (exit 1): ValueError: bad shard']


def test_no_traceback_at_all_names_the_culprit_and_says_so():
    assert rfail.first_error([], ['w1']) is None
    assert rfail.failure_lines(None, {'w1': -9}, 'w1') == ['first failure: w1 (exit -9): no Python traceback in its log']
    assert rfail.failure_lines(None, {}) == []
