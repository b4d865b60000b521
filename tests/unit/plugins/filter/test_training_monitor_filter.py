"""training_progress_view and training_job_verdict on results as Ansible registers them."""

from ansible_collections.gpucluster.multinode.plugins.filter.training import training_job_verdict
from ansible_collections.gpucluster.multinode.plugins.filter.training_monitor import training_progress_view

ROW = {'node': 'head', 'rank': 0, 'alive': True, 'held': None, 'tracked': 'progress file', 'last_step': 10,
       'last_step_time': 1.0, 'seconds_since_step': 1.0, 'steps_per_s': 2.0}


def test_a_failed_read_makes_the_job_unknown_naming_the_node_and_its_error():
    results = [{'ranks': [ROW], 'step_regex': 'step [0-9]+ loss'},
               {'failed': True, 'msg': 'node worker: sample_seconds must be 0 to 30, got 60.0'}]
    view = training_progress_view(results, ['head', 'worker'], 600, 'j-1')
    assert view['state'] == 'unknown' and view['nodes'] == {'head': 'running', 'worker': 'unknown'}
    assert 'worker: read failed: node worker: sample_seconds must be 0 to 30, got 60.0' in view['lines']
    assert not any(line == 'state: not running' for line in view['lines'])


def test_an_unreachable_node_or_one_without_an_answer_is_unknown_too():
    view = training_progress_view([{'ranks': []}, {'unreachable': True, 'msg': 'ssh: timeout'}, None],
                                  ['head', 'w1', 'w2'], 600, 'j-1')
    assert view['state'] == 'unknown' and view['node_errors']['w1'] == 'ssh: timeout'
    assert 'no answer' in view['node_errors']['w2']


def test_every_node_read_gives_the_state_and_no_errors():
    view = training_progress_view([{'ranks': [ROW]}, {'ranks': []}], ['head', 'w1'], 600, 'j-1')
    assert view['state'] == 'running' and view['node_errors'] == {}
    assert view['nodes'] == {'head': 'running', 'w1': 'no ranks'}


def test_the_status_read_errors_give_an_unknown_verdict():
    result = training_job_verdict([{'node': 'head', 'running': False}, {'failed': True, 'msg': 'boom'}], ['head', 'w1'],
                                  ['head', 'w1'], 'j-1')
    assert result['state'] == 'unknown' and result['unknown_nodes'] == ['w1']
    assert result['lines'] == ['job j-1: unknown (its state could not be read on w1)', 'w1: read failed: boom']


def test_a_stall_names_the_collective_the_flight_recorder_dumps_show(tmp_path):
    # the dumps two gloo ranks wrote when rank 1 stopped before a collective (recorded fixture)
    import os
    import shutil
    from ansible_collections.gpucluster.multinode.plugins.module_utils.training import flight_recorder as fr
    fixture = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'flight', 'gloo-rank1-stopped')
    os.makedirs(str(tmp_path / 'flight'))
    for name in ('rank_0', 'rank_1'):
        shutil.copy(os.path.join(fixture, name), str(tmp_path / 'flight' / name))
    flight = fr.read_job(str(tmp_path))
    rows = [dict(ROW, node='head', rank=0, seconds_since_step=120.0), dict(ROW, node='w1', rank=1, seconds_since_step=120.0)]
    view = training_progress_view([{'ranks': rows[:1], 'flight': flight}, {'ranks': rows[1:], 'flight': flight}],
                                  ['head', 'w1'], 60, 'j-1')
    assert view['state'] == 'stalled'
    assert view['stall']['collectives'] == flight['lines']
    assert any(line.startswith('  collective: process group 0: rank(s) 0 wait in gloo:all_reduce #5')
               for line in view['lines'])
    # no dumps (a CPU job, or no timeout yet): the stall is reported without them
    view = training_progress_view([{'ranks': rows[:1], 'flight': {}}, {'ranks': rows[1:]}], ['head', 'w1'], 60, 'j-1')
    assert view['state'] == 'stalled' and view['stall']['collectives'] is None


def test_the_checkpoint_bound_is_passed_through_to_the_stall_rule():
    # both ranks save since 900 s, their heartbeats 5 s old: within training_checkpoint_seconds, then past it
    saving = dict(ROW, seconds_since_step=900.0, seconds_since_heartbeat=5.0, phase='checkpoint', phase_s=900.0)
    results = [{'ranks': [saving]}, {'ranks': [dict(saving, node='w1', rank=1)]}]
    assert training_progress_view(results, ['head', 'w1'], 600, 'j-1', None, checkpoint_seconds=1800)['state'] == 'running'
    # as Ansible passes it from -e: a string
    assert training_progress_view(results, ['head', 'w1'], '600', 'j-1', None, checkpoint_seconds='1800')['state'] == 'running'
    view = training_progress_view(results, ['head', 'w1'], 600, 'j-1', None, checkpoint_seconds=600)
    assert view['state'] == 'stalled'
    assert view['stall']['why'].startswith('a checkpoint save running for 900 s (training_checkpoint_seconds 600)')
    # without the bound (the filter's default) a save that beats is judged by its heartbeats alone
    assert training_progress_view(results, ['head', 'w1'], 600, 'j-1')['state'] == 'running'
    stopped = dict(saving, seconds_since_heartbeat=700.0)
    quiet = [{'ranks': [stopped]}, {'ranks': [dict(stopped, node='w1', rank=1)]}]
    assert training_progress_view(quiet, ['head', 'w1'], 600, 'j-1', None, checkpoint_seconds=1800)['state'] == 'stalled'
