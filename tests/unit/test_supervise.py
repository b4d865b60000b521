"""The supervisor's decisions (roles/training/files/gpucluster_supervise.py): what a status read says,
whom to blame, where to restart, when to give up; its event log and summary.

The status reads are built with the filters status.yml itself uses (training_verdict on training_job
results, training_unknown_result, training_progress_view on training_progress results)."""

import json
import os
import sys
import time

from ansible_collections.gpucluster.multinode.plugins.filter.training import training_verdict
from ansible_collections.gpucluster.multinode.plugins.filter.training_monitor import (
    training_progress_view, training_read_errors, training_unknown_result)

FILES = os.path.join(os.path.dirname(__file__), '..', '..', 'roles', 'training', 'files')
sys.path.insert(0, FILES)

import gpucluster_supervise as sv  # noqa: E402

NODES = ['head', 'w1', 'w2']
NOW = 1764000000.0
SETTINGS = {'restarts': 3, 'min_nodes': 2}


def _row(node, rank, step, alive=True, since=2.0, **kw):
    row = {'node': node, 'rank': rank, 'alive': alive, 'held': None, 'tracked': 'progress file', 'last_step': step,
           'last_step_time': NOW - since, 'seconds_since_step': since, 'steps_per_s': 1.0}
    row.update(kw)
    return row


def _status(job_results, progress_results, stall_seconds=60):
    errors = training_read_errors(job_results, NODES)
    result = (training_unknown_result(errors, 'j-1') if errors
              else training_verdict(job_results, NODES))
    out = {'result': result}
    if progress_results is not None:
        out['progress'] = training_progress_view(progress_results, NODES, stall_seconds, 'j-1')
    return out


def _running(node, ranks):
    return {'job_id': 'j-1', 'node': node, 'role': 'launcher' if node == 'head' else 'ranks', 'running': True,
            'exit_code': None, 'ranks': ranks, 'world_size': 4}


def test_a_running_job_is_left_alone():
    status = _status([_running('head', [0, 1]), _running('w1', [2, 2]), _running('w2', [3, 3])],
                     [{'ranks': [_row('head', 0, 17), _row('head', 1, 17)]}, {'ranks': [_row('w1', 2, 17)]},
                      {'ranks': [_row('w2', 3, 17)]}])
    obs = sv.observe(status, NOW)
    assert (obs['state'], obs['step']) == ('running', 17)
    assert sv.decide(obs)['action'] == 'wait'


def test_a_killed_rank_stops_the_job_naming_the_node_whose_rank_failed_first():
    # the deepspeed launcher on the head: pdsh says w1's ranks exited -9, the head's launcher then 1
    head = dict(_running('head', [0, 1]), running=False, exit_code=1, node_exit_codes={'w1': -9},
                log_tail=['w1: [rank2]: killed'])
    status = _status([head, dict(_running('w1', [2, 2]), running=False), _running('w2', [3, 3])],
                     [{'ranks': [_row('head', 0, 23, alive=False, exit='exit 1')]},
                      {'ranks': [_row('w1', 2, 23, alive=False, exit='signal 9')]}, {'ranks': [_row('w2', 3, 23)]}])
    obs = sv.observe(status, NOW)
    assert obs['state'] == 'failed' and obs['failed_nodes'][0] == 'w1' and obs['step'] == 23
    act = sv.decide(obs)
    assert act == {'action': 'stop', 'seen': 'failed', 'nodes': ['w1'], 'why': 'a rank failed first on w1 (exit -9)'}


def test_a_node_that_does_not_answer_is_named_and_the_job_stopped():
    status = _status([_running('head', [0, 1]), {'unreachable': True, 'msg': 'ssh: Connection timed out during banner'},
                      _running('w2', [3, 3])], None)
    obs = sv.observe(status, NOW)
    assert obs['state'] == 'unreachable' and obs['unreachable_nodes'] == ['w1']
    assert sv.decide(obs) == {'action': 'stop', 'seen': 'unreachable', 'nodes': ['w1'], 'why': 'w1 could not be read'}


def test_a_stall_names_the_ranks_that_stopped_first():
    # w2's rank was stopped (SIGSTOP): its last step is old, the others wait for it in the all-reduce
    progress = [{'ranks': [_row('head', 0, 30, since=95.0), _row('head', 1, 30, since=95.0)]},
                {'ranks': [_row('w1', 2, 30, since=95.0)]},
                {'ranks': [_row('w2', 3, 29, since=100.0, held='stopped (SIGSTOP)')]}]
    status = _status([_running('head', [0, 1]), _running('w1', [2, 2]), _running('w2', [3, 3])], progress, 60)
    obs = sv.observe(status, NOW)
    assert obs['state'] == 'stalled', status['progress']['lines']
    assert 'w2' in obs['stalled_nodes']
    assert sv.decide(obs)['action'] == 'stop' and sv.decide(obs)['seen'] == 'stalled'


def test_a_finished_or_stopped_job_ends_the_supervision():
    done = _status([dict(_running('head', [0, 1]), running=False, exit_code=0)], None)
    assert sv.decide(sv.observe(done, NOW)) == {'action': 'done', 'why': 'the job finished'}
    stopped = sv.observe({'result': {'state': 'stopped'}}, NOW)
    assert sv.decide(stopped)['action'] == 'done' and 'not by its supervisor' in sv.decide(stopped)['why']
    # a read that said nothing (the playbook could not run) is waited out, not taken for a fault
    assert sv.decide(sv.observe(None, NOW)) == {'action': 'wait', 'why': 'the status read gave nothing'}


def _state(nodes=None, restarts=0, failures=None):
    return {'nodes': list(nodes or NODES), 'restarts': restarts, 'failures': list(failures or [])}


def test_a_node_that_fails_its_check_is_left_out_and_the_job_restarts_on_the_others():
    fault = {'step': 23}
    plan = sv.plan_restart(_state(), fault, ['w1'], ['w1'], 20, SETTINGS)
    assert plan['action'] == 'restart' and plan['nodes'] == ['head', 'w2'] and plan['left_out'] == ['w1']
    assert plan['resume_step'] == 20 and plan['why'] == 'without w1'


def test_a_culprit_that_passes_its_check_is_a_transient_failure_restarted_on_all_nodes():
    plan = sv.plan_restart(_state(), {'step': 23}, ['w1'], [], 20, SETTINGS)
    assert plan['nodes'] == NODES and plan['left_out'] == []
    assert plan['why'] == 'on all nodes (w1 passed the check: a transient failure)'


def test_too_few_nodes_left_the_head_lost_or_restarts_used_up_give_up_with_the_reason():
    plan = sv.plan_restart(_state(), {'step': 23}, ['w1'], ['w1', 'w2'], 20, SETTINGS)
    assert plan == {'action': 'give_up', 'why': '1 node(s) would remain (head) and training_min_nodes is 2; '
                                                'left out: w1, w2'}
    plan = sv.plan_restart(_state(), {'step': 23}, ['head'], ['head'], 20, SETTINGS)
    assert plan['action'] == 'give_up' and plan['why'].startswith('the head head failed its check')
    plan = sv.plan_restart(_state(restarts=3, failures=[{'resume_step': 10, 'step': 15}]), {'step': 40}, ['w1'], [],
                           30, SETTINGS)
    assert plan == {'action': 'give_up', 'why': 'training_restarts (3) used up'}


def test_the_same_step_failing_twice_with_no_progress_gives_up():
    state = _state(restarts=1, failures=[{'resume_step': 20, 'step': 23}])
    plan = sv.plan_restart(state, {'step': 23}, ['w1'], [], 20, SETTINGS)
    assert plan == {'action': 'give_up', 'why': 'step 24 failed twice with no progress (resumed from step 20 both times)'}
    # progress past the earlier failure is not the same failure again
    assert sv.plan_restart(state, {'step': 27}, ['w1'], [], 20, SETTINGS)['action'] == 'restart'
    # nor is a failure after a newer checkpoint
    assert sv.plan_restart(state, {'step': 23}, ['w1'], [], 22, SETTINGS)['action'] == 'restart'


def test_no_checkpoint_restarts_from_the_beginning():
    plan = sv.plan_restart(_state(), {'step': 23}, ['w1'], [], None, SETTINGS)
    assert plan['action'] == 'restart' and plan['resume_step'] == 0


def test_the_health_report_names_failing_nodes_and_those_it_has_no_record_of():
    report = {'records': [{'node': 'head', 'check': 'ssh', 'status': 'ok'},
                          {'node': 'w2', 'check': 'disk', 'status': 'warn'},
                          {'node': 'w2', 'check': 'gpu', 'status': 'ok'}]}
    assert sv.bad_nodes(report, NODES) == ['w1']
    report['records'].append({'node': 'w2', 'check': 'nfs', 'status': 'fail'})
    assert sv.bad_nodes(report, NODES) == ['w1', 'w2']
    assert sv.bad_nodes({}, NODES) == NODES
    # a node that could not be reached: its checks are unknown, none ok
    report['records'].append({'node': 'w1', 'check': 'reachable', 'status': 'unknown'})
    assert sv.bad_nodes(report, NODES) == ['w1', 'w2']


def test_the_event_log_tells_the_story_and_the_summary_counts_restarts_steps_and_time_lost(tmp_path, monkeypatch):
    clock = iter([100.0, 130.0, 140.0, 160.0, 190.0, 400.0, 420.0, 450.0, 470.0, 800.0])
    monkeypatch.setattr(sv.time, 'time', lambda: next(clock))
    job = str(tmp_path)
    sv.event(job, 'supervising', nodes=NODES)
    sv.event(job, 'fault', seen='unreachable', nodes=['w1'], step=23, last_step_time=120.0, why='w1 could not be read')
    sv.event(job, 'job_stopped', why='stop ended with rc 2')
    sv.event(job, 'restart', nodes=['head', 'w2'], left_out=['w1'], resume_step=20, lost_steps=3, attempt=1)
    sv.event(job, 'training', step=21)
    sv.event(job, 'fault', seen='failed', nodes=['w2'], step=44, last_step_time=395.0)
    sv.event(job, 'restart', nodes=['head', 'w2'], left_out=[], resume_step=40, lost_steps=4, attempt=2)
    sv.event(job, 'training', step=41)
    sv.event(job, 'done', why='the job finished', step=100)
    with open(os.path.join(job, 'events.jsonl'), 'a') as handle:
        handle.write('{"event": "fau')  # a line cut short by a crash is skipped
    events = sv.read_events(os.path.join(job, 'events.jsonl'))
    assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'restart', 'training', 'fault',
                                            'restart', 'training', 'done']
    assert json.loads(open(os.path.join(job, 'events.jsonl')).readline())['time'] == 100.0
    summary = sv.summarize(events)
    # time lost: 120 -> 190 and 395 -> 450
    assert summary == {'restarts': 2, 'steps_lost': 7, 'time_lost_s': 125.0, 'faults': 2, 'left_out': ['w1'],
                       'outcome': 'finished', 'why': 'the job finished'}
    lines = sv.summary_lines(events)
    assert lines[0] == ('supervision: finished (the job finished); 2 restart(s), 7 step(s) lost, 125 s lost; '
                        'left out: w1')
    assert any('fault seen=unreachable nodes=w1 step=23 why=w1 could not be read' in line for line in lines)


def test_a_give_up_counts_the_time_to_it_and_says_why():
    events = [{'event': 'fault', 'time': 10.0, 'last_step_time': 5.0, 'step': 3},
              {'event': 'gave_up', 'time': 65.0, 'why': 'training_restarts (2) used up'}]
    assert sv.summarize(events)['time_lost_s'] == 60.0
    assert sv.summary_lines(events)[0].startswith('supervision: gave up (training_restarts (2) used up); 0 restart(s)')


def test_two_supervisors_never_act_on_one_job(tmp_path):
    first = sv.lock(str(tmp_path / 'lock'))
    assert first is not None
    assert sv.lock(str(tmp_path / 'lock')) is None
    first.close()
    assert sv.lock(str(tmp_path / 'lock')) is not None


def test_the_report_says_who_supervises_the_job_or_that_nobody_does(tmp_path):
    (tmp_path / 'supervise').mkdir()
    (tmp_path / 'supervise' / 'supervisor.json').write_text(json.dumps(
        {'unit': 'gpucluster-supervise@j-1.service', 'pid': 4242, 'host': 'head', 'doing': 'reading',
         'time': NOW - 5, 'restarts': 1}))
    (tmp_path / 'events.jsonl').write_text(json.dumps({'event': 'supervising', 'time': NOW - 60}) + '\n')
    held = sv.lock(str(tmp_path / 'supervise' / 'lock'))
    lines = sv.report(str(tmp_path), NOW)
    assert lines[0] == 'supervised by gpucluster-supervise@j-1.service (pid 4242 on head, reading 5 s ago; restarts 1)'
    assert lines[1].startswith('supervision: supervised; 0 restart(s)')
    held.close()  # the supervisor died: the job runs on, and status says so
    assert sv.report(str(tmp_path), NOW)[0] == ('nobody supervises this job (no supervisor holds %s/supervise/lock)'
                                                % tmp_path)


def test_a_stopped_supervisor_ends_its_playbook_run_but_not_a_job_started_in_a_session_of_its_own(tmp_path):
    import threading
    import time as clock
    # stands in for ansible-playbook: it starts a "job" in its own session (as training_job does), then works on
    playbook = tmp_path / 'ansible-playbook'
    playbook.write_text('#!/bin/bash\nsetsid sleep 60 & echo $! > %s/job.pid\nsleep 60\n' % tmp_path)
    playbook.chmod(0o755)
    (tmp_path / 'supervise').mkdir()
    settings = {'job_id': 'j-1', 'job_dir': str(tmp_path), 'nodes': NODES, 'ansible_playbook': str(playbook),
                'inventory': 'inv', 'vars_file': 'vars.json', 'action_timeout': 30}
    sup = sv.Supervisor(settings)
    done = []
    runner = threading.Thread(target=lambda: done.append(sup.playbook('train.yml', {'training_state': 'started'})))
    runner.start()
    for _ in range(100):
        if (tmp_path / 'job.pid').exists() and (tmp_path / 'job.pid').read_text().strip():
            break
        clock.sleep(0.05)
    run = sup.child
    sup.end_child()
    runner.join(10)
    job = int((tmp_path / 'job.pid').read_text())
    try:
        assert done == [-15] and run.poll() is not None
        os.kill(job, 0)  # the job lives on
    finally:
        os.kill(job, 9)
    assert 'train.yml' in (tmp_path / 'supervise' / 'ansible.log').read_text()


FAKE_PLAYBOOK = r'''#!/usr/bin/env python3
# stands in for ansible-playbook: answers the supervisor's runs from a script of results
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
extra = {}
for i, word in enumerate(sys.argv):
    if word == '-e' and sys.argv[i + 1].startswith('{'):
        extra.update(json.loads(sys.argv[i + 1]))
limit = sys.argv[sys.argv.index('--limit') + 1] if '--limit' in sys.argv else ''
with open(os.path.join(here, 'script.json')) as handle:
    script = json.load(handle)
kind = 'health' if 'health_tier' in extra else extra['training_state']
with open(os.path.join(here, 'calls.log'), 'a') as handle:
    handle.write(json.dumps([kind, limit, extra.get('training_resume_from', '')]) + '\n')
if kind == 'report':
    with open(os.path.join(here, 'report.json'), 'w') as handle:
        json.dump(extra, handle)
    time.sleep(script.get('report_sleep', 0))
    sys.exit(script.get('report_rc', 0))
if kind in ('status', 'health'):
    answer = script[kind].pop(0)
    if answer is None:
        sys.exit(2)  # a run that failed before it wrote anything
    path = extra['training_status_file'] if kind == 'status' else os.path.join(extra['health_report_dir'],
                                                                               'latest-quick.json')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as handle:
        json.dump(answer, handle)
with open(os.path.join(here, 'script.json'), 'w') as handle:
    json.dump(script, handle)
'''


def _progress(step, node_states=None):
    return {'state': 'running', 'stall': {'stalled': False},
            'ranks': [_row('head', 0, step), _row('head', 1, step), _row('w1', 2, step), _row('w2', 3, step)]}


def _failed(node, step):
    return {'result': {'state': 'failed', 'failed_nodes': [node], 'first_failure': {'node': node, 'exit_code': -9}},
            'progress': dict(_progress(step), state='failed')}


def _supervise(tmp_path, statuses, healths, restarts=3, min_nodes=2, checkpoint_step=20, report=None, **more):
    import gpucluster_progress as gp
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    playbook = bin_dir / 'ansible-playbook'
    playbook.write_text('#!%s\n%s' % (sys.executable, FAKE_PLAYBOOK.split('\n', 1)[1]))
    playbook.chmod(0o755)
    (bin_dir / 'script.json').write_text(json.dumps(dict({'status': statuses, 'health': healths}, **(report or {}))))
    job = tmp_path / 'job'
    (job / 'supervise').mkdir(parents=True)
    ckpt = tmp_path / 'ckpt'
    ckpt.mkdir()
    if checkpoint_step is not None:
        (ckpt / ('step%d' % checkpoint_step)).mkdir()
        gp.commit_checkpoint(str(ckpt), 'step%d' % checkpoint_step, checkpoint_step, 4)
    settings = {'job_id': 'j-1', 'job_dir': str(job), 'nodes': NODES, 'hosts': {}, 'restarts': restarts,
                'min_nodes': min_nodes, 'seconds': 60, 'interval': 0.01, 'action_timeout': 30,
                'checkpoint_dir': str(ckpt), 'ansible_playbook': str(playbook), 'inventory': 'inv',
                'train_playbook': 'gpucluster.multinode.train', 'health_playbook': 'gpucluster.multinode.health',
                'vars_file': 'vars.json', 'health_report_dir': str(tmp_path / 'health')}
    settings.update(more)
    rc = sv.Supervisor(settings).run()
    calls = [json.loads(line) for line in (bin_dir / 'calls.log').read_text().splitlines()]
    return rc, calls, sv.read_events(str(job / 'events.jsonl'))


def _healthy(*bad):
    return {'records': [{'node': n, 'check': 'ssh', 'status': 'fail' if n in bad else 'ok'} for n in NODES]}


def test_the_loop_stops_checks_and_restarts_a_killed_rank_on_all_nodes_then_sees_it_train_and_finish(tmp_path):
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    statuses = [running, _failed('w1', 23), {'result': {'state': 'running'}, 'progress': _progress(25)},
                {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy()])
    assert rc == 0
    assert [c[0] for c in calls] == ['status', 'status', 'stopped', 'health', 'started', 'status', 'status', 'report']
    assert calls[4] == ['started', 'head,w1,w2', str(tmp_path / 'ckpt')]
    assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'checked', 'restart', 'training',
                                            'done']
    restart = events[4]
    assert (restart['nodes'], restart['resume_step'], restart['lost_steps'], restart['attempt']) == (NODES, 20, 3, 1)
    assert sv.summarize(events)['restarts'] == 1 and sv.summarize(events)['outcome'] == 'finished'


def test_the_loop_leaves_out_a_node_that_fails_its_check(tmp_path):
    statuses = [{'result': {'state': 'unknown', 'unknown_nodes': ['w2']}}, {'result': {'state': 'running'},
                                                                            'progress': _progress(21)},
                {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy('w2')])
    assert rc == 0 and calls[3] == ['started', 'head,w1', str(tmp_path / 'ckpt')]
    assert events[1]['seen'] == 'unreachable' and events[3]['nodes'] == ['w2']
    assert events[4]['left_out'] == ['w2'] and events[4]['why'] == 'without w2'


def test_a_node_that_hangs_counts_the_steps_lost_from_the_last_step_read_before_it(tmp_path):
    """The read that finds a node hung may reach no rank at all: the steps lost still count from the step
    the reads before it saw, not 'unknown'; after the restart only the new job's steps count."""
    statuses = [{'result': {'state': 'running'}, 'progress': _progress(23)},
                {'result': {'state': 'unknown', 'unknown_nodes': ['w2']}},
                {'result': {'state': 'unknown'}}, {'result': {'state': 'running'}, 'progress': _progress(21)},
                {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy('w2')])
    assert rc == 0
    assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'checked', 'restart', 'training',
                                            'done']
    assert (events[1]['step'], events[1]['step_read']) == (23, 'before the fault')
    assert (events[4]['resume_step'], events[4]['lost_steps']) == (20, 3)
    assert events[5]['step'] == 21
    assert sv.summarize(events)['steps_lost'] == 3
    # the heartbeat before each read carries the last step read so far (the final read ended the supervision)
    assert json.loads((tmp_path / 'job' / 'supervise' / 'supervisor.json').read_text())['step'] == 21


def test_a_health_run_that_wrote_no_report_calls_no_node_failing_and_judges_by_the_fault(tmp_path):
    statuses = [_failed('w1', 23), {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [None])
    assert rc == 0 and calls[3] == ['started', 'head,w2', str(tmp_path / 'ckpt')]
    checked = [e for e in events if e['event'] == 'checked'][0]
    assert checked['nodes'] == ['w1']
    assert checked['why'].startswith('the quick health tier wrote no report (health.yml rc 2; its output in ')
    assert checked['why'].endswith('judged by the fault alone: w1')


def test_a_node_failing_after_every_restart_gives_up_after_training_restarts_with_the_reason(tmp_path):
    statuses = [_failed('w1', 23), _failed('w1', 26), _failed('w1', 29)]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy(), _healthy(), _healthy()], restarts=2)
    assert rc == 1
    assert [c[0] for c in calls].count('started') == 2
    assert [e['event'] for e in events].count('restart') == 2
    assert events[-1]['event'] == 'gave_up' and events[-1]['why'] == 'training_restarts (2) used up'


def test_without_a_checkpoint_the_restart_starts_from_the_beginning_and_says_so(tmp_path):
    statuses = [_failed('w1', 23), {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy()], checkpoint_step=None)
    assert rc == 0 and calls[3] == ['started', 'head,w1,w2', '']
    restart = [e for e in events if e['event'] == 'restart'][0]
    assert restart['resume_step'] == 0 and restart['lost_steps'] == 23
    assert restart['why'] == ('on all nodes (w1 passed the check: a transient failure); no complete checkpoint under '
                              '%s yet: restarting from the beginning' % (tmp_path / 'ckpt'))


# ----- the report page at the end ------------------------------------------------------------------
def test_a_job_done_gets_its_report_page_written_on_the_head_without_a_fetch(tmp_path):
    statuses = [{'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}]
    rc, calls, events = _supervise(tmp_path, statuses, [])
    assert rc == 0 and [c[0] for c in calls] == ['status', 'report']
    extra = json.loads((tmp_path / 'bin' / 'report.json').read_text())
    assert extra['training_job_id'] == 'j-1' and extra['training_report_fetch'] is False
    assert extra['training_supervisor_acting'] is True
    assert [e['event'] for e in events] == ['supervising', 'done']


def test_a_job_given_up_gets_its_report_page_too(tmp_path):
    statuses = [_failed('w1', 23), _failed('w1', 26)]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy(), _healthy()], restarts=1)
    assert rc == 1 and calls[-1][0] == 'report'
    assert events[-1]['event'] == 'gave_up'


def test_a_report_run_that_fails_is_an_event_not_a_crash(tmp_path):
    statuses = [{'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [], report={'report_rc': 2})
    assert rc == 0 and calls[-1][0] == 'report'
    assert [e['event'] for e in events] == ['supervising', 'done', 'report_failed']
    assert events[-1]['why'].startswith('train.yml report ended with rc 2 (its output in ')
    assert sv.summarize(events)['outcome'] == 'finished'  # the job's outcome is the done, not the report


def test_a_report_run_is_bounded_in_time(tmp_path):
    statuses = [{'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    started = time.time()
    rc, calls, events = _supervise(tmp_path, statuses, [], report={'report_sleep': 60}, report_timeout=1)
    assert rc == 0 and time.time() - started < 30
    assert events[-1]['event'] == 'report_failed' and 'rc 124' in events[-1]['why']


def test_a_report_run_that_cannot_start_is_an_event_not_a_crash(tmp_path):
    job = tmp_path / 'job'
    (job / 'supervise').mkdir(parents=True)
    settings = {'job_id': 'j-1', 'job_dir': str(job), 'nodes': NODES, 'ansible_playbook': str(tmp_path / 'missing'),
                'inventory': 'inv', 'train_playbook': 'gpucluster.multinode.train', 'vars_file': 'vars.json',
                'action_timeout': 30}
    sv.Supervisor(settings).write_report()
    events = sv.read_events(str(job / 'events.jsonl'))
    assert [e['event'] for e in events] == ['report_failed']
    assert events[0]['why'].startswith('the report page was not written: ')
