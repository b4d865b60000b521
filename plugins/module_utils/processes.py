# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Life cycle of the background processes the collection starts, and who holds a TCP port.

One place for: reading /proc (environ, cmdline, stat with the start time, owner uid), the
identity of a process (pid + start time + uid [+ job id]), starting a detached process group
whose pid file records that identity, trusting a pid file only while it still names the same
process, signalling only processes that are ours and carry the job's id (EPERM is an answer,
not a crash), private state directories with checked modes, and the listeners of a TCP port
(/proc/net/tcp{,6} + /proc/*/fd).

Every function takes ``proc`` (default /proc) so the unit tests run on a fake /proc tree.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import signal
import socket
import stat as stat_mod
import struct
import subprocess
import time

JOB_ENV = 'GPUCLUSTER_JOB_ID'
PIDFILE = 'pid'
EXIT_CODE_FILE = 'exit_code'

# signal results (what signal_process / signal_group answer)
SIGNALLED = 'signalled'
GONE = 'gone'
NOT_PERMITTED = 'not permitted'
NOT_OURS = 'not ours'


class ProcessError(ValueError):
    """A problem worded for the user (an unsafe state directory, a pid file that cannot be written)."""


# ----- reading /proc ---------------------------------------------------------------------------
def _read(path, mode='r'):
    try:
        with open(path, mode) as handle:
            return handle.read()
    except (IOError, OSError, UnicodeDecodeError):
        return None


def pids(proc='/proc'):
    """Pids of every process visible in proc."""
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def read_environ(pid, proc='/proc'):
    """{name: value} of a process's environment ({} when it is gone or not readable)."""
    raw = _read(os.path.join(proc, str(pid), 'environ'), 'rb')
    if not raw:
        return {}
    env = {}
    for item in raw.split(b'\0'):
        if b'=' in item:
            key, _, value = item.partition(b'=')
            env[key.decode('utf-8', 'replace')] = value.decode('utf-8', 'replace')
    return env


def read_cmdline(pid, proc='/proc'):
    """The command line as one string, arguments joined by spaces ('' for kernel threads or gone)."""
    raw = _read(os.path.join(proc, str(pid), 'cmdline'), 'rb') or b''
    return ' '.join(p.decode('utf-8', 'replace') for p in raw.split(b'\0') if p)


def parse_stat(text):
    """{pid, comm, state, ppid, pgid, sid, start_time} from the text of /proc/PID/stat.

    comm may hold spaces and parentheses, so the fields after it are split from the last ')'.
    start_time is field 22, in clock ticks since boot: with the pid it names one process for the
    life of the machine."""
    if not text or ')' not in text:
        return None
    head, _, tail = text.rpartition(')')
    pid_text, _, comm = head.partition(' (')
    fields = tail.split()
    try:
        return {'pid': int(pid_text), 'comm': comm, 'state': fields[0], 'ppid': int(fields[1]),
                'pgid': int(fields[2]), 'sid': int(fields[3]), 'start_time': int(fields[19])}
    except (ValueError, IndexError):
        return None


def read_stat(pid, proc='/proc'):
    return parse_stat(_read(os.path.join(proc, str(pid), 'stat')))


def read_uid(pid, proc='/proc'):
    """Real uid of a process (from /proc/PID/status), None when it is gone."""
    text = _read(os.path.join(proc, str(pid), 'status')) or ''
    for line in text.splitlines():
        if line.startswith('Uid:'):
            try:
                return int(line.split()[1])
            except (ValueError, IndexError):
                return None
    return None


def identity(pid, proc='/proc'):
    """{pid, start_time, uid, pgid, job_id} of a live process; None when it is gone (or a zombie)."""
    info = read_stat(pid, proc)
    if info is None or info['state'] in ('Z', 'X'):
        return None
    uid = read_uid(pid, proc)
    if uid is None:
        return None
    return {'pid': int(pid), 'start_time': info['start_time'], 'uid': uid, 'pgid': info['pgid'],
            'job_id': read_environ(pid, proc).get(JOB_ENV)}


def same_process(recorded, proc='/proc'):
    """The live identity when the process a record names still runs with the same start time and
    uid (and, when the record has one, still carries the same job id); None otherwise."""
    if not recorded or not recorded.get('pid'):
        return None
    now = identity(recorded['pid'], proc)
    if now is None:
        return None
    if recorded.get('start_time') is None or now['start_time'] != recorded['start_time']:
        return None
    if recorded.get('uid') is not None and now['uid'] != recorded['uid']:
        return None
    if recorded.get('job_id') and now['job_id'] != recorded['job_id']:
        return None
    return now


# ----- pid files -------------------------------------------------------------------------------
def write_pidfile(path, record):
    """Write an identity record (JSON, mode 0600) through a temporary file and a rename."""
    tmp = '%s.tmp%d' % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, 'O_NOFOLLOW', 0), 0o600)
    with os.fdopen(fd, 'w') as handle:
        handle.write(json.dumps(record, sort_keys=True) + '\n')
    os.rename(tmp, path)


def read_pidfile(path):
    """The record a pid file holds ({pid, start_time, uid, job_id}); a bare pid (older files) gives
    a record with no start time, which same_process() never trusts. None when absent or unreadable."""
    text = _read(path)
    if not text or not text.strip():
        return None
    text = text.strip()
    if text.isdigit():
        return {'pid': int(text), 'start_time': None, 'uid': None, 'job_id': None}
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get('pid'), int):
        return None
    return record


def read_exit_code(state_dir):
    """Exit status the wrapper wrote when the process ended; None while it runs (or never ran)."""
    text = _read(os.path.join(state_dir, EXIT_CODE_FILE))
    if text is None or not text.strip():
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def pidfile_process(state_dir, job_id=None, proc='/proc'):
    """The live identity of what state_dir's pid file names, or None when the file is missing, the
    process ended (its exit_code was written), or the pid now names another process (another
    start time, another owner, or no longer this job's id)."""
    if read_exit_code(state_dir) is not None:
        return None
    record = read_pidfile(os.path.join(state_dir, PIDFILE))
    if record is None:
        return None
    if job_id and record.get('job_id') and record['job_id'] != str(job_id):
        return None
    return same_process(record, proc)


# ----- private state directories ---------------------------------------------------------------
def default_state_root(euid=None):
    """Where a user's private job state lives: /var/lib/gpucluster/jobs for root, else
    ~/.local/state/gpucluster/jobs of the account (from the password database, not $HOME)."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return '/var/lib/gpucluster/jobs'
    try:
        home = pwd.getpwuid(euid).pw_dir
    except KeyError:
        home = None
    if home and os.path.isdir(home):
        return os.path.join(home, '.local', 'state', 'gpucluster', 'jobs')
    return '/var/tmp/gpucluster-%d' % euid


def private_dir(path, euid=None):
    """Create path (and missing parents) mode 0700 owned by us, and check nobody else can read it or
    swap it: every existing ancestor is owned by root or us and is not writable by others unless it
    is sticky (/tmp, /var/tmp), a directory right below a sticky one is ours and not a link, and the
    leaf is ours with mode 0700. Raises ProcessError naming the path at fault."""
    euid = os.geteuid() if euid is None else euid
    path = os.path.abspath(path)
    parts = path.strip('/').split('/')
    current = '/'
    below_sticky = False
    for index, part in enumerate(parts):
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise ProcessError('state directory %s: cannot inspect %s: %s' % (path, current, exc))
            try:
                os.mkdir(current, 0o700)
            except OSError as exc2:
                if exc2.errno != errno.EEXIST:
                    raise ProcessError('state directory %s: cannot create %s: %s' % (path, current, exc2))
            info = os.lstat(current)
        if stat_mod.S_ISLNK(info.st_mode):
            if below_sticky:
                raise ProcessError('state directory %s: %s is a symbolic link in a shared directory' % (path, current))
            info = os.stat(current)
        if not stat_mod.S_ISDIR(info.st_mode):
            raise ProcessError('state directory %s: %s is not a directory' % (path, current))
        leaf = index == len(parts) - 1
        if below_sticky and info.st_uid != euid:
            raise ProcessError('state directory %s: %s is owned by uid %d, not by us (uid %d), in a shared '
                               'directory' % (path, current, info.st_uid, euid))
        if info.st_uid not in (0, euid):
            raise ProcessError('state directory %s: %s is owned by uid %d (only root or uid %d may own it)'
                               % (path, current, info.st_uid, euid))
        shared = info.st_mode & (stat_mod.S_IWGRP | stat_mod.S_IWOTH)
        sticky = info.st_mode & stat_mod.S_ISVTX
        if shared and not sticky and not (leaf and info.st_uid == euid):
            raise ProcessError('state directory %s: %s is writable by others (mode %04o)'
                               % (path, current, stat_mod.S_IMODE(info.st_mode)))
        below_sticky = bool(shared and sticky)
        if leaf:
            if info.st_uid != euid:
                raise ProcessError('state directory %s is owned by uid %d, not by us (uid %d)'
                                   % (path, info.st_uid, euid))
            if stat_mod.S_IMODE(info.st_mode) != 0o700:
                os.chmod(current, 0o700)
    return path


# ----- starting a detached process -------------------------------------------------------------
def _quote(text):
    return "'" + str(text).replace("'", "'\"'\"'") + "'"


def spawn_detached(command, env, cwd, log_path, state_dir, job_id=None, proc='/proc', exit_files=()):
    """Start a shell command in its own session (its pid is the process group id), output appended
    to log_path, exit status written to state_dir/exit_code when it ends, and a pid file recording
    its identity (pid, start time, uid, job id). state_dir is made private (see private_dir).
    exit_files: more paths the exit status is copied to (a job directory other nodes read).

    Returns the identity record."""
    private_dir(state_dir)
    for name in (EXIT_CODE_FILE, PIDFILE):
        try:
            os.unlink(os.path.join(state_dir, name))
        except OSError:
            pass
    env = dict(env)
    if job_id:
        env[JOB_ENV] = str(job_id)
    wrapper = '( %s ); rc=$?; echo $rc > %s' % (command, _quote(os.path.join(state_dir, EXIT_CODE_FILE)))
    for path in exit_files:
        wrapper += '; echo $rc > %s' % _quote(path)
    with open(log_path, 'ab') as log, open(os.devnull, 'rb') as devnull:
        child = subprocess.Popen(['/bin/bash', '-c', wrapper], cwd=cwd, env=env, stdin=devnull,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 close_fds=True)
    info = read_stat(child.pid, proc)
    record = {'pid': child.pid, 'start_time': info['start_time'] if info else None, 'uid': os.geteuid(),
              'job_id': str(job_id) if job_id else None}
    write_pidfile(os.path.join(state_dir, PIDFILE), record)
    return record


# ----- signalling ------------------------------------------------------------------------------
def _send(target, sig, group):
    try:
        if group:
            os.killpg(target, sig)
        else:
            os.kill(target, sig)
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return GONE
        if exc.errno == errno.EPERM:
            return NOT_PERMITTED
        raise
    return SIGNALLED


def signal_process(recorded, sig, proc='/proc', uid=None, group=False):
    """Signal one process only when it still is the one recorded and is owned by uid (default: us).

    With group, signal its whole process group instead when it leads one (its pid is the group id),
    never our own group. Answers SIGNALLED, GONE, NOT_OURS or NOT_PERMITTED."""
    uid = os.geteuid() if uid is None else uid
    now = same_process(recorded, proc)
    if now is None:
        return GONE
    if now['uid'] != uid:
        return NOT_OURS
    lead = group and now['pgid'] == now['pid'] and now['pgid'] != os.getpgid(0)
    return _send(now['pgid'] if lead else now['pid'], sig, lead)


def signal_group(recorded, sig, proc='/proc', uid=None):
    """signal_process(..., group=True): the group a recorded leader leads, checked the same way."""
    return signal_process(recorded, sig, proc, uid, group=True)


def job_processes(job_id, uid=None, proc='/proc', leaders=()):
    """[{pid, pgid, uid, start_time, cmdline}] of a job's processes on this node: owned by uid
    (default: us) and either carrying GPUCLUSTER_JOB_ID=job_id in their environment, or members of
    the process group of a verified leader (an identity from pidfile_process) that carry no job id."""
    uid = os.geteuid() if uid is None else uid
    me = os.getpid()
    groups = {int(lead['pgid']) for lead in leaders if lead and lead.get('pgid') == lead.get('pid')}
    groups.discard(os.getpgid(0))
    found = []
    for pid in pids(proc):
        if pid == me:
            continue
        info = read_stat(pid, proc)
        if info is None or info['state'] in ('Z', 'X'):
            continue
        if read_uid(pid, proc) != uid:
            continue
        marker = read_environ(pid, proc).get(JOB_ENV)
        if marker == str(job_id) or (info['pgid'] in groups and marker is None):
            found.append({'pid': pid, 'pgid': info['pgid'], 'uid': uid, 'start_time': info['start_time'],
                          'cmdline': read_cmdline(pid, proc)})
    return found


def jobs_running(uid=None, proc='/proc'):
    """{job_id: [pids]} of every job with a process of uid (default: us) on this node."""
    uid = os.geteuid() if uid is None else uid
    out = {}
    for pid in pids(proc):
        if read_uid(pid, proc) != uid:
            continue
        job = read_environ(pid, proc).get(JOB_ENV)
        if job:
            out.setdefault(job, []).append(pid)
    return out


# Seconds a SIGKILLed process is given to go: one in uninterruptible I/O (a busy or slow shared
# filesystem) dies only once its I/O returns, seconds later on a loaded node.
KILL_WAIT_SECONDS = 15.0


def stop_job(job_id, uid=None, grace=10.0, proc='/proc', leaders=(), sleep=time.sleep, clock=time.time,
             daemons=()):
    """SIGTERM a job's processes (see job_processes), wait up to grace seconds, SIGKILL what is left.

    A group is signalled whole only through its live leader (verified, or one of the job's processes) when
    it holds only the job's live processes; every process no group signal reached (its leader exited, say the
    wrapper on SIGTERM) is signalled itself, re-checked (same start time) first.
    daemons: processes of the job that do not carry its id (a launcher's daemon, found by the caller),
    signalled, waited for and reported with them while each is still the process recorded.
    Returns {signalled: [pids], refused: [{pid, reason}], left: [processes]}."""
    uid = os.geteuid() if uid is None else uid
    signalled, refused = [], []
    own_group = os.getpgid(0)
    verified = {lead['pid']: lead for lead in leaders if lead}

    def remaining():
        mine = job_processes(job_id, uid, proc, leaders)
        return mine + [d for d in daemons if d['pid'] not in {p['pid'] for p in mine} and same_process(d, proc)]

    for sig, wait in ((signal.SIGTERM, float(grace)), (signal.SIGKILL, KILL_WAIT_SECONDS)):
        procs = remaining()
        if not procs:
            break
        by_pid = {p['pid']: p for p in procs}
        live = [s for s in (read_stat(pid, proc) for pid in pids(proc)) if s and s['state'] not in ('Z', 'X')]
        reached = set()  # the groups a signal through their live leader reached whole
        for pgid in sorted({p['pgid'] for p in procs} - {own_group, 0, 1}):
            lead = by_pid.get(pgid) or verified.get(pgid)
            if lead is not None and not [s for s in live if s['pgid'] == pgid and s['pid'] not in by_pid]:
                answer = signal_group({'pid': pgid, 'start_time': lead['start_time'], 'uid': uid}, sig, proc, uid)
                reached.update([pgid] if answer == SIGNALLED else [])
                refused += [pgid] if answer == NOT_PERMITTED and pgid not in refused else []
        for p in procs:
            answer = SIGNALLED if p['pgid'] in reached else signal_process(
                {'pid': p['pid'], 'start_time': p['start_time'], 'uid': uid}, sig, proc, uid)
            if answer == SIGNALLED:
                signalled.append(p['pid'])
            elif answer == NOT_PERMITTED and p['pid'] not in refused:
                refused.append(p['pid'])
        deadline = clock() + wait
        while clock() < deadline and remaining():
            sleep(0.2)
    return {'signalled': sorted(set(signalled)), 'refused': [{'pid': pid, 'reason': 'not permitted'} for pid in refused],
            'left': remaining()}


# ----- who listens on a TCP port ---------------------------------------------------------------
def _decode_address(hexaddr):
    """The text form of a /proc/net/tcp{,6} address column (host byte order per 32-bit word)."""
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, struct.pack('=I', struct.unpack('>I', raw)[0]))
    words = struct.unpack('>4I', raw)
    packed = b''.join(struct.pack('=I', w) for w in words)
    text = socket.inet_ntop(socket.AF_INET6, packed)
    if text.startswith('::ffff:') and '.' in text:
        return text[7:]
    return text


def parse_proc_net_tcp(text):
    """[{address, port, uid, inode}] of the LISTEN sockets in the text of /proc/net/tcp or tcp6."""
    out = []
    for line in (text or '').splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != '0A':
            continue
        addr, _, port = fields[1].rpartition(':')
        try:
            out.append({'address': _decode_address(addr), 'port': int(port, 16), 'uid': int(fields[7]),
                        'inode': fields[9]})
        except (ValueError, OSError):
            continue
    return out


WILDCARDS = ('0.0.0.0', '::')


def port_listeners(port, address=None, proc='/proc'):
    """[{pid, uid, cmdline, job_id, address}] of the processes listening on a TCP port ([] when it is
    free). With address, only sockets bound to that address or to a wildcard count. A socket whose
    owner this account cannot see gives one entry with pid None (and the socket's uid)."""
    sockets = {}
    for table in ('net/tcp', 'net/tcp6'):
        for item in parse_proc_net_tcp(_read(os.path.join(proc, table))):
            if item['port'] != int(port):
                continue
            if address and item['address'] not in WILDCARDS and item['address'] != address:
                continue
            sockets[item['inode']] = item
    if not sockets:
        return []
    found, seen = [], set()
    for pid in pids(proc):
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
            inode = target[8:-1] if target.startswith('socket:[') else None
            if inode in sockets:
                # one entry per process, every socket of it seen (sshd holds 0.0.0.0:22 and [::]:22)
                if inode not in seen and not any(f['pid'] == pid for f in found):
                    found.append({'pid': pid, 'uid': sockets[inode]['uid'], 'cmdline': read_cmdline(pid, proc),
                                  'job_id': read_environ(pid, proc).get(JOB_ENV),
                                  'address': sockets[inode]['address']})
                seen.add(inode)
    for inode, item in sockets.items():
        if inode not in seen:  # its owner is not visible (another user or namespace)
            found.append({'pid': None, 'uid': item['uid'], 'cmdline': '', 'job_id': None,
                          'address': item['address']})
    return found


def describe_listeners(port, listeners):
    """One human line about who holds a port."""
    parts = []
    for item in listeners:
        if item['pid'] is None:
            parts.append('a process this account cannot see (uid %s)' % item.get('uid', '?'))
            continue
        text = 'pid %d (%s)' % (item['pid'], item['cmdline'][:120] or '?')
        if item.get('job_id'):
            text += ' of job %s' % item['job_id']
        parts.append(text)
    return 'port %s is in use by %s' % (port, ', '.join(parts))


def tail_text(path, max_bytes):
    """(the text of the last max_bytes of a file, its mtime), None when it cannot be read. A first line cut
    by the bound is dropped, so every line returned is whole (a log can be large; its end is what is read)."""
    try:
        mtime = os.stat(path).st_mtime
        with open(path, 'rb') as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read(max_bytes)
    except (IOError, OSError):
        return None
    text = data.decode('utf-8', 'replace')
    if size > max_bytes:
        text = text.partition('\n')[2]
    return text, mtime


def tail(path, lines=20):
    """Last lines of a text file ([] when it does not exist)."""
    text = _read(path)
    if text is None:
        return []
    return text.splitlines()[-lines:]
