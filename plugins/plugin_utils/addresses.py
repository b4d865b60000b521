# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Address arithmetic shared by the filters, the test plugin and the inventory contract (controller only)."""

from __future__ import annotations

import ipaddress


def _net(value):
    try:
        return ipaddress.ip_network(str(value), strict=False)
    except ValueError as exc:
        raise ValueError('%r is not a network in CIDR form: %s' % (value, exc)) from exc


def ip_or_none(value):
    """The ipaddress object of a single address, None when value is not one."""
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        return None


def network_or_none(value):
    """The ipaddress network of an address or a network (host bits allowed), None when it is neither."""
    try:
        return ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        return None


def is_cidr(value):
    """True when value is an IPv4/IPv6 network written as address/prefix."""
    if not isinstance(value, str) or '/' not in value:
        return False
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def is_ip(value):
    """True when value is a single IPv4/IPv6 address (no prefix)."""
    if not isinstance(value, str):
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def cidr_overlaps(a, b):
    """True when networks a and b share at least one address."""
    na, nb = _net(a), _net(b)
    return na.version == nb.version and na.overlaps(nb)


def cidr_contains(cidr, address):
    """True when the address (with or without a prefix) lies inside cidr."""
    net = _net(cidr)
    addr = ipaddress.ip_interface(str(address)).ip
    return addr.version == net.version and addr in net


def cidr_host(cidr, index):
    """The index-th address of cidr (0 is the network address)."""
    net = _net(cidr)
    index = int(index)
    if index < 0 or index >= net.num_addresses:
        raise ValueError('host %d is outside %s' % (index, net))
    return str(net.network_address + index)


def cidr_size(cidr):
    """Number of addresses in cidr."""
    return _net(cidr).num_addresses


def cidr_network(value, prefix=None):
    """The network that holds an address: cidr_network('10.0.3.7/24') -> '10.0.3.0/24'."""
    text = str(value) if prefix is None else '%s/%s' % (str(value).split('/')[0], prefix)
    return str(_net(text))
