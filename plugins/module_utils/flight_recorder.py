# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""PyTorch's NCCL flight recorder: the environment that turns it on for a job, and the reading of
the dumps its ranks leave in ``<job_dir>/flight/`` to tell which rank did not enter the collective
the others wait in.

With TORCH_FR_BUFFER_SIZE set, each rank's process group keeps its last collectives in a ring; with
TORCH_NCCL_DUMP_ON_TIMEOUT=1, a collective that times out makes every rank write that ring to
``TORCH_FR_DUMP_TEMP_FILE<rank>`` (TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE
are the names before torch 2.8). A dump is a pickle of a dict::

    {'version': '2.10', 'pg_config': {'0': {'name': '0', 'desc': 'default_pg', 'ranks': '[0, 1]'}},
     'pg_status': {'0': {'last_enqueued_collective': 5, 'last_started_collective': 5,
                         'last_completed_collective': 4}},
     'entries': [{'collective_seq_id': 5, 'profiling_name': 'nccl:all_reduce',
                  'state': 'scheduled' | 'started' | 'completed', 'retired': False,
                  'process_group': ('0', 'default_pg'), 'is_p2p': False, 'input_sizes': [[4]],
                  'time_created_ns': 1795633010407016072, ...}, ...]}

It is read with an unpickler that builds only plain values (dicts, lists, strings, numbers): a
file that asks for any class is refused, never run."""

from __future__ import annotations

import ast
import io
import os
import pickle
import re

FLIGHT_DIR = 'flight'
DUMP_PREFIX = 'rank_'
DUMP_RE = re.compile(r'^%s(\d+)$' % DUMP_PREFIX)
BUFFER_SIZE = 2000
MAX_DUMP_BYTES = 64 * 1024 * 1024


def job_env(job_dir):
    """The flight recorder's variables for a job whose ranks use NCCL (training_env overrides them)."""
    return {'TORCH_FR_BUFFER_SIZE': str(BUFFER_SIZE),
            'TORCH_NCCL_DUMP_ON_TIMEOUT': '1',
            'TORCH_FR_DUMP_TEMP_FILE': os.path.join(job_dir, FLIGHT_DIR, DUMP_PREFIX)}


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


def read_dir(job_dir):
    """({rank: dump}, {file: error}) of the dumps in <job_dir>/flight/."""
    folder = os.path.join(job_dir, FLIGHT_DIR)
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
        try:
            if os.path.getsize(path) > MAX_DUMP_BYTES:
                raise DumpError('larger than %d MiB' % (MAX_DUMP_BYTES // 1048576))
            with open(path, 'rb') as handle:
                dumps[int(match.group(1))] = load(handle.read())
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


def read_job(job_dir):
    """analyse() of the dumps in <job_dir>/flight/, or {} when there are none."""
    dumps, errors = read_dir(job_dir)
    if not dumps and not errors:
        return {}
    return analyse(dumps, errors)
