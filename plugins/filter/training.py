# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Turn the per-node results of training_job (state=status) into one verdict for the job."""

from __future__ import annotations

import json
import os

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import containers as cn
from ansible_collections.gpucluster.multinode.plugins.module_utils import deepspeed_ops
from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf
from ansible_collections.gpucluster.multinode.plugins.module_utils import training as tr
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import python_env
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import rank_failure as rfail


def _rank_failure_node(result):
    """The node a result's rank failure report names: the one deepspeed's head log names, the report's own
    host under Slurm (one log holds every node's report), else the node that read it (torchrun)."""
    failure = result['rank_failure']
    return failure.get('node') or (failure['host'] if result.get('slurm_job_id') else result.get('node'))


def training_verdict(results, nodes=None):
    """{state: running|succeeded|failed|stopped|unknown, failed_nodes, exit_codes, first_failure, lines}.

    results: the per-node return values of training_job with state=status, head first.
    A node counts as failed when its own launcher or agent exited non-zero, or when the deepspeed
    launcher on the head saw its ranks exit non-zero (pdsh). A job with a failed node is failed even
    while ranks still run elsewhere (they may hang in a collective until stopped)."""
    results = [r for r in results if r]
    order = nodes or [r.get('node') for r in results]
    codes = {}
    running = []
    for r in results:
        node = r.get('node')
        if r.get('running'):
            running.append(node)
        if r.get('slurm_job_id'):
            # Slurm: the batch script's status is the job's; srun names the nodes whose task failed
            if r.get('exit_code') and not r.get('node_exit_codes') and not str(r.get('slurm_state')).startswith('CANCELLED'):
                codes[node] = r['exit_code']
        elif r.get('exit_code') is not None:
            codes[node] = r['exit_code']
        cancelled = str(r.get('slurm_state') or '').startswith('CANCELLED')
        for other, code in ({} if cancelled else (r.get('node_exit_codes') or {})).items():
            # pdsh names hosts as the hostfile does; map addresses back to node names where we can
            codes[other] = code
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
                _rank_failure_node(r)) for r in results if r.get('rank_failure')]
    reports = [rep for rep in reports if rep[2] in failed]
    if reports:
        culprit = min(reports)[2]
        failed = [culprit] + [n for n in failed if n != culprit]
    head = results[0] if results else {}
    slurm_state = str(head.get('slurm_state') or '')
    if failed:
        state = 'failed'
    elif running:
        state = 'running'
    elif head.get('exit_code') == 0 or slurm_state == 'COMPLETED':
        state = 'succeeded'
    elif slurm_state.startswith('CANCELLED'):
        state = 'stopped'
    elif not any(r.get('exit_code') is not None for r in results):
        state = 'stopped' if results else 'unknown'
    else:
        state = 'succeeded' if all(c == 0 for c in codes.values()) else 'failed'
    first = None
    if failed:
        by_node = {r.get('node'): r for r in results}
        culprit = failed[0]
        source = by_node.get(culprit) or head
        tail = source.get('log_tail') or []
        log = source.get('log')
        pdsh_tail = (head.get('node_log_tails') or {}).get(culprit)
        if pdsh_tail and (source.get('role') == 'ranks' or not tail):
            tail, log = pdsh_tail, '%s (lines from %s)' % (head.get('log'), culprit)
        first = {'node': culprit, 'exit_code': codes.get(culprit), 'log': log, 'log_tail': tail}
        # the first failing rank's own error (a root error before the follow-ons of the ranks left waiting)
        reported = [r['rank_failure'] for r in results if r.get('rank_failure') and _rank_failure_node(r) == culprit]
        first['error'] = rfail.first_error(rfail.node_errors(results), failed, order, reported[0] if reported else None)
    last = None
    for r in results:
        for line in r.get('log_tail') or []:
            if 'final loss' in line or (last is None or 'final loss' not in last) and ' loss ' in line:
                last = line.strip()
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
    lines.extend(container_lines(results))
    if first:
        lines.append('first failure: %s (exit %s); last lines of %s:' % (first['node'], first['exit_code'], first['log']))
        lines.extend('  | ' + line for line in first['log_tail'])
    return {'state': state, 'failed_nodes': failed, 'running_nodes': running, 'exit_codes': codes,
            'first_failure': first, 'last_loss_line': last, 'lines': lines}


def container_lines(results):
    """Each node's containers of the job (podman: name, image id, state, exit code), for a job run in
    containers (the results carry 'containers'); a node that has none says so."""
    lines = []
    for r in results:
        if 'containers' not in r:
            continue
        boxes = r.get('containers') or []
        if not boxes:
            lines.append('  %-20s containers: none' % r.get('node'))
        for box in boxes:
            code = box.get('exit_code')
            lines.append('  %-20s container %s image %s %s exit=%s' % (
                r.get('node'), box.get('name') or box.get('id'), box.get('image_id') or box.get('image') or '?',
                box.get('state') or '?', '-' if code is None else code))
    return lines


def training_stopped_lines(results, job_id):
    """What a stop did, per node: the containers it removed and the processes it signalled, from the
    results of training_job state=stopped (a node that answered nothing is named as unknown)."""
    lines = ['job %s stopped; nothing of it runs on any node' % job_id]
    for r in results:
        if not isinstance(r, dict) or 'node' not in r:
            continue
        removed = r.get('removed_containers') or []
        pids = r.get('stopped_pids') or []
        what = []
        if removed:
            what.append('removed container(s) %s' % ', '.join(removed))
        if pids:
            what.append('signalled process(es) %s' % ', '.join(str(p) for p in pids))
        lines.append('%s: %s' % (r['node'], '; '.join(what) if what else 'nothing of the job was left there'))
        # flight_dump: what the ranks' flight recorders dumped before the stop, and who gave none
        dumps = r.get('flight_dumps') or {}
        for rank in sorted(dumps, key=lambda k: int(k) if str(k).isdigit() else 0):
            lines.append('%s: rank %s dumped its flight recorder to %s' % (r['node'], rank, dumps[rank]))
        for item in r.get('flight_dump_missing') or []:
            lines.append('%s: rank %s gave no flight recorder dump: %s' % (r['node'], item.get('rank'), item.get('why')))
    return lines


def training_image_ops(stamp_text, wanted, accelerator=None, image=''):
    """{ready, lines}: whether the job's image carries the DeepSpeed ops the job needs (the text of the
    image's /etc/gpucluster/deepspeed-ops.json, empty when it has none)."""
    ready, lines = deepspeed_ops.image_ops_lines(stamp_text, dict(wanted or {}), accelerator or None, image)
    return {'ready': ready, 'lines': lines}


def training_ops_stamp_argv(container):
    """The command that reads the image's record of its DeepSpeed ops (training_job's container settings)."""
    try:
        return cn.ops_stamp_argv(cn.check_spec(container))
    except (cn.ContainerError, TypeError) as exc:
        raise AnsibleFilterError('training_ops_stamp_argv: %s' % exc)


def training_layout(nodes):
    """'5 rank(s): alpha 2 (0-1), bravo-2 1 (2), ...' from the job's nodes (name, slots)."""
    return hf.describe_layout(nodes)


def json_object_or_none(text):
    """The JSON object in text, or None when text is not a JSON object."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def latest_checkpoint(files):
    """Name of the newest checkpoint among ansible.builtin.find results (DeepSpeed's 'latest' wins)."""
    entries = [(os.path.basename(f['path']), f.get('mtime', 0), bool(f.get('isdir'))) for f in files or []]
    return tr.latest_checkpoint(entries)


def training_launch_mismatches(versions_by_node, image='', head=None):
    """What the launcher needs the same on every node and differs, one line each naming the nodes.

    versions_by_node: {node: the versions training_job's check reported}. A job in a container
    (podman) reports {'image': id}: each node's image id is compared with the head's, naming both
    ids; a host job reports its Python environment's versions, compared between all nodes."""
    if not hasattr(versions_by_node, 'items'):
        raise AnsibleFilterError('training_launch_mismatches takes {node: versions}, got %s'
                                 % type(versions_by_node).__name__)
    by_node = dict((str(n), dict(v or {})) for n, v in versions_by_node.items())
    if any('image' in v for v in by_node.values()):
        # the head's image is the reference; without the head (it left the play) the first node's
        return cn.mismatch_lines(dict((n, v.get('image')) for n, v in by_node.items()), image,
                                 head if head in by_node else None)
    return python_env.version_mismatches(by_node)


def training_layout_nodes(nodes, layout, job_id=''):
    """The nodes a job was started on: those of nodes (cluster_job_nodes, head first) named in its
    layout ({node: ranks}, layout.json written at its start), in the same order.

    A name in the layout that is not a node of the inventory any more is an error naming it."""
    if not hasattr(layout, 'keys') or not layout:
        raise AnsibleFilterError('job %s: its layout must be a JSON object of node: ranks, got %r' % (job_id, layout))
    known = [n['name'] for n in nodes or []]
    unknown = [str(name) for name in layout if name not in known]
    if unknown:
        raise AnsibleFilterError('job %s was started on %s, which %s not a node of the inventory (%s)'
                                 % (job_id, ', '.join(unknown), 'is' if len(unknown) == 1 else 'are',
                                    ', '.join(known)))
    return [n for n in nodes if n['name'] in layout]


class FilterModule:
    def filters(self):
        return {'training_verdict': training_verdict, 'json_object_or_none': json_object_or_none,
                'latest_checkpoint': latest_checkpoint, 'training_layout': training_layout,
                'training_launch_mismatches': training_launch_mismatches,
                'training_layout_nodes': training_layout_nodes,
                'training_stopped_lines': training_stopped_lines, 'training_image_ops': training_image_ops,
                'training_ops_stamp_argv': training_ops_stamp_argv}
