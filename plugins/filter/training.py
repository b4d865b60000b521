# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The training role's filters: the job's verdict (decided in plugin_utils/training/job_state.py), its layout, the
versions its nodes must share, what a stop did."""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import containers as cn
from ansible_collections.gpucluster.multinode.plugins.module_utils import deepspeed_ops
from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_state as js
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import failure_policy
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import python_env


def training_verdict(results, nodes=None):
    """The job's verdict from the per-node results of training_job state=status, head first
    (plugin_utils/training/job_state.launch_verdict)."""
    return js.launch_verdict(results, nodes)


def training_status_record(result, progress=None):
    """The status file's record for the job's supervisor: the verdicts and the job's one state
    (plugin_utils/training/job_state.status_record)."""
    return js.status_record(result, progress)


def training_job_verdict(results, hosts, nodes=None, job_id=None, left_out=None):
    """The job's verdict from the status read registered on every host (in the order of hosts): unknown,
    naming the nodes that could not be read, else training_verdict's; left_out: the job's nodes a status of
    training_status_nodes did not read (plugin_utils/training/job_state.job_verdict)."""
    return js.job_verdict(results, hosts, nodes, job_id, left_out)


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


def training_failure_policy_problems(value):
    """[] when training_failure_policy is a list of rules the supervisor can apply, else the one problem, naming
    the rule and its field (plugin_utils/failure_policy.py: the k8s cluster file's rules too)."""
    try:
        failure_policy.read(value, 'training_failure_policy')
    except failure_policy.PolicyError as exc:
        return [str(exc)]
    return []


def training_failure_policy(value):
    """training_failure_policy's rules as the supervisor reads them (a bare YAML key `on`, read as true, is on)."""
    try:
        return failure_policy.read(value, 'training_failure_policy')
    except failure_policy.PolicyError as exc:
        raise AnsibleFilterError(str(exc))


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
        return {'training_verdict': training_verdict, 'training_job_verdict': training_job_verdict,
                'training_status_record': training_status_record,
                'json_object_or_none': json_object_or_none,
                'training_layout': training_layout,
                'training_launch_mismatches': training_launch_mismatches,
                'training_layout_nodes': training_layout_nodes,
                'training_stopped_lines': training_stopped_lines, 'training_image_ops': training_image_ops,
                'training_ops_stamp_argv': training_ops_stamp_argv,
                'training_failure_policy': training_failure_policy,
                'training_failure_policy_problems': training_failure_policy_problems}
