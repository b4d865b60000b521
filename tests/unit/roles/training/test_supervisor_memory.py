"""The supervisor outlives its own faults (roles/training/files/gpucluster_supervise.py): what it decided is in
its memory (memory.json) before it acts, a supervisor that starts again goes on from there (same attempt, same
restarts used, a recovery half done finished, never done twice), an unexpected error is an event, a crash loop
ends in a gave_up that says why, its tools gone are a blind supervisor, not a crash; it follows the job for as
long as the job runs unless a bound is set; and a checkpoint directory it cannot read stops the restart, naming
the directory and the account, instead of a restart from step 0."""

import json
import os
import shutil
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_supervise import (NODES, _closed_port, _extras, _failed, _healthy, _progress, _script,  # noqa: E402
                            core)
from test_supervise_core import _rec  # noqa: E402
import supervisor_driver as sdriver  # noqa: E402
import supervisor_record as srecord  # noqa: E402
import supervisor_runs as sruns  # noqa: E402

RUNNING_2 = {'result': {'state': 'running', 'attempt': 2}, 'progress': _progress(25, attempt=2)}
DONE_2 = {'result': {'state': 'succeeded', 'attempt': 2}, 'progress': _progress(40, attempt=2)}


def _answers(bin_dir, statuses, healths=(), **more):
    """A new script of answers for the fake playbooks (the calls made so far are kept)."""
    (bin_dir / 'script.json').write_text(json.dumps(dict(status=[_rec(s) for s in statuses], health=list(healths),
                                                         ping=[], started=[], stopped=[], **more)))


def _setup(tmp_path, statuses, healths=(), checkpoint_step=20, **more):
    bin_dir = _script(tmp_path, status=[_rec(s) for s in statuses], health=list(healths), ping=[], started=[],
                      stopped=[])
    for name in ('job', 'state', 'ckpt'):
        (tmp_path / name).mkdir()
    if checkpoint_step is not None:
        import gpucluster_progress as gp
        (tmp_path / 'ckpt' / ('step%d' % checkpoint_step)).mkdir()
        gp.commit_checkpoint(str(tmp_path / 'ckpt'), 'step%d' % checkpoint_step, checkpoint_step, 4)
    settings = {'job_id': 'j-1', 'job_dir': str(tmp_path / 'job'), 'state_dir': str(tmp_path / 'state'),
                'nodes': NODES, 'hosts': {}, 'addresses': dict((n, '127.0.0.1') for n in NODES),
                'ssh_port': _closed_port(), 'restarts': 3, 'min_nodes': 2, 'seconds': 60, 'interval': 0.01,
                'action_timeout': 30, 'checkpoint_dir': str(tmp_path / 'ckpt'),
                'ansible_playbook': str(bin_dir / 'ansible-playbook'), 'inventory': 'inv',
                'train_playbook': 'gpucluster.multinode.train', 'health_playbook': 'gpucluster.multinode.health',
                'vars_file': 'vars.json', 'health_report_dir': str(tmp_path / 'health'), 'glance_seconds': 0}
    settings.update(more)
    return bin_dir, settings


def _calls(bin_dir):
    return [json.loads(line)[0] for line in (bin_dir / 'calls.log').read_text().splitlines()]


def _memory(tmp_path):
    return json.loads((tmp_path / 'state' / 'memory.json').read_text())


def _events(tmp_path):
    return core.read_events(str(tmp_path / 'state'))


def test_a_supervisor_that_dies_mid_recovery_goes_on_from_its_memory_with_the_same_attempt_and_budget(
        tmp_path, monkeypatch):
    bin_dir, settings = _setup(tmp_path, [_failed('w1', 23)])
    real_health = sdriver.Supervisor.health

    def dies(self, nodes):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(sdriver.Supervisor, 'health', dies)
    assert sdriver.Supervisor(settings).run() == 1  # the unit starts it again
    events = _events(tmp_path)
    assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'supervisor_error']
    assert events[-1]['why'].startswith('OSError: [Errno 28] No space left on device (test_supervisor_memory.py line ')
    memory = _memory(tmp_path)
    assert (memory['phase']['phase'], memory['attempt'], memory['state']['restarts']) == ('checking', 1, 0)
    assert oct(os.stat(str(tmp_path / 'state' / 'memory.json')).st_mode & 0o777) == oct(0o600)

    # started again: it finishes the recovery (from the stop: a stop and a check only end and judge) once
    monkeypatch.setattr(sdriver.Supervisor, 'health', real_health)
    _answers(bin_dir, [RUNNING_2, DONE_2], [_healthy()])
    assert sdriver.Supervisor(settings).run() == 0
    assert _calls(bin_dir) == ['status', 'stopped', 'stopped', 'health', 'started', 'status', 'status', 'report']
    events = _events(tmp_path)
    assert [(e['event'], e['attempt']) for e in events] == [
        ('supervising', 1), ('fault', 1), ('job_stopped', 1), ('supervisor_error', 1), ('resumed', 1),
        ('job_stopped', 1), ('checked', 1), ('restart', 2), ('training', 2), ('done', 2)]
    assert events[4]['why'].startswith('the supervisor started again (start 2 of its last 600 s): attempt 1, 0 of 3 '
                                       'restart(s) used, until ')
    assert events[4]['why'].endswith('; a recovery was half done (checking): it is finished now')
    assert [x['training_attempt'] for x in _extras(tmp_path) if x.get('training_state') == 'started'] == [2]
    summary = core.summarize(events)
    assert (summary['restarts'], summary['faults'], summary['outcome']) == (1, 1, 'finished')
    assert _memory(tmp_path)['ended'] == 'done'
    # an ended supervision started again (its host rebooted) does nothing
    assert sdriver.Supervisor(settings).run() == 0
    assert len(_events(tmp_path)) == len(events) and _calls(bin_dir)[-1] == 'report'


def _decided(tmp_path, settings):
    """memory.json as a supervisor leaves it when it ends right after it decided attempt 2 (restart counted)."""
    plan = {'action': 'restart', 'nodes': NODES, 'left_out': [], 'recovered': ['w1'], 'spares': [],
            'resume_step': 20, 'why': 'on all nodes'}
    extra = {'training_wait': 'first_step', 'training_attempt': 2, 'training_spares': [],
             'training_resume_from': settings['checkpoint_dir'], 'training_resume_if_present': True}
    memory = {'job_id': 'j-1', 'attempt': 2, 'attempt_began': True, 'started': time.time() - 100,
              'until': time.time() + 3600, 'starts': [time.time() - 100], 'to_fence': {},
              'state': {'nodes': NODES, 'restarts': 1, 'failures': [{'resume_step': 20, 'step': 23}],
                        'spares_used': []},
              'phase': {'phase': 'restarting', 'plan': plan, 'extra': extra, 'time': time.time() - 5}}
    (tmp_path / 'state' / 'memory.json').write_text(json.dumps(memory))


def test_a_restart_that_was_started_before_the_supervisor_died_is_not_started_again(tmp_path):
    bin_dir, settings = _setup(tmp_path, [RUNNING_2, DONE_2])
    _decided(tmp_path, settings)
    assert sdriver.Supervisor(settings).run() == 0
    assert _calls(bin_dir) == ['status', 'status', 'report']  # read, seen running as attempt 2: nothing started
    events = _events(tmp_path)
    assert [(e['event'], e['attempt']) for e in events] == [('resumed', 2), ('training', 2), ('done', 2)]
    assert 'attempt 2, 1 of 3 restart(s) used' in events[0]['why']


def test_a_restart_decided_but_not_started_is_started_once_with_the_same_attempt_and_no_new_count(tmp_path):
    stale = {'result': {'state': 'failed', 'attempt': 1, 'failed_nodes': ['w1']},
             'progress': dict(_progress(23, attempt=1), state='failed')}
    bin_dir, settings = _setup(tmp_path, [stale, RUNNING_2, DONE_2])
    _decided(tmp_path, settings)
    assert sdriver.Supervisor(settings).run() == 0
    # the read shows nothing of attempt 2: what it may have half started is stopped, then attempt 2 starts
    assert _calls(bin_dir) == ['status', 'stopped', 'started', 'status', 'status', 'report']
    assert [x['training_attempt'] for x in _extras(tmp_path) if x.get('training_state') == 'started'] == [2]
    assert [e['event'] for e in _events(tmp_path)] == ['resumed', 'training', 'done']
    memory = _memory(tmp_path)
    assert (memory['state']['restarts'], memory['attempt'], memory['phase']) == (1, 2, None)


def test_a_supervisor_that_keeps_failing_gives_up_saying_why_and_the_job_runs_on(tmp_path):
    bin_dir, settings = _setup(tmp_path, [])
    now = time.time()
    (tmp_path / 'state' / 'memory.json').write_text(json.dumps(
        {'job_id': 'j-1', 'attempt': 1, 'state': {'nodes': NODES, 'restarts': 0}, 'phase': None, 'until': None,
         'starts': [now - 500, now - 400, now - 300, now - 200, now - 100]}))
    assert sdriver.Supervisor(settings).run() == srecord.EXIT_ENDED
    assert not (bin_dir / 'calls.log').exists()
    events = _events(tmp_path)
    assert [e['event'] for e in events] == ['gave_up']
    assert events[0]['why'].startswith('the supervisor started 6 times within 600 s (its supervisor_error events '
                                       'say why): it gives up; the job runs on unsupervised')
    # starts further apart than the window are no loop
    (tmp_path / 'state' / 'memory.json').write_text(json.dumps(
        {'job_id': 'j-1', 'attempt': 1, 'state': {'nodes': NODES, 'restarts': 0}, 'phase': None, 'until': None,
         'starts': [now - 5000, now - 4000, now - 3000, now - 2000, now - 1000]}))
    _answers(bin_dir, [DONE_2])
    assert sdriver.Supervisor(settings).run() == 0


def test_a_memory_that_cannot_be_read_is_an_error_never_a_guess(tmp_path):
    bin_dir, settings = _setup(tmp_path, [])
    (tmp_path / 'state' / 'memory.json').write_text('{"attempt": 3, "sta')
    assert sdriver.Supervisor(settings).run() == srecord.EXIT_ENDED
    events = _events(tmp_path)
    assert [e['event'] for e in events] == ['supervisor_error']
    assert 'memory.json cannot be read: the supervisor does not guess what it did' in events[0]['why']
    assert not (bin_dir / 'calls.log').exists()


def test_its_tools_gone_make_it_blind_not_dead_and_it_reads_again_when_they_are_back(tmp_path):
    bin_dir, settings = _setup(tmp_path, [{'result': {'state': 'running'}, 'progress': _progress(12)}] * 3
                               + [{'result': {'state': 'succeeded'}, 'progress': _progress(40)}],
                               blind_reads=2, interval=0.2)
    hidden = tmp_path / 'moved-away'
    shutil.move(str(bin_dir), str(hidden))  # the supervisor's venv moved away

    def restore():
        time.sleep(1.5)
        shutil.move(str(hidden), str(bin_dir))
    import threading
    back = threading.Thread(target=restore)
    back.start()
    assert sdriver.Supervisor(settings).run() == 0
    back.join()
    events = _events(tmp_path)
    assert [e['event'] for e in events] == ['supervising', 'blind', 'sighted', 'done']
    assert 'ansible-playbook cannot be run: No such file or directory' in events[1]['why']


def test_it_follows_the_job_until_it_ends_unless_a_bound_is_set_and_a_bound_survives_its_restart(tmp_path):
    bin_dir, settings = _setup(tmp_path, [{'result': {'state': 'running'}, 'progress': _progress(12)},
                                          {'result': {'state': 'succeeded'}, 'progress': _progress(40)}], seconds=0,
                               metrics_dir='')
    assert sdriver.Supervisor(settings).run() == 0
    assert _memory(tmp_path)['until'] is None
    assert _events(tmp_path)[0]['why'] == 'restarts 3, min nodes 2, until the job ends'
    assert 'until_timestamp_seconds' not in (tmp_path / 'state' / 'supervisor.prom').read_text()

    shutil.rmtree(str(tmp_path / 'state'))
    (tmp_path / 'state').mkdir()
    _answers(bin_dir, [{'result': {'state': 'running'}, 'progress': _progress(12)}] * 50)
    settings.update(seconds=1)
    began = time.time()
    assert sdriver.Supervisor(settings).run() == 0
    until = _memory(tmp_path)['until']
    assert began <= until - 1 <= time.time()
    assert 'gpucluster_supervisor_until_timestamp_seconds{job="j-1"} %r' % until \
        in (tmp_path / 'state' / 'supervisor.prom').read_text()
    # a supervisor that starts again keeps the bound of the first start: it does not begin a new one
    memory = _memory(tmp_path)
    memory.pop('ended')
    (tmp_path / 'state' / 'memory.json').write_text(json.dumps(memory))
    assert sdriver.Supervisor(settings).run() == 0
    assert _memory(tmp_path)['until'] == until
    assert [e['event'] for e in _events(tmp_path)][-2:] == ['resumed', 'stopped']


@pytest.mark.skipif(os.geteuid() != 0 or not os.access('/usr/bin/python3', os.X_OK),
                    reason='reads as another account: root only, with a Python that account may run')
def test_a_checkpoint_directory_the_training_account_cannot_read_is_named_and_nothing_restarts_from_zero(monkeypatch):
    # the supervisor runs its host's Python (training_supervise_python), which every account may run
    monkeypatch.setattr(sys, 'executable', '/usr/bin/python3')
    base = tempfile.mkdtemp()
    try:
        os.chmod(base, 0o755)
        from pathlib import Path
        tmp = Path(base)
        bin_dir, settings = _setup(tmp, [_failed('w1', 23)], [_healthy()], training_user='nobody')
        os.chmod(str(tmp / 'ckpt'), 0o700)  # root's: the training account cannot list it (a root_squash export
        # with a 0700 directory looks the same to root)
        assert sdriver.Supervisor(settings).run() == srecord.EXIT_ENDED
        assert 'started' not in _calls(bin_dir)
        gave_up = _events(tmp)[-1]
        assert gave_up['event'] == 'gave_up'
        assert gave_up['why'].startswith('not restarted: checkpoint directory %s cannot be read (Permission denied), '
                                         'read as nobody; a restart would begin again from step 0' % (tmp / 'ckpt'))

        # readable to the account: found as the start's own check finds it (step 20), read as that account
        shutil.rmtree(str(tmp))
        os.mkdir(base)
        os.chmod(base, 0o755)
        bin_dir, settings = _setup(tmp, [_failed('w1', 23), DONE_2], [_healthy()], training_user='nobody')
        for folder, _, files in os.walk(str(tmp / 'ckpt')):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        assert sdriver.Supervisor(settings).run() == 0
        restart = [e for e in _events(tmp) if e['event'] == 'restart'][0]
        assert restart['resume_step'] == 20
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_run_a_killed_supervisor_left_is_ended_before_it_acts_and_nothing_else_is_signalled(tmp_path):
    import subprocess
    bin_dir, settings = _setup(tmp_path, [DONE_2])
    left = subprocess.Popen(['sleep', '60'], start_new_session=True)  # its read, in a session of its own
    other = subprocess.Popen(['sleep', '60'], start_new_session=True)  # a process that is not its run
    try:
        memory = {'job_id': 'j-1', 'attempt': 2, 'state': {'nodes': NODES, 'restarts': 1}, 'phase': None,
                  'until': None, 'starts': [time.time() - 50], 'child': [left.pid, srecord.proc_start(left.pid)]}
        (tmp_path / 'state' / 'memory.json').write_text(json.dumps(memory))
        assert sdriver.Supervisor(settings).run() == 0
        assert left.wait(5) == -15
        resumed = _events(tmp_path)[0]
        assert resumed['event'] == 'resumed' and resumed['why'].endswith('; the run it left (pid %d) was ended' % left.pid)
        # a pid whose start time is not the one remembered is another process: never signalled
        memory.update(child=[other.pid, srecord.proc_start(other.pid) + 1])
        (tmp_path / 'state' / 'memory.json').write_text(json.dumps(memory))
        _answers(bin_dir, [DONE_2])
        assert sdriver.Supervisor(settings).run() == 0
        assert other.poll() is None
        assert 'was ended' not in _events(tmp_path)[-3]['why']
    finally:
        for proc in (left, other):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _remembered(tmp, written_ago):
    """A supervisor's memory of attempt 1 with no restart used, written `written_ago` seconds ago (its start 100 s
    ago): what a supervisor killed or rebooted mid-job finds. Now, as the time it was written from."""
    now = time.time()
    (tmp / 'state' / 'memory.json').write_text(json.dumps(
        {'job_id': 'j-1', 'attempt': 1, 'state': {'nodes': NODES, 'restarts': 0}, 'phase': None, 'until': None,
         'starts': [now - 100], 'time': now - written_ago}))
    return now


def test_after_its_host_rebooted_a_job_found_stopped_is_a_fault_restarted_from_its_checkpoint(tmp_path, monkeypatch):
    import socket
    stopped = {'result': {'state': 'stopped', 'attempt': 1}, 'progress': dict(_progress(33, attempt=1), state='stopped')}
    bin_dir, settings = _setup(tmp_path, [stopped, RUNNING_2, DONE_2], [_healthy()],
                               hosts={'head': socket.gethostname()})
    now = _remembered(tmp_path, written_ago=60)
    monkeypatch.setattr(srecord, 'boot_time', lambda: now - 30)  # the head came back 30 s ago
    assert sdriver.Supervisor(settings).run() == 0
    assert _calls(bin_dir) == ['status', 'stopped', 'health', 'started', 'status', 'status', 'report']
    events = _events(tmp_path)
    assert [e['event'] for e in events] == ['resumed', 'fault', 'job_stopped', 'checked', 'restart', 'training', 'done']
    assert ' rebooted (up since ' in events[0]['why']
    fault, restart = events[1], events[4]
    assert (fault['seen'], fault['nodes']) == ('rebooted', ['head'])
    assert fault['why'].startswith('the job ended with the reboot of %s' % socket.gethostname())
    assert (restart['attempt'], restart['resume_step']) == (2, 20)


def test_after_its_host_rebooted_a_rank_that_failed_elsewhere_is_the_reboot_not_that_node(tmp_path, monkeypatch):
    """The head's ranks ended with its reboot; a worker's rank then failed in a collective whose peer was gone
    (exit 1, the first exit the read finds). The fault is the reboot of the head, and the restart takes every node."""
    import socket
    failed = _failed('w1', 33)
    failed['result']['why'] = 'a rank failed first on w1 (exit 1)'
    bin_dir, settings = _setup(tmp_path, [failed, RUNNING_2, DONE_2], [_healthy()], hosts={'head': socket.gethostname()})
    now = _remembered(tmp_path, written_ago=60)
    monkeypatch.setattr(srecord, 'boot_time', lambda: now - 30)
    assert sdriver.Supervisor(settings).run() == 0
    events = _events(tmp_path)
    assert [e['event'] for e in events] == ['resumed', 'fault', 'job_stopped', 'checked', 'restart', 'training', 'done']
    fault, restart = events[1], events[4]
    assert (fault['seen'], fault['nodes']) == ('rebooted', ['head'])
    assert fault['why'].startswith('the job ended with the reboot of %s (up since ' % socket.gethostname())
    assert 'its ranks there ended with it, then the others failed' in fault['why']
    assert restart['nodes'] == NODES and restart['left_out'] == []


def test_a_failure_after_a_reboot_of_a_supervisor_host_that_runs_no_rank_is_that_failure(tmp_path, monkeypatch):
    bin_dir, settings = _setup(tmp_path, [_failed('w1', 33), RUNNING_2, DONE_2], [_healthy()])
    now = _remembered(tmp_path, written_ago=60)
    monkeypatch.setattr(srecord, 'boot_time', lambda: now - 30)
    assert sdriver.Supervisor(settings).run() == 0
    fault = [e for e in _events(tmp_path) if e['event'] == 'fault'][0]
    assert fault['seen'] == 'failed' and fault['nodes'] == ['w1']


def _started_again_after_a_fault(tmp, beat):
    tmp.mkdir()
    bin_dir, settings = _setup(tmp, [_failed('w1', None), RUNNING_2, DONE_2], [_healthy()])
    now = _remembered(tmp, written_ago=5)
    (tmp / 'state' / 'supervisor.json').write_text(json.dumps(dict(beat, time=now - 6)))
    assert sdriver.Supervisor(settings).run() == 0
    return [e for e in _events(tmp) if e['event'] == 'restart'][0]


def test_a_supervisor_started_again_counts_the_steps_lost_to_a_fault_its_first_read_finds(tmp_path):
    """Killed and back: its first read finds a failed rank but reads no step (a quick read that reached no rank's
    file); the step in its heartbeat, of the same attempt, counts the steps lost."""
    restart = _started_again_after_a_fault(tmp_path / 'same', {'attempt': 1, 'step': 23})
    assert (restart['resume_step'], restart['lost_steps']) == (20, 3)
    # a heartbeat of another attempt is not this one's step
    restart = _started_again_after_a_fault(tmp_path / 'other', {'attempt': 7, 'step': 23})
    assert restart['lost_steps'] is None


def test_without_a_reboot_a_job_found_stopped_ends_the_supervision_as_before(tmp_path, monkeypatch):
    stopped = {'result': {'state': 'stopped'}, 'progress': dict(_progress(33), state='stopped')}
    bin_dir, settings = _setup(tmp_path, [stopped])
    now = _remembered(tmp_path, written_ago=60)
    monkeypatch.setattr(srecord, 'boot_time', lambda: now - 3600)
    assert sdriver.Supervisor(settings).run() == 0
    assert 'started' not in _calls(bin_dir)
    assert [e['event'] for e in _events(tmp_path)] == ['resumed', 'stopped']


def _sshd(answer):
    """A stand-in for a node's sshd on 127.0.0.1: it sends answer (b'': a frozen one sends nothing); its port."""
    import socket
    import threading
    server = socket.socket()
    server.bind(('127.0.0.1', 0))
    server.listen(16)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if answer:
                conn.sendall(answer)
                conn.close()
    threading.Thread(target=serve, daemon=True).start()
    return server


def test_a_node_whose_logins_fail_but_whose_sshd_answers_is_not_lost_and_a_frozen_one_is(tmp_path, monkeypatch):
    from test_supervise import _pings, _unreachable
    monkeypatch.setattr(sruns, 'BANNER_TIMEOUT', 1)
    # w2 is read by neither read and its ansible ping fails (a login slower than the bound), but its sshd answers
    server = _sshd(b'SSH-2.0-OpenSSH_9.2p1\r\n')
    try:
        statuses = [_unreachable('w2'), _unreachable('w2'), {'result': {'state': 'succeeded'}, 'progress': _progress(40)}]
        bin_dir, settings = _setup(tmp_path, statuses, ssh_port=server.getsockname()[1], glance_seconds=0)
        assert sdriver.Supervisor(settings).run() == 0
    finally:
        server.close()
    events = _events(tmp_path)
    assert [e['event'] for e in events] == ['supervising', 'read_missed', 'done']
    assert 'it answered the direct probe' in events[1]['why'] and 'sshd answered (SSH-2.0-OpenSSH_9.2p1)' in events[1]['why']

    # frozen: the port accepts, no banner comes, no ping: lost
    frozen = tmp_path / 'frozen'
    frozen.mkdir()
    server = _sshd(b'')
    try:
        statuses = [_unreachable('w2'), _unreachable('w2'), RUNNING_2, DONE_2]
        bin_dir, settings = _setup(frozen, statuses, [_healthy('w2')], ssh_port=server.getsockname()[1])
        assert sdriver.Supervisor(settings).run() == 0
    finally:
        server.close()
    fault = [e for e in _events(frozen) if e['event'] == 'fault'][0]
    assert fault['nodes'] == ['w2'] and 'open, but no SSH banner within 1 s (a frozen node?)' in fault['why']


def test_the_host_booted_when_its_init_started():
    booted = srecord.boot_time()
    with open('/proc/stat') as handle:
        btime = float([line for line in handle if line.startswith('btime ')][0].split()[1])
    assert btime <= booted <= time.time()
