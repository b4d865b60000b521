# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""PyTorch's NCCL flight recorder: the environment that turns it on for a job, the request for a dump
through each rank's debug-info pipe, and the reading of the dumps its ranks leave in the job's
directory to tell which rank did not enter the collective the others wait in.

With TORCH_FR_BUFFER_SIZE set, each rank's process group keeps its last collectives in a ring; with
TORCH_NCCL_DUMP_ON_TIMEOUT=1, a collective that times out makes every rank write that ring to
``TORCH_FR_DUMP_TEMP_FILE<rank>``. With TORCH_NCCL_DEBUG_INFO_PIPE_FILE set, every rank's monitor
thread makes a FIFO ``<pipe file><rank>.pipe`` and polls it (about once a second): whatever is
written there makes that rank write the same dump while it keeps running. torch before 2.8 reads
TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE (and creates the pipe only with
TORCH_NCCL_TRACE_BUFFER_SIZE set), later ones TORCH_FR_*: a job gets both generations. It also gets
TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (tear the process down without aborting the communicators): with 1
the watchdog aborts the communicators, and the ranks die, before the dump is written.

Each attempt of a job (GPUCLUSTER_ATTEMPT: the supervisor starts a failed job again as attempt 2, 3,
...) has its own dumps and pipes: attempt 1 in ``<job_dir>/flight/``, attempt N in
``<job_dir>/flight/attempt-N/``; the readers read one attempt only. A dump is a pickle of a dict::

    {'version': '2.10', 'pg_config': {'0': {'name': '0', 'desc': 'default_pg', 'ranks': '[0, 1]'}},
     'pg_status': {'0': {'last_enqueued_collective': 5, 'last_started_collective': 5,
                         'last_completed_collective': 4}},
     'entries': [{'collective_seq_id': 5, 'profiling_name': 'nccl:all_reduce',
                  'state': 'scheduled' | 'started' | 'completed', 'retired': False,
                  'process_group': ('0', 'default_pg'), 'is_p2p': False, 'input_sizes': [[4]],
                  'time_created_ns': 1795633010407016072, ...}, ...]}

It is read with an unpickler that builds only plain values (dicts, lists, strings, numbers): a
file that asks for any class is refused, never run. Standard library only: the supervisor imports
this file on its host, where no Ansible is installed."""

from __future__ import annotations

import ast
import errno
import io
import os
import pickle
import re
import stat
import time

FLIGHT_DIR = 'flight'
ATTEMPT_DIR = 'attempt-%d'
ATTEMPT_RE = re.compile(r'^attempt-(\d+)$')
DUMP_PREFIX = 'rank_'
DUMP_RE = re.compile(r'^%s(\d+)$' % DUMP_PREFIX)
PIPE_SUFFIX = '.pipe'
BUFFER_SIZE = 2000
MAX_DUMP_BYTES = 64 * 1024 * 1024
# the variables, each generation's name: (torch 2.8 and later, before)
BUFFER_ENV = ('TORCH_FR_BUFFER_SIZE', 'TORCH_NCCL_TRACE_BUFFER_SIZE')
DUMP_FILE_ENV = ('TORCH_FR_DUMP_TEMP_FILE', 'TORCH_NCCL_DEBUG_INFO_TEMP_FILE')
# ProcessGroupNCCL reads TORCH_NCCL_DEBUG_INFO_PIPE_FILE; XCCL (torch on Intel GPUs) the TORCH_FR_ name
PIPE_FILE_ENV = ('TORCH_FR_DEBUG_INFO_PIPE_FILE', 'TORCH_NCCL_DEBUG_INFO_PIPE_FILE')
ASYNC_ERROR_ENV = 'TORCH_NCCL_ASYNC_ERROR_HANDLING'
ASYNC_ERROR_SKIP_CLEANUP = '3'


def attempt_number(value):
    """An attempt from GPUCLUSTER_ATTEMPT: a whole number of 1 or more; 1 when missing or anything else."""
    text = str(value if value is not None else '').strip()
    return int(text) if text.isdigit() and int(text) > 0 else 1


def attempt_dir(job_dir, attempt=1):
    """Where the dumps and pipes of one attempt of the job are."""
    attempt = attempt_number(attempt)
    folder = os.path.join(job_dir, FLIGHT_DIR)
    return folder if attempt == 1 else os.path.join(folder, ATTEMPT_DIR % attempt)


def dump_path(job_dir, attempt, rank):
    return os.path.join(attempt_dir(job_dir, attempt), '%s%d' % (DUMP_PREFIX, rank))


def pipe_path(job_dir, attempt, rank):
    return dump_path(job_dir, attempt, rank) + PIPE_SUFFIX


def newest_attempt(job_dir):
    """The newest attempt that has a directory of dumps (attempt-N), 1 when none has."""
    try:
        names = os.listdir(os.path.join(job_dir, FLIGHT_DIR))
    except OSError:
        return 1
    numbers = [int(m.group(1)) for m in (ATTEMPT_RE.match(n) for n in names) if m]
    return max([n for n in numbers if n > 0] or [1])


def job_env(job_dir, attempt=1):
    """The flight recorder's variables for one attempt of a job whose ranks use NCCL (training_env
    overrides them): the ring, the dump on a timeout, the dump file and the debug-info pipe under both
    generations' names, and the error handling that lets the dump be written."""
    prefix = os.path.join(attempt_dir(job_dir, attempt), DUMP_PREFIX)
    env = {'TORCH_NCCL_DUMP_ON_TIMEOUT': '1', ASYNC_ERROR_ENV: ASYNC_ERROR_SKIP_CLEANUP}
    for names, value in ((BUFFER_ENV, str(BUFFER_SIZE)), (DUMP_FILE_ENV, prefix), (PIPE_FILE_ENV, prefix)):
        env.update((name, value) for name in names)
    return env


def set_aside(job_dir, attempt=1):
    """Rename the dumps an earlier run of the same job id and attempt left (rank_N to rank_N.previous),
    so that this run's readers never take them for its own; [the renamed paths]."""
    folder, moved = attempt_dir(job_dir, attempt), []
    try:
        names = os.listdir(folder)
    except OSError:
        return moved
    for name in names:
        if DUMP_RE.match(name):
            try:
                os.replace(os.path.join(folder, name), os.path.join(folder, name + '.previous'))
                moved.append(os.path.join(folder, name))
            except OSError:
                pass  # another node of the job set it aside first
    return moved


def _state(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _write_pipe(pipe):
    """Write one line to a rank's debug-info pipe without ever blocking; None, or why it was not asked."""
    try:
        st = os.lstat(pipe)
    except OSError:
        return 'no debug-info pipe %s (the rank has not made its process group, or its torch makes none)' % pipe
    if not stat.S_ISFIFO(st.st_mode):
        return '%s is not a FIFO' % pipe
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | getattr(os, 'O_NOFOLLOW', 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return 'no process reads its pipe %s (the rank is gone, or runs on another node)' % pipe
        return 'cannot open its pipe %s: %s' % (pipe, exc.strerror)
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return '%s is not a FIFO' % pipe
        os.write(fd, b'1\n')
    except OSError as exc:
        if exc.errno != errno.EAGAIN:  # EAGAIN: the pipe is full of requests the rank has not read yet
            return 'cannot write to its pipe %s: %s' % (pipe, exc.strerror)
    finally:
        os.close(fd)
    return None


def request_dumps(job_dir, attempt, ranks, timeout=20.0, poll=0.25, settle=0.5, sleep=time.sleep,
                  clock=time.monotonic):
    """Ask each of ranks (of one attempt, its process on this node) for its flight recorder's dump through
    its debug-info pipe, then wait at most timeout seconds for the dumps: a rank's is there once its dump
    file changed (made or written again) and then stayed the same for settle seconds. Writes one line to
    each pipe, opened without blocking (a pipe nobody reads is skipped), and signals nothing.
    {flight_dumps: {rank: path}, flight_dump_missing: [{rank, why}]}."""
    asked, missing, dumps = {}, [], {}
    for rank in sorted(set(ranks)):
        path = dump_path(job_dir, attempt, rank)
        before = _state(path)
        why = _write_pipe(pipe_path(job_dir, attempt, rank))
        if why:
            missing.append({'rank': rank, 'why': why})
        else:
            asked[rank] = (path, before)
    seen = {}  # rank: (state, since)
    deadline = clock() + max(0.0, float(timeout))
    while True:
        for rank, (path, before) in asked.items():
            now = _state(path)
            if rank in dumps or now is None or now == before or not now[1]:
                continue
            if seen.get(rank, (None,))[0] != now:
                seen[rank] = (now, clock())
            elif clock() - seen[rank][1] >= settle:
                dumps[rank] = path
        if len(dumps) == len(asked) or clock() >= deadline:
            break
        sleep(poll)
    for rank in sorted(set(asked) - set(dumps)):
        missing.append({'rank': rank, 'why': 'asked through its pipe, but %s within %s s' % (
            'its dump was still being written' if rank in seen else 'no new dump came', timeout)})
    return {'flight_dumps': dumps, 'flight_dump_missing': sorted(missing, key=lambda m: m['rank'])}


class DumpError(Exception):
    pass


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise DumpError('it asks for %s.%s; a flight recorder dump holds plain values only' % (module, name))


def load(data):
    """The dict of one dump (bytes); DumpError when it is not one."""
    try:
        dump = _PlainUnpickler(io.BytesIO(data)).load()
    except DumpError:
        raise
    except Exception as exc:  # a truncated or foreign file: any unpickling error
        raise DumpError('not a pickle: %s' % exc)
    if not isinstance(dump, dict) or not isinstance(dump.get('entries'), list):
        raise DumpError('not a flight recorder dump (no entries)')
    return dump


def read_dir(job_dir, attempt=None):
    """({rank: dump}, {file: error}) of the dumps of one attempt (None: the newest, newest_attempt)."""
    folder = attempt_dir(job_dir, newest_attempt(job_dir) if attempt is None else attempt)
    dumps, errors = {}, {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return dumps, errors
    for name in names:
        match = DUMP_RE.match(name)
        if not match:
            continue
        path = os.path.join(folder, name)
        try:  # the supervisor reads them as root: a regular file only, never a link followed, a FIFO waited on
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW), 'rb') as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise DumpError('not a regular file')
                data = handle.read(MAX_DUMP_BYTES + 1)
            if len(data) > MAX_DUMP_BYTES:
                raise DumpError('larger than %d MiB' % (MAX_DUMP_BYTES // 1048576))
            dumps[int(match.group(1))] = load(data)
        except (OSError, DumpError) as exc:
            errors[path] = str(exc)
    return dumps, errors


def _pg(entry):
    group = entry.get('process_group')
    if isinstance(group, (list, tuple)) and group:
        return str(group[0])
    return str(entry.get('pg_id', '0'))


def _call(entry):
    return {'seq': entry.get('collective_seq_id'), 'name': entry.get('profiling_name') or '?'}


def _completed(entry):
    return entry.get('state') == 'completed' or entry.get('retired') is True


def rank_view(dump):
    """{process group: {last_started, last_completed, waiting}} of one rank's dump: the last collective
    it entered (scheduled or started), the last it completed, and the one it waits in (entered, not
    completed), each {seq, name} or None."""
    out = {}
    for entry in dump['entries']:
        if not isinstance(entry, dict) or entry.get('is_p2p') or not isinstance(entry.get('collective_seq_id'), int):
            continue
        view = out.setdefault(_pg(entry), {'last_started': None, 'last_completed': None, 'waiting': None})
        seq = entry['collective_seq_id']
        if view['last_started'] is None or seq >= view['last_started']['seq']:
            view['last_started'] = _call(entry)
        if _completed(entry):
            if view['last_completed'] is None or seq >= view['last_completed']['seq']:
                view['last_completed'] = _call(entry)
        elif view['waiting'] is None or seq >= view['waiting']['seq']:
            view['waiting'] = _call(entry)
    return out


def _pg_ranks(dumps, pg):
    for dump in dumps.values():
        config = (dump.get('pg_config') or {}).get(pg) or {}
        try:
            ranks = ast.literal_eval(str(config.get('ranks', '')))
        except (ValueError, SyntaxError):
            continue
        if isinstance(ranks, (list, tuple)) and all(isinstance(r, int) for r in ranks):
            return sorted(ranks)
    return None


def _fmt(call):
    return '%s #%s' % (call['name'], call['seq']) if call else 'none'


def analyse(dumps, errors=None):
    """What the ranks' dumps say of a stalled job: per rank its last started and completed
    collective, the collective the others wait in and the ranks that did not enter it (named by the
    last collective they did enter), per process group, with the lines to print."""
    views = {rank: rank_view(dump) for rank, dump in dumps.items()}
    groups = sorted({pg for view in views.values() for pg in view})
    out = {'ranks': {}, 'groups': [], 'not_entered': [], 'lines': [], 'errors': dict(errors or {})}
    for rank in sorted(views):
        default = views[rank].get(groups[0]) if groups else None
        out['ranks'][rank] = {'last_started': default and default['last_started'],
                              'last_completed': default and default['last_completed'],
                              'groups': views[rank]}
    for pg in groups:
        members = _pg_ranks(dumps, pg) or sorted(r for r in views if pg in views[r])
        waiting = [(r, views[r][pg]['waiting']) for r in members if r in views and pg in views[r]
                   and views[r][pg]['waiting']]
        if not waiting:
            continue
        top = max(call['seq'] for _, call in waiting)
        name = [call['name'] for _, call in waiting if call['seq'] == top][0]
        waiters = sorted(r for r, call in waiting if call['seq'] == top)
        behind, no_dump = [], []
        for r in members:
            if r not in views:
                no_dump.append(r)
                continue
            last = (views[r].get(pg) or {}).get('last_started')
            if last is None or last['seq'] < top:
                behind.append({'rank': r, 'last_started': last})
        group = {'process_group': pg, 'waiting_in': {'seq': top, 'name': name}, 'waiting_ranks': waiters,
                 'not_entered': behind, 'no_dump': no_dump}
        out['groups'].append(group)
        out['not_entered'] += [b['rank'] for b in behind if b['rank'] not in out['not_entered']]
        line = 'process group %s: rank(s) %s wait in %s' % (pg, ', '.join(map(str, waiters)), _fmt(group['waiting_in']))
        if behind:
            line += '; not entered by ' + ', '.join(
                'rank %d (last started %s)' % (b['rank'], _fmt(b['last_started'])) for b in behind)
        if no_dump:
            line += '; no dump from rank(s) %s' % ', '.join(map(str, no_dump))
        out['lines'].append(line)
    for rank in sorted(out['ranks']):
        view = out['ranks'][rank]
        out['lines'].append('rank %d: last started %s, last completed %s'
                            % (rank, _fmt(view['last_started']), _fmt(view['last_completed'])))
    for path, error in sorted(out['errors'].items()):
        out['lines'].append('%s: not read (%s)' % (path, error))
    return out


def read_job(job_dir, attempt=None):
    """analyse() of the dumps of one attempt (None: the newest) with its attempt, or {} when it has none."""
    attempt = newest_attempt(job_dir) if attempt is None else attempt_number(attempt)
    dumps, errors = read_dir(job_dir, attempt)
    if not dumps and not errors:
        return {}
    return dict(analyse(dumps, errors), attempt=attempt)


def _pg_desc(dumps, pg):
    """The process group's description (default_pg, or the group_desc it was made with), else its id."""
    for dump in dumps.values():
        desc = ((dump.get('pg_config') or {}).get(pg) or {}).get('desc')
        if desc:
            return str(desc)
        for entry in dump['entries']:
            group = entry.get('process_group') if isinstance(entry, dict) else None
            if isinstance(group, (list, tuple)) and len(group) > 1 and str(group[0]) == pg and group[1]:
                return str(group[1])
    return pg


def _ranks_text(ranks):
    return '%s %s' % ('rank' if len(ranks) == 1 else 'ranks', ', '.join(map(str, ranks)))


def stall_verdict(job_dir, attempt=None):
    """What the dumps of one attempt of a stalled job (None: the newest) say, or None when they name
    no collective that ranks wait in: {collective, seq, process_group, process_group_id, missing_ranks,
    waiting_ranks, no_dump, last_entered, attempt, why}. missing_ranks: those whose dump shows they never
    entered it (last_entered: {rank: 'name #seq'} of the last they did); no_dump: members that left no
    dump. Of several process groups with ranks waiting, the first whose waiters miss a rank that dumped."""
    attempt = newest_attempt(job_dir) if attempt is None else attempt_number(attempt)
    dumps, errors = read_dir(job_dir, attempt)
    if not dumps:
        return None
    groups = analyse(dumps, errors)['groups']
    groups = [g for g in groups if g['not_entered']] + [g for g in groups if not g['not_entered'] and g['no_dump']]
    if not groups:
        return None
    group = groups[0]
    call, pg = group['waiting_in'], group['process_group']
    missing = [b['rank'] for b in group['not_entered']]
    last = dict((b['rank'], _fmt(b['last_started']) if b['last_started'] else None) for b in group['not_entered'])
    name = _pg_desc(dumps, pg)
    waiters = group['waiting_ranks']
    listed = '%s %s' % (_ranks_text(waiters), 'waits' if len(waiters) == 1 else 'wait')
    if missing:
        if len(waiters) + len(missing) == len(_pg_ranks(dumps, pg) or dumps) and not group['no_dump']:
            listed = 'the other rank waits' if len(waiters) == 1 else 'the other %d ranks wait' % len(waiters)
        why = '%s never entered %s #%s of process group %s (%s in it; %s)' % (
            _ranks_text(missing), call['name'], call['seq'], name, listed,
            ', '.join('rank %d last entered %s' % (r, last[r]) if last[r] else 'rank %d entered none of it'
                      % r for r in missing))
    else:
        why = '%s in %s #%s of process group %s' % (listed, call['name'], call['seq'], name)
    if group['no_dump']:
        why += '; %s left no dump' % _ranks_text(group['no_dump'])
    return {'collective': call['name'], 'seq': call['seq'], 'process_group': name, 'process_group_id': pg,
            'missing_ranks': missing, 'waiting_ranks': waiters, 'no_dump': group['no_dump'],
            'last_entered': last, 'attempt': attempt, 'why': why}
