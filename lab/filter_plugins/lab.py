# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filter that lays out the nodes of a lab: names, groups, addresses, container names."""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import addresses

IFNAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$')


def lab_layout(lab_name, nodes, subnet, first_host=10, head_name='lab-head', worker_prefix='lab-worker',
               head_slots=1, worker_slots=1, interface_names=None):
    """One dict per node: name, group (head/workers), address, container, slots (ranks the
    launchers start there: node_slots in the inventory) and interface (the name of the node's
    cluster NIC: the head takes the first of interface_names, the workers the others in turn)."""
    try:
        nodes = int(nodes)
        first_host = int(first_host)
        head_slots = int(head_slots)
        worker_slots = int(worker_slots)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError('lab_layout: nodes, first_host and the slots must be integers: %s' % exc) from exc
    if nodes < 1:
        raise AnsibleFilterError('lab_layout: lab_nodes must be at least 1, got %d' % nodes)
    if head_slots < 1 or worker_slots < 1:
        raise AnsibleFilterError('lab_layout: lab_head_slots and lab_worker_slots must be at least 1, got %d and %d'
                                 % (head_slots, worker_slots))
    ifnames = [str(n) for n in (interface_names or ['eth0'])]
    bad = [n for n in ifnames if not IFNAME.match(n)]
    if bad:
        raise AnsibleFilterError('lab_layout: lab_interface_names holds %s, not an interface name '
                                 '(1-15 characters: letters, digits, . - _)' % ', '.join(repr(n) for n in bad))
    worker_ifnames = ifnames[1:] or ifnames
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
            'slots': head_slots if idx == 0 else worker_slots,
            'interface': ifnames[0] if idx == 0 else worker_ifnames[(idx - 1) % len(worker_ifnames)],
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


def podman_subnets(networks):
    """Subnets (CIDR strings) of the networks returned by containers.podman.podman_network_info."""
    out = []
    for net in networks or []:
        for sub in net.get('subnets') or []:
            if sub.get('subnet'):
                out.append(sub['subnet'])
    return out


def cidr_size(cidr):
    """Number of addresses in the network (the lab checks its subnet has room for its nodes)."""
    try:
        return addresses.cidr_size(cidr)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {'lab_layout': lab_layout, 'platform_networks': platform_networks, 'podman_subnets': podman_subnets,
                'cidr_size': cidr_size}
