# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Turn every node's training_progress result into the job's view: state, slowest node, stall."""

from __future__ import annotations

import time

from ansible_collections.gpucluster.multinode.plugins.module_utils import job_monitor as jm


def training_progress_view(results, hosts, stall_seconds=600, job_id=None):
    """{state, slowest_node, stall, lines, ranks, summary} from the per-node results of
    training_progress (in the order of hosts); a node whose read failed is named in the lines."""
    rows, errors = [], {}
    for host, result in zip(hosts, results):
        result = result or {}
        if result.get('failed') or result.get('unreachable') or 'ranks' not in result:
            errors[host] = result.get('msg', 'no answer')
            continue
        rows.extend(result['ranks'])
    view = jm.verdict(rows, float(stall_seconds), errors)
    view['summary'] = jm.summary(view['ranks'], job_id, view['state'], view['slowest_node'], time.time())
    return view


def training_rank_line(row):
    """The one-line view of a rank (as in the view's lines)."""
    return jm.rank_line(row)


class FilterModule:
    def filters(self):
        return {'training_progress_view': training_progress_view, 'training_rank_line': training_rank_line}
