# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Checks and renderings for the network role.

Every check returns a list of problems, one line each, naming the host and the variable, so a
role can fail before it changes anything with a message a user can act on.
"""

from __future__ import annotations

import ipaddress
import re

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import inventory_contract as contract

DOCUMENTATION = r'''
---
name: network_static_errors
short_description: Problems of a node's static address settings, one line each naming the host and the variable
version_added: "0.1.0"
description:
  - Checks C(network_static) (C(interface), C(address) as C(a.b.c.d/prefix), C(gateway), C(dns)) against
    the cluster network, the node's cluster address and the interfaces the node really has.
  - "Refused: unknown keys; a missing interface or address; an address without a prefix or with a
    prefix length out of range; an address outside O(cluster_cidr) or other than the node's cluster
    address; an interface the node does not have; a gateway that is not an address of the node's
    subnet (or is the node itself); a DNS server that is not an IP address."
  - All but the interface are read from the inventory alone, and the inventory contract every playbook checks
    first refuses them too, on the controller, before any node is contacted.
  - Companion filters C(network_hostname_errors), C(network_hosts_lines) (the managed /etc/hosts
    block), C(network_static_facts) (the parts of a valid C(network_static)) and
    C(network_domain_errors).
positional: _input, host, cluster_cidr, interfaces, cluster_address
options:
  _input:
    description: The host's C(network_static) dictionary.
    type: dict
    required: true
  host:
    description: The inventory name, used in the messages.
    type: str
    required: true
  cluster_cidr:
    description: The cluster network.
    type: str
    required: true
  interfaces:
    description: Interface names of the node (C(ansible_facts.interfaces)).
    type: list
    elements: str
    required: true
  cluster_address:
    description: The node's cluster address; the static address must be it. Empty skips this check.
    type: str
    default: ""
'''

EXAMPLES = r'''
- name: Fail on static address settings that cannot work, before anything changes
  vars:
    errors: "{{ network_static | gpucluster.multinode.network_static_errors(inventory_hostname,
                cluster_cidr, ansible_facts.interfaces, hostvars[inventory_hostname] | gpucluster.multinode.cluster_address) }}"
  ansible.builtin.assert:
    that: errors | length == 0
    fail_msg: "{{ errors }}"
'''

RETURN = r'''
_value:
  description: One line per problem; empty when the settings are sound.
  type: list
  elements: str
'''


def network_static_errors(static, host, cluster_cidr, interfaces, cluster_address=''):
    """Problems of one node's network_static, each line naming the host and the variable: the inventory
    contract's (plugin_utils/inventory_contract.static_errors, checked on the controller first) and whether
    the interface exists on the node (from its facts)."""
    return contract.static_errors(static, host, cluster_cidr, cluster_address, interfaces=interfaces or [])


def network_static_facts(static):
    """The parts of a valid network_static: ip, prefix, network, gateway, dns (list)."""
    interface = ipaddress.ip_interface(str(static['address']))
    return {
        'interface': static['interface'],
        'address': str(interface),
        'ip': str(interface.ip),
        'prefix': interface.network.prefixlen,
        'netmask': str(interface.netmask),
        'network': str(interface.network),
        'gateway': str(static.get('gateway') or ''),
        'dns': [str(d) for d in static.get('dns') or []],
    }


def network_hostname_errors(name, host):
    """A hostname must be RFC 1123 labels (letters, digits, hyphens), 253 characters at most."""
    if contract.is_hostname(name):
        return []
    return ['host %s: network_hostname %r is not a valid host name (letters, digits and hyphens, '
            'labels separated by dots)' % (host, name)]


def network_domain_errors(domain, host):
    """network_domain is empty or an RFC 1123 domain: it is appended to names in /etc/hosts."""
    if domain in (None, ''):
        return []
    if isinstance(domain, str) and contract.is_hostname(domain.strip('.')) and domain.strip('.') == domain.rstrip('.'):
        return []
    return ['host %s: network_domain %r is not a valid DNS domain (RFC 1123: letters, digits and inner hyphens, '
            'labels separated by dots, no spaces); /etc/hosts would give a wrong name' % (host, domain)]


def _names(hostvars, host, domain):
    name = str(contract._get(hostvars, host, 'network_hostname') or host)
    short = name.split('.')[0]
    names = []
    if '.' in name:
        names.append(name)
    elif domain:
        names.append('%s.%s' % (name, str(domain).strip('.')))
    names.append(short)
    if host not in names:
        names.append(host)
    return names


def network_hosts_lines(groups, hostvars, domain=''):
    """/etc/hosts lines of every cluster node, head first, spares last: address, FQDN (when known), short
    name (a restart that takes a spare reaches it by name)."""
    lines = []
    for host in contract.cluster_nodes(groups):
        lines.append('%s %s' % (contract.cluster_address(hostvars, host), ' '.join(_names(hostvars, host, domain))))
    return lines


def network_hosts_loopback_pattern(groups, hostvars, domain=''):
    """A multi-line regular expression of the /etc/hosts lines that map a cluster node's name to a loopback
    address (a Debian installer's `127.0.1.1 <hostname>`): glibc's getaddrinfo answers such a line beside the
    node's cluster address, and sorts 127.0.1.1 first, so that gloo or NCCL on that node binds to loopback.
    The managed block never matches (a cluster address is never a loopback address); a commented line neither."""
    names = set()
    for host in contract.cluster_nodes(groups):
        names.update(_names(hostvars, host, domain))
    alternation = '|'.join(re.escape(n) for n in sorted(names, key=lambda n: (-len(n), n)))
    return r'^((?:127(?:\.[0-9]{1,3}){3}|::1)[ \t]+(?:[^#\n]*[ \t])?(?:%s)(?=[ \t#]|$)[^\n]*)$' % alternation


class FilterModule:
    def filters(self):
        return {
            'network_hosts_loopback_pattern': network_hosts_loopback_pattern,
            'network_static_errors': network_static_errors,
            'network_static_facts': network_static_facts,
            'network_hostname_errors': network_hostname_errors,
            'network_hosts_lines': network_hosts_lines,
            'network_domain_errors': network_domain_errors,
        }
