# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filters of the cluster tests: plans checked before anything starts, and the reports built from the results.

bandwidth_plan(nodes, hostvars, ...)   rounds of disjoint pairs with addresses; problems with the input
bandwidth_report(results, nodes, ...)  matrix, per-node summary, slow links and the node they share
collective_plan(sizes, thresholds)     checked message sizes and per-size thresholds
collective_summary(results, nodes)     rows, busbw and correctness of the collective test, as lines
dist_check_report(results, nodes)      who joined the group (how many ranks where), who did not and why
pairs_with_device(pairs, devices, i)   the pairs of a round where both ends have an i-th RDMA device

results: {node: the result registered on that node}, built by the role from hostvars.

The plan filters never raise on bad input: they return the problems, one line each naming the
variable (and the host), so a play can fail with all of them before anything runs.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_test_inputs as inputs
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import cluster_test_reports as reports
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.inventory_contract import cluster_address


def bandwidth_plan(nodes, hostvars, pairs=None, schedule='round_robin', threshold_gbps=None,
                   relative_threshold=None):
    """{'problems', 'nodes', 'rounds': [[{client, server, client_address, server_address}]], 'pairs'}."""
    problems = []
    for label, value in (('cluster_tests_bandwidth_threshold_gbps', threshold_gbps),
                         ('cluster_tests_bandwidth_relative_threshold', relative_threshold)):
        try:
            number = inputs.check_positive(value, label)
            if label.endswith('relative_threshold') and number is not None and number >= 1:
                problems.append('%s must be a fraction of the fleet median below 1 (e.g. 0.7), got %r' % (label, value))
        except inputs.ClusterTestError as exc:
            problems.append(str(exc))
    try:
        plan = inputs.plan_pairs(list(nodes), pairs or None, schedule)
    except inputs.ClusterTestError as exc:
        message = str(exc)
        if message.startswith('pairs'):
            message = 'cluster_tests_bandwidth_' + message
        elif message.startswith('schedule'):
            message = 'cluster_tests_bandwidth_' + message
        problems.append(message)
        return {'problems': problems, 'nodes': list(nodes), 'rounds': [], 'pairs': 0}
    rounds = []
    for rnd in plan['rounds']:
        rounds.append([{'client': a, 'server': b,
                        'client_address': cluster_address(hostvars, a),
                        'server_address': cluster_address(hostvars, b)} for a, b in rnd])
    return {'problems': problems, 'nodes': plan['nodes'], 'rounds': rounds, 'pairs': plan['pairs']}


def bandwidth_report(results, nodes, threshold_gbps=None, relative_threshold=None, rounds=None):
    """The report of bandwidth module results (see module_utils cluster_tests.bandwidth_report)."""
    try:
        return reports.bandwidth_report(results, nodes, threshold_gbps=threshold_gbps or None,
                                        relative=relative_threshold or None, rounds=rounds)
    except ValueError as exc:
        raise AnsibleFilterError('bandwidth_report: %s' % exc) from exc


def collective_plan(sizes, thresholds=None, sizes_label='cluster_tests_collective_sizes',
                    thresholds_label='cluster_tests_collective_thresholds'):
    """{'problems', 'sizes': [bytes], 'thresholds': {bytes: GB/s}} with the sizes checked."""
    try:
        checked = inputs.check_sizes(sizes, sizes_label, multiple_of=4)
        limits = inputs.check_thresholds(thresholds or {}, checked, thresholds_label)
    except inputs.ClusterTestError as exc:
        return {'problems': [str(exc)], 'sizes': [], 'thresholds': {}}
    return {'problems': [], 'sizes': checked, 'thresholds': {str(k): v for k, v in limits.items()}}


def _results(results, nodes):
    """{node: result or None}: a result that is missing, not a dict or skipped counts as none."""
    if not isinstance(results, dict):
        raise AnsibleFilterError('results must be a dict of node name to registered result, got %s'
                                 % type(results).__name__)
    found = {}
    for node in nodes:
        value = results.get(node)
        found[node] = value if isinstance(value, dict) and not value.get('skipped') else None
    return found


def dist_check_report(results, nodes):
    """One verdict from the smoke module results, {node: result registered there}."""
    found = {n: r if r and 'stage' in r else None for n, r in _results(results, nodes).items()}
    return reports.dist_check_report(found, list(nodes))


def collective_summary(results, nodes):
    """One report from the collective results, {node: result registered there}."""
    try:
        return reports.collective_summary(_results(results, nodes), list(nodes))
    except ValueError as exc:
        raise AnsibleFilterError('collective_summary: %s' % exc) from exc


def pairs_with_device(pairs, devices, index):
    """The pairs of a round where both ends have an RDMA device of this index.

    devices: {node: [RDMA device names]} (from the nodes' bandwidth check)."""
    def count(host):
        return len((devices or {}).get(host) or [])
    return [p for p in pairs or [] if count(p['client']) > int(index) and count(p['server']) > int(index)]


def rdma_lines(results):
    """One line per ib_write_bw result: 'rdma a -> b (mlx5_0): 180.2 Gbit/s' or the error."""
    lines = []
    for r in results or []:
        what = '%.2f Gbit/s' % r['gbps'] if r.get('gbps') is not None else 'failed: %s' % r.get('error')
        lines.append('rdma %s -> %s (%s): %s' % (r.get('client'), r.get('server'), r.get('device'), what))
    return lines


class FilterModule:
    def filters(self):
        return {
            'bandwidth_plan': bandwidth_plan,
            'bandwidth_report': bandwidth_report,
            'collective_plan': collective_plan,
            'dist_check_report': dist_check_report,
            'collective_summary': collective_summary,
            'pairs_with_device': pairs_with_device,
            'rdma_lines': rdma_lines,
        }
