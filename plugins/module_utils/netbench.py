# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Pairwise network tests across a cluster: who tests with whom, and which node is slow.

round_robin(nodes)          rounds of disjoint pairs covering every pair once (circle method)
bandwidth_matrix(results)   N x N matrix, per-link and per-node summaries, fleet median
flag_slow_links(report)     links under a threshold, and the node(s) they have in common
"""

from __future__ import annotations

import statistics

from ansible_collections.gpucluster.multinode.plugins.module_utils.hostfile import natural_key


def round_robin(nodes):
    """Rounds of disjoint pairs such that every unordered pair meets exactly once.

    N nodes give N-1 rounds of N/2 pairs when N is even; with N odd each round one node
    sits out (a bye) and there are N rounds of (N-1)/2 pairs. Each pair is [a, b] in the
    order the nodes were given. Circle method: the first node stays, the others rotate.
    """
    nodes = list(nodes)
    dupes = sorted({str(n) for n in nodes if nodes.count(n) > 1}, key=natural_key)
    if dupes:
        raise ValueError('round_robin: node names must be unique, repeated: %s' % ', '.join(dupes))
    if len(nodes) < 2:
        raise ValueError('round_robin: need at least 2 nodes to pair, got %d' % len(nodes))
    position = {n: i for i, n in enumerate(nodes)}
    circle = nodes + [None] if len(nodes) % 2 else list(nodes)
    n = len(circle)
    rounds = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = circle[i], circle[n - 1 - i]
            if a is None or b is None:
                continue
            pairs.append(sorted([a, b], key=position.get))
        rounds.append(pairs)
        circle = [circle[0], circle[-1]] + circle[1:-1]
    return rounds


def _summary(values):
    if not values:
        return {'min': None, 'median': None, 'max': None, 'links': 0}
    return {'min': min(values), 'median': statistics.median(values), 'max': max(values), 'links': len(values)}


def bandwidth_matrix(results, nodes=None):
    """Matrix and summaries from pairwise results.

    results: dicts {'client': a, 'server': b, 'gbps': x} for a measured direction, or
    {'client': a, 'server': b, 'error': '...'} for a test that failed (e.g. the output of
    parse_iperf3 with client/server added: its gbps and error keys are read).
    nodes: the order of the matrix (default: head-first order is not known here, so the
    natural order of the names seen).

    Returns {nodes, matrix, links, failed, node_summary, median_gbps, link_median_gbps}
    where matrix[i][j] is the rate measured from nodes[i] to nodes[j] (None: not measured),
    links has one entry per unordered pair {a, b, gbps (the slower direction), directions},
    and node_summary gives min/median/max over each node's links.

    median_gbps, the fleet median, is the median of the nodes' median link rates: a slow
    node drags down every one of its links, and in a small cluster those are most links
    (2 of 3 with 3 nodes), so the plain median of the links would call the slow rate
    normal. link_median_gbps is that plain median, for reference.
    """
    seen = []
    measured = {}
    errors = {}
    for index, r in enumerate(results or []):
        if not isinstance(r, dict):
            raise ValueError('bandwidth_matrix: results[%d] must be a dict, got %s' % (index, type(r).__name__))
        a, b = r.get('client'), r.get('server')
        if a is None or b is None:
            raise ValueError('bandwidth_matrix: results[%d] has no %s' % (index, 'client' if a is None else 'server'))
        if a == b:
            raise ValueError('bandwidth_matrix: results[%d] pairs %s with itself' % (index, a))
        for node in (a, b):
            if node not in seen:
                seen.append(node)
        if r.get('error') or r.get('ok') is False:
            errors[(a, b)] = str(r.get('error') or 'failed')
            continue
        gbps = r.get('gbps')
        if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or gbps < 0:
            raise ValueError('bandwidth_matrix: results[%d] (%s -> %s) needs gbps as a number of 0 or more, got %r'
                             % (index, a, b, gbps))
        measured[(a, b)] = float(gbps)

    if nodes is None:
        nodes = sorted(seen, key=natural_key)
    else:
        nodes = list(nodes)
        unknown = [n for n in seen if n not in nodes]
        if unknown:
            raise ValueError('bandwidth_matrix: results name %s, not in nodes' % ', '.join(map(str, unknown)))
    index = {n: i for i, n in enumerate(nodes)}
    matrix = [[None] * len(nodes) for _ in nodes]
    for (a, b), gbps in measured.items():
        matrix[index[a]][index[b]] = gbps

    links = []
    failed = []
    per_node = {n: [] for n in nodes}
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            directions = {d: measured[d] for d in ((a, b), (b, a)) if d in measured}
            errs = {d: errors[d] for d in ((a, b), (b, a)) if d in errors}
            if errs:
                failed.append({'a': a, 'b': b, 'error': '; '.join('%s -> %s: %s' % (d[0], d[1], e)
                                                                  for d, e in errs.items())})
            if not directions:
                continue
            gbps = min(directions.values())
            links.append({'a': a, 'b': b, 'gbps': gbps,
                          'directions': {'%s -> %s' % d: v for d, v in directions.items()}})
            per_node[a].append(gbps)
            per_node[b].append(gbps)
    values = [link['gbps'] for link in links]
    summary = {n: _summary(per_node[n]) for n in nodes}
    node_medians = [s['median'] for s in summary.values() if s['median'] is not None]
    return {
        'nodes': nodes,
        'matrix': matrix,
        'links': links,
        'failed': failed,
        'node_summary': summary,
        'median_gbps': statistics.median(node_medians) if node_medians else None,
        'link_median_gbps': statistics.median(values) if values else None,
    }


def _groups(flagged):
    """Connected groups of flagged links (links sharing a node belong together)."""
    groups = []
    for link in flagged:
        ends = {link['a'], link['b']}
        touching = [g for g in groups if g['nodes'] & ends]
        merged = {'nodes': set(ends), 'links': [link]}
        for g in touching:
            merged['nodes'] |= g['nodes']
            merged['links'] = g['links'] + merged['links']
            groups.remove(g)
        groups.append(merged)
    return groups


def flag_slow_links(report, threshold_gbps=None, relative=None):
    """Links below threshold_gbps, or below relative x the fleet median, and their culprits.

    report: the output of bandwidth_matrix. A failed link (in report['failed']) is always
    flagged. Flagged links that share nodes form a group; in each group the node on every
    flagged link is the culprit. When no node is on all of them (two bad nodes), the nodes
    on the most flagged links of the group are named. A group of one link names no culprit:
    either end may be at fault (its link is still listed).

    Returns {threshold_gbps, slow_links, culprits, groups, counts}.
    """
    if threshold_gbps is None and relative is None:
        raise ValueError('flag_slow_links: give threshold_gbps (Gbit/s), relative (fraction of the median) or both')
    for label, value in (('threshold_gbps', threshold_gbps), ('relative', relative)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ValueError('flag_slow_links: %s must be a number above 0, got %r' % (label, value))
    if not isinstance(report, dict) or 'links' not in report:
        raise ValueError('flag_slow_links: report must be the output of bandwidth_matrix (no links key)')

    limits = []
    if threshold_gbps is not None:
        limits.append(float(threshold_gbps))
    median = report.get('median_gbps')
    if relative is not None and median is not None:
        limits.append(float(relative) * median)
    limit = max(limits) if limits else None

    flagged = []
    for link in report['links']:
        if limit is not None and link['gbps'] < limit:
            flagged.append({'a': link['a'], 'b': link['b'], 'gbps': link['gbps'], 'reason': 'slow'})
    for fail in report.get('failed') or []:
        if not any({f['a'], f['b']} == {fail['a'], fail['b']} for f in flagged):
            flagged.append({'a': fail['a'], 'b': fail['b'], 'gbps': None, 'reason': 'failed: %s' % fail['error']})

    counts = {}
    for link in flagged:
        for node in (link['a'], link['b']):
            counts[node] = counts.get(node, 0) + 1

    culprits = []
    groups = []
    for group in _groups(flagged):
        shared = set.intersection(*({link['a'], link['b']} for link in group['links']))
        if len(group['links']) == 1:
            named = []
        elif shared:
            named = sorted(shared, key=natural_key)
        else:
            top = max(counts[n] for n in group['nodes'])
            named = sorted((n for n in group['nodes'] if counts[n] == top), key=natural_key)
        culprits.extend(n for n in named if n not in culprits)
        groups.append({'nodes': sorted(group['nodes'], key=natural_key), 'links': len(group['links']),
                       'culprits': named})
    return {
        'threshold_gbps': limit,
        'slow_links': flagged,
        'culprits': culprits,
        'groups': groups,
        'counts': counts,
    }
