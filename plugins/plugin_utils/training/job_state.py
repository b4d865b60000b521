# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Where a training job's state is decided: every node's read in, the job's state out. Controller only.

Two reads of the job, each with its verdict:
- the launchers' (training_job state=status on every node): job_verdict() - running, succeeded, failed,
  stopped or unknown, the failed nodes with the culprit first, every node's exit code and the first
  failure. What a result says is its launcher's rule (module_utils/training/launchers.py: exit_codes,
  failure_node, ended); a node whose read failed makes the job unknown, never stopped.
- the ranks' figures (training_progress, or training_job's progress): progress_verdict() - running,
  stalled, finished, failed, not running or unknown, the stall and the ranks that stopped first, the
  rows of the newest attempt only (fence_rows).

the job's one state from both: job_state() - running, succeeded, stopped, failed, unreachable, stalled or
unknown, with the nodes to blame in order (the node whose rank failed first, those that could not be read,
the stalled), the step and the attempt read. It is the `job` of the status file (status_record()) that the
supervisor reads: a fault is what job_state() says, the supervisor only decides what to do about it; and
whether a watch that ended failed: watch_outcome().

The training filters (training_verdict, training_job_verdict, training_progress_view, training_status_record)
read these for status, watch and the supervisor; plugin_utils/training/job_view.py prints them."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.module_utils.training.monitor import last_loss_line, slowest_node
from ansible_collections.gpucluster.multinode.plugins.module_utils.training.launchers import LAUNCHERS, Launcher
# when a job is stalled: the supervision core's rule, the same for pod 0 on Kubernetes
from ansible_collections.gpucluster.multinode.plugins.module_utils.training.supervision import (  # noqa: F401
    activity_age, saving_age, stall)
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_view as jv
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import rank_failure as rfail


# ----- the launchers' read ---------------------------------------------------------------------
def launcher_of(result):
    """The launcher class whose rules read a node's status result (its 'launcher'; the common rules when
    it names none)."""
    return LAUNCHERS.get((result or {}).get('launcher'), Launcher)


def job_verdict(results, hosts, nodes=None, job_id=None, left_out=None):
    """The job's verdict from every node's status result (results in the order of hosts, a task result
    registered on every host): unknown_verdict naming the nodes that could not be read, else
    launch_verdict of the others (nodes: the job's node names, head first). left_out: the job's nodes this
    read did not read (a status of training_status_nodes): the verdict says so (left_out, a line) and is
    of the nodes read only - job_state() takes from it a failure, never that the job runs or ended."""
    errors = read_errors(results, hosts)
    verdict = unknown_verdict(errors, job_id) if errors else launch_verdict(results, nodes)
    if left_out:
        verdict['left_out'] = list(left_out)
        verdict['lines'].insert(1, 'a read of part of the job: %s read, %s left out (training_status_nodes)'
                                % (', '.join(nodes or hosts), ', '.join(left_out)))
    return verdict


def read_errors(results, hosts):
    """{host: why} of the hosts whose read (a task result registered on every host) failed, was
    unreachable or gave no answer, in the order of hosts."""
    errors = {}
    for host, result in zip(hosts, results):
        result = result or {}
        if not result or result.get('failed') or result.get('unreachable'):
            errors[host] = str(result.get('msg') or 'no answer (the node could not be read)').strip()
    return errors


def unknown_verdict(errors, job_id):
    """The job's verdict (launch_verdict's keys) when some nodes could not be read: unknown,
    never stopped, naming each node with its error."""
    nodes = sorted(errors)
    lines = ['job %s: unknown (its state could not be read on %s)' % (job_id, ', '.join(nodes))]
    lines += ['%s: read failed: %s' % (node, errors[node]) for node in nodes]
    return {'state': 'unknown', 'failed_nodes': [], 'running_nodes': [], 'exit_codes': {}, 'first_failure': None,
            'last_loss_line': None, 'unknown_nodes': nodes, 'lines': lines}


def launch_verdict(results, nodes=None):
    """{state: running|succeeded|failed|stopped|unknown, failed_nodes, exit_codes, first_failure, lines}.

    results: the per-node return values of training_job with state=status, head first.
    A node counts as failed when its own launcher or agent exited non-zero, or when the deepspeed
    launcher on the head saw its ranks exit non-zero (pdsh). A job with a failed node is failed even
    while ranks still run elsewhere (they may hang in a collective until stopped). What one result says
    (its exit codes, the node its rank failure report names, the state once nothing runs) is its
    launcher's rule (module_utils/training/launchers.py: exit_codes, failure_node, ended)."""
    results = [r for r in results if r]
    order = nodes or [r.get('node') for r in results]
    codes = {}
    running = []
    for r in results:
        if r.get('running'):
            running.append(r.get('node'))
        # each launcher says what its node's result tells: its part's exit code, the nodes its head names
        codes.update(launcher_of(r).exit_codes(r))
    failed = [n for n in order if codes.get(n)]
    failed += [n for n in codes if codes[n] and n not in failed]
    # The launcher on the head (pdsh, mpirun, srun) names the nodes whose ranks failed: those come
    # before the head, whose launcher only exits non-zero because of them.
    named = [n for n in ((results[0] if results else {}).get('node_exit_codes') or {}) if n in failed]
    failed = named + [n for n in failed if n not in named]
    # torchrun: every agent exits non-zero once one rank dies; the culprit is the node whose rank
    # failed first (a signal such as SIGKILL breaks a tie), as torchrun's own reports say.
    # (Under Slurm one log holds every node's report: the report's own host is the node.)
    # DeepSpeed: the head's pdsh lines hold every node's launcher report, each naming its node.
    reports = [(r['rank_failure']['time'], 0 if (r['rank_failure'].get('exit_code') or 0) < 0 else 1,
                launcher_of(r).failure_node(r)) for r in results if r.get('rank_failure')]
    reports = [rep for rep in reports if rep[2] in failed]
    if reports:
        culprit = min(reports)[2]
        failed = [culprit] + [n for n in failed if n != culprit]
    head = results[0] if results else {}
    ended = launcher_of(head).ended(head)
    if failed:
        state = 'failed'
    elif running:
        state = 'running'
    elif ended:
        state = ended
    elif not any(r.get('exit_code') is not None for r in results):
        state = 'stopped' if results else 'unknown'
    else:
        state = 'succeeded' if all(c == 0 for c in codes.values()) else 'failed'
    first = None
    if failed:
        by_node = {r.get('node'): r for r in results}
        culprit = failed[0]
        source = head if launcher_of(head).one_log else (by_node.get(culprit) or head)
        tail = source.get('log_tail') or []
        log = source.get('log')
        pdsh_tail = (head.get('node_log_tails') or {}).get(culprit)
        if pdsh_tail and (source.get('role') == 'ranks' or not tail):
            tail, log = pdsh_tail, '%s (lines from %s)' % (head.get('log'), culprit)
        first = {'node': culprit, 'exit_code': codes.get(culprit), 'log': log, 'log_tail': tail}
        # the first failing rank's own error (a root error before the follow-ons of the ranks left waiting)
        reported = [r['rank_failure'] for r in results
                    if r.get('rank_failure') and launcher_of(r).failure_node(r) == culprit]
        first['error'] = rfail.first_error(rfail.node_errors(results), failed, order, reported[0] if reported else None)
    last = None
    for r in results:   # each node's loss line (read from more of its log than the tail), else its tail's
        last = last_loss_line([r['loss_line']] if r.get('loss_line') else r.get('log_tail'), last)
    lines = ['job %s: %s' % (head.get('job_id', '?'), state)]
    if first:
        lines.extend(rfail.failure_lines(first['error'], codes, first['node']))
    if last:
        lines.append('last loss line: %s' % last)
    if head.get('world_size'):
        lines.append('world %s' % head['world_size'])
    for r in results:
        ranks = r.get('ranks') or []
        span = '-' if not ranks else ('%d' % ranks[0] if ranks[0] == ranks[1] else '%d-%d' % tuple(ranks))
        lines.append('  %-20s %-8s ranks=%-6s running=%-5s exit=%s' % (r.get('node'), r.get('role', ''), span,
                                                                       bool(r.get('running')), codes.get(r.get('node'), '-')))
    lines.extend(jv.container_lines(results))
    if first:
        lines.append('first failure: %s (exit %s); last lines of %s:' % (first['node'], first['exit_code'], first['log']))
        lines.extend('  | ' + line for line in first['log_tail'])
    return {'state': state, 'failed_nodes': failed, 'running_nodes': running, 'exit_codes': codes,
            'first_failure': first, 'last_loss_line': last, 'lines': lines}


# ----- the ranks' figures ------------------------------------------------------------------------
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


def progress_verdict(rows, stall_seconds, node_errors=None, step_regex=None, collectives=None, checkpoint_seconds=None,
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
        lines.append(jv.stale_line(stale, attempt))
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
        lines.append(jv.rank_line(r))
    return {'state': state, 'slowest_node': slow, 'slowest_why': slow_why, 'stall': st, 'lines': lines,
            'ranks': rows, 'node_errors': dict(node_errors), 'attempt': attempt, 'stale': stale}


# ----- the job's one state ---------------------------------------------------------------------------
def _whole_list(values):
    return [v for v in values if _whole(v)]


def job_state(result, progress):
    """The job's one state from the launchers' verdict (launch_verdict's or unknown_verdict's keys) and the
    ranks' (progress_verdict's), either may be missing: {state, failed_nodes, unreachable_nodes,
    stalled_nodes, step, last_step_time, attempt, why; exit_code: the first failure's, where a rank failed).

    state: failed (a rank or launcher exited non-zero: failed_nodes, the culprit first), unreachable (a node
    could not be read; a rank that failed as well is in failed_nodes and said in why), stalled (no rank
    logged a step or heartbeat for training_stall_seconds: stalled_nodes, the nodes of the ranks that
    stopped first), else the launchers' running, succeeded or stopped, else unknown (nothing read).
    A failure wins over a stall: the ranks left waiting by a dead one look stalled too. A read of part of
    the job (the verdict's left_out) says failed or unreachable as any read, else unknown: it cannot tell
    that the job runs, stalls or ended. step and last_step_time: the highest of the ranks' rows; attempt:
    the lowest attempt either verdict names (a read that still shows an earlier attempt is of that one)."""
    result = result if isinstance(result, dict) else {}
    progress = progress if isinstance(progress, dict) else {}
    ranks = progress.get('ranks') or []
    steps = [r.get('last_step') for r in ranks if _whole(r.get('last_step'))]
    times = [r.get('last_step_time') for r in ranks if isinstance(r.get('last_step_time'), (int, float))]
    attempts = _whole_list([result.get('attempt'), progress.get('attempt')])
    out = {'state': 'unknown', 'failed_nodes': [], 'unreachable_nodes': [], 'stalled_nodes': [],
           'step': max(steps) if steps else None, 'last_step_time': max(times) if times else None,
           'attempt': min(attempts) if attempts else None, 'why': ''}
    unknown = list(result.get('unknown_nodes') or [])
    unreachable = unknown + [n for n in sorted(progress.get('node_errors') or {}) if n not in unknown]
    stalled = progress.get('stall') or {}
    failed_why = None
    if result.get('state') == 'failed':
        first = result.get('first_failure') or {}
        failed = list(result.get('failed_nodes') or [])
        out['failed_nodes'] = failed
        failed_why = 'a rank failed first on %s (exit %s)' % (first.get('node') or ', '.join(failed or ['?']),
                                                              first.get('exit_code'))
        if isinstance(first.get('exit_code'), int) and not isinstance(first.get('exit_code'), bool):
            out['exit_code'] = first['exit_code']  # the first failure's: a failure policy's rule may name it
    left_out = list(result.get('left_out') or [])
    if left_out:
        out['left_out'] = left_out
    if unreachable:
        out.update(state='unreachable', unreachable_nodes=unreachable,
                   why='%s could not be read' % ', '.join(unreachable) + ('; %s' % failed_why if failed_why else ''))
    elif failed_why:
        out.update(state='failed', why=failed_why)
    elif left_out:
        # what the nodes read show says nothing of the others: no stall, no end of the whole job
        out['why'] = 'a read of part of the job saw no failure (left out: %s)' % ', '.join(left_out)
    elif progress.get('state') == 'stalled' or stalled.get('stalled'):
        out.update(state='stalled', stalled_nodes=list(stalled.get('nodes') or []), why=stalled.get('why') or 'stalled')
    elif result.get('state') in ('running', 'succeeded', 'stopped'):
        out['state'] = result['state']
    elif not result and not progress:
        out['why'] = 'the status read gave nothing'
    return out


def status_record(result, progress=None):
    """What a status read writes for the job's supervisor (training_status_file): the two verdicts and the
    job's one state (job_state) as `job`."""
    record = {'result': result if isinstance(result, dict) else {}, 'job': job_state(result, progress)}
    if progress is not None:
        record['progress'] = progress
    return record


def watch_outcome(progress_state, verdict_state=None):
    """{fail, why} of a watch that ended: it fails when the job failed (its ranks' view or its verdict),
    stalled or could not be read; finished, stopped, not running or still running at the end of the
    watch's bound end it cleanly."""
    if progress_state in ('failed', 'stalled', 'unknown'):
        return {'fail': True, 'why': 'the job is %s' % progress_state}
    if verdict_state in ('failed', 'unknown'):
        return {'fail': True, 'why': 'the job is %s' % verdict_state}
    return {'fail': False, 'why': 'the job is %s' % (progress_state or verdict_state or 'not running')}
