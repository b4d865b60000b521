# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The reports of the cluster tests, built on the controller from the per-node results:
the bandwidth matrix, the collective test's table and verdict, the smoke test's verdict.
"""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.module_utils import netbench
from ansible_collections.gpucluster.multinode.plugins.module_utils import nccl_tests_output as nccl_tests
from ansible_collections.gpucluster.multinode.plugins.module_utils.nccl_tests_output import allreduce_rows, size_label  # noqa: F401
from ansible_collections.gpucluster.multinode.plugins.module_utils.cluster_test_inputs import (
    ClusterTestError,
    check_positive,
)


def _fmt(value, digits=2):
    return '-' if value is None else ('%.*f' % (digits, value))


def bandwidth_report(results, nodes, threshold_gbps=None, relative=None, rounds=None):
    """Matrix, per-node summary, flagged links and printable lines from the measured directions.

    results: list of {'client' (sender), 'server' (receiver), 'gbps' or 'error', 'tool'}.
    threshold_gbps / relative: see netbench.flag_slow_links; both None: nothing is flagged but
    failed links.
    """
    threshold_gbps = check_positive(threshold_gbps, 'threshold_gbps')
    relative = check_positive(relative, 'relative_threshold')
    if relative is not None and relative >= 1:
        raise ClusterTestError('relative_threshold must be a fraction of the fleet median below 1 '
                               '(e.g. 0.7), got %r' % relative)
    report = netbench.bandwidth_matrix(results or [], nodes=list(nodes))
    if threshold_gbps is None and relative is None:
        flags = netbench.flag_slow_links(report, threshold_gbps=1e-12)  # failed links only
        flags['threshold_gbps'] = None
        flags['slow_links'] = [f for f in flags['slow_links'] if f['reason'] != 'slow']
    else:
        flags = netbench.flag_slow_links(report, threshold_gbps=threshold_gbps, relative=relative)
    names = report['nodes']
    width = max([len(n) for n in names] + [8])
    lines = ['bandwidth matrix, Gbit/s (row sends to column), %d node(s), %d link(s) measured%s'
             % (len(names), len(report['links']),
                ', %d round(s)' % rounds if rounds is not None else '')]
    lines.append(' '.join(['%-*s' % (width, 'from\\to')] + ['%*s' % (width, n) for n in names]))
    for i, a in enumerate(names):
        cells = []
        for j, _ in enumerate(names):
            cells.append('%*s' % (width, '.' if i == j else _fmt(report['matrix'][i][j])))
        lines.append(' '.join(['%-*s' % (width, a)] + cells))
    for n in names:
        s = report['node_summary'][n]
        lines.append('node %s: links %d, min %s, median %s, max %s Gbit/s'
                     % (n, s['links'], _fmt(s['min']), _fmt(s['median']), _fmt(s['max'])))
    lines.append('fleet median %s Gbit/s; threshold %s Gbit/s'
                 % (_fmt(report['median_gbps']), _fmt(flags['threshold_gbps'])))
    for f in flags['slow_links']:
        lines.append('flagged %s - %s: %s' % (f['a'], f['b'], 'slow, %s Gbit/s' % _fmt(f['gbps'])
                                              if f['reason'] == 'slow' else f['reason']))
    if flags['culprits']:
        lines.append('slow node(s): %s (on every flagged link of its group)' % ', '.join(flags['culprits']))
    elif not flags['slow_links']:
        lines.append('no slow or failed link')
    report.update(flags)
    report['rounds'] = rounds
    report['ok'] = not flags['slow_links']
    report['lines'] = lines
    return report


def dist_check_report(results, nodes):
    """One verdict from the per-node smoke module results.

    results: {node: module result or None (Ansible could not run it there)}; nodes: the node
    names, head first. The head's result says who reached the rendezvous (joined); every node
    says where it stopped and why.
    """
    head = nodes[0]
    head_result = results.get(head) or {}
    joined = head_result.get('joined')
    if joined is None:
        joined = [n for n in nodes if (results.get(n) or {}).get('joined_store')]
    problems = []
    for node in nodes:
        r = results.get(node)
        if not r:
            problems.append({'node': node, 'stage': 'ansible', 'cause': 'Ansible did not run the check there '
                             '(host unreachable or failed earlier)', 'error': None})
            continue
        if r.get('ok'):
            continue
        problems.append({'node': node, 'stage': r.get('stage'), 'cause': r.get('cause'), 'error': r.get('error')})
    missing = [n for n in nodes if n not in joined]
    ok = not problems and all((results.get(n) or {}).get('ok') for n in nodes)
    # a node that did not join, or that names a cause of its own, is at fault; the others
    # only waited for it
    waiting = ('process group did not form', 'waited ', 'rendezvous store failed')
    at_fault = [p['node'] for p in problems
                if p['node'] in missing or not str(p['cause'] or '').startswith(waiting)]
    ranks = {n: (results.get(n) or {}).get('slots') for n in nodes}
    where = ', '.join('%s %s' % (n, ranks[n]) for n in nodes if ranks[n] is not None)
    lines = []
    if ok:
        lines.append('dist_check: %d of %d node(s) joined one %s group of %s rank(s)%s through %s; all-reduce sum %s '
                     '(expected %s) on every rank'
                     % (len(joined), len(nodes), head_result.get('backend'), head_result.get('world_size'),
                        ' (%s)' % where if where else '', head_result.get('rendezvous'),
                        head_result.get('sum'), head_result.get('expected')))
    else:
        if missing:
            lines.append('dist_check: %d of %d node(s) joined (%s); did not join: %s'
                         % (len(joined), len(nodes), ', '.join(joined) or 'none', ', '.join(missing)))
        else:
            lines.append('dist_check: %d of %d node(s) reached the rendezvous but the check failed%s'
                         % (len(joined), len(nodes),
                            ' at %s' % ', '.join(at_fault) if at_fault else ''))
        order = sorted(problems, key=lambda p: (p['node'] not in at_fault, nodes.index(p['node'])))
        for p in order:
            lines.append('host %s: %s%s%s' % (p['node'], p['cause'] or 'failed',
                                              ' (at %s)' % p['stage'] if p['stage'] else '',
                                              ': %s' % p['error'] if p['error'] else ''))
    return {'ok': ok, 'nodes': list(nodes), 'joined': joined, 'missing': missing, 'at_fault': at_fault,
            'world_size': head_result.get('world_size'), 'ranks': ranks, 'problems': problems, 'lines': lines}


def collective_summary(results, nodes):
    """One report from the collective results of the nodes: {ok, rows, ..., problems, lines}.

    results: {node: collective result or None}. The reporter's result (the head's) holds the
    rows; every node that failed adds a problem naming it.
    """
    reporter = None
    problems = []
    for node in nodes:
        r = results.get(node)
        if r is None:
            continue
        if r.get('failed'):
            problems.append('host %s: %s' % (node, r.get('msg') or 'failed'))
            continue
        if r.get('reporter') and reporter is None:
            reporter = dict(r, node=node)
        elif r.get('error'):
            problems.append('host %s: %s%s' % (node, r['error'], ('\n' + r['output']) if r.get('output') else ''))
    if reporter is None:
        problems.insert(0, 'no node reported the collective test (the head did not run it)')
        return {'ok': False, 'rows': [], 'problems': problems, 'lines': problems[:]}
    if reporter.get('error'):
        problems.insert(0, 'host %s: %s' % (reporter['node'], reporter['error']))
    rows = reporter.get('rows') or []
    where = ', '.join('%s %d' % (r['node'], r['slots']) for r in reporter.get('ranks') or [])
    lines = ['collective: %s, %s rank(s) on %s node(s)%s, method %s'
             % (reporter.get('algorithm'), reporter.get('world_size'), reporter.get('nnodes'),
                ' (%s)' % where if where else '', reporter.get('method'))]
    lines.append('%10s %12s %12s %11s %11s %6s' % ('size', 'count', 'time_us', 'algbw GB/s', 'busbw GB/s', 'wrong'))
    for r in rows:
        lines.append('%10s %12s %12s %11s %11s %6s'
                     % (size_label(r['size']), r.get('count'), _fmt(r.get('time_us'), 1), _fmt(r.get('algbw_gbs'), 4),
                        _fmt(r.get('busbw_gbs'), 4), r.get('wrong')))
    if rows:
        lines.append('busbw at the largest size (%s): %s GB/s; average busbw %s GB/s; values %s'
                     % (size_label(rows[-1]['size']), _fmt(rows[-1].get('busbw_gbs'), 4),
                        _fmt(reporter.get('avg_busbw_gbs'), 4), 'correct' if reporter.get('correct') else 'WRONG'))
        if not reporter.get('correct'):
            bad = [size_label(r['size']) for r in rows if r.get('wrong')]
            problems.append('wrong reduced values at size(s) %s' % (', '.join(bad) or 'see out_of_bounds'))
    for b in reporter.get('below_threshold') or []:
        if b['busbw_gbs'] is None:
            problems.append('size %s: no result, so not at its threshold %s GB/s'
                            % (size_label(b['size']), _fmt(b['threshold_gbs'], 4)))
        else:
            problems.append('size %s: busbw %s GB/s is under its threshold %s GB/s'
                            % (size_label(b['size']), _fmt(b['busbw_gbs'], 4), _fmt(b['threshold_gbs'], 4)))
    lines.extend(problems)
    ok = bool(rows) and not problems and reporter.get('ok') is not False
    out = {k: reporter.get(k) for k in ('method', 'algorithm', 'backend', 'world_size', 'nnodes', 'ranks', 'correct',
                                        'avg_busbw_gbs', 'max_busbw_gbs', 'below_threshold', 'missing_sizes')}
    out.update(ok=ok, rows=rows, problems=problems, lines=lines, reporter=reporter['node'])
    return out
