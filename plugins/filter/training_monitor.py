# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Turn every node's training_progress result into the job's view: state, slowest node, stall."""

from __future__ import annotations

import time

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_state as js
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_view as jv
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import rank_failure as rfail


def training_progress_view(results, hosts, stall_seconds=600, job_id=None, step_regex=None, checkpoint_seconds=None):
    """{state, slowest_node, stall, lines, ranks, nodes, node_errors, summary, attempt, stale} from the
    per-node results of training_progress (in the order of hosts). Only the newest attempt's ranks are
    the job's: what the nodes read of older attempts is in stale, and a line names it. A node whose read failed is named with
    its error and makes the state unknown; nodes holds each node's own state (unknown there).
    checkpoint_seconds (training_checkpoint_seconds): how long a rank that saves a checkpoint, its
    heartbeats still coming, may save before it is stalled; None (or '') judges it by stall_seconds."""
    rows, flight, stale, attempts, flight_attempt, log_steps = [], None, [], [], 1, []
    results = [r or {} for r in results]
    errors = js.read_errors(results, hosts)
    for host, result in zip(hosts, results):
        if host in errors:
            continue
        if 'ranks' not in result:
            errors[host] = 'no figures in its answer'
            continue
        rows.extend(result['ranks'])
        if isinstance(result.get('log_last_step'), int):
            log_steps.append(result['log_last_step'])
        # the files and processes of older attempts each node left out (the view keeps the newest attempt only)
        stale.extend(result.get('stale') or [])
        if isinstance(result.get('attempt'), int):
            attempts.append(result['attempt'])
        step_regex = step_regex if step_regex is not None else result.get('step_regex')
        # every node reads the same dumps on the shared storage: the first that found some of the newest
        # attempt says it (a node that has seen no rank of a new attempt yet reads the one before)
        found = result.get('flight') or {}
        if found.get('lines') and (flight is None or found.get('attempt', 1) > flight_attempt):
            flight, flight_attempt = found['lines'], found.get('attempt', 1)
    if checkpoint_seconds is not None and str(checkpoint_seconds).strip() != '':
        checkpoint_seconds = float(checkpoint_seconds)
    else:
        checkpoint_seconds = None
    view = js.progress_verdict(rows, float(stall_seconds), errors, step_regex, flight, checkpoint_seconds, stale, attempts)
    view['nodes'] = js.node_states(view['ranks'], list(hosts), errors)
    view['summary'] = jv.summary(view['ranks'], job_id, view['state'], view['slowest_node'], time.time())
    if view['summary']['steps'] is None and log_steps:
        # an ended job of a script that writes no progress file: no rank rows, its last step from the logs
        view['summary']['steps'] = max(log_steps)
    return view


def training_first_failure(result, progress_results=None, hosts=None):
    """{error, lines} of a job's first failure (training_verdict's result): the failing rank's own error,
    picked again among the tracebacks the training_progress reads returned too (logs: every node's launcher
    and per-rank logs), and the lines that show it first; {error: None, lines: []} unless the job failed."""
    result = result or {}
    first = result.get('first_failure') or {}
    if result.get('state') != 'failed' or not first:
        return {'error': None, 'lines': []}
    errors = rfail.node_errors([{'errors': [first['error']], 'node': first['error'].get('node')}]
                               if first.get('error') else [])
    errors += rfail.node_errors(progress_results or [], hosts)
    error = rfail.first_error(errors, result.get('failed_nodes') or [first.get('node')], hosts)
    return {'error': error, 'lines': rfail.failure_lines(error, result.get('exit_codes'), first.get('node'))}


def training_watch_outcome(progress_state, verdict_state=None):
    """{fail, why} of a watch that ended (the last view's state, the job's verdict where it was read)."""
    return js.watch_outcome(progress_state, verdict_state)


def training_rank_line(row):
    """The one-line view of a rank (as in the view's lines)."""
    return jv.rank_line(row)


class FilterModule:
    def filters(self):
        return {'training_progress_view': training_progress_view, 'training_rank_line': training_rank_line,
                'training_first_failure': training_first_failure, 'training_watch_outcome': training_watch_outcome}
