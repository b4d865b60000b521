# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filters of the cluster tests: plans checked before anything starts, and the reports built from the results.

bandwidth_plan(nodes, hostvars, ...)   rounds of disjoint pairs with addresses; problems with the input
bandwidth_report(results, nodes, ...)  matrix, per-node summary, slow links and the node they share
collective_plan(sizes, thresholds)     checked message sizes and per-size thresholds
collective_summary(nodes, hostvars, v) rows, busbw and correctness of the collective test, as lines
dist_check_report(nodes, hostvars, v)  who joined the group, who did not and why

The plan filters never raise on bad input: they return the problems, one line each naming the
variable (and the host), so a play can fail with all of them before anything runs.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_tests as ct
from ansible_collections.gpucluster.multinode.plugins.module_utils.inventory_contract import cluster_address


def bandwidth_plan(nodes, hostvars, pairs=None, schedule='round_robin', threshold_gbps=None,
                   relative_threshold=None):
    """{'problems', 'nodes', 'rounds': [[{client, server, client_address, server_address}]], 'pairs'}."""
    problems = []
    for label, value in (('cluster_tests_bandwidth_threshold_gbps', threshold_gbps),
                         ('cluster_tests_bandwidth_relative_threshold', relative_threshold)):
        try:
            number = ct.check_positive(value, label)
            if label.endswith('relative_threshold') and number is not None and number >= 1:
                problems.append('%s must be a fraction of the fleet median below 1 (e.g. 0.7), got %r' % (label, value))
        except ct.ClusterTestError as exc:
            problems.append(str(exc))
    try:
        plan = ct.plan_pairs(list(nodes), pairs or None, schedule)
    except ct.ClusterTestError as exc:
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
    """The report of net_bandwidth results (see module_utils cluster_tests.bandwidth_report)."""
    try:
        return ct.bandwidth_report(results, nodes, threshold_gbps=threshold_gbps or None,
                                   relative=relative_threshold or None, rounds=rounds)
    except ValueError as exc:
        raise AnsibleFilterError('bandwidth_report: %s' % exc) from exc


def collective_plan(sizes, thresholds=None, sizes_label='cluster_tests_collective_sizes',
                    thresholds_label='cluster_tests_collective_thresholds'):
    """{'problems', 'sizes': [bytes], 'thresholds': {bytes: GB/s}} with the sizes checked."""
    try:
        checked = ct.check_sizes(sizes, sizes_label, multiple_of=4)
        limits = ct.check_thresholds(thresholds or {}, checked, thresholds_label)
    except ct.ClusterTestError as exc:
        return {'problems': [str(exc)], 'sizes': [], 'thresholds': {}}
    return {'problems': [], 'sizes': checked, 'thresholds': {str(k): v for k, v in limits.items()}}


def _results(nodes, hostvars, var):
    found = {}
    for node in nodes:
        try:
            value = hostvars[node].get(var)
        except KeyError:
            value = None
        found[node] = value if isinstance(value, dict) and not value.get('skipped') else None
    return found


def dist_check_report(nodes, hostvars, var):
    """One verdict from the dist_check result registered as var on each node."""
    results = {n: r if r and 'stage' in r else None for n, r in _results(nodes, hostvars, var).items()}
    return ct.dist_check_report(results, list(nodes))


def collective_summary(nodes, hostvars, var):
    """One report from the nccl_test results registered as var on each node."""
    try:
        return ct.collective_summary(_results(nodes, hostvars, var), list(nodes))
    except ValueError as exc:
        raise AnsibleFilterError('collective_summary: %s' % exc) from exc


def pairs_with_device(pairs, hostvars, index, check_var='__cluster_tests_bw_check'):
    """The pairs of a round where both ends have an RDMA device of this index (from their check)."""
    def devices(host):
        try:
            found = (hostvars[host].get(check_var) or {}).get('rdma_devices') or []
        except KeyError:
            return []
        return found
    return [p for p in pairs or [] if len(devices(p['client'])) > int(index) and len(devices(p['server'])) > int(index)]


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
