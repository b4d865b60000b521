"""job_state (the ranks' figures): the job's state, slowest node and stall from rows read on recorded progress
files and logs; job_view's lines of them. The launchers' verdict: test_job_state_launchers.py."""

import os
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm
from ansible_collections.gpucluster.multinode.plugins.module_utils.training.monitor import slowest_node
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_state as js
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_view as jv

# the rows the node side reads from the recorded progress files (tests/unit/fixtures/job_monitor)
sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(__file__), '..', 'module_utils')))
from test_job_monitor import live_row, rows_from  # noqa: E402


def test_the_node_of_the_slow_rank_is_named_slowest():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    node, why = slowest_node(rows)
    assert node == 'worker-2', why


def test_no_node_is_named_when_all_compute_alike():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'worker-1'})
    node, why = slowest_node(rows)
    assert node is None and 'no node' in why


def test_a_stopped_rank_makes_the_job_stalled_naming_its_node():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=60, held={1})
    result = js.progress_verdict(rows, stall_seconds=30)
    assert result['state'] == 'stalled'
    assert result['stall']['nodes'] == ['worker-1'] and result['stall']['ranks'] == [1]
    assert any('rank 1 on worker-1' in line for line in result['lines'])


def test_not_stalled_before_the_bound():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=0, held={1})
    assert js.progress_verdict(rows, stall_seconds=30)['state'] == 'running'


def test_a_stall_without_held_rank_names_the_lowest_step():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=60)
    rows[1]['last_step'] -= 1
    st = js.stall(rows, 30)
    assert st['stalled'] and st['nodes'] == ['worker-1']


def test_an_exited_rank_beside_live_ones_is_failed_and_all_finished_is_finished():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    rows[2].update(alive=False, exit='exited')
    assert js.progress_verdict(rows, 300)['state'] == 'failed'
    for r in rows:
        r.update(alive=False, exit='finished')
    assert js.progress_verdict(rows, 300)['state'] == 'finished'


def test_summary_has_steps_rates_slowest_and_peak_memory():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    for r in rows:
        r.update(alive=False, exit='finished')
    record = jv.summary(rows, 'job-1', 'finished', 'worker-2', 1.0)
    assert record['steps'] == 60 and record['slowest_node'] == 'worker-2'
    assert 5 < record['mean_steps_per_s'] < 12
    assert all(r['peak_rss_kib'] > 100000 for r in record['ranks'])


def test_a_checkpoint_save_longer_than_the_stall_bound_is_not_a_stall_and_shows_its_phase():
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=2 time=1000.0\n'
            'step=140 loss=0.5 time=1100.0\n'
            '# heartbeat phase=checkpoint step=140 time=1100.1\n')
    # read 700 s after the last step and the heartbeat that opened the save, with a 600 s bound
    rows = [live_row(text, 1800.0, rank=0), live_row(text, 1800.0, node='worker', rank=1)]
    assert rows[0]['phase'] == 'checkpoint' and rows[0]['phase_s'] == pytest.approx(699.9)
    assert js.progress_verdict(rows, 600)['state'] == 'stalled'  # the save's heartbeat itself is 700 s old
    # the saving rank writes a heartbeat every few minutes while it saves: held
    text += '# heartbeat phase=checkpoint step=140 time=1500.0\n'
    rows = [live_row(text, 1800.0, rank=0), live_row(text.split('# heartbeat')[0], 1800.0, node='worker', rank=1)]
    view = js.progress_verdict(rows, 600)
    assert view['state'] == 'running', view['lines']
    assert any('saving checkpoint since 700 s' in line for line in view['lines']), view['lines']


def test_a_heartbeat_within_the_bound_holds_the_clock_and_a_step_ends_the_phase():
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=1 time=1000.0\n'
            'step=5 loss=0.5 time=1010.0\n# heartbeat phase=eval step=5 time=1590.0\n')
    row = live_row(text, 1700.0)
    assert js.stall([row], 600)['stalled'] is False
    assert 'evaluating since 110 s' in jv.rank_line(row)
    stepped = live_row(text + 'step=6 loss=0.4 time=1600.0\n', 1700.0)
    assert stepped['phase'] is None and 'since' not in jv.rank_line(stepped)
    back = live_row(text + '# heartbeat phase=train step=5 time=1595.0\n', 1700.0)
    assert back['phase'] is None and back['seconds_since_heartbeat'] == pytest.approx(105.0)


def test_a_stale_phase_is_named_in_the_stall():
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=1 time=1000.0\n'
            'step=5 loss=0.5 time=1010.0\n# heartbeat phase=checkpoint step=5 time=1020.0\n')
    st = js.stall([live_row(text, 2000.0)], 600)
    assert st['stalled'] and 'rank 0 on head has been saving checkpoint for 980 s' in st['why']


def test_a_start_up_hang_is_a_stall_before_the_first_step():
    header = '# gpucluster-progress rank=%d host=%s pid=1 world=2 time=1000.0\n'
    rows = [live_row(header % (0, 'head'), 1000.0 + 700, node='head', rank=0),
            live_row(header % (1, 'worker'), 1000.0 + 700, node='worker', rank=1)]
    for row in rows:
        row['seconds_since_start'] = 700.0
    view = js.progress_verdict(rows, 600)
    assert view['state'] == 'stalled' and 'start-up hang' in view['stall']['why']
    assert view['stall']['nodes'] == ['head', 'worker']
    for row in rows:
        row['seconds_since_start'] = 30.0
    assert js.progress_verdict(rows, 600)['state'] == 'running'


def test_every_rank_at_the_same_step_is_named_as_a_collective_hang_with_room_for_the_collectives():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=60)
    assert rows[0]['last_step'] == rows[1]['last_step']
    st = js.stall(rows, 30)
    assert st['stalled'] and 'every rank stopped after step' in st['why'] and st['ranks'] == [0, 1]
    assert st['collectives'] is None


def test_a_node_whose_read_failed_makes_the_state_unknown_never_not_running():
    view = js.progress_verdict([], 600, {'worker-1': 'node worker-1: sample_seconds must be 0 to 30, got 60.0'})
    assert view['state'] == 'unknown'
    assert view['lines'][0].startswith('state: unknown (the read failed on worker-1')
    assert 'worker-1: read failed: node worker-1: sample_seconds must be 0 to 30, got 60.0' in view['lines']
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head'})
    assert js.progress_verdict(rows, 600, {'worker-2': 'Permission denied'})['state'] == 'unknown'
    assert js.node_states(rows, ['head', 'worker-2'], {'worker-2': 'x'}) == {'head': 'running', 'worker-2': 'unknown'}


def test_steps_from_a_log_with_named_groups_give_rates_and_a_stall():
    t0 = 1764000000.0
    log = ''.join('worker: it %d | loss %.2f | t %.1f\n' % (i, 1.0 / i, t0 + i) for i in range(1, 11))
    parsed = jm.parse_log(log + 'saving...\n', r'it (?P<step>\d+) \| loss (?P<loss>[0-9.]+) \| t (?P<time>[0-9.]+)',
                          mtime=t0 + 11)
    assert parsed['steps'][-1] == {'step': 10, 'loss': 0.1, 'time': t0 + 10, 'dated': True}
    figures = jm.progress_figures(parsed, t0 + 10.5)
    assert figures['tracked'] == 'log' and figures['steps_per_s'] == pytest.approx(1.0)
    rows = jm.node_ranks('n', 'n', {0: {'pid': 5, 'state': 'S', 'local_rank': 0, 'visible_devices': None,
                                        'started_at': t0}}, {}, {}, {}, {}, t0 + 1000, log=parsed)
    assert rows[0]['last_step'] == 10 and 'steps from its log' in jv.rank_line(rows[0])
    assert js.progress_verdict(rows, 600)['state'] == 'stalled'


def test_nothing_tracked_is_said_plainly_and_stall_detection_is_off():
    procs = {0: {'pid': 5, 'state': 'S', 'local_rank': 0, 'visible_devices': None, 'started_at': 1.0}}
    untracked = jm.parse_log('loading data\nwarming up\n', 'step [0-9]+ loss', mtime=1.0)
    rows = jm.node_ranks('n', 'n', procs, {}, {}, {}, {}, 99999.0, log=untracked)
    view = js.progress_verdict(rows, 600, step_regex='step [0-9]+ loss')
    assert view['state'] == 'running' and view['stall']['off']
    assert ('no steps tracked: the script writes no progress file and no log line matches '
            'training_progress_regex (step [0-9]+ loss); stall detection is off for this job') in view['lines']
    assert 'no steps tracked' in jv.rank_line(rows[0])


# ----- a save judged by training_checkpoint_seconds ------------------------------------------------
def _saving(began, last_beat, step=140, step_time=None, every=10.0):
    """The progress file of a rank that logged step `step` then entered `with progress.saving(step):`
    at began: a checkpoint heartbeat every `every` seconds up to last_beat, each naming the save's start."""
    step_time = began - 0.1 if step_time is None else step_time
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=2 time=%.3f\n' % (step_time - 100)
            + 'step=%d loss=0.5 time=%.3f\n' % (step, step_time))
    beat = began
    while beat <= last_beat:
        text += '# heartbeat phase=checkpoint step=%d since=%.3f time=%.3f\n' % (step, began, beat)
        beat += every
    return text


def test_a_save_longer_than_the_stall_bound_but_within_the_checkpoint_bound_is_not_stalled():
    # both ranks have been saving for 900 s (the stall bound is 600 s), their heartbeats 5 s old
    text = _saving(1000.0, 1895.0)
    rows = [live_row(text, 1900.0, rank=0), live_row(text, 1900.0, node='worker', rank=1)]
    assert rows[0]['phase'] == 'checkpoint' and rows[0]['phase_s'] == pytest.approx(900.0)
    assert rows[0]['seconds_since_step'] > 600
    st = js.stall(rows, 600, checkpoint_seconds=1800)
    assert not st['stalled'], st
    view = js.progress_verdict(rows, 600, checkpoint_seconds=1800)
    assert view['state'] == 'running', view['lines']
    assert any('saving checkpoint since 900 s' in line for line in view['lines']), view['lines']


def test_a_save_longer_than_the_checkpoint_bound_is_stalled_and_says_so():
    # a hung save: the heartbeat thread beats on (5 s old), the save began 1900 s ago
    text = _saving(1000.0, 2895.0)
    rows = [live_row(text, 2900.0, rank=0), live_row(text, 2900.0, node='worker', rank=1)]
    st = js.stall(rows, 600, checkpoint_seconds=1800)
    assert st['stalled'] and st['ranks'] == [0, 1] and st['nodes'] == ['head', 'worker'], st
    assert 'a checkpoint save running for 1900 s (training_checkpoint_seconds 1800)' in st['why'], st['why']
    assert 'no rank logged a step or heartbeat' not in st['why']  # they did: their heartbeats are recent
    view = js.progress_verdict(rows, 600, checkpoint_seconds=1800)
    assert view['state'] == 'stalled'
    assert any(line.startswith('stalled: a checkpoint save running for 1900 s') for line in view['lines']), view['lines']
    # just under the bound it runs
    rows = [live_row(_saving(1000.0, 2795.0), 2799.0, rank=r) for r in (0, 1)]
    assert not js.stall(rows, 600, checkpoint_seconds=1800)['stalled']


def test_the_rank_still_saving_past_the_bound_is_named_when_the_others_went_back_to_steps():
    saving = _saving(1000.0, 2895.0)
    # rank 1 finished its part, said so, and waits in the next step's collective since
    done = _saving(1000.0, 1010.0) + '# heartbeat phase=train step=140 time=1020.0\n'
    rows = [live_row(saving, 2900.0, rank=0), live_row(done, 2900.0, node='worker', rank=1)]
    assert rows[1]['phase'] is None
    st = js.stall(rows, 600, checkpoint_seconds=1800)
    assert st['stalled'] and st['ranks'] == [0] and st['nodes'] == ['head'], st
    assert st['why'].startswith('a checkpoint save running for 1900 s (training_checkpoint_seconds 1800) on '
                                'rank 0 on head; no other rank logged a step or heartbeat for 1880 s'), st['why']
    # within the save bound, the rank waiting for it is not a stall of its own
    rows = [live_row(_saving(1000.0, 1895.0), 1900.0, rank=0), live_row(done, 1900.0, node='worker', rank=1)]
    assert not js.stall(rows, 600, checkpoint_seconds=1800)['stalled']


def test_a_save_whose_heartbeats_stopped_is_stalled_by_the_stall_bound():
    # the process died inside the save or is frozen whole (heartbeat thread too): last beat 700 s old
    text = _saving(1000.0, 1200.0)
    rows = [live_row(text, 1900.0, rank=r) for r in (0, 1)]
    st = js.stall(rows, 600, checkpoint_seconds=1800)
    assert st['stalled'] and st['why'].startswith('no rank logged a step or heartbeat for 700 s or more'), st['why']
    assert 'has been saving checkpoint for 900 s' in st['why']
    # the single heartbeat an older script writes before its save: the same as before
    old = ('# gpucluster-progress rank=0 host=head pid=1 world=2 time=1000.0\n'
           'step=140 loss=0.5 time=1100.0\n# heartbeat phase=checkpoint step=140 time=1100.1\n')
    rows = [live_row(old, 1800.0, rank=0), live_row(old, 1800.0, node='worker', rank=1)]
    assert js.progress_verdict(rows, 600, checkpoint_seconds=1800)['state'] == 'stalled'


def test_a_rank_without_step_or_heartbeat_is_stalled_as_before_with_a_checkpoint_bound():
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=2 time=1000.0\n'
            'step=140 loss=0.5 time=1100.0\n')
    rows = [live_row(text, 1701.0, rank=0), live_row(text, 1701.0, node='worker', rank=1)]
    for bound in (None, 1800, 10):
        st = js.stall(rows, 600, checkpoint_seconds=bound)
        assert st['stalled'] and st['ranks'] == [0, 1], (bound, st)
        assert st['why'].startswith('no rank logged a step or heartbeat for 601 s or more (every rank stopped '
                                    'after step 140'), st['why']
    assert not js.stall([live_row(text, 1699.0, rank=r) for r in (0, 1)], 600, checkpoint_seconds=1800)['stalled']


def test_without_a_checkpoint_bound_a_save_that_beats_is_never_stalled_as_before():
    text = _saving(1000.0, 9995.0)
    rows = [live_row(text, 10000.0, rank=r) for r in (0, 1)]
    assert not js.stall(rows, 600)['stalled']
    assert js.progress_verdict(rows, 600)['state'] == 'running'


# ----- the job's one state (what the supervisor reads) ---------------------------------------------
def test_a_failed_rank_wins_over_the_stall_of_the_ranks_it_left_waiting():
    result = {'state': 'failed', 'failed_nodes': ['w1', 'head'], 'first_failure': {'node': 'w1', 'exit_code': -9}}
    progress = {'state': 'stalled', 'stall': {'stalled': True, 'nodes': ['head', 'w2'], 'why': 'no step'},
                'ranks': [{'last_step': 23, 'last_step_time': 5.0}, {'last_step': 22, 'last_step_time': 4.0}]}
    state = js.job_state(result, progress)
    assert state['state'] == 'failed' and state['failed_nodes'] == ['w1', 'head'] and state['stalled_nodes'] == []
    assert state['why'] == 'a rank failed first on w1 (exit -9)' and (state['step'], state['last_step_time']) == (23, 5.0)
    assert js.job_state({'state': 'running'}, progress)['state'] == 'stalled'
    assert js.job_state({'state': 'running'}, progress)['stalled_nodes'] == ['head', 'w2']


def test_a_node_not_read_makes_it_unreachable_and_a_failure_read_elsewhere_is_kept():
    result = {'state': 'failed', 'failed_nodes': ['w1'], 'first_failure': {'node': 'w1', 'exit_code': 1}}
    state = js.job_state(result, {'node_errors': {'w2': 'ssh: timed out'}, 'ranks': []})
    assert state['state'] == 'unreachable' and state['unreachable_nodes'] == ['w2'] and state['failed_nodes'] == ['w1']
    assert state['why'] == 'w2 could not be read; a rank failed first on w1 (exit 1)'
    unknown = js.unknown_verdict({'w2': 'boom', 'head': 'gone'}, 'j')
    assert js.job_state(unknown, None)['unreachable_nodes'] == ['head', 'w2']


def test_the_state_names_the_lowest_attempt_read_and_nothing_read_is_unknown():
    assert js.job_state({'state': 'running', 'attempt': 2}, {'attempt': 1, 'ranks': []})['attempt'] == 1
    assert js.job_state({'state': 'succeeded'}, None)['state'] == 'succeeded'
    nothing = js.job_state(None, None)
    assert nothing['state'] == 'unknown' and nothing['why'] == 'the status read gave nothing'
    record = js.status_record({'state': 'stopped'})
    assert record['job']['state'] == 'stopped' and 'progress' not in record


@pytest.mark.parametrize('progress, verdict, fail', [
    ('failed', 'failed', True), ('failed', None, True), ('not running', 'failed', True),
    ('stalled', None, True), ('unknown', None, True), ('not running', 'unknown', True),
    ('finished', None, False), ('running', None, False), ('not running', 'stopped', False),
    ('not running', 'succeeded', False),
])
def test_a_watch_fails_on_a_job_that_failed_or_stalled_and_ends_cleanly_otherwise(progress, verdict, fail):
    assert js.watch_outcome(progress, verdict)['fail'] is fail
