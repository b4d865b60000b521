# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Processes of a training job on one node, found by the job id in their environment.

Every process a job starts carries GPUCLUSTER_JOB_ID=<id> in its environment, whatever
launcher started it (deepspeed over pdsh, torchrun, mpirun), so a node can list and stop
exactly that job's processes without matching command names.
"""

from __future__ import annotations

import errno
import os
import signal
import time

JOB_ENV = 'GPUCLUSTER_JOB_ID'


def _read(path, mode='r'):
    try:
        with open(path, mode) as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def proc_environ(pid, proc='/proc'):
    raw = _read(os.path.join(proc, str(pid), 'environ'), 'rb')
    if not raw:
        return {}
    env = {}
    for item in raw.split(b'\0'):
        if b'=' in item:
            key, _, value = item.partition(b'=')
            env[key.decode('utf-8', 'replace')] = value.decode('utf-8', 'replace')
    return env


def proc_cmdline(pid, proc='/proc'):
    raw = _read(os.path.join(proc, str(pid), 'cmdline'), 'rb') or b''
    return ' '.join(p.decode('utf-8', 'replace') for p in raw.split(b'\0') if p)


def proc_pgid(pid, proc='/proc'):
    stat = _read(os.path.join(proc, str(pid), 'stat'))
    if not stat:
        return None
    # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses
    fields = stat[stat.rindex(')') + 2:].split()
    return int(fields[2])


def _pids(proc='/proc'):
    for name in os.listdir(proc):
        if name.isdigit():
            yield int(name)


def job_processes(job_id, proc='/proc', pgids=()):
    """[{pid, pgid, cmdline}] of the processes whose environment names this job, or that belong to
    one of the process groups given (the groups this node started; /proc/PID/stat is readable by
    anyone, while another account's environment may not be)."""
    found = []
    me = os.getpid()
    groups = {int(g) for g in pgids if g}
    for pid in _pids(proc):
        if pid == me:
            continue
        pgid = proc_pgid(pid, proc)
        if (pgid in groups and pgid != os.getpgid(0)) or proc_environ(pid, proc).get(JOB_ENV) == str(job_id):
            found.append({'pid': pid, 'pgid': pgid, 'cmdline': proc_cmdline(pid, proc)})
    return found


def jobs_running(proc='/proc'):
    """{job_id: [pids]} of every job with a process on this node."""
    out = {}
    for pid in _pids(proc):
        job = proc_environ(pid, proc).get(JOB_ENV)
        if job:
            out.setdefault(job, []).append(pid)
    return out


def stop_job(job_id, grace=10.0, proc='/proc', pgids=()):
    """SIGTERM the process groups of the job, wait up to grace seconds, then SIGKILL what is left.

    Returns the pids that were signalled. Never touches processes of other jobs."""
    procs = job_processes(job_id, proc, pgids)
    signalled = [p['pid'] for p in procs]
    groups = sorted({p['pgid'] for p in procs if p['pgid'] and p['pgid'] > 1})
    own_group = os.getpgid(0)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            if pgid == own_group:
                continue
            try:
                os.killpg(pgid, sig)
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    raise
        for p in job_processes(job_id, proc, pgids):  # strays outside the groups seen
            try:
                os.kill(p['pid'], sig)
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    raise
        deadline = time.time() + (grace if sig == signal.SIGTERM else 5.0)
        while time.time() < deadline and job_processes(job_id, proc, pgids):
            time.sleep(0.2)
        if not job_processes(job_id, proc, pgids):
            break
    return signalled


def _tcp_listen_inodes(port, proc='/proc'):
    inodes = set()
    for table in ('net/tcp', 'net/tcp6'):
        text = _read(os.path.join(proc, table)) or ''
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, state, inode = fields[1], fields[3], fields[9]
            if state == '0A' and int(local.rsplit(':', 1)[1], 16) == int(port):
                inodes.add(inode)
    return inodes


def port_listeners(port, proc='/proc'):
    """[{pid, cmdline, job_id}] of the processes listening on a TCP port ([] when it is free)."""
    inodes = _tcp_listen_inodes(port, proc)
    if not inodes:
        return []
    found = []
    for pid in _pids(proc):
        fd_dir = os.path.join(proc, str(pid), 'fd')
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith('socket:[') and target[8:-1] in inodes:
                found.append({'pid': pid, 'cmdline': proc_cmdline(pid, proc),
                              'job_id': proc_environ(pid, proc).get(JOB_ENV)})
                break
    if not found:  # the socket exists but its owner is not visible (another user or namespace)
        found.append({'pid': None, 'cmdline': '', 'job_id': None})
    return found


def describe_listeners(port, listeners):
    """One human line about who holds a port."""
    parts = []
    for item in listeners:
        if item['pid'] is None:
            parts.append('a process this account cannot see')
            continue
        text = 'pid %d (%s)' % (item['pid'], item['cmdline'][:120] or '?')
        if item.get('job_id'):
            text += ' of job %s' % item['job_id']
        parts.append(text)
    return 'port %s is in use by %s' % (port, ', '.join(parts))


def spawn_detached(command, env, cwd, log_path, state_dir):
    """Start a shell command in its own session, output to log_path, exit status to state_dir/exit_code.

    Returns the pid (which is also the process group id)."""
    import subprocess  # only here: spawning is what this helper is for

    os.makedirs(state_dir, exist_ok=True)
    for name in ('exit_code', 'pid'):
        try:
            os.unlink(os.path.join(state_dir, name))
        except OSError:
            pass
    wrapper = '( %s ); echo $? > %s' % (command, _quote(os.path.join(state_dir, 'exit_code')))
    with open(log_path, 'ab') as log, open(os.devnull, 'rb') as devnull:
        child = subprocess.Popen(['/bin/bash', '-c', wrapper], cwd=cwd, env=env, stdin=devnull,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 close_fds=True)
    with open(os.path.join(state_dir, 'pid'), 'w') as handle:
        handle.write('%d\n' % child.pid)
    return child.pid


def _quote(text):
    return "'" + str(text).replace("'", "'\"'\"'") + "'"


def read_pid(state_dir):
    text = _read(os.path.join(state_dir, 'pid'))
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


def read_exit_code(state_dir):
    text = _read(os.path.join(state_dir, 'exit_code'))
    if text is None or not text.strip():
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def tail(path, lines=20):
    text = _read(path)
    if text is None:
        return []
    return text.splitlines()[-lines:]
