"""The supervision core (plugins/module_utils/training/supervision.py): what the head's supervisor and the
pod agent on Kubernetes share. Its event vocabulary, writer and reader, the summary a supervised job's status
and report page give, the culprits' order, and the restart decisions: the plan after a fault (spares, the
job's size, the head, the budget) and a failure policy's rule."""

from __future__ import annotations

import ast
import json
import os
import re
import stat
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import supervision as core
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')
sys.path.insert(0, os.path.join(ROOT, 'tests', 'unit'))
from test_layering import program_closure  # noqa: E402  (the layering test's reading of a program's imports)
NODES = ['head', 'w1', 'w2']
NOW = 1764000000.0
SETTINGS = {'restarts': 3, 'min_nodes': 2}
KILLED = 'exit 247 (a rank was killed by SIGKILL: an out-of-memory kill does this)'


# ----- the events ---------------------------------------------------------------------------------
def test_an_event_is_one_synced_line_any_user_can_read_and_an_unknown_kind_is_refused(tmp_path):
    record = core.append_event(str(tmp_path), 'fault', seen='failed', nodes=['w1'], attempt=2)
    assert record['event'] == 'fault' and isinstance(record['time'], float)
    path = tmp_path / core.EVENTS
    assert stat.S_IMODE(os.stat(str(path)).st_mode) == 0o644
    assert json.loads(path.read_text()) == record
    with pytest.raises(ValueError, match="unknown supervision event 'faulted'"):
        core.append_event(str(tmp_path), 'faulted')
    assert len(path.read_text().splitlines()) == 1  # nothing written for it


def test_the_reader_skips_a_line_cut_short_and_tells_a_job_never_supervised_from_one_with_no_event(tmp_path):
    assert core.read_events(str(tmp_path)) is None  # no events.jsonl: not supervised
    core.append_event(str(tmp_path), 'supervising', nodes=NODES)
    with open(str(tmp_path / core.EVENTS), 'a') as handle:
        handle.write('{"event": "fau\n["not", "an", "event"]\n{"event": "done", "time": "late"}\n')
    core.append_event(str(tmp_path), 'done', why='the job finished')
    events = core.read_events(str(tmp_path))
    assert [e['event'] for e in events] == ['supervising', 'done']
    assert core.read_events(str(tmp_path / core.EVENTS)) == events  # the file itself, or its directory
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'empty' / core.EVENTS).write_text('')
    assert core.read_events(str(tmp_path / 'empty')) == []


def _kinds_written(path):
    """The event kinds a program writes: the string given as the kind of every call of event(), job_event() or
    append_event() (the kind is the first string argument)."""
    with open(path) as handle:
        tree = ast.parse(handle.read())
    kinds = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, 'attr', None) or getattr(node.func, 'id', None)
            if name in ('event', 'job_event', 'append_event'):
                words = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                kinds.update(words[:1])
    return kinds


@pytest.mark.parametrize('program', ['roles/training/files/gpucluster_supervise.py', 'roles/k8s/files/k8s_pod.py'])
def test_both_supervisors_write_the_cores_vocabulary(program):
    """Each supervisor writes the core's words: those of its own (a driver's: read_missed, blind, fenced...),
    and, where it runs the core's loop, those the loop writes (fault, job_stopped, restart, gave_up, done)."""
    kinds, runs_the_loop = set(), False
    # the program and the modules beside it that it imports (its driver and the driver's parts), and theirs
    for path in [os.path.join(ROOT, os.path.dirname(program), name) for name in program_closure(program)]:
        kinds |= _kinds_written(path)
        with open(path) as handle:
            runs_the_loop = runs_the_loop or re.search(r'\b(core|supervision)\.Loop\(', handle.read()) is not None
    if runs_the_loop:
        kinds |= _kinds_written(core.__file__)
    assert {'supervising', 'fault', 'job_stopped', 'restart', 'gave_up', 'done'} <= kinds
    assert kinds <= set(core.EVENT_KINDS), sorted(kinds - set(core.EVENT_KINDS))


def test_the_report_page_reads_the_events_and_counts_them_as_the_supervisors_status_does(tmp_path):
    from ansible_collections.gpucluster.multinode.plugins.module_utils.training import report
    core.append_event(str(tmp_path), 'fault', seen='failed', nodes=['w1'], step=23)
    core.append_event(str(tmp_path), 'restart', nodes=NODES, left_out=['w1'], resume_step=20, lost_steps=3)
    events = report.read_events(str(tmp_path / core.EVENTS))
    assert report.supervision(events) == core.summarize(core.read_events(str(tmp_path)))
    assert report.supervision(events)['left_out'] == ['w1'] and report.supervision(None) is None


# ----- the culprits -------------------------------------------------------------------------------
def test_a_lost_node_is_blamed_before_the_ranks_that_failed_because_of_it_and_the_earliest_among_equals():
    entries = [{'node': 'w1', 'kind': 'exit', 'ended': 10.0}, {'node': 'w3', 'kind': 'stopped', 'ended': 9.0},
               {'node': 'w2', 'kind': 'unreachable'}, {'node': 'w4', 'kind': 'signal', 'ended': 12.0},
               {'node': 'w5', 'kind': 'signal', 'ended': 11.0}, {'node': 'w6', 'kind': 'restarted', 'ended': 30.0},
               {'node': 'w2', 'kind': 'exit', 'ended': 1.0}]
    assert [e['node'] for e in core.order_culprits(entries)] == ['w6', 'w2', 'w5', 'w4', 'w1', 'w3']


def test_the_heads_culprits_follow_the_same_order_as_the_pods():
    obs = {'failed_nodes': ['w1', 'w3'], 'unreachable_nodes': ['w2'], 'stalled_nodes': ['w4', 'w1']}
    assert core.culprits(obs) == ['w2', 'w1', 'w4']  # the unreachable, the first failed rank, the stalled
    assert core.culprits({'failed_nodes': [], 'unreachable_nodes': [], 'stalled_nodes': ['w4']}) == ['w4']


def test_a_read_decides_stop_on_a_fault_done_on_an_end_and_wait_otherwise():
    obs = {'state': 'failed', 'failed_nodes': ['w1'], 'unreachable_nodes': [], 'stalled_nodes': [], 'why': 'exit 1'}
    assert core.decide(obs) == {'action': 'stop', 'seen': 'failed', 'nodes': ['w1'], 'why': 'exit 1'}
    assert core.decide(dict(obs, state='succeeded'))['action'] == 'done'
    assert core.decide(dict(obs, state='stopped'))['why'].startswith('the job was stopped (not by its supervisor)')
    assert core.decide(dict(obs, state='unknown', why=''))['action'] == 'wait'


@pytest.mark.parametrize('state,kind', [
    ({'state': 'failed', 'exit_code': 7, 'reason': 'exit 7'}, 'exit'),
    ({'state': 'failed', 'exit_code': 247, 'reason': KILLED}, 'signal'),
    ({'state': 'failed', 'exit_code': -9, 'reason': 'killed by SIGKILL (an out-of-memory kill does this)'}, 'signal'),
    ({'state': 'unreachable', 'reason': 'unreachable (timed out)'}, 'unreachable'),
    ({'state': 'failed', 'reason': 'restarted: the container ended while its part ran'}, 'restarted'),
    ({'state': 'absent', 'reason': 'has no part of the job (its container started again without its state?)'},
     'restarted'),
])
def test_each_failure_has_a_kind_the_cluster_file_knows(state, kind):
    assert core.failure_kind(state) == kind and kind in kc.FAILURE_KINDS


def test_the_first_matching_rule_decides_and_no_rule_restarts():
    policy = [{'on': ['exit'], 'exit_codes': [3, 4], 'action': 'fail'}, {'on': ['exit', 'signal'], 'action': 'restart_uncounted'}]
    assert core.policy_action(policy, 'exit', 3) == ('fail', 0)
    assert core.policy_action(policy, 'exit', 1) == ('restart_uncounted', 1)
    assert core.policy_action(policy, 'signal', -9) == ('restart_uncounted', 1)
    assert core.policy_action(policy, 'unreachable') == ('restart', None)
    assert core.policy_action([], 'exit', 1) == ('restart', None)


@pytest.mark.parametrize('used,kind,code,decision', [
    (0, 'exit', 3, {'action': 'give_up', 'counted': False, 'why': 'train.failure_policy[0] fails the job on a exit failure'}),
    (2, 'exit', 1, {'action': 'restart', 'counted': False, 'why': 'restart not counted (train.failure_policy[1])'}),
    (1, 'unreachable', None, {'action': 'restart', 'counted': True, 'why': 'restart 2 of 2 (train.restarts)'}),
    (2, 'unreachable', None, {'action': 'give_up', 'counted': True, 'why': 'train.restarts (2) used up'}),
])
def test_one_rule_decides_a_restart_for_both_supervisors(used, kind, code, decision):
    policy = [{'on': ['exit'], 'exit_codes': [3, 4], 'action': 'fail'}, {'on': ['exit', 'signal'], 'action': 'restart_uncounted'}]
    assert core.restart_decision(used, 2, 'train.restarts', policy, kind, code) == decision
    # the head's supervisor has no failure policy: its restarts are counted, training_restarts bounds them
    assert core.restart_decision(used, 2, 'training_restarts')['action'] == ('restart' if used < 2 else 'give_up')


# ----- the plan after a fault ---------------------------------------------------------------------
def _state(nodes=None, restarts=0, failures=None):
    return {'nodes': list(nodes or NODES), 'restarts': restarts, 'failures': list(failures or [])}


def test_a_node_that_fails_its_check_is_left_out_and_the_job_restarts_on_the_others():
    fault = {'step': 23}
    plan = core.plan_restart(_state(), fault, ['w1'], ['w1'], 20, SETTINGS)
    assert plan['action'] == 'restart' and plan['nodes'] == ['head', 'w2'] and plan['left_out'] == ['w1']
    assert plan['resume_step'] == 20 and plan['why'] == 'without w1'


def test_a_culprit_that_passes_its_check_is_a_transient_failure_restarted_on_all_nodes():
    plan = core.plan_restart(_state(), {'step': 23}, ['w1'], [], 20, SETTINGS)
    assert plan['nodes'] == NODES and plan['left_out'] == []
    assert plan['why'] == 'on all nodes (w1 passed the check: a transient failure)'


def test_too_few_nodes_left_the_head_lost_or_restarts_used_up_give_up_with_the_reason():
    plan = core.plan_restart(_state(), {'step': 23}, ['w1'], ['w1', 'w2'], 20, SETTINGS)
    assert plan == {'action': 'give_up', 'short': ['w1', 'w2'],
                    'why': '1 node(s) would remain (head) and training_min_nodes is 2; left out: w1, w2'}
    plan = core.plan_restart(_state(), {'step': 23}, ['head'], ['head'], 20, SETTINGS)
    assert plan['action'] == 'give_up' and plan['why'].startswith('the head head failed its check')
    # the restart budget is decided before the plan, by restart_decision (the loop calls it right after the stop)
    decision = core.restart_decision(3, SETTINGS['restarts'], 'training_restarts')
    assert decision['action'] == 'give_up' and decision['why'] == 'training_restarts (3) used up'


def test_the_same_step_failing_twice_with_no_progress_gives_up():
    state = _state(restarts=1, failures=[{'resume_step': 20, 'step': 23}])
    plan = core.plan_restart(state, {'step': 23}, ['w1'], [], 20, SETTINGS)
    assert plan == {'action': 'give_up', 'why': 'step 24 failed twice with no progress (resumed from step 20 both times)'}
    # progress past the earlier failure is not the same failure again
    assert core.plan_restart(state, {'step': 27}, ['w1'], [], 20, SETTINGS)['action'] == 'restart'
    # nor is a failure after a newer checkpoint
    assert core.plan_restart(state, {'step': 23}, ['w1'], [], 22, SETTINGS)['action'] == 'restart'


def test_no_checkpoint_restarts_from_the_beginning():
    plan = core.plan_restart(_state(), {'step': 23}, ['w1'], [], None, SETTINGS)
    assert plan['action'] == 'restart' and plan['resume_step'] == 0


def test_the_health_report_names_failing_nodes_and_those_it_has_no_record_of():
    report = {'records': [{'node': 'head', 'check': 'ssh', 'status': 'ok'},
                          {'node': 'w2', 'check': 'disk', 'status': 'warn'},
                          {'node': 'w2', 'check': 'gpu', 'status': 'ok'}]}
    assert core.bad_nodes(report, NODES) == ['w1']
    report['records'].append({'node': 'w2', 'check': 'nfs', 'status': 'fail'})
    assert core.bad_nodes(report, NODES) == ['w1', 'w2']
    assert core.bad_nodes({}, NODES) == NODES
    # a node that could not be reached: its checks are unknown, none ok
    report['records'].append({'node': 'w1', 'check': 'reachable', 'status': 'unknown'})
    assert core.bad_nodes(report, NODES) == ['w1', 'w2']


def test_a_give_up_counts_the_time_to_it_and_says_why():
    events = [{'event': 'fault', 'time': 10.0, 'last_step_time': 5.0, 'step': 3},
              {'event': 'gave_up', 'time': 65.0, 'why': 'training_restarts (2) used up'}]
    assert core.summarize(events)['time_lost_s'] == 60.0
    assert core.summary_lines(events)[0].startswith('supervision: gave up (training_restarts (2) used up); 0 restart(s)')


def test_a_restart_event_line_names_its_attempt():
    lines = core.summary_lines([{'event': 'restart', 'time': NOW, 'nodes': ['head'], 'resume_step': 20, 'attempt': 2,
                               'why': 'on all nodes'}, {'event': 'done', 'time': NOW, 'attempt': 2}])
    assert lines[1].endswith('restart nodes=head resume_step=20 attempt=2 why=on all nodes')
    assert lines[2].endswith(' done')


SETTINGS_SPARES = {'restarts': 3, 'min_nodes': 2, 'spares': ['s1', 's2']}


def test_a_node_left_out_is_replaced_by_a_spare_that_passed_its_check_and_the_job_keeps_its_size():
    state = {'nodes': ['h', 'w1', 'w2'], 'restarts': 0, 'failures': []}
    plan = core.plan_restart(state, {'step': 20}, ['w2'], ['w2', 's1'], 15, SETTINGS_SPARES)
    assert plan['action'] == 'restart'
    assert plan['nodes'] == ['h', 'w1', 's2'] and plan['spares'] == ['s2'] and plan['left_out'] == ['w2']
    assert 'spare s2 in its place' in plan['why']


def test_a_spare_is_taken_once_then_the_job_shrinks_down_to_min_nodes_and_no_further():
    state = {'nodes': ['h', 'w1', 's1'], 'restarts': 1, 'failures': [{'resume_step': 10, 'step': 12}],
             'spares_used': ['s1', 's2']}
    plan = core.plan_restart(state, {'step': 30}, ['s1'], ['s1'], 25, SETTINGS_SPARES)
    assert plan['nodes'] == ['h', 'w1'] and plan['spares'] == []
    assert 'no ready spare: the job shrinks' in plan['why']
    state = {'nodes': ['h', 'w1'], 'restarts': 2, 'failures': [{'resume_step': 25, 'step': 30}],
             'spares_used': ['s1', 's2']}
    plan = core.plan_restart(state, {'step': 40}, ['w1'], ['w1'], 35, SETTINGS_SPARES)
    assert plan['action'] == 'give_up' and 'training_min_nodes is 2' in plan['why']


def test_without_spares_a_transient_failure_restarts_on_every_node():
    state = {'nodes': ['h', 'w1', 'w2'], 'restarts': 0, 'failures': []}
    plan = core.plan_restart(state, {'step': 20}, ['w1'], [], 15, {'restarts': 3, 'min_nodes': 2})
    assert plan['nodes'] == ['h', 'w1', 'w2'] and plan['spares'] == []
    assert plan['why'].startswith('on all nodes')


# ----- the restart budget -------------------------------------------------------------------------
def test_the_restart_budget_names_the_variable_that_sets_it():
    assert core.restarts_used_up(1, 2, 'train.restarts') == ''
    assert core.restarts_used_up(2, 2, 'train.restarts') == 'train.restarts (2) used up'
    assert core.restarts_used_up(0, 0, 'training_restarts') == 'training_restarts is 0'
