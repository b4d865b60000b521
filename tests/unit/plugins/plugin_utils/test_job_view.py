"""job_view: the job's state, slowest node and stall from rows read on recorded progress files and logs."""

import os
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import job_monitor as jm
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import job_view as jv

# the rows the node side reads from the recorded progress files (tests/unit/fixtures/job_monitor)
sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(__file__), '..', 'module_utils')))
from test_job_monitor import live_row, rows_from  # noqa: E402


def test_the_node_of_the_slow_rank_is_named_slowest():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    node, why = jv.slowest_node(rows)
    assert node == 'worker-2', why


def test_no_node_is_named_when_all_compute_alike():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'worker-1'})
    node, why = jv.slowest_node(rows)
    assert node is None and 'no node' in why


def test_a_stopped_rank_makes_the_job_stalled_naming_its_node():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=60, held={1})
    result = jv.verdict(rows, stall_seconds=30)
    assert result['state'] == 'stalled'
    assert result['stall']['nodes'] == ['worker-1'] and result['stall']['ranks'] == [1]
    assert any('rank 1 on worker-1' in line for line in result['lines'])


def test_not_stalled_before_the_bound():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=0, held={1})
    assert jv.verdict(rows, stall_seconds=30)['state'] == 'running'


def test_a_stall_without_held_rank_names_the_lowest_step():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=60)
    rows[1]['last_step'] -= 1
    st = jv.stall(rows, 30)
    assert st['stalled'] and st['nodes'] == ['worker-1']


def test_an_exited_rank_beside_live_ones_is_failed_and_all_finished_is_finished():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    rows[2].update(alive=False, exit='exited')
    assert jv.verdict(rows, 300)['state'] == 'failed'
    for r in rows:
        r.update(alive=False, exit='finished')
    assert jv.verdict(rows, 300)['state'] == 'finished'


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
    assert jv.verdict(rows, 600)['state'] == 'stalled'  # the save's heartbeat itself is 700 s old
    # the saving rank writes a heartbeat every few minutes while it saves: held
    text += '# heartbeat phase=checkpoint step=140 time=1500.0\n'
    rows = [live_row(text, 1800.0, rank=0), live_row(text.split('# heartbeat')[0], 1800.0, node='worker', rank=1)]
    view = jv.verdict(rows, 600)
    assert view['state'] == 'running', view['lines']
    assert any('saving checkpoint since 700 s' in line for line in view['lines']), view['lines']


def test_a_heartbeat_within_the_bound_holds_the_clock_and_a_step_ends_the_phase():
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=1 time=1000.0\n'
            'step=5 loss=0.5 time=1010.0\n# heartbeat phase=eval step=5 time=1590.0\n')
    row = live_row(text, 1700.0)
    assert jv.stall([row], 600)['stalled'] is False
    assert 'evaluating since 110 s' in jv.rank_line(row)
    stepped = live_row(text + 'step=6 loss=0.4 time=1600.0\n', 1700.0)
    assert stepped['phase'] is None and 'since' not in jv.rank_line(stepped)
    back = live_row(text + '# heartbeat phase=train step=5 time=1595.0\n', 1700.0)
    assert back['phase'] is None and back['seconds_since_heartbeat'] == pytest.approx(105.0)


def test_a_stale_phase_is_named_in_the_stall():
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=1 time=1000.0\n'
            'step=5 loss=0.5 time=1010.0\n# heartbeat phase=checkpoint step=5 time=1020.0\n')
    st = jv.stall([live_row(text, 2000.0)], 600)
    assert st['stalled'] and 'rank 0 on head has been saving checkpoint for 980 s' in st['why']


def test_a_start_up_hang_is_a_stall_before_the_first_step():
    header = '# gpucluster-progress rank=%d host=%s pid=1 world=2 time=1000.0\n'
    rows = [live_row(header % (0, 'head'), 1000.0 + 700, node='head', rank=0),
            live_row(header % (1, 'worker'), 1000.0 + 700, node='worker', rank=1)]
    for row in rows:
        row['seconds_since_start'] = 700.0
    view = jv.verdict(rows, 600)
    assert view['state'] == 'stalled' and 'start-up hang' in view['stall']['why']
    assert view['stall']['nodes'] == ['head', 'worker']
    for row in rows:
        row['seconds_since_start'] = 30.0
    assert jv.verdict(rows, 600)['state'] == 'running'


def test_every_rank_at_the_same_step_is_named_as_a_collective_hang_with_room_for_the_collectives():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=60)
    assert rows[0]['last_step'] == rows[1]['last_step']
    st = jv.stall(rows, 30)
    assert st['stalled'] and 'every rank stopped after step' in st['why'] and st['ranks'] == [0, 1]
    assert st['collectives'] is None


def test_a_node_whose_read_failed_makes_the_state_unknown_never_not_running():
    view = jv.verdict([], 600, {'worker-1': 'node worker-1: sample_seconds must be 0 to 30, got 60.0'})
    assert view['state'] == 'unknown'
    assert view['lines'][0].startswith('state: unknown (the read failed on worker-1')
    assert 'worker-1: read failed: node worker-1: sample_seconds must be 0 to 30, got 60.0' in view['lines']
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head'})
    assert jv.verdict(rows, 600, {'worker-2': 'Permission denied'})['state'] == 'unknown'
    assert jv.node_states(rows, ['head', 'worker-2'], {'worker-2': 'x'}) == {'head': 'running', 'worker-2': 'unknown'}


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
    assert jv.verdict(rows, 600)['state'] == 'stalled'


def test_nothing_tracked_is_said_plainly_and_stall_detection_is_off():
    procs = {0: {'pid': 5, 'state': 'S', 'local_rank': 0, 'visible_devices': None, 'started_at': 1.0}}
    untracked = jm.parse_log('loading data\nwarming up\n', 'step [0-9]+ loss', mtime=1.0)
    rows = jm.node_ranks('n', 'n', procs, {}, {}, {}, {}, 99999.0, log=untracked)
    view = jv.verdict(rows, 600, step_regex='step [0-9]+ loss')
    assert view['state'] == 'running' and view['stall']['off']
    assert ('no steps tracked: the script writes no progress file and no log line matches '
            'training_progress_regex (step [0-9]+ loss); stall detection is off for this job') in view['lines']
    assert 'no steps tracked' in jv.rank_line(rows[0])
