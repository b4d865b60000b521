# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The job's view from every node's rows (module_utils/job_monitor.py reads them on each node, the
training_progress module returns them): the slowest node, a stall and the ranks that stopped first, the
job's state with the lines to print, one line per rank, and the end-of-job summary. Controller only:
the training_monitor filter uses it."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.module_utils.job_monitor import slowest_node

PHASE_NAMES = {'checkpoint': 'saving checkpoint', 'eval': 'evaluating', 'load': 'loading checkpoint'}


def activity_age(row):
    """Seconds since the rank last showed life: its last step or heartbeat, and before its first
    step the time since it started (its progress header, else its process start); None when
    nothing tracks it."""
    if not row.get('tracked'):
        return None
    ages = [row.get('seconds_since_step'), row.get('seconds_since_heartbeat')]
    if row.get('last_step') is None:
        ages.append(row.get('seconds_since_start'))
    ages = [a for a in ages if isinstance(a, (int, float))]
    return min(ages) if ages else None


def phase_text(row):
    """'saving checkpoint since 40 s' of a rank between two steps, '' when it steps."""
    if not row.get('phase'):
        return ''
    return '%s since %s s' % (PHASE_NAMES.get(row['phase'], row['phase']), _fmt(row.get('phase_s'), '%.0f'))


SAVE_PHASES = ('checkpoint',)


def saving_age(row):
    """Seconds a rank has been saving a checkpoint (its latest heartbeat's phase is checkpoint: since
    the save began), None when it is not saving."""
    if row.get('phase') not in SAVE_PHASES:
        return None
    age = row.get('phase_s')
    return age if isinstance(age, (int, float)) else 0.0


def _quiet(row, stall_seconds, checkpoint_seconds):
    """(quiet, overlong) of a tracked rank: quiet when it showed no life for stall_seconds; with
    checkpoint_seconds, a rank saving a checkpoint whose heartbeats still come is quiet (overlong)
    only once its save began checkpoint_seconds ago or more."""
    age = activity_age(row)
    if checkpoint_seconds is None or saving_age(row) is None:
        return age >= stall_seconds, False
    beat = row.get('seconds_since_heartbeat')
    if not isinstance(beat, (int, float)) or beat >= stall_seconds:
        return age >= stall_seconds, False  # its heartbeats stopped: judged as any rank
    return saving_age(row) >= checkpoint_seconds, saving_age(row) >= checkpoint_seconds


def stall(rows, stall_seconds, checkpoint_seconds=None):
    """{stalled, off, ranks: [...first to stop...], nodes, why, collectives} of a job.

    Stalled: every rank alive and none of the tracked ones showed life (a step, a heartbeat, or
    before the first step its start) for stall_seconds. With checkpoint_seconds, a rank whose latest
    heartbeat says it saves a checkpoint (phase checkpoint, its heartbeats still coming) is judged by
    the save's age instead: it shows no life once its save began checkpoint_seconds ago or more (a
    heartbeat thread beats on while the main thread hangs in the save); a rank whose heartbeats
    stopped for stall_seconds is judged as before. None keeps every rank on stall_seconds.

    The ranks named are the ones held by the kernel (stopped, traced) when any is, else those in a
    save past checkpoint_seconds, else those without a step (a start-up hang), else those with the
    lowest last step, earliest first. When every rank stopped at the same step (a collective that
    never completed: the usual NCCL hang) all are named; collectives is left for a reader of the
    collectives in flight (NCCL's flight recorder) to fill: a list of lines.
    off: nothing tracks the job's steps (no progress file, no log line matching the regex)."""
    out = {'stalled': False, 'off': False, 'ranks': [], 'nodes': [], 'why': '', 'collectives': None}
    if rows and not any(r.get('tracked') for r in rows):
        out.update(off=True, why='no steps tracked')
        return out
    alive = [r for r in rows if r.get('alive')]
    if not alive or len(alive) != len(rows):
        return out
    tracked = [r for r in alive if activity_age(r) is not None]
    if not tracked:
        return out
    judged = [(r,) + _quiet(r, stall_seconds, checkpoint_seconds) for r in tracked]
    if not all(quiet for _, quiet, _ in judged):
        return out
    overlong = sorted([r for r, _, long in judged if long], key=lambda r: -saving_age(r))
    others = [r for r, _, long in judged if not long]
    held = [r for r in alive if r.get('held')]
    no_step = [r for r in tracked if r.get('last_step') is None]
    if held:
        first = held
        why = ', '.join('rank %d on %s is %s' % (r['rank'], r['node'], r['held']) for r in held)
    elif overlong:
        first = overlong
        why = ''
    elif no_step:
        first = no_step
        why = ('no rank logged a first step since it started: a start-up hang (rendezvous, NCCL '
               'initialisation, loading)' if len(no_step) == len(tracked) else
               '%s logged no step since it started' % ', '.join('rank %d' % r['rank'] for r in no_step))
    else:
        low = min(r['last_step'] for r in tracked)
        first = sorted([r for r in tracked if r['last_step'] == low], key=lambda r: r['last_step_time'])
        if len(first) == len(tracked) and len(tracked) > 1:
            why = ('every rank stopped after step %d: they wait in the same collective (a rank, GPU or '
                   'link that never joined it; the steps cannot tell which)' % low)
        else:
            why = 'lowest last step %d' % low
    phases = ['rank %d on %s has been %s' % (r['rank'], r['node'], phase_text(r).replace(' since ', ' for '))
              for r in others if r.get('phase')]
    if phases:
        why += ('; ' if why else '') + ', '.join(phases)
    if overlong:
        saves = 'a checkpoint save running for %d s (training_checkpoint_seconds %d) on %s' % (
            int(saving_age(overlong[0])), int(checkpoint_seconds),
            ', '.join('rank %d on %s' % (r['rank'], r['node']) for r in overlong))
        if others:
            saves += '; no other rank logged a step or heartbeat for %d s or more' % int(
                min(activity_age(r) for r in others))
        why = '%s%s' % (saves, ' (%s)' % why if why else '')
    else:
        why = 'no rank logged a step or heartbeat for %d s or more (%s)' % (
            int(min(activity_age(r) for r in tracked)), why)
    out.update(stalled=True, ranks=[r['rank'] for r in first], nodes=sorted({r['node'] for r in first}), why=why)
    return out


def fence_rows(rows, attempt=None, stale=()):
    """(rows, stale, attempt) of the job's newest attempt: attempt is the newest that a row or a node's
    read (attempt: each training_progress result's) names, None when none does; rows keeps the rows of
    that attempt (and those that name none); stale is every node's stale list (training_progress's, the
    same files are read by every node: listed once) with the rows of older attempts added (a node that
    read before the new attempt's ranks started there), sorted by rank."""
    numbers = [r['attempt'] for r in rows if _whole(r.get('attempt'))]
    numbers += [a for a in (attempt if isinstance(attempt, (list, tuple)) else [attempt]) if _whole(a)]
    newest = max(numbers) if numbers else None
    kept, out, seen = [], [], set()
    for item in list(stale or []):
        key = (item.get('kind'), item.get('rank'), item.get('attempt'), item.get('host'), item.get('pid'))
        if key not in seen:
            seen.add(key)
            out.append(dict(item))
    for row in rows:
        if newest is None or not _whole(row.get('attempt')) or row['attempt'] >= newest:
            kept.append(row)
            continue
        item = {'rank': row['rank'], 'attempt': row['attempt'], 'kind': 'process' if row.get('alive') else 'progress file',
                'host': row.get('node')}
        if row.get('alive'):
            item['pid'] = row.get('pid')
        key = (item['kind'], item['rank'], item['attempt'], item['host'], item.get('pid'))
        if key not in seen:
            seen.add(key)
            out.append(item)
    out.sort(key=lambda i: (i.get('rank', -1), str(i.get('kind')), i.get('attempt') or 0, str(i.get('host'))))
    return kept, out, newest


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def stale_line(stale, attempt):
    """'left out, of older attempts than attempt 2: rank 3 of attempt 1 (progress file, node-4)'."""
    items = ['rank %s of attempt %s (%s%s)' % (i.get('rank'), i.get('attempt'), i.get('kind'),
                                               ', %s' % i['host'] if i.get('host') else '') for i in stale]
    return 'left out, of older attempts than attempt %s: %s' % (attempt if attempt is not None else '?', ', '.join(items))


def node_states(rows, hosts, node_errors):
    """{node: running|finished|exited|no ranks|unknown} per host: unknown where its read failed."""
    out = {}
    for host in hosts:
        mine = [r for r in rows if r.get('node') == host]
        if host in node_errors:
            out[host] = 'unknown'
        elif any(r.get('alive') for r in mine):
            out[host] = 'running'
        elif mine and all(r.get('exit') == 'finished' for r in mine):
            out[host] = 'finished'
        else:
            out[host] = 'exited' if mine else 'no ranks'
    return out


def verdict(rows, stall_seconds, node_errors=None, step_regex=None, collectives=None, checkpoint_seconds=None,
            stale=None, attempt=None):
    """state (running, stalled, finished, failed, not running, unknown), slowest node, stall and the
    lines to print, from every node's rows. A node whose read failed (node_errors: {node: why})
    makes the state unknown: what the other nodes show says nothing of it. collectives: the lines
    of the NCCL flight recorder's dumps (flight_recorder.analyse), named with a stall.
    checkpoint_seconds: the bound of a checkpoint save whose heartbeats still come (stall).
    stale, attempt: what the nodes' reads left out of older attempts, and the attempts they read
    (one or a list): only the rows of the newest attempt are the job's (fence_rows); the others never
    make it stalled or failed, and a line names them."""
    node_errors = node_errors or {}
    rows, stale, attempt = fence_rows(rows, attempt, stale)
    rows = sorted(rows, key=lambda r: r['rank'])
    alive = [r for r in rows if r.get('alive')]
    exited = [r for r in rows if not r.get('alive') and r.get('exit') != 'finished']
    st = stall(rows, stall_seconds, checkpoint_seconds)
    if st['stalled'] and collectives:
        st['collectives'] = list(collectives)
    slow, slow_why = slowest_node(rows)
    if node_errors:
        state = 'unknown'
    elif st['stalled']:
        state = 'stalled'
    elif alive and exited:
        state = 'failed'
    elif alive:
        state = 'running'
    elif rows and not exited:
        state = 'finished'
    elif rows:
        state = 'failed'
    else:
        state = 'not running'
    if node_errors:
        lines = ['state: unknown (the read failed on %s: what the other nodes show cannot tell the job\'s state)'
                 % ', '.join(sorted(node_errors))]
    else:
        lines = ['state: %s' % state]
    for node, error in sorted(node_errors.items()):
        lines.append('%s: read failed: %s' % (node, error))
    if stale:
        lines.append(stale_line(stale, attempt))
    if st['stalled']:
        lines.append('stalled: %s; first to stop: %s' % (st['why'], ', '.join(
            'rank %d on %s' % (r, n) for r, n in ((r['rank'], r['node']) for r in rows if r['rank'] in st['ranks']))))
        for item in st.get('collectives') or []:
            lines.append('  collective: %s' % (item.get('line', item) if isinstance(item, dict) else item))
    if st['off'] and alive:
        lines.append('no steps tracked: the script writes no progress file and no log line matches '
                     'training_progress_regex (%s); stall detection is off for this job' % (step_regex or 'none set'))
    if slow:
        lines.append('slowest node: %s' % slow_why)
    for r in rows:
        lines.append(rank_line(r))
    return {'state': state, 'slowest_node': slow, 'slowest_why': slow_why, 'stall': st, 'lines': lines,
            'ranks': rows, 'node_errors': dict(node_errors), 'attempt': attempt, 'stale': stale}


def _fmt(value, pattern, missing='-'):
    return missing if value is None else pattern % value


def rank_line(r):
    """One line per rank, the figures a person watching the job looks at first."""
    if r.get('alive'):
        life = 'alive' if not r.get('held') else 'HELD (%s)' % r['held']
    else:
        life = r.get('exit', 'exited')
    parts = ['%s rank %d: %s' % (r['node'], r['rank'], life),
             'step %s' % _fmt(r.get('last_step'), '%d'),
             'loss %s' % _fmt(r.get('last_loss'), '%.4f'),
             '%s steps/s' % _fmt(r.get('steps_per_s'), '%.2f'),
             'last step %s s ago' % _fmt(r.get('seconds_since_step'), '%.0f')]
    if r.get('phase'):
        parts.append(phase_text(r))
    if r.get('tracked') == 'log':
        parts.append('steps from its log')
    elif str(r.get('tracked') or '').startswith('log of '):
        parts.append('steps from the %s' % r['tracked'])
    elif not r.get('tracked'):
        parts.append('no steps tracked')
    if r.get('compute_s') is not None:
        parts.append('compute %.3f s/step, wait %.3f' % (r['compute_s'], r['wait_s']))
    if r.get('alive'):
        parts.append('cpu %s%%' % _fmt(r.get('cpu_pct'), '%.0f'))
        rss = _fmt(r.get('rss_kib'), '%d', '?') if r.get('rss_kib') is None else r['rss_kib'] // 1024
        peak = '?' if r.get('peak_rss_kib') is None else r['peak_rss_kib'] // 1024
        parts.append('rss %s MiB (peak %s)' % (rss, peak))
    gpu = r.get('gpu')
    if gpu:
        parts.append('gpu %s: %s%% util, %s/%s MiB' % (gpu.get('index'), _fmt(gpu.get('utilization_pct'), '%d'),
                                                       _fmt(gpu.get('memory_used_mib'), '%d'),
                                                       _fmt(gpu.get('memory_total_mib'), '%d')))
    elif r.get('gpu_note'):
        parts.append(r['gpu_note'])
    return ', '.join(parts)


def summary(rows, job_id, state, slowest, finished_s):
    """The end-of-job record: steps, mean steps/s, slowest node, peak memory per rank."""
    ranks = []
    for r in sorted(rows, key=lambda r: r['rank']):
        ranks.append({'rank': r['rank'], 'node': r['node'], 'last_step': r.get('last_step'),
                      'mean_steps_per_s': r.get('mean_steps_per_s'), 'last_loss': r.get('last_loss'),
                      'peak_rss_kib': r.get('peak_rss_kib') or r.get('final_peak_rss_kib'),
                      'compute_s': r.get('compute_s')})
    rates = [r['mean_steps_per_s'] for r in ranks if isinstance(r['mean_steps_per_s'], (int, float))]
    steps = [r['last_step'] for r in ranks if isinstance(r['last_step'], int)]
    return {'job_id': job_id, 'state': state, 'written': finished_s, 'steps': max(steps) if steps else None,
            'mean_steps_per_s': round(sum(rates) / len(rates), 3) if rates else None,
            'slowest_node': slowest, 'ranks': ranks}
