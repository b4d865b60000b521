# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filter that lays out the nodes of a lab: names, groups, addresses, container names."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import addresses


def lab_layout(lab_name, nodes, subnet, first_host=10, head_name='lab-head', worker_prefix='lab-worker'):
    """One dict per node: name, group (head/workers), address, container."""
    try:
        nodes = int(nodes)
        first_host = int(first_host)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError('lab_layout: nodes and first_host must be integers: %s' % exc) from exc
    if nodes < 1:
        raise AnsibleFilterError('lab_layout: lab_nodes must be at least 1, got %d' % nodes)
    names = [head_name] + ['%s-%d' % (worker_prefix, i) for i in range(1, nodes)]
    out = []
    for idx, name in enumerate(names):
        try:
            address = addresses.cidr_host(subnet, first_host + idx)
        except ValueError as exc:
            raise AnsibleFilterError('lab_layout: lab_subnet %s has no room for %d nodes: %s' % (subnet, nodes, exc)) from exc
        out.append({
            'name': name,
            'group': 'head' if idx == 0 else 'workers',
            'address': address,
            'container': '%s-%s' % (lab_name, name),
        })
    return out


def platform_networks(platforms, prefix=24):
    """Networks named by test platforms ("net-a,net-b"), each with the /prefix holding the
    first address given on it (None when no platform gives one)."""
    order, subnets = [], {}
    for platform in platforms or []:
        names = [n.strip() for n in str(platform.get('network') or '').split(',') if n.strip()]
        for pos, name in enumerate(names):
            if name not in subnets:
                order.append(name)
                subnets[name] = None
            if pos == 0 and platform.get('ip') and subnets[name] is None:
                subnets[name] = addresses.cidr_network(platform['ip'], prefix)
    return [{'name': n, 'subnet': subnets[n]} for n in order]


class FilterModule:
    def filters(self):
        return {'lab_layout': lab_layout, 'platform_networks': platform_networks}
