# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Address filters (cidr_contains, cidr_host, ...) over module_utils/addresses, on Python's ipaddress module."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import addresses


def _wrap(func):
    def inner(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ValueError as exc:
            raise AnsibleFilterError(str(exc)) from exc
    inner.__name__ = func.__name__
    inner.__doc__ = func.__doc__
    return inner


def podman_subnets(networks):
    """Subnets (CIDR strings) of the networks returned by containers.podman.podman_network_info."""
    out = []
    for net in networks or []:
        for sub in net.get('subnets') or []:
            if sub.get('subnet'):
                out.append(sub['subnet'])
    return out


class FilterModule:
    def filters(self):
        return {
            'cidr_overlaps': _wrap(addresses.cidr_overlaps),
            'cidr_contains': _wrap(addresses.cidr_contains),
            'cidr_host': _wrap(addresses.cidr_host),
            'cidr_size': _wrap(addresses.cidr_size),
            'cidr_prefix': _wrap(addresses.cidr_prefix),
            'cidr_network': _wrap(addresses.cidr_network),
            'podman_subnets': podman_subnets,
        }
