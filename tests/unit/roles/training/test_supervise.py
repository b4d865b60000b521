"""The supervisor's decisions (roles/training/files/gpucluster_supervise.py): what a status read says,
whom to blame, where to restart, when to give up; its event log and summary.

The status reads are built with the filters status.yml itself uses (training_job_verdict on training_job
results, training_progress_view on training_progress results)."""

import json
import os
import shutil
import sys
import time

from ansible_collections.gpucluster.multinode.plugins.filter.training import training_job_verdict, training_status_record
from ansible_collections.gpucluster.multinode.plugins.filter.training_monitor import training_progress_view

FILES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')
sys.path.insert(0, FILES)

import gpucluster_supervise as sv  # noqa: E402
import supervisor_driver as sdriver  # noqa: E402
import supervisor_glance as sglance  # noqa: E402
import supervisor_reads as sreads  # noqa: E402
import supervisor_record as srecord  # noqa: E402
import supervision as core  # noqa: E402  the supervision core, as the supervisor imports it

sys.path.insert(0, os.path.dirname(__file__))
from test_supervise_core import _rec  # noqa: E402  (a status read as status.yml writes it)

NODES = ['head', 'w1', 'w2']
NOW = 1764000000.0
SETTINGS = {'restarts': 3, 'min_nodes': 2}


def _row(node, rank, step, alive=True, since=2.0, **kw):
    row = {'node': node, 'rank': rank, 'alive': alive, 'held': None, 'tracked': 'progress file', 'last_step': step,
           'last_step_time': NOW - since, 'seconds_since_step': since, 'steps_per_s': 1.0}
    row.update(kw)
    return row


def _status(job_results, progress_results, stall_seconds=60):
    result = training_job_verdict(job_results, NODES, NODES, 'j-1')
    progress = (training_progress_view(progress_results, NODES, stall_seconds, 'j-1')
                if progress_results is not None else None)
    return training_status_record(result, progress)


def _running(node, ranks):
    return {'job_id': 'j-1', 'node': node, 'role': 'launcher' if node == 'head' else 'ranks', 'running': True,
            'exit_code': None, 'ranks': ranks, 'world_size': 4}


def test_a_running_job_is_left_alone():
    status = _status([_running('head', [0, 1]), _running('w1', [2, 2]), _running('w2', [3, 3])],
                     [{'ranks': [_row('head', 0, 17), _row('head', 1, 17)]}, {'ranks': [_row('w1', 2, 17)]},
                      {'ranks': [_row('w2', 3, 17)]}])
    obs = sreads.observe(_rec(status), NOW)
    assert (obs['state'], obs['step']) == ('running', 17)
    assert core.decide(obs)['action'] == 'wait'


def test_a_killed_rank_stops_the_job_naming_the_node_whose_rank_failed_first():
    # the deepspeed launcher on the head: pdsh says w1's ranks exited -9, the head's launcher then 1
    head = dict(_running('head', [0, 1]), running=False, exit_code=1, node_exit_codes={'w1': -9},
                log_tail=['w1: [rank2]: killed'])
    status = _status([head, dict(_running('w1', [2, 2]), running=False), _running('w2', [3, 3])],
                     [{'ranks': [_row('head', 0, 23, alive=False, exit='exit 1')]},
                      {'ranks': [_row('w1', 2, 23, alive=False, exit='signal 9')]}, {'ranks': [_row('w2', 3, 23)]}])
    obs = sreads.observe(_rec(status), NOW)
    assert obs['state'] == 'failed' and obs['failed_nodes'][0] == 'w1' and obs['step'] == 23
    act = core.decide(obs)
    assert act == {'action': 'stop', 'seen': 'failed', 'nodes': ['w1'], 'why': 'a rank failed first on w1 (exit -9)'}


def test_a_node_that_does_not_answer_is_named_and_the_job_stopped():
    status = _status([_running('head', [0, 1]), {'unreachable': True, 'msg': 'ssh: Connection timed out during banner'},
                      _running('w2', [3, 3])], None)
    obs = sreads.observe(_rec(status), NOW)
    assert obs['state'] == 'unreachable' and obs['unreachable_nodes'] == ['w1']
    assert core.decide(obs) == {'action': 'stop', 'seen': 'unreachable', 'nodes': ['w1'], 'why': 'w1 could not be read'}


def test_a_stall_names_the_ranks_that_stopped_first():
    # w2's rank was stopped (SIGSTOP): its last step is old, the others wait for it in the all-reduce
    progress = [{'ranks': [_row('head', 0, 30, since=95.0), _row('head', 1, 30, since=95.0)]},
                {'ranks': [_row('w1', 2, 30, since=95.0)]},
                {'ranks': [_row('w2', 3, 29, since=100.0, held='stopped (SIGSTOP)')]}]
    status = _status([_running('head', [0, 1]), _running('w1', [2, 2]), _running('w2', [3, 3])], progress, 60)
    obs = sreads.observe(_rec(status), NOW)
    assert obs['state'] == 'stalled', status['progress']['lines']
    assert 'w2' in obs['stalled_nodes']
    assert core.decide(obs)['action'] == 'stop' and core.decide(obs)['seen'] == 'stalled'


def test_a_finished_or_stopped_job_ends_the_supervision():
    done = _status([dict(_running('head', [0, 1]), running=False, exit_code=0)], None)
    assert core.decide(sreads.observe(_rec(done), NOW)) == {'action': 'done', 'why': 'the job finished'}
    stopped = sreads.observe(_rec({'result': {'state': 'stopped'}}), NOW)
    assert core.decide(stopped)['action'] == 'ended' and 'not by its supervisor' in core.decide(stopped)['why']
    # a read that said nothing (the playbook could not run) is waited out, not taken for a fault
    assert core.decide(sreads.observe(_rec(None), NOW)) == {'action': 'wait', 'why': 'the status read gave nothing'}


def test_the_event_log_tells_the_story_and_the_summary_counts_restarts_steps_and_time_lost(tmp_path, monkeypatch):
    clock = iter([100.0, 130.0, 140.0, 160.0, 190.0, 400.0, 420.0, 450.0, 470.0, 800.0])
    monkeypatch.setattr(sv.time, 'time', lambda: next(clock))
    job = str(tmp_path)  # the supervisor's state directory
    umask = os.umask(0o077)  # users read the events whatever the supervisor's umask
    try:
        core.append_event(job, 'supervising', nodes=NODES)
    finally:
        os.umask(umask)
    core.append_event(job, 'fault', seen='unreachable', nodes=['w1'], step=23, last_step_time=120.0, why='w1 could not be read')
    core.append_event(job, 'job_stopped', why='stop ended with rc 2')
    core.append_event(job, 'restart', nodes=['head', 'w2'], left_out=['w1'], resume_step=20, lost_steps=3, attempt=1)
    core.append_event(job, 'training', step=21)
    core.append_event(job, 'fault', seen='failed', nodes=['w2'], step=44, last_step_time=395.0)
    core.append_event(job, 'restart', nodes=['head', 'w2'], left_out=[], resume_step=40, lost_steps=4, attempt=2)
    core.append_event(job, 'training', step=41)
    core.append_event(job, 'done', why='the job finished', step=100)
    with open(os.path.join(job, 'events.jsonl'), 'a') as handle:
        handle.write('{"event": "fau')  # a line cut short by a crash is skipped
    events = core.read_events(job)
    assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'restart', 'training', 'fault',
                                            'restart', 'training', 'done']
    assert core.read_events(os.path.join(job, 'events.jsonl')) == events  # the file itself (the report page's reader)
    assert json.loads(open(os.path.join(job, 'events.jsonl')).readline())['time'] == 100.0
    assert os.stat(os.path.join(job, 'events.jsonl')).st_mode & 0o777 == 0o644  # users read the events
    summary = core.summarize(events)
    # time lost: 120 -> 190 and 395 -> 450
    assert summary == {'restarts': 2, 'steps_lost': 7, 'time_lost_s': 125.0, 'faults': 2, 'left_out': ['w1'],
                       'outcome': 'finished', 'why': 'the job finished'}
    lines = core.summary_lines(events)
    assert lines[0] == ('supervision: finished (the job finished); 2 restart(s), 7 step(s) lost, 125 s lost; '
                        'left out: w1')
    assert any('fault seen=unreachable nodes=w1 step=23 why=w1 could not be read' in line for line in lines)


def test_two_supervisors_never_act_on_one_job(tmp_path):
    first = sv.lock(str(tmp_path / 'lock'))
    assert first is not None
    assert sv.lock(str(tmp_path / 'lock')) is None
    first.close()
    assert sv.lock(str(tmp_path / 'lock')) is not None


def test_the_report_says_who_supervises_the_job_or_that_nobody_does(tmp_path):
    # everything in the supervisor's state directory: its heartbeat, its events, its lock, its memory
    (tmp_path / 'supervisor.json').write_text(json.dumps(
        {'unit': 'gpucluster-supervise@j-1.service', 'pid': 4242, 'host': 'head', 'doing': 'reading',
         'time': NOW - 5, 'restarts': 1, 'attempt': 2, 'until': None}))
    (tmp_path / 'events.jsonl').write_text(json.dumps({'event': 'supervising', 'time': NOW - 60}) + '\n')
    held = sv.lock(str(tmp_path / 'lock'))
    lines = sv.report(str(tmp_path), NOW)
    assert lines[0] == ('supervised by gpucluster-supervise@j-1.service (pid 4242 on head, reading 5 s ago; attempt 2, '
                        'restarts 1; for as long as the job runs)')
    assert lines[1].startswith('supervision: supervised; 0 restart(s)')
    # a bound the user set is shown before it ends
    beat = json.loads((tmp_path / 'supervisor.json').read_text())
    (tmp_path / 'supervisor.json').write_text(json.dumps(dict(beat, until=NOW + 3600)))
    assert sv.report(str(tmp_path), NOW)[0].endswith('restarts 1; until %s (training_supervise_seconds))'
                                                     % srecord.when(NOW + 3600))
    # the report only looks: the supervisor still holds its lock after it
    assert sv.lock(str(tmp_path / 'lock')) is None
    # and a report that looks at the same time as another is not taken for a supervisor
    import fcntl
    with open(str(tmp_path / 'lock')) as looking:
        held.close()
        fcntl.flock(looking, fcntl.LOCK_SH | fcntl.LOCK_NB)
        assert srecord.lock_held(str(tmp_path / 'lock')) is False
    held = sv.lock(str(tmp_path / 'lock'))
    assert srecord.lock_held(str(tmp_path / 'lock')) is True
    held.close()  # the supervisor died: the job runs on, and status says so
    assert sv.report(str(tmp_path), NOW)[0] == 'nobody supervises this job (no supervisor holds %s/lock)' % tmp_path
    # with its memory: what it was at and its last error, and never `supervised` on the next line
    (tmp_path / 'memory.json').write_text(json.dumps({'job_id': 'j-1', 'attempt': 2, 'state': {'restarts': 1}}))
    with open(str(tmp_path / 'events.jsonl'), 'a') as handle:
        handle.write(json.dumps({'event': 'supervisor_error', 'time': NOW - 30, 'why': 'OSError: disk full'}) + '\n')
    lines = sv.report(str(tmp_path), NOW)
    assert lines[0] == ('nobody supervises this job (no supervisor holds %s/lock): its supervisor is not running '
                        '(attempt 2, 1 restart(s) used; its last event at %s: supervisor_error: OSError: disk full); the job '
                        'runs on unsupervised until it starts again (systemctl status gpucluster-supervise@j-1.service)'
                        % (tmp_path, time.strftime('%H:%M:%S', time.localtime(NOW - 30))))
    assert lines[1].startswith('supervision: not supervised now; 0 restart(s)')
    (tmp_path / 'memory.json').write_text(json.dumps({'job_id': 'j-1', 'attempt': 2, 'ended': 'gave_up'}))
    assert sv.report(str(tmp_path), NOW)[0].endswith(': its supervision ended (gave up)')
    (tmp_path / 'lock').unlink()  # never supervised here
    assert sv.report(str(tmp_path), NOW)[0].startswith('nobody supervises this job')


def test_a_stopped_supervisor_ends_its_playbook_run_but_not_a_job_started_in_a_session_of_its_own(tmp_path):
    import threading
    import time as clock
    # stands in for ansible-playbook: it starts a "job" in its own session (as training_job does), then works on
    playbook = tmp_path / 'ansible-playbook'
    playbook.write_text('#!/bin/bash\nsetsid sleep 60 & echo $! > %s/job.pid\nsleep 60\n' % tmp_path)
    playbook.chmod(0o755)
    (tmp_path / 'state').mkdir()
    settings = {'job_id': 'j-1', 'job_dir': str(tmp_path / 'job'), 'state_dir': str(tmp_path / 'state'),
                'nodes': NODES, 'ansible_playbook': str(playbook), 'inventory': 'inv', 'vars_file': 'vars.json',
                'action_timeout': 30}
    sup = sdriver.Supervisor(settings)
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
    assert 'train.yml' in (tmp_path / 'state' / 'ansible.log').read_text()


FAKE_PLAYBOOK = r"""#!/usr/bin/env python3
# stands in for ansible-playbook: answers the supervisor's runs from a script of results
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
extra = {}
for i, word in enumerate(sys.argv):
    if word == '-e' and sys.argv[i + 1].startswith('{'):
        extra.update(json.loads(sys.argv[i + 1]))
limit = sys.argv[sys.argv.index('--limit') + 1] if '--limit' in sys.argv else ''
import fcntl
lock = open(os.path.join(here, 'script.lock'), 'w')
fcntl.flock(lock, fcntl.LOCK_EX)  # the direct probe's ansible runs beside a read: one of them at a time here
with open(os.path.join(here, 'script.json')) as handle:
    script = json.load(handle)
kind = 'health' if 'health_tier' in extra else extra['training_state']
with open(os.path.join(here, 'calls.log'), 'a') as handle:
    handle.write(json.dumps([kind, limit, extra.get('training_resume_from', '')]) + '\n')
with open(os.path.join(here, 'extra.log'), 'a') as handle:
    handle.write(json.dumps(extra) + '\n')
if kind == 'report':
    with open(os.path.join(here, 'report.json'), 'w') as handle:
        json.dump(extra, handle)
    time.sleep(script.get('report_sleep', 0))
    sys.exit(script.get('report_rc', 0))
answers = script.get(kind) or []
answer = answers.pop(0) if answers else ({} if kind in ('stopped', 'started') else None)
with open(os.path.join(here, 'script.json'), 'w') as handle:
    json.dump(script, handle)
lock.close()
if kind in ('status', 'health'):
    # _sleep: this answer's run takes so long (else sleep_<kind>, every such run)
    time.sleep(answer.pop('_sleep') if isinstance(answer, dict) and '_sleep' in answer else script.get('sleep_' + kind, 0))
    if answer is None:
        print('ERROR! the script of answers ran out')
        sys.exit(2)  # a run that failed before it wrote anything
    if '_fail' in answer:  # a run that failed with this output and wrote nothing
        print(answer['_fail']['output'])
        sys.exit(answer['_fail']['rc'])
    path = extra['training_status_file'] if kind == 'status' else os.path.join(extra['health_report_dir'],
                                                                               'latest-quick.json')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as handle:
        json.dump(answer, handle)
elif answer:
    print(answer.get('output', ''))
    sys.exit(answer.get('rc', 0))
"""

FAKE_ANSIBLE = r"""#!/usr/bin/env python3
# stands in for ansible (the direct probe's ping): each host answers as the script says, else is unreachable
import fcntl, json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
lock = open(os.path.join(here, 'script.lock'), 'w')
fcntl.flock(lock, fcntl.LOCK_EX)
with open(os.path.join(here, 'script.json')) as handle:
    script = json.load(handle)
answers = script.get('ping') or []
answer = answers.pop(0) if answers else {}
with open(os.path.join(here, 'script.json'), 'w') as handle:
    json.dump(script, handle)
with open(os.path.join(here, 'calls.log'), 'a') as handle:
    handle.write(json.dumps(['ping', sys.argv[1], sys.argv[sys.argv.index('-m') + 1]]) + '\n')
lock.close()
rc = 0
for host in sys.argv[1].split(','):
    if answer.get(host) == 'SUCCESS':
        print('%s | SUCCESS => {"changed": false,"ping": "pong"}' % host)
    else:
        print('%s | UNREACHABLE!: Task failed: Failed to connect to the host via ssh: ssh: connect to host %s port '
              '22: No route to host' % (host, host))
        rc = 4
sys.exit(rc)
"""


def _progress(step, node_states=None, attempt=None):
    out = {'state': 'running', 'stall': {'stalled': False},
           'ranks': [_row('head', 0, step), _row('head', 1, step), _row('w1', 2, step), _row('w2', 3, step)]}
    if attempt is not None:
        out['attempt'] = attempt
    return out


def _failed(node, step):
    return {'result': {'state': 'failed', 'failed_nodes': [node], 'first_failure': {'node': node, 'exit_code': -9}},
            'progress': dict(_progress(step), state='failed')}


def _unreachable(node):
    return {'result': {'state': 'unknown', 'unknown_nodes': [node]}}


def _read_fails(rc, output):
    return {'_fail': {'rc': rc, 'output': output}}


def _closed_port():
    import socket
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def _script(base, **answers):
    bin_dir = base / 'bin'
    bin_dir.mkdir()
    for name, text in (('ansible-playbook', FAKE_PLAYBOOK), ('ansible', FAKE_ANSIBLE)):
        (bin_dir / name).write_text('#!%s\n%s' % (sys.executable, text.split('\n', 1)[1]))
        (bin_dir / name).chmod(0o755)
    (bin_dir / 'script.json').write_text(json.dumps(answers))
    return bin_dir


def _listing(job):
    return sorted(os.path.relpath(os.path.join(d, f), str(job)) for d, _, fs in os.walk(str(job)) for f in fs)


def _supervise(tmp_path, statuses, healths, restarts=3, min_nodes=2, checkpoint_step=20, report=None, ping=None,
               started=None, stopped=None, job_files=None, meanwhile=None, **more):
    """Run the supervisor's loop against the fake playbooks: (rc, the runs it made, its events). job_files:
    {path under the job directory: text} there from the start (what the job's nodes wrote on the shared storage);
    meanwhile(job directory): what the job's nodes do while it runs (a thread), [paths it wrote there]."""
    import gpucluster_progress as gp
    bin_dir = _script(tmp_path, status=[_rec(s) for s in statuses], health=healths, ping=ping or [], started=started or [],
                      stopped=stopped or [], **(report or {}))
    job = tmp_path / 'job'
    job.mkdir()
    for name, text in (job_files or {}).items():
        (job / name).parent.mkdir(parents=True, exist_ok=True)
        (job / name).write_text(text)
    before = _listing(job)
    written = []
    if meanwhile is not None:
        import threading
        threading.Thread(target=lambda: written.extend(meanwhile(job)), daemon=True).start()
    state = tmp_path / 'state'
    state.mkdir()
    ckpt = tmp_path / 'ckpt'
    ckpt.mkdir()
    if checkpoint_step is not None:
        (ckpt / ('step%d' % checkpoint_step)).mkdir()
        gp.commit_checkpoint(str(ckpt), 'step%d' % checkpoint_step, checkpoint_step, 4)
    settings = {'job_id': 'j-1', 'job_dir': str(job), 'state_dir': str(state), 'nodes': NODES, 'hosts': {},
                'addresses': dict((n, '127.0.0.1') for n in NODES), 'ssh_port': _closed_port(),
                'restarts': restarts, 'min_nodes': min_nodes, 'seconds': 60, 'interval': 0.01, 'action_timeout': 30,
                'checkpoint_dir': str(ckpt), 'ansible_playbook': str(bin_dir / 'ansible-playbook'), 'inventory': 'inv',
                'train_playbook': 'gpucluster.multinode.train', 'health_playbook': 'gpucluster.multinode.health',
                'vars_file': 'vars.json', 'health_report_dir': str(tmp_path / 'health')}
    settings.update(more)
    rc = sdriver.driver_for(settings).run()
    calls = [json.loads(line) for line in (bin_dir / 'calls.log').read_text().splitlines()]
    assert _listing(job) == sorted(before + written)  # the supervisor writes nothing on the shared storage
    return rc, calls, core.read_events(str(state))


def _runs(calls):
    """The playbook runs, in order (the ad-hoc runs, the direct probe's ping and the fence, run beside them: their
    place among them varies)."""
    return [c for c in calls if c[0] != 'ping']


def _pings(calls):
    """The direct probe's pings (the fence's ad-hoc command runs are not among them)."""
    return [c for c in calls if c[0] == 'ping' and c[2] == 'ansible.builtin.ping']


def _extras(tmp_path):
    return [json.loads(line) for line in (tmp_path / 'bin' / 'extra.log').read_text().splitlines()]


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
    # the job's first start was attempt 1: the restart is attempt 2
    assert (restart['nodes'], restart['resume_step'], restart['lost_steps'], restart['attempt']) == (NODES, 20, 3, 2)
    assert core.summarize(events)['restarts'] == 1 and core.summarize(events)['outcome'] == 'finished'


def test_a_node_that_misses_two_reads_and_the_direct_probe_is_a_fault_and_is_left_out_when_it_fails_its_check(
        tmp_path):
    statuses = [_unreachable('w2'), _unreachable('w2'), {'result': {'state': 'running'}, 'progress': _progress(21)},
                {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy('w2')], ping=[{'head': 'SUCCESS'}])
    assert rc == 0
    # the first read missed w2: a direct probe (an ansible ping of w2 alone) beside a second read, then the stop
    assert _pings(calls) == [['ping', 'w2', 'ansible.builtin.ping']]
    runs = _runs(calls)
    assert runs[:2] == [['status', '', ''], ['status', '', '']]
    # confirmed lost: neither the stop nor the health run waits on it (each would wait out its SSH timeout)
    assert runs[2] == ['stopped', 'head,w1', ''] and runs[3] == ['health', 'head,w1', '']
    assert runs[4] == ['started', 'head,w1', str(tmp_path / 'ckpt')]
    assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'checked', 'restart', 'training',
                                            'done']
    fault = events[1]
    assert fault['seen'] == 'unreachable' and fault['nodes'] == ['w2']
    assert fault['why'].startswith('w2 did not answer two reads and a direct probe (w2: port ')
    assert 'Connection refused' in fault['why'] and 'No route to host' in fault['why']
    assert events[2]['why'] == ('every rank, container and launcher stopped on head, w1; w2 lost: its ranks are '
                                'killed when it answers again')
    assert events[3]['nodes'] == ['w2'] and events[3]['why'].endswith('(w2 lost: not checked)')
    assert events[4]['left_out'] == ['w2'] and events[4]['why'] == 'without w2'
    # train.yml is told the stop's --limit leaves w2 out on purpose (it refuses such a limit otherwise)
    stop = [x for x in _extras(tmp_path) if x.get('training_state') == 'stopped'][0]
    assert stop['training_lost_nodes'] == ['w2']


def test_a_spare_the_job_started_on_stays_in_its_layout_when_another_node_is_left_out(tmp_path):
    # the job started on head, w1, w2 and the spare s1 (training_spares); w2 is lost: the restart runs on head,
    # w1 and s1, and passes s1 as training_spares (without it train.yml lays the job out on head and w1 alone)
    statuses = [_unreachable('w2'), _unreachable('w2'), {'result': {'state': 'running'}, 'progress': _progress(21)},
                {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    health = {'records': [{'node': n, 'check': 'ssh', 'status': 'ok'} for n in ('head', 'w1', 's1')]}
    rc, calls, events = _supervise(tmp_path, statuses, [health], ping=[{}], nodes=['head', 'w1', 'w2', 's1'],
                                   job_spares=['s1'], spares=[], min_nodes=2)
    assert rc == 0
    restart = [e for e in events if e['event'] == 'restart'][0]
    assert restart['nodes'] == ['head', 'w1', 's1'] and restart['left_out'] == ['w2']
    assert restart['why'] == 'without w2 (no ready spare: the job shrinks)'
    start = [x for x in _extras(tmp_path) if x.get('training_state') == 'started'][0]
    assert start['training_spares'] == ['s1']
    assert _runs(calls)[2] == ['stopped', 'head,w1,s1', '']


def test_a_node_that_hangs_counts_the_steps_lost_from_the_last_step_read_before_it(tmp_path):
    """The read that finds a node hung may reach no rank at all: the steps lost still count from the step
    the reads before it saw, not 'unknown'; after the restart only the new job's steps count."""
    statuses = [{'result': {'state': 'running'}, 'progress': _progress(23)}, _unreachable('w2'), _unreachable('w2'),
                {'result': {'state': 'unknown'}}, {'result': {'state': 'running'}, 'progress': _progress(21)},
                {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy('w2')])
    assert rc == 0
    assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'checked', 'restart', 'training',
                                            'done']
    assert (events[1]['step'], events[1]['step_read']) == (23, 'before the fault')
    assert (events[4]['resume_step'], events[4]['lost_steps']) == (20, 3)
    assert events[5]['step'] == 21
    assert core.summarize(events)['steps_lost'] == 3
    # the heartbeat after each read carries the last step read (the final read ended the supervision)
    beat = json.loads((tmp_path / 'state' / 'supervisor.json').read_text())
    assert (beat['step'], beat['attempt'], beat['failed_reads']) == (40, 2, 0)
    assert isinstance(beat['read_seconds'], float) and 'blind' not in beat


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
    assert rc == srecord.EXIT_ENDED
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
    assert rc == srecord.EXIT_ENDED and calls[-1][0] == 'report'
    assert events[-1]['event'] == 'gave_up'


def test_a_report_run_that_fails_is_an_event_not_a_crash(tmp_path):
    statuses = [{'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [], report={'report_rc': 2})
    assert rc == 0 and calls[-1][0] == 'report'
    assert [e['event'] for e in events] == ['supervising', 'done', 'report_failed']
    assert events[-1]['why'].startswith('train.yml report ended with rc 2 (its output in ')
    assert core.summarize(events)['outcome'] == 'finished'  # the job's outcome is the done, not the report


def test_a_report_run_is_bounded_in_time(tmp_path):
    statuses = [{'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    started = time.time()
    rc, calls, events = _supervise(tmp_path, statuses, [], report={'report_sleep': 60}, report_timeout=1)
    assert rc == 0 and time.time() - started < 30
    assert events[-1]['event'] == 'report_failed' and 'rc 124' in events[-1]['why']


def test_a_report_run_that_cannot_start_is_an_event_not_a_crash(tmp_path):
    state = tmp_path / 'state'
    state.mkdir()
    settings = {'job_id': 'j-1', 'job_dir': str(tmp_path / 'job'), 'state_dir': str(state), 'nodes': NODES,
                'ansible_playbook': str(tmp_path / 'missing'), 'inventory': 'inv',
                'train_playbook': 'gpucluster.multinode.train', 'vars_file': 'vars.json', 'action_timeout': 30}
    sdriver.Supervisor(settings).write_report()
    events = core.read_events(str(state))
    assert [e['event'] for e in events] == ['report_failed']
    # a program that cannot be run (its venv gone) is a run that failed, said with why
    assert events[0]['why'].startswith('train.yml report ended with rc 127 (its output in %s/ansible.log): %s/missing '
                                       'cannot be run: No such file or directory' % (state, tmp_path))


# ----- a node that misses a read --------------------------------------------------------------------
def test_a_node_that_misses_one_read_is_not_stopped(tmp_path):
    statuses = [{'result': {'state': 'running'}, 'progress': _progress(12)}, _unreachable('w2'),
                {'result': {'state': 'running'}, 'progress': _progress(13)},
                {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [])  # w2 does not answer the ping either
    assert rc == 0
    assert [c[0] for c in _runs(calls)] == ['status', 'status', 'status', 'status', 'report']
    assert len(_pings(calls)) == 1  # beside the third read
    assert [e['event'] for e in events] == ['supervising', 'read_missed', 'done']
    missed = events[1]
    assert missed['nodes'] == ['w2'] and missed['attempt'] == 1
    assert missed['why'].startswith('not read once, not a fault: w2: the second read reached it; the direct probe '
                                    'failed (port ')


def test_a_node_that_answers_the_direct_probe_is_not_stopped_and_a_run_of_misses_is_said_once(tmp_path):
    statuses = [_unreachable('w2'), _unreachable('w2'), _unreachable('w2'), _unreachable('w2'),
                {'result': {'state': 'running'}, 'progress': _progress(14)},
                {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [], ping=[{'w2': 'SUCCESS'}, {'w2': 'SUCCESS'}])
    assert rc == 0
    assert [c[0] for c in _runs(calls)] == ['status', 'status', 'status', 'status', 'status', 'status', 'report']
    assert len(_pings(calls)) == 2  # one beside the second read of each pair
    assert [e['event'] for e in events] == ['supervising', 'read_missed', 'done']
    assert events[1]['why'].startswith('not read once, not a fault: w2: the second read could not reach it either; '
                                       'it answered the direct probe (port ')
    assert events[1]['why'].endswith('; ansible ping: pong)')


# ----- a supervisor that cannot read the job ----------------------------------------------------------
FATAL_READ = ('TASK [Read the job on every node] ****\n'
              'fatal: [w1]: UNREACHABLE! => {"changed": false, "msg": "Failed to connect to the host via ssh: ssh: '
              'connect to host w1 port 22: No route to host", "unreachable": true}\n')


def test_reads_that_fail_k_times_in_a_row_make_the_supervisor_blind_until_one_works_and_it_stops_nothing(tmp_path):
    statuses = [{'result': {'state': 'running'}, 'progress': _progress(12)}] + [_read_fails(4, FATAL_READ)] * 3 + [
        {'result': {'state': 'running'}, 'progress': _progress(14)},
        {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [], blind_reads=3)
    assert rc == 0
    assert [c[0] for c in calls] == ['status'] * 6 + ['report']  # nothing stopped, no probe
    assert [e['event'] for e in events] == ['supervising', 'blind', 'sighted', 'done']
    blind = events[1]
    assert blind['why'].startswith('3 reads in a row failed: train.yml status ended with rc 4 and wrote no status: '
                                   'task "Read the job on every node": w1: unreachable: Failed to connect to the host '
                                   'via ssh: ssh: connect to host w1 port 22: No route to host; last good read ')
    assert blind['why'].endswith(' s ago') and blind['failed_reads'] == 3 and blind['attempt'] == 1
    assert events[2]['why'] == 'reads again after 3 failed reads'
    beat = json.loads((tmp_path / 'state' / 'supervisor.json').read_text())
    assert 'blind' not in beat and beat['failed_reads'] == 0


def test_fewer_failed_reads_than_blind_reads_say_nothing(tmp_path):
    statuses = [_read_fails(2, 'ERROR! boom')] * 2 + [{'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [], blind_reads=3)
    assert rc == 0 and [e['event'] for e in events] == ['supervising', 'done']
    assert [c[0] for c in calls] == ['status'] * 3 + ['report']


def test_a_blind_supervisor_says_so_in_its_heartbeat_figures_and_report(tmp_path):
    # one good read, then every read fails (the fake's answers run out) until the supervision's time ends
    (tmp_path / 'metrics').mkdir()
    rc, calls, events = _supervise(tmp_path, [{'result': {'state': 'running'}, 'progress': _progress(12)}], [],
                                   blind_reads=2, seconds=2, metrics_dir=str(tmp_path / 'metrics'))
    assert rc == 0 and [e['event'] for e in events] == ['supervising', 'blind', 'stopped']
    assert set(c[0] for c in calls) == {'status'}
    why = events[1]['why']
    assert why.startswith('2 reads in a row failed: train.yml status ended with rc 2 and wrote no status: the script '
                          'of answers ran out; last good read ')
    state = tmp_path / 'state'
    beat = json.loads((state / 'supervisor.json').read_text())
    assert (beat['doing'], beat['blind']) == ('blind', why) and beat['failed_reads'] >= 2
    assert oct(os.stat(str(state / 'supervisor.json')).st_mode & 0o777) == oct(0o644)
    prom = (state / 'supervisor.prom').read_text()
    assert 'gpucluster_supervisor_blind{job="j-1"} 1\n' in prom
    assert 'gpucluster_supervisor_failed_reads{job="j-1"} %d\n' % beat['failed_reads'] in prom
    # the figures left node_exporter's directory when the supervision ended
    assert os.listdir(str(tmp_path / 'metrics')) == []
    held = sv.lock(str(state / 'lock'))  # as if it still ran
    try:
        lines = sv.report(str(state), time.time())
    finally:
        held.close()
    assert lines[0] == 'supervisor cannot read the job: %s (since %s)' % (
        why, time.strftime('%H:%M:%S', time.localtime(beat['blind_since'])))


# ----- attempts ----------------------------------------------------------------------------------
def test_every_event_carries_its_attempt_the_restart_passes_it_and_a_read_of_the_attempt_before_is_ignored(tmp_path):
    stale = dict(_failed('w1', 23))
    stale['result'] = dict(stale['result'], attempt=1)
    statuses = [{'result': {'state': 'running', 'attempt': 1}, 'progress': _progress(12, attempt=1)},
                dict(_failed('w1', 23), result=dict(_failed('w1', 23)['result'], attempt=1)),
                stale,  # the restarted job has not written yet: its read still says attempt 1 failed
                {'result': {'state': 'running', 'attempt': 2}, 'progress': _progress(21, attempt=2)},
                {'result': {'state': 'succeeded', 'attempt': 2}, 'progress': _progress(40, attempt=2)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy()])
    assert rc == 0
    assert [c[0] for c in calls] == ['status', 'status', 'stopped', 'health', 'started', 'status', 'status', 'status',
                                     'report']
    assert [(e['event'], e['attempt']) for e in events] == [
        ('supervising', 1), ('fault', 1), ('job_stopped', 1), ('checked', 1), ('restart', 2), ('training', 2),
        ('done', 2)]
    started = [x for x in _extras(tmp_path) if x.get('training_state') == 'started']
    assert [x['training_attempt'] for x in started] == [2]
    assert events[5]['step'] == 21


def test_the_first_attempt_is_the_one_settings_names(tmp_path):
    statuses = [_failed('w1', 23), {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy()], attempt=4)
    assert rc == 0 and [c[0] for c in calls].count('started') == 1
    assert [e['attempt'] for e in events if e['event'] in ('supervising', 'fault', 'restart')] == [4, 4, 5]
    assert [x['training_attempt'] for x in _extras(tmp_path) if x.get('training_state') == 'started'] == [5]


# ----- a restart that fails says why ----------------------------------------------------------------
def test_a_restart_that_fails_says_the_failing_tasks_message(tmp_path):
    output = ('TASK [Start the launcher on the head] ****\n'
              '[ERROR]: Task failed: Action failed: host head: the launcher exited at once: deepspeed: command not '
              'found\nOrigin: /x/started.yml:40:3\n\n'
              'fatal: [head]: FAILED! => {"changed": false, "msg": "host head: the launcher exited at once: '
              'deepspeed: command not found"}\n\nPLAY RECAP ****\nhead : ok=3 failed=1\n')
    statuses = [_failed('w1', 23), {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy()], started=[{'rc': 2, 'output': output}])
    # the job was then read as done (a start that failed half way is read as the fake says)
    assert rc == 0 and [c[0] for c in calls] == ['status', 'stopped', 'health', 'started', 'status', 'report']
    failed = [e for e in events if e['event'] == 'restart_failed']
    assert len(failed) == 1 and failed[0]['attempt'] == 2
    assert failed[0]['why'] == ('train.yml started ended with rc 2: task "Start the launcher on the head": head: host '
                                'head: the launcher exited at once: deepspeed: command not found')


# ----- a stop that failed on a node that answered: the job may run on there ---------------------------
def _stop_output(host, caption, msg):
    return ("TASK [gpucluster.multinode.training : Stop the job's processes on every node] ****\n"
            'fatal: [%s]: %s => {"changed": false, "msg": "%s"}\n\nPLAY RECAP ****\n%s : ok=3 failed=1\n'
            % (host, caption, msg, host))


def test_a_stop_that_left_processes_of_the_job_is_not_restarted_on_and_says_why(tmp_path):
    left = 'node w1: 1 process(es) of job j-1 are left: 9738 (they survived SIGKILL for 15 s)'
    statuses = [_failed('w1', 23), {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy()],
                                   stopped=[{'rc': 2, 'output': _stop_output('w1', 'FAILED!', left)}])
    # no health run, no start on top of what the stop left
    assert rc == srecord.EXIT_ENDED and [c[0] for c in calls] == ['status', 'stopped', 'report']
    assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'gave_up']
    assert events[2]['why'] == 'stop ended with rc 2 (a node that does not answer keeps its frozen ranks); it failed ' \
                               'on w1 (%s)' % left
    assert events[3]['why'] == ('not restarted: the stop failed on w1, where the job may still run; a restart would '
                                'start beside it (end what is left there, then start the job again)')
    assert core.summarize(events)['outcome'] == 'gave up'


def test_a_stop_that_could_not_reach_a_node_goes_on_to_the_check_and_the_restart(tmp_path):
    statuses = [_failed('w1', 23), {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    unreachable = _stop_output('w2', 'UNREACHABLE!', 'Failed to connect to the host via ssh')
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy('w2')], stopped=[{'rc': 4, 'output': unreachable}])
    assert rc == 0 and [c[0] for c in calls] == ['status', 'stopped', 'health', 'started', 'status', 'report']
    assert calls[3][1] == 'head,w1'


# ----- the program as the unit runs it ------------------------------------------------------------
def test_the_program_holds_the_lock_in_its_state_dir_and_a_stop_ends_its_run_and_its_figures(tmp_path):
    import signal
    import subprocess
    bin_dir = _script(tmp_path, status=[_rec({'result': {'state': 'running'}, 'progress': _progress(12)})], health=[],
                      sleep_status=60)
    state = tmp_path / 'state'
    state.mkdir()
    (tmp_path / 'metrics').mkdir()
    settings = {'job_id': 'j-1', 'job_dir': str(tmp_path / 'job'), 'state_dir': str(state), 'nodes': NODES,
                'restarts': 1, 'min_nodes': 2, 'seconds': 120, 'interval': 1, 'action_timeout': 30,
                'ansible_playbook': str(bin_dir / 'ansible-playbook'), 'inventory': 'inv',
                'train_playbook': 'gpucluster.multinode.train', 'health_playbook': 'gpucluster.multinode.health',
                'vars_file': 'vars.json', 'health_report_dir': str(tmp_path / 'health'),
                'metrics_dir': str(tmp_path / 'metrics'), 'unit': 'gpucluster-supervise@j-1.service'}
    (state / 'settings.json').write_text(json.dumps(settings))
    # installed as the training role installs it: its files and the collection's modules it imports, side by side
    lib = tmp_path / 'lib'
    lib.mkdir()
    import yaml
    with open(os.path.join(FILES, '..', 'vars', 'main.yml')) as handle:
        for src in yaml.safe_load(handle)['__training_supervisor_files']:
            shutil.copy(os.path.join(FILES, '..', '..', '..', src) if '/' in src else os.path.join(FILES, src), str(lib))
    program = str(lib / 'gpucluster_supervise.py')
    sup = subprocess.Popen([sys.executable, program, str(state / 'settings.json')])
    try:
        for _ in range(200):  # until its first read runs
            if (bin_dir / 'calls.log').exists():
                break
            time.sleep(0.05)
        assert (tmp_path / 'metrics' / 'gpucluster_supervisor_j-1.prom').exists()
        assert sv.report(str(state))[0].startswith('supervised by gpucluster-supervise@j-1.service (pid %d on '
                                                   % sup.pid)
        second = subprocess.run([sys.executable, program, str(state / 'settings.json')], stdout=subprocess.PIPE,
                                universal_newlines=True, timeout=30)
        assert second.returncode == 3 and 'is supervised already (the lock %s/lock is held)' % state in second.stdout
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        if sup.poll() is None:
            sup.kill()
    events = core.read_events(str(state))
    assert [e['event'] for e in events] == ['supervising', 'stopped']
    assert events[1]['why'].startswith('the supervisor was stopped (signal 15: systemctl stop, or its host shutting down)')
    assert os.listdir(str(tmp_path / 'metrics')) == [] and (state / 'supervisor.prom').exists()
    assert sv.report(str(state))[0].startswith(
        'nobody supervises this job (no supervisor holds %s/lock): its supervisor is not running (attempt 1, 0 '
        'restart(s) used; its last event at ' % state)
    assert ': stopped: the supervisor was stopped (signal 15' in sv.report(str(state))[0]


# ----- Slurm: requeued and held, drained, released under the same id ---------------------------------
def test_a_slurm_job_is_held_by_the_stop_its_failing_node_drained_and_released_by_the_restart(tmp_path):
    statuses = [_failed('w2', 23), {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy('w2')], launcher='slurm')
    assert rc == 0 and [c[0] for c in calls] == ['status', 'stopped', 'health', 'started', 'status', 'report']
    stop, health, start = [x for x in _extras(tmp_path) if x.get('training_state') in ('stopped', 'started')
                           or 'health_tier' in x]
    assert stop['training_slurm_hold'] is True                     # requeuehold, not scancel
    assert health['health_slurm_drain'] is True                     # the node that fails its check is drained
    assert calls[3][1] == 'head,w1' and start['training_attempt'] == 2  # released on the kept nodes


def test_a_slurm_job_given_up_has_its_held_job_cancelled(tmp_path):
    statuses = [_failed('w1', 23), _failed('w1', 26)]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy(), _healthy()], restarts=1, launcher='slurm')
    assert rc == srecord.EXIT_ENDED
    stops = [x for x in _extras(tmp_path) if x.get('training_state') == 'stopped']
    assert [x.get('training_slurm_hold') for x in stops] == [True, True, None]   # the last: scancel of the held job
    assert [e['event'] for e in events][-2:] == ['gave_up', 'job_stopped']
    assert events[-1]['why'] == 'the held Slurm job cancelled'


def test_other_launchers_neither_hold_nor_drain(tmp_path):
    statuses = [_failed('w1', 23), {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    _supervise(tmp_path, statuses, [_healthy()], launcher='torchrun')
    assert not [x for x in _extras(tmp_path) if 'training_slurm_hold' in x or 'health_slurm_drain' in x]


# ----- the glance: the job's files on the shared storage between two reads ------------------------
def _rank_file(rank, attempt=1, steps=(), done=None, header_time=NOW):
    lines = ['# gpucluster-progress rank=%d host=n pid=1 world=4 attempt=%d time=%.3f' % (rank, attempt, header_time)]
    lines += ['step=%d loss=0.5 time=%.3f' % (step, NOW + step) for step in steps]
    if done is not None:
        lines.append('# done step=%d time=%.3f peak_rss_kib=1' % (done, NOW + 100))
    return '\n'.join(lines) + '\n'


def test_a_rank_file_is_read_from_its_first_line_and_its_end_only(tmp_path):
    import gpucluster_progress as gp
    path = tmp_path / 'rank-3.log'
    path.write_text(_rank_file(3, attempt=2, steps=range(1, 2000)))
    marks = gp.rank_file_marks(str(path), tail_bytes=256)
    assert (marks['rank'], marks['attempt'], marks['step'], marks['step_time'], marks['done']) == (
        3, 2, 1999, NOW + 1999, None)
    path.write_text(_rank_file(3, steps=[5], done=5))
    assert gp.rank_file_marks(str(path))['done'] == 5
    path.write_text('step=5 loss=1 time=1\n')  # no header: not a progress file of the collection
    assert gp.rank_file_marks(str(path)) is None
    assert gp.rank_file_marks(str(tmp_path / 'gone.log')) is None


def test_a_rank_file_says_its_host_and_its_longest_gap_between_two_lines_with_a_time(tmp_path):
    import gpucluster_progress as gp
    path = tmp_path / 'rank-5.log'
    path.write_text('# gpucluster-progress rank=5 host=w2.lab pid=7 world=8 attempt=1 time=100.000\n'
                    'step=1 loss=0.5 time=101.000\nstep=2 loss=0.5 time=102.000\n'
                    '# heartbeat phase=checkpoint step=2 time=104.000\n'
                    '# heartbeat phase=checkpoint step=2 since=104.000 time=114.000\n'  # a save: a beat every 10 s
                    'step=3 loss=0.5 time=115.500\n')
    marks = gp.rank_file_marks(str(path))
    assert (marks['host'], marks['step'], marks['gap']) == ('w2.lab', 3, 10.0)
    path.write_text('# gpucluster-progress rank=5 host=w2 pid=7 world=8 attempt=1 time=100.000\nstep=1 loss=0.5 time=101\n')
    assert gp.rank_file_marks(str(path))['gap'] is None  # one line with a time: no pace yet


def _late(rank, host, silent, gap=1.0, step=40, done=None, attempt=1):
    return {'rank': rank, 'host': host, 'attempt': attempt, 'mtime': NOW - silent, 'step': step, 'gap': gap,
            'done': done}


def test_a_glance_names_the_nodes_of_ranks_late_past_their_bound_by_their_hosts():
    ranks = [_late(0, 'head', 2), _late(1, 'w1', 31), _late(2, 'w2.example.org', 45),
             _late(3, 'w2.example.org', 50, gap=20.0),  # a rank whose lines come every 20 s: late past 60 s only
             _late(4, 'w1', 90, done=40), _late(5, 'w1', 90, step=None),  # done; no step yet (it loads): no sign
             _late(6, 'w1', 900, attempt=0)]  # an attempt before: no sign
    signs = sglance.glance_signs({}, ranks, NODES, 1, 600, NOW, late_seconds=30)
    assert [s['kind'] for s in signs] == ['done', 'late']
    # since: the first rank became late (rank 2: 45 s silent, late past 30 s)
    assert signs[1:] == [{'kind': 'late', 'nodes': ['w1', 'w2'], 'since': NOW - 45 + 30,
                          'why': 'rank(s) late: 1 on w1 wrote nothing for 31 s (its bound 30 s); '
                                 '2 on w2 wrote nothing for 45 s (its bound 30 s)'}]
    assert [s['kind'] for s in sglance.glance_signs({}, ranks, NODES, 1, 600, NOW, late_seconds=0)] == ['done']  # 0: none late
    # a rank past the stall bound is quiet, not late; a host that names no node of the job: no node named,
    # the job is read whole
    quiet = sglance.glance_signs({}, [_late(1, 'w1', 90)], NODES, 1, 60, NOW, late_seconds=30)
    assert [s['kind'] for s in quiet] == ['quiet']
    unknown = sglance.glance_signs({}, [_late(1, 'gpu-17', 40), _late(2, 'w2', 40)], NODES, 1, 600, NOW, late_seconds=30)
    assert unknown[0]['nodes'] == [] and '1 on gpu-17 wrote nothing' in unknown[0]['why']


def test_a_frozen_node_seen_late_is_confirmed_by_quick_reads_of_it_and_the_head_never_a_read_of_every_node(
        tmp_path):
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    finished = {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}
    # w2's rank stepped every second, then wrote nothing for 40 s (its node froze): the quick read of the head
    # and w2 cannot reach w2 (w1 left out), nor can the second quick read; the direct probe fails too
    quick_lost = {'result': {'state': 'unknown', 'unknown_nodes': ['w2'], 'left_out': ['w1']}}
    rank = ('# gpucluster-progress rank=3 host=w2 pid=7 world=4 attempt=1 time=%.3f\n' % (time.time() - 60)
            + ''.join('step=%d loss=0.5 time=%.3f\n' % (i, time.time() - 50 + i) for i in range(1, 11)))

    def frozen(job):
        path = job / 'progress' / 'rank-3.log'
        os.utime(str(path), (time.time() - 40, time.time() - 40))
        return []

    rc, calls, events = _supervise(
        tmp_path, [running, quick_lost, quick_lost, finished], [_healthy()], interval=30,
        glance_seconds=0.05, late_seconds=30, job_files={'progress/rank-3.log': rank}, meanwhile=frozen)
    assert rc == 0
    fault = [e for e in events if e['event'] == 'fault'][0]
    assert fault['seen'] == 'unreachable' and fault['nodes'] == ['w2']
    assert fault['sign'].startswith('rank(s) late: 3 on w2 wrote nothing for 4') and fault['quick_read'] == ['head', 'w2']
    assert fault['why'].startswith('w2 did not answer two reads and a direct probe (w2: port ')
    runs = _runs(calls)
    # the first read, then two quick reads (the second beside the ping of w2): never a second read of every node
    assert [r[:2] for r in runs[:3]] == [['status', ''], ['status', 'head,w2'], ['status', 'head,w2']]
    assert _pings(calls) == [['ping', 'w2', 'ansible.builtin.ping']]
    assert runs[3][:2] == ['stopped', 'head,w1'] and runs[5][:2] == ['started', 'head,w1']
    assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'checked', 'restart', 'training',
                                            'done']


def test_a_late_rank_on_a_node_that_answers_costs_a_quick_read_and_one_whole_read(tmp_path):
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    finished = {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}
    quick_running = {'result': {'state': 'running', 'left_out': ['w1']}}
    rank = ('# gpucluster-progress rank=3 host=w2 pid=7 world=4 attempt=1 time=%.3f\nstep=1 loss=0.5 time=%.3f\n'
            % (time.time() - 60, time.time() - 59))

    def evaluating(job):  # the rank evaluates for a while and writes no line meanwhile
        os.utime(str(job / 'progress' / 'rank-3.log'), (time.time() - 59, time.time() - 59))
        return []

    began = time.time()
    rc, calls, events = _supervise(tmp_path, [running, quick_running, running, finished], [], interval=1.5,
                                   glance_seconds=0.05, late_seconds=30, job_files={'progress/rank-3.log': rank},
                                   meanwhile=evaluating)
    # no fault; the late node that answered is on record (a frozen node that came back says so too)
    assert rc == 0 and [e['event'] for e in events] == ['supervising', 'late', 'done']
    late = events[1]
    assert late['nodes'] == ['w2'] and late['why'].startswith('rank(s) late: 3 on w2 wrote nothing for ')
    assert late['why'].endswith('the quick read of head, w2 (%.1f s) reached them and read no failure: not a fault'
                                % float(late['why'].rsplit('(', 1)[1].split(' s)')[0]))
    # the sign: a quick read of the head and w2 that saw it running, then the job read whole; the same sign is
    # not read for again while it lasts: the next read waited for the interval
    assert [c[1] for c in calls if c[0] == 'status'] == ['', 'head,w2', '', '']
    assert time.time() - began >= 1.5
    log = (tmp_path / 'state' / 'ansible.log').read_text()
    assert 'the quick read of head, w2' in log and 'saw no failure' in log


def test_a_late_rank_whose_quick_read_gave_no_answer_is_no_late_event_the_job_is_read_whole(tmp_path):
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    finished = {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}
    rank = ('# gpucluster-progress rank=3 host=w2 pid=7 world=4 attempt=1 time=%.3f\nstep=1 loss=0.5 time=%.3f\n'
            % (time.time() - 60, time.time() - 59))

    def evaluating(job):
        os.utime(str(job / 'progress' / 'rank-3.log'), (time.time() - 59, time.time() - 59))
        return []

    # the quick read wrote no status (None): nothing is said of w2, the whole read decides
    rc, calls, events = _supervise(tmp_path, [running, None, running, finished], [], interval=1.5,
                                   glance_seconds=0.05, late_seconds=30, job_files={'progress/rank-3.log': rank},
                                   meanwhile=evaluating)
    assert rc == 0 and [e['event'] for e in events] == ['supervising', 'done']
    assert [c[1] for c in calls if c[0] == 'status'][:3] == ['', 'head,w2', '']


def test_a_glance_names_a_node_whose_part_exited_non_zero_the_earliest_first_and_only_the_jobs_nodes_now():
    exits = {'w2': {'code': 137, 'mtime': NOW + 2}, 'w1': {'code': 1, 'mtime': NOW + 1},
             'old': {'code': 137, 'mtime': NOW}}  # a node a restart left out: its file stays, no sign
    signs = sglance.glance_signs(exits, [], NODES, 1, 60, NOW + 3)
    why = 'the job on w1, w2 exited with code 1, code 137 (its exit files)'
    # since: the first of them ended (a read that began before it is ended by the sign)
    assert signs == [{'kind': 'exit', 'nodes': ['w1', 'w2'], 'since': NOW + 1, 'failed': True, 'why': why}]
    assert sglance.glance_signs({'old': {'code': 137, 'mtime': NOW}}, [], NODES, 1, 60, NOW) == []
    ended = sglance.glance_signs({'head': {'code': 0, 'mtime': NOW}}, [], NODES, 1, 60, NOW)
    assert ended[0]['why'] == 'the job on head ended with code 0'


def test_a_glance_sees_ranks_done_or_quiet_of_this_attempt_only():
    ranks = [{'rank': 0, 'attempt': 2, 'mtime': NOW - 5, 'done': None},
             {'rank': 1, 'attempt': 2, 'mtime': NOW - 90, 'done': None},   # quiet for 90 s, the bound 60
             {'rank': 2, 'attempt': 2, 'mtime': NOW - 90, 'done': 40},     # done: not quiet
             {'rank': 3, 'attempt': 1, 'mtime': NOW - 900, 'done': None}]  # the attempt before: no sign
    signs = sglance.glance_signs({}, ranks, NODES, 2, 60, NOW)
    assert [(s['kind'], s['why'], s['since']) for s in signs] == [
        ('done', 'rank(s) 2 wrote done', NOW - 90), ('quiet', 'rank(s) 1 wrote nothing for more than 60 s', NOW - 30)]
    assert [s['kind'] for s in sglance.glance_signs({}, ranks, NODES, 2, 0, NOW)] == ['done']  # no stall bound: no quiet


def test_a_killed_rank_is_read_at_once_when_the_glance_sees_its_exit_file_not_at_the_interval(tmp_path):
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    finished = {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}
    began = time.time()
    # the quick read of w1 and the head (head, w1 read; w2 left out) after the restart, as the role answers it
    quick_running = {'result': {'state': 'running', 'left_out': ['w2']}}
    quick_failed = {'result': dict(_failed('w1', 23)['result'], left_out=['w2'])}  # no figures in a quick read
    rc, calls, events = _supervise(
        tmp_path, [running, quick_failed, running, quick_running, finished], [_healthy()], interval=25,
        glance_seconds=0.05,
        job_files={'exit/w1': '137\n', 'progress/rank-2.log': _rank_file(2, steps=[23], header_time=time.time())})
    took = time.time() - began
    assert rc == 0
    fault = [e for e in events if e['event'] == 'fault'][0]
    assert fault['sign'] == 'the job on w1 exited with code 137 (its exit file)' and fault['sign_time'] >= began
    # the read after the first one did not wait the 25 s interval: a quick read of the head and w1 alone saw the
    # failure; after the restart the sign (the same file: a real start removes it) counts again, its quick read
    # sees no failure and the job is read whole at once
    assert fault['quick_read'] == ['head', 'w1'] and fault['nodes'] == ['w1']
    # the quick read reads no rank's figures: the step and its time are the last read before the fault
    assert (fault['step'], fault['step_read']) == (12, 'before the fault') and fault['last_step_time'] is not None
    assert took < 25, took
    assert [c[0] for c in calls] == ['status', 'status', 'stopped', 'health', 'started', 'status', 'status', 'status',
                                     'report']
    assert [c[1] for c in calls if c[0] == 'status'] == ['', 'head,w1', '', 'head,w1', '']  # the quick ones: --limit
    quick = [x for x in _extras(tmp_path) if x.get('training_status_nodes')]
    assert [(x['training_status_nodes'], x['training_progress_report']) for x in quick] == [(['head', 'w1'], False)] * 2
    log = (tmp_path / 'state' / 'ansible.log').read_text()
    assert 'the quick read of head, w1' in log and 'saw no failure (a read of part of the job saw no failure' in log


def test_a_read_that_began_before_a_rank_was_killed_is_ended_by_its_sign_and_the_job_read_again(tmp_path):
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    finished = {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}
    # each read takes 4 s; the rank is killed (its node's exit file written) 0.5 s into the first one; the quick
    # reads of the head and w1 (w2 left out): the first sees the failure, the one after the restart does not
    quick_failed = {'result': dict(_failed('w1', 23)['result'], left_out=['w2']), '_sleep': 4}
    quick_running = {'result': {'state': 'running', 'left_out': ['w2']}}
    statuses = [dict(running, _sleep=4), quick_failed, dict(running, _sleep=0), quick_running, finished]
    killed = []

    def kill(job):
        time.sleep(0.5)
        (job / 'exit').mkdir(parents=True, exist_ok=True)
        (job / 'exit' / 'w1').write_text('137\n')
        killed.append(time.time())
        return ['exit/w1']

    rc, calls, events = _supervise(tmp_path, statuses, [_healthy()], interval=30, glance_seconds=0.1, meanwhile=kill)
    assert rc == 0
    fault = [e for e in events if e['event'] == 'fault'][0]
    # the first read was ended by the sign and the quick read of the head and w1, 4 s, saw the fault: not the
    # rest of the first read and then a whole second one (8 s)
    assert fault['sign'] == 'the job on w1 exited with code 137 (its exit file)' and fault['quick_read'] == ['head', 'w1']
    assert fault['time'] - killed[0] < 7, fault['time'] - killed[0]
    assert [c[0] for c in calls] == ['status', 'status', 'stopped', 'health', 'started', 'status', 'status', 'status',
                                     'report']
    assert [c[1] for c in calls if c[0] == 'status'] == ['', 'head,w1', '', 'head,w1', '']
    log = (tmp_path / 'state' / 'ansible.log').read_text()
    assert 'the read was ended: the job on w1 exited with code 137 (its exit file), after it began' in log


def test_a_sign_of_what_began_before_the_read_leaves_the_read_to_its_end(tmp_path):
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    finished = {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}
    # the exit file is there before the first read begins: that read sees it, it is not ended
    # (after the restart the same file is a sign again: its quick read of the head and w1 sees no failure)
    quick_running = {'result': {'state': 'running', 'left_out': ['w2']}}
    rc, calls, events = _supervise(tmp_path, [dict(_failed('w1', 23), _sleep=1.5), running, quick_running, finished],
                                   [_healthy()], interval=0.2, glance_seconds=0.1, job_files={'exit/w1': '137\n'})
    assert rc == 0
    assert [c[0] for c in calls][:4] == ['status', 'stopped', 'health', 'started']
    assert [c[1] for c in calls if c[0] == 'status'] == ['', '', 'head,w1', '']
    assert 'the read was ended' not in (tmp_path / 'state' / 'ansible.log').read_text()
    fault = [e for e in events if e['event'] == 'fault'][0]
    assert 'sign' not in fault  # the read saw the fault itself


def test_a_sign_a_read_judged_is_not_read_for_again_while_it_lasts(tmp_path):
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    finished = {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}
    began = time.time()
    rc, calls, events = _supervise(tmp_path, [running, running, finished], [], interval=1.5, glance_seconds=0.05,
                                   job_files={'exit/head': '0\n'})
    assert rc == 0 and [c[0] for c in calls] == ['status', 'status', 'status', 'report']
    # the sign made the second read at once; the third waited the interval: the same sign was read already
    assert time.time() - began >= 1.5


def test_a_job_directory_that_cannot_be_read_turns_the_glances_off_and_the_reads_go_on(tmp_path):
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    finished = {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}
    rc, calls, events = _supervise(tmp_path, [running, finished], [], interval=0.3, glance_seconds=0.05,
                                   job_dir=str(tmp_path / 'not-mounted'))
    assert rc == 0 and [c[0] for c in calls] == ['status', 'status', 'report']
    glance = [e for e in events if e['event'] == 'glance']
    off = 'glances off: %s: No such file or directory' % (tmp_path / 'not-mounted')
    assert len(glance) == 1 and glance[0]['why'].startswith(off)
    beat = json.loads((tmp_path / 'state' / 'supervisor.json').read_text())
    assert beat['glance'].startswith('off: ')
    assert 'gpucluster_supervisor_glance_off{job="j-1"} 1' in (tmp_path / 'state' / 'supervisor.prom').read_text()


def test_a_glance_that_hangs_is_given_up_named_and_the_glances_come_back_when_it_returns(tmp_path, monkeypatch):
    import threading
    monkeypatch.setattr(sglance, 'GLANCE_TIMEOUT', 0.2)
    release = threading.Event()

    def hung(path):  # a read of the shared storage that does not come back until released
        release.wait(10)

    (tmp_path / 'job' / 'progress').mkdir(parents=True)
    (tmp_path / 'job' / 'progress' / 'rank-0.log').write_text(_rank_file(0))
    (tmp_path / 'state').mkdir()
    sup = sdriver.Supervisor({'job_id': 'j-1', 'job_dir': str(tmp_path / 'job'), 'state_dir': str(tmp_path / 'state'),
                              'nodes': NODES, 'interval': 5, 'glance_seconds': 0.05})
    sup.glance = sglance.Glance(str(tmp_path / 'job'), hung)
    deadline = time.time() + 5
    while sup.glance_off is None and time.time() < deadline:
        assert sup.glance_once(time.time() + 0.1) is None
    assert sup.glance_off == 'the job directory %s did not answer within 0.2 s' % (tmp_path / 'job')
    assert not sup.glance.start(NODES, 1, 0)  # never a second glance beside the hung one
    release.set()
    sup.glance.thread.join(5)
    sup.glance_once(time.time() + 1)
    events = [e['why'] for e in core.read_events(str(tmp_path / 'state')) if e['event'] == 'glance']
    assert events[0].startswith('glances off: the job directory') and events[1].startswith('glances on again')
    assert sup.glance_off is None


def test_a_quick_read_that_fails_or_sees_no_failure_is_followed_by_a_read_of_the_whole_job(tmp_path):
    # the exit file of w1 (137) is there: its quick read fails (rc 4, no status), the read of every node then
    # decides (the rank failed there), and the failed quick read counts as no failed read
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    finished = {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}
    quick_running = {'result': {'state': 'running', 'left_out': ['w2']}}
    statuses = [running, _read_fails(4, 'fatal: [w1]: UNREACHABLE! => {"msg": "ssh: timed out"}'), _failed('w1', 23),
                running, quick_running, finished]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy()], interval=30, glance_seconds=0.05,
                                   job_files={'exit/w1': '137\n'})
    assert rc == 0
    assert [c[1] for c in calls if c[0] == 'status'] == ['', 'head,w1', '', '', 'head,w1', '']
    fault = [e for e in events if e['event'] == 'fault'][0]
    assert fault['nodes'] == ['w1'] and 'quick_read' not in fault
    assert not [e for e in events if e['event'] in ('blind', 'read_missed')]
    log = (tmp_path / 'state' / 'ansible.log').read_text()
    assert 'the quick read of head, w1' in log and 'saw no failure' in log


def test_a_glance_of_a_part_that_ended_with_code_0_makes_no_quick_read(tmp_path):
    running = {'result': {'state': 'running'}, 'progress': _progress(12)}
    finished = {'result': {'state': 'succeeded'}, 'progress': dict(_progress(40), state='finished')}
    rc, calls, _ = _supervise(tmp_path, [running, finished], [], interval=30, glance_seconds=0.05,
                              job_files={'exit/w1': '0\n'})
    assert rc == 0 and [c[1] for c in calls if c[0] == 'status'] == ['', '']


def _exited(node, step, code):
    return {'result': {'state': 'failed', 'failed_nodes': [node], 'first_failure': {'node': node, 'exit_code': code}},
            'progress': dict(_progress(step), state='failed')}


def test_a_failure_policy_rule_fails_the_job_at_once_on_the_exit_code_it_names_without_a_health_run(tmp_path):
    policy = [{'on': ['exit'], 'exit_codes': [3], 'action': 'fail'}]
    rc, calls, events = _supervise(tmp_path, [_exited('w1', 23, 3)], [], failure_policy=policy)
    assert rc == srecord.EXIT_ENDED
    assert [c[0] for c in calls] == ['status', 'stopped', 'report']          # no health run, no start
    assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'gave_up']
    assert (events[1]['failure'], events[1]['exit_code']) == ('exit', 3)
    assert events[-1]['why'] == 'training_failure_policy[0] fails the job on a exit failure'


def test_an_uncounted_restart_leaves_training_restarts_whole(tmp_path):
    # a rank killed by a signal (a preemption, the OOM killer) restarts without using the one restart
    policy = [{'on': ['signal'], 'action': 'restart_uncounted'}]
    statuses = [_failed('w1', 23), {'result': {'state': 'running'}, 'progress': _progress(25)},
                _exited('w1', 27, 1), {'result': {'state': 'running'}, 'progress': _progress(28)},
                {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
    rc, calls, events = _supervise(tmp_path, statuses, [_healthy(), _healthy()], restarts=1, failure_policy=policy)
    assert rc == 0
    restarts = [e for e in events if e['event'] == 'restart']
    assert [(r['counted'], r['restarts_used']) for r in restarts] == [(False, 0), (True, 1)]
    assert [e['failure'] for e in events if e['event'] == 'fault'] == ['signal', 'exit']
