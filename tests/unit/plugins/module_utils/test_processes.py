import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr

ME = os.geteuid()
OTHER = ME + 4242


def fake_proc(root, pid, uid=ME, start_time=1000, pgid=None, env=None, cmdline=('python', 'train.py'),
              comm='python', state='S', sockets=(), ppid=1):
    """One process in a fake /proc tree, laid out as the kernel does."""
    d = root / str(pid)
    d.mkdir(parents=True)
    pgid = pid if pgid is None else pgid
    rest = [state, str(ppid), str(pgid), str(pgid)] + ['0'] * 15 + [str(start_time)] + ['0'] * 30
    (d / 'stat').write_text('%d (%s) %s\n' % (pid, comm, ' '.join(rest)))
    (d / 'status').write_text('Name:\t%s\nState:\t%s\nUid:\t%d\t%d\t%d\t%d\n' % (comm, state, uid, uid, uid, uid))
    (d / 'environ').write_bytes(b''.join(('%s=%s' % kv).encode() + b'\0' for kv in (env or {}).items()))
    (d / 'cmdline').write_bytes(b''.join(a.encode() + b'\0' for a in cmdline))
    (d / 'fd').mkdir()
    for n, inode in enumerate(sockets):
        os.symlink('socket:[%s]' % inode, str(d / 'fd' / str(n + 3)))
    return d


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / 'proc'
    root.mkdir()
    return root


def fake_kernel(monkeypatch, proc, survive_sigterm=()):
    """os.kill/os.killpg that record the call and end the fake process (or the live members of its group:
    zombies stay), as the kernel refuses another account's; the pids in survive_sigterm outlive SIGTERM."""
    calls = []

    def end(pid, sig):
        if pr.read_stat(pid, str(proc))['state'] != 'Z' and not (sig == signal.SIGTERM and pid in survive_sigterm):
            shutil.rmtree(str(proc / str(pid)))

    def kill(pid, sig):
        calls.append(('kill', pid, sig))
        if not (proc / str(pid)).exists():
            raise OSError(errno.ESRCH, 'No such process')
        if pr.read_uid(pid, str(proc)) != ME:
            raise OSError(errno.EPERM, 'Operation not permitted')
        end(pid, sig)

    def killpg(pgid, sig):
        calls.append(('killpg', pgid, sig))
        members = [p for p in pr.pids(str(proc)) if pr.read_stat(p, str(proc))['pgid'] == pgid]
        if not members:
            raise OSError(errno.ESRCH, 'No such process')
        if any(pr.read_uid(p, str(proc)) != ME for p in members):
            raise OSError(errno.EPERM, 'Operation not permitted')
        for p in members:
            end(p, sig)

    monkeypatch.setattr(pr.os, 'kill', kill)
    monkeypatch.setattr(pr.os, 'killpg', killpg)
    return calls


@pytest.fixture
def kills(monkeypatch, proc):
    """os.kill/os.killpg that record the call and end the fake process (or its whole group)."""
    return fake_kernel(monkeypatch, proc)


def test_stat_parse_keeps_start_time_when_comm_has_spaces_and_parentheses():
    text = '4242 (python (rank 0)) S 1 4242 4242 0 -1 4194560 ' + ' '.join(['0'] * 12) + ' 98765 1234 5678'
    info = pr.parse_stat(text)
    assert info['comm'] == 'python (rank 0)'
    assert (info['pid'], info['pgid'], info['start_time']) == (4242, 4242, 98765)


def test_identity_reads_uid_start_time_group_and_job_id(proc):
    fake_proc(proc, 300, uid=OTHER, start_time=77, pgid=290, env={pr.JOB_ENV: 'job-1', 'A': 'x=y'})
    assert pr.identity(300, str(proc)) == {'pid': 300, 'start_time': 77, 'uid': OTHER, 'pgid': 290,
                                           'job_id': 'job-1'}
    assert pr.identity(301, str(proc)) is None
    fake_proc(proc, 302, state='Z')
    assert pr.identity(302, str(proc)) is None


def test_pidfile_is_trusted_only_while_pid_start_time_uid_and_job_id_match(proc, tmp_path):
    state = tmp_path / 'state'
    state.mkdir()
    pr.write_pidfile(str(state / 'pid'), {'pid': 500, 'start_time': 10, 'uid': ME, 'job_id': 'job-1'})
    assert oct((state / 'pid').stat().st_mode & 0o777) == '0o600'
    fake_proc(proc, 500, start_time=10, env={pr.JOB_ENV: 'job-1'})
    assert pr.pidfile_process(str(state), 'job-1', str(proc))['pid'] == 500
    # the pid was reused by an unrelated process: another start time
    shutil.rmtree(str(proc / '500'))
    fake_proc(proc, 500, start_time=99, env={pr.JOB_ENV: 'job-1'})
    assert pr.pidfile_process(str(state), 'job-1', str(proc)) is None
    # same start time but no longer carrying the job's id
    shutil.rmtree(str(proc / '500'))
    fake_proc(proc, 500, start_time=10, env={})
    assert pr.pidfile_process(str(state), 'job-1', str(proc)) is None


def test_bare_pid_in_an_old_pidfile_is_never_trusted(proc, tmp_path):
    (tmp_path / 'pid').write_text('500\n')
    fake_proc(proc, 500, env={pr.JOB_ENV: 'job-1'})
    assert pr.read_pidfile(str(tmp_path / 'pid'))['start_time'] is None
    assert pr.pidfile_process(str(tmp_path), 'job-1', str(proc)) is None


def test_finished_job_pidfile_names_nothing_even_if_the_process_matches(proc, tmp_path):
    fake_proc(proc, 500, start_time=10, env={pr.JOB_ENV: 'job-1'})
    pr.write_pidfile(str(tmp_path / 'pid'), {'pid': 500, 'start_time': 10, 'uid': ME, 'job_id': 'job-1'})
    (tmp_path / 'exit_code').write_text('0\n')
    assert pr.read_exit_code(str(tmp_path)) == 0
    assert pr.pidfile_process(str(tmp_path), 'job-1', str(proc)) is None


def test_job_processes_need_our_uid_and_the_job_id_or_a_verified_group(proc):
    fake_proc(proc, 100, env={pr.JOB_ENV: 'job-1'})                  # ours, the job's
    fake_proc(proc, 101, uid=OTHER, env={pr.JOB_ENV: 'job-1'})       # another user's job of the same id
    fake_proc(proc, 102, env={pr.JOB_ENV: 'job-2'})                  # another job
    fake_proc(proc, 103, pgid=200, env={})                           # in the verified group, env cleared
    fake_proc(proc, 200, start_time=5, env={pr.JOB_ENV: 'job-1'})    # the verified leader
    fake_proc(proc, 104, pgid=300, env={})                           # an unrelated group of ours
    leader = pr.identity(200, str(proc))
    found = sorted(p['pid'] for p in pr.job_processes('job-1', ME, str(proc), [leader]))
    assert found == [100, 103, 200]
    assert sorted(p['pid'] for p in pr.job_processes('job-1', OTHER, str(proc))) == [101]


def test_stop_signals_only_the_job_of_our_account(proc, kills):
    fake_proc(proc, 100, env={pr.JOB_ENV: 'job-1'})
    fake_proc(proc, 110, pgid=100, env={pr.JOB_ENV: 'job-1'})
    fake_proc(proc, 101, uid=OTHER, env={pr.JOB_ENV: 'job-1'})
    fake_proc(proc, 102, env={pr.JOB_ENV: 'job-2'})
    out = pr.stop_job('job-1', ME, grace=1, proc=str(proc), sleep=lambda s: None)
    assert out['signalled'] == [100, 110]
    assert out['left'] == [] and out['refused'] == []
    assert ('killpg', 100, signal.SIGTERM) in kills
    assert all(c[1] not in (101, 102) for c in kills)
    assert sorted(pr.pids(str(proc))) == [101, 102]


def test_stop_as_root_reaches_only_the_accounts_processes(proc, kills):
    fake_proc(proc, 100, env={pr.JOB_ENV: 'job-1'})
    fake_proc(proc, 101, uid=OTHER, env={pr.JOB_ENV: 'job-1'})
    ticks = iter(range(1000))
    out = pr.stop_job('job-1', OTHER, grace=0, proc=str(proc), sleep=lambda s: None, clock=lambda: next(ticks))
    # the other account's process is refused by the kernel: an answer, not a crash
    assert out['refused'] and out['refused'][0]['pid'] == 101
    assert [p['pid'] for p in out['left']] == [101]
    assert (proc / '100').exists()


def orted_tree(proc):
    """A worker of an mpirun job: Open MPI's orted (started over SSH, no job id in its environment,
    in its SSH session's group) and the rank it started; beside them an orted of another job and one
    of another account."""
    fake_proc(proc, 50, pgid=49, comm='orted', cmdline=('/usr/bin/orted', '-mca', 'ess', 'env'), env={})
    fake_proc(proc, 51, ppid=50, pgid=49, env={pr.JOB_ENV: 'job-1', 'RANK': '1'})
    fake_proc(proc, 60, pgid=59, comm='orted', cmdline=('/usr/bin/orted',), env={})
    fake_proc(proc, 61, ppid=60, pgid=59, env={pr.JOB_ENV: 'job-2', 'RANK': '1'})
    fake_proc(proc, 70, uid=OTHER, pgid=69, comm='orted', cmdline=('/usr/bin/orted',), env={})
    fake_proc(proc, 71, uid=OTHER, ppid=70, pgid=69, env={pr.JOB_ENV: 'job-1', 'RANK': '1'})


def orted_of_job_1(proc):
    return [dict(pr.identity(50, str(proc)), cmdline='/usr/bin/orted')]


def test_the_stop_ends_the_daemons_it_is_given_with_the_job(proc, kills):
    orted_tree(proc)
    out = pr.stop_job('job-1', ME, grace=1, proc=str(proc), sleep=lambda s: None, daemons=orted_of_job_1(proc))
    assert out['signalled'] == [50, 51] and out['left'] == []
    # each alone (their group is the SSH session's); another job's and another account's orted are not
    assert ('kill', 50, signal.SIGTERM) in kills and not any(c[0] == 'killpg' for c in kills)
    assert sorted(pr.pids(str(proc))) == [60, 61, 70, 71]


def test_without_daemons_the_stop_leaves_the_orted_it_is_not_given(proc, kills):
    orted_tree(proc)
    out = pr.stop_job('job-1', ME, grace=1, proc=str(proc), sleep=lambda s: None)
    assert out['signalled'] == [51] and (proc / '50').exists()


@pytest.mark.parametrize('dies_on,left', [(signal.SIGKILL, []), (None, [50])])
def test_a_daemon_that_outlives_sigterm_is_killed_waited_for_and_reported_left(proc, monkeypatch, dies_on, left):
    # an orted that ignores SIGTERM: SIGKILL ends it; one that survives SIGKILL too is left, by its pid
    orted_tree(proc)
    calls = []

    def kill(pid, sig):
        calls.append((pid, sig))
        if pid != 50 or sig == dies_on:
            shutil.rmtree(str(proc / str(pid)))

    monkeypatch.setattr(pr.os, 'kill', kill)
    monkeypatch.setattr(pr.os, 'killpg', None)  # no group here is the job's
    ticks = iter(range(0, 10000, 1))
    out = pr.stop_job('job-1', ME, grace=3, proc=str(proc), sleep=lambda s: None, clock=lambda: next(ticks),
                      daemons=orted_of_job_1(proc))
    assert (50, signal.SIGTERM) in calls and (50, signal.SIGKILL) in calls
    assert [p['pid'] for p in out['left']] == left and (proc / '50').exists() is bool(left)


def test_stale_pidfile_pointing_at_an_unrelated_process_is_ignored_by_stop(proc, kills, tmp_path):
    fake_proc(proc, 700, start_time=4242, env={'HOME': '/home/train'}, cmdline=('vim',))
    pr.write_pidfile(str(tmp_path / 'pid'), {'pid': 700, 'start_time': 11, 'uid': ME, 'job_id': 'job-1'})
    leader = pr.pidfile_process(str(tmp_path), 'job-1', str(proc))
    assert leader is None
    out = pr.stop_job('job-1', ME, grace=0, proc=str(proc), leaders=[leader], sleep=lambda s: None)
    assert out['signalled'] == [] and kills == []
    assert (proc / '700').exists()


def torchrun_tree(proc, job='job-1'):
    """A node's part of a torchrun job: its wrapper (100, the group's leader, named by the pid file), the
    agent (110) in its group and the agent's rank (120), a zombie once it died."""
    fake_proc(proc, 100, start_time=5, comm='bash', cmdline=('/bin/bash', '-c', 'torchrun'), env={pr.JOB_ENV: job})
    fake_proc(proc, 110, pgid=100, ppid=100, start_time=6, comm='torchrun', env={pr.JOB_ENV: job})
    fake_proc(proc, 120, pgid=100, ppid=110, start_time=7, state='Z', env={pr.JOB_ENV: job, 'RANK': '0'})
    return pr.identity(100, str(proc))


def test_a_process_whose_group_leader_exited_on_sigterm_gets_sigkill_itself(proc, monkeypatch):
    # the wrapper ends on SIGTERM, the agent outlives it: its group has no leader to be signalled through
    leader = torchrun_tree(proc)
    calls = fake_kernel(monkeypatch, proc, survive_sigterm=(110,))
    ticks = iter(range(10000))
    out = pr.stop_job('job-1', ME, grace=3, proc=str(proc), leaders=[leader], sleep=lambda s: None,
                      clock=lambda: next(ticks))
    assert ('killpg', 100, signal.SIGTERM) in calls and ('kill', 110, signal.SIGKILL) in calls
    assert out['left'] == [] and out['refused'] == [] and out['signalled'] == [100, 110]
    assert not (proc / '110').exists()


def test_a_group_that_holds_another_jobs_or_accounts_process_is_never_signalled_whole(proc, kills):
    leader = torchrun_tree(proc)
    fake_proc(proc, 130, pgid=100, env={pr.JOB_ENV: 'job-2'})              # another job's, in the same group
    fake_proc(proc, 140, pgid=100, uid=OTHER, env={pr.JOB_ENV: 'job-1'})   # another account's
    out = pr.stop_job('job-1', ME, grace=1, proc=str(proc), leaders=[leader], sleep=lambda s: None)
    assert out['left'] == [] and out['signalled'] == [100, 110]
    assert not [c for c in kills if c[0] == 'killpg' or c[1] in (130, 140)]
    assert sorted(pr.pids(str(proc))) == [120, 130, 140]


def test_signal_group_refuses_a_record_whose_process_changed(proc, kills):
    fake_proc(proc, 800, start_time=1, env={pr.JOB_ENV: 'job-1'})
    assert pr.signal_group({'pid': 800, 'start_time': 2, 'uid': ME}, signal.SIGTERM, str(proc)) == pr.GONE
    fake_proc(proc, 801, uid=OTHER, start_time=1)
    assert pr.signal_group({'pid': 801, 'start_time': 1}, signal.SIGTERM, str(proc)) == pr.NOT_OURS
    assert kills == []
    assert pr.signal_group({'pid': 800, 'start_time': 1, 'uid': ME}, signal.SIGTERM, str(proc)) == pr.SIGNALLED


TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 51234 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 51235 1 0000000000000000 100 0 0 10 0
   2: 0B00610A:7530 0C00610A:D431 01 00000000:00000000 00:00000000 00000000  1001        0 51236 1 0000000000000000 100 0 0 10 0
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1389 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 61000 1 0000000000000000 100 0 0 10 0
"""


def test_parse_proc_net_tcp_decodes_listeners_only():
    items = pr.parse_proc_net_tcp(TCP)
    assert [(i['address'], i['port'], i['uid'], i['inode']) for i in items] == [
        ('0.0.0.0', 30000, 1001, '51234'), ('127.0.0.1', 8080, 0, '51235')]
    assert pr.parse_proc_net_tcp(TCP6)[0]['address'] == '::'


def test_port_listeners_names_pid_job_and_an_invisible_owner(proc):
    (proc / 'net').mkdir()
    (proc / 'net' / 'tcp').write_text(TCP)
    (proc / 'net' / 'tcp6').write_text(TCP6)
    fake_proc(proc, 900, env={pr.JOB_ENV: 'old-job'}, cmdline=('torchrun', '--nnodes', '2'), sockets=['51234'])
    holders = pr.port_listeners(30000, proc=str(proc))
    assert holders == [{'pid': 900, 'uid': 1001, 'cmdline': 'torchrun --nnodes 2', 'job_id': 'old-job',
                        'address': '0.0.0.0'}]
    assert pr.describe_listeners(30000, holders) == 'port 30000 is in use by pid 900 (torchrun --nnodes 2) of job old-job'
    # 8080 is held on 127.0.0.1 only: free for another address, and its owner is not visible
    assert pr.port_listeners(8080, address='10.97.0.11', proc=str(proc)) == []
    hidden = pr.port_listeners(8080, proc=str(proc))
    assert hidden[0]['pid'] is None and 'cannot see (uid 0)' in pr.describe_listeners(8080, hidden)
    assert pr.port_listeners(5001, address='10.97.0.11', proc=str(proc))[0]['uid'] == 998
    assert pr.port_listeners(5002, proc=str(proc)) == []


def test_a_process_listening_on_ipv4_and_ipv6_is_one_holder_and_no_invisible_one(proc):
    """sshd holds 0.0.0.0:22 and [::]:22: one entry, not a second 'process this account cannot see'."""
    (proc / 'net').mkdir()
    (proc / 'net' / 'tcp').write_text(
        '  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n'
        '   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7001 1 0 100 0 0 10 0\n')
    (proc / 'net' / 'tcp6').write_text(
        '  sl  local_address                         remote_address                        st tx_queue rx_queue tr '
        'tm->when retrnsmt   uid  timeout inode\n'
        '   0: 00000000000000000000000000000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 '
        '00:00000000 00000000     0        0 7002 1 0 100 0 0 10 0\n')
    fake_proc(proc, 39, uid=0, cmdline=('sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups',),
              sockets=['7001', '7002'])
    holders = pr.port_listeners(22, proc=str(proc))
    assert [(h['pid'], h['address']) for h in holders] == [(39, '0.0.0.0')]
    assert pr.describe_listeners(22, holders) == (
        'port 22 is in use by pid 39 (sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups)')


def test_port_listeners_on_the_real_proc_finds_this_process():
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    try:
        holders = pr.port_listeners(port, address='127.0.0.1')
        assert [h['pid'] for h in holders] == [os.getpid()]
    finally:
        sock.close()
    assert pr.port_listeners(port) == []


def test_spawn_detached_records_identity_and_stop_ends_the_whole_group(tmp_path):
    state = pr.private_dir(str(tmp_path / 'state' / 'job-9'))
    log = tmp_path / 'job.log'
    record = pr.spawn_detached('sleep 60 & sleep 60; wait', dict(os.environ), str(tmp_path), str(log), state,
                               job_id='job-9')
    try:
        # Popen returns when the exec closes its close-on-exec pipe, which the kernel does before it
        # lays out the new program's environment: for that moment /proc/PID/environ is empty and the
        # leader does not yet carry the job id. Callers read the pid file in a later module run.
        deadline = time.time() + 10
        leader = pr.pidfile_process(state, 'job-9')
        while leader is None and time.time() < deadline:
            time.sleep(0.01)
            leader = pr.pidfile_process(state, 'job-9')
        assert leader and leader['pid'] == record['pid'] == leader['pgid']
        deadline = time.time() + 30  # a loaded machine starts the shell and its sleeps slowly
        while time.time() < deadline and len(pr.job_processes('job-9', leaders=[leader])) < 3:
            time.sleep(0.05)
        assert len(pr.job_processes('job-9', leaders=[leader])) >= 3
        out = pr.stop_job('job-9', grace=5, leaders=[leader])
        assert record['pid'] in out['signalled'] and out['left'] == []
        assert pr.pidfile_process(state, 'job-9') is None
    finally:
        try:
            os.killpg(record['pid'], signal.SIGKILL)
        except OSError:
            pass


def test_private_dir_is_created_0700_and_refuses_a_world_writable_parent(tmp_path):
    path = pr.private_dir(str(tmp_path / 'a' / 'b'))
    assert oct(os.stat(path).st_mode & 0o777) == '0o700'
    open_dir = tmp_path / 'open'
    open_dir.mkdir()
    os.chmod(str(open_dir), 0o777)
    with pytest.raises(pr.ProcessError, match='writable by others'):
        pr.private_dir(str(open_dir / 'jobs'))
    sticky = tmp_path / 'sticky'
    sticky.mkdir()
    os.chmod(str(sticky), 0o1777)
    os.symlink(str(tmp_path), str(sticky / 'jobs'))
    with pytest.raises(pr.ProcessError, match='symbolic link'):
        pr.private_dir(str(sticky / 'jobs' / 'x'))


def test_private_dir_tightens_a_leaf_we_own(tmp_path):
    leaf = tmp_path / 'leaf'
    leaf.mkdir()
    os.chmod(str(leaf), 0o755)
    pr.private_dir(str(leaf))
    assert oct(leaf.stat().st_mode & 0o777) == '0o700'


def test_a_detached_job_is_found_by_its_id_and_stopped_with_its_children(tmp_path):
    job = 'unit-%d' % os.getpid()
    env = dict(os.environ, **{pr.JOB_ENV: job})
    # a parent that starts a child in the same group, both sleeping
    pid = pr.spawn_detached('sleep 60 & sleep 60; wait', env, str(tmp_path), str(tmp_path / 'log'),
                            str(tmp_path / 'state'))['pid']
    deadline = time.time() + 10
    while time.time() < deadline and len(pr.job_processes(job)) < 3:
        time.sleep(0.1)
    found = pr.job_processes(job)
    assert pid in [p['pid'] for p in found]
    assert len(found) >= 3 and {p['pgid'] for p in found} == {pid}
    assert pr.jobs_running().get(job)
    # another job's process is left alone
    other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],
                             env=dict(os.environ, **{pr.JOB_ENV: job + '-other'}), start_new_session=True)
    try:
        stopped = pr.stop_job(job, grace=5)['signalled']
        assert set(p['pid'] for p in found) <= set(stopped)
        assert pr.job_processes(job) == []
        assert other.poll() is None
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()


def test_exit_code_of_a_detached_command_is_recorded(tmp_path):
    state = str(tmp_path / 'state')
    pr.spawn_detached('echo hello; exit 3', dict(os.environ), str(tmp_path), str(tmp_path / 'log'), state)
    deadline = time.time() + 10
    while time.time() < deadline and pr.read_exit_code(state) is None:
        time.sleep(0.1)
    assert pr.read_exit_code(state) == 3
    assert pr.tail(str(tmp_path / 'log')) == ['hello']


def test_a_listening_port_is_described_with_its_job(tmp_path):
    srv = socket.socket()
    srv.bind(('127.0.0.1', 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        holders = pr.port_listeners(port)
        assert [h['pid'] for h in holders] == [os.getpid()]
        assert 'port %d is in use by pid %d' % (port, os.getpid()) in pr.describe_listeners(port, holders)
    finally:
        srv.close()
    assert pr.port_listeners(port) == []
