# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Checks for the firewall role: the controller's own address, admin networks, ports and sources.

Every check returns a list of problems, one line each, naming the host and the variable, so the
role (and site.yml's preflight) can fail before ufw or firewalld is touched.
"""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import addresses
from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults

DOCUMENTATION = r'''
---
name: firewall_admin_errors
short_description: Problems of the firewall settings, one line each naming the host and the variable
version_added: "0.1.0"
description:
  - C(firewall_admin_errors) checks C(firewall_admin_networks) (addresses or networks) and refuses a
    set that would lock the controller's own SSH connection out.
  - C(firewall_port_errors) checks ports and ranges (C(first:last), 1-65535, first not above last).
  - C(firewall_source_errors) checks that sources are addresses or networks.
  - C(firewall_controller_address) reads the controller's address from C(SSH_CLIENT).
  - C(port_range) is C(first:last) of a count of ports from the first (the defaults of
    C(firewall_rendezvous_ports) and C(firewall_ray_ports) derive from the ports they hold).
positional: _input, host, cluster_cidr, controller
options:
  _input:
    description: C(firewall_admin_networks).
    type: list
    required: true
  host:
    description: The inventory name, used in the messages.
    type: str
  cluster_cidr:
    description: The cluster network (always allowed).
    type: str
  controller:
    description: The controller's address as the node sees it (C(firewall_controller_address)).
    type: str
'''

EXAMPLES = r'''
- name: Refuse ports ufw would refuse, before ufw is touched
  ansible.builtin.fail:
    msg: "{{ firewall_ray_ports | gpucluster.multinode.firewall_port_errors(inventory_hostname, 'firewall_ray_ports') }}"
  when: firewall_ray_ports | gpucluster.multinode.firewall_port_errors(inventory_hostname, 'firewall_ray_ports') | length > 0
'''

RETURN = r'''
_value:
  description: The problems found, each naming the host and the variable; an empty list when there are none.
  type: list
  elements: str
'''


_ip = addresses.ip_or_none
_network = addresses.network_or_none


def firewall_controller_address(ssh_client):
    """The controller's address as the node sees it: the first field of SSH_CLIENT ('' when unknown)."""
    first = str(ssh_client or '').split(' ')[0].strip()
    return first if _ip(first) is not None else ''


def firewall_admin_errors(admin_networks, host, cluster_cidr, controller=''):
    """Problems of firewall_admin_networks: malformed entries, or a set that locks the controller out."""
    errors = []
    nets = []
    if not isinstance(admin_networks, list):
        return ['host %s: firewall_admin_networks must be a list of addresses or networks, got %r' % (host, admin_networks)]
    for item in admin_networks:
        net = _network(item)
        if net is None:
            errors.append('host %s: firewall_admin_networks entry %r is not an address or a network (a.b.c.d/prefix)'
                          % (host, item))
        else:
            nets.append(net)
    if errors or not controller:
        return errors
    ip = _ip(controller)
    allowed = nets + [n for n in [_network(cluster_cidr)] if n is not None]
    if not any(ip.version == n.version and ip in n for n in allowed):
        errors.append('host %s: firewall_admin_networks %s excludes the controller\'s own address %s (the Ansible '
                      'connection comes from it), and it is outside cluster_cidr %s: SSH would be locked out. '
                      'Add %s/32 (or its network) to firewall_admin_networks'
                      % (host, ', '.join(str(n) for n in nets) or '[]', controller, cluster_cidr, controller))
    return errors


def _port(text):
    return int(text) if text.isdigit() and 1 <= int(text) <= 65535 else None


def firewall_port_errors(ports, host, variable):
    """Problems of a list of ports or first:last ranges (ufw and firewalld take 1-65535, first <= last)."""
    errors = []
    for item in ports if isinstance(ports, list) else [ports]:
        text = str(item).strip()
        parts = text.split(':')
        numbers = [_port(part) for part in parts]
        if len(parts) > 2 or None in numbers:
            errors.append('host %s: %s entry %r is not a port (1-65535) or a range first:last of ports'
                          % (host, variable, text))
        elif len(numbers) == 2 and numbers[0] > numbers[1]:
            errors.append('host %s: %s range %s starts above its end' % (host, variable, text))
    return errors


def firewall_source_errors(sources, host, variable):
    """Problems of a list of sources: each an IP address or a network in CIDR form."""
    if not isinstance(sources, list):
        return ['host %s: %s must be a list of addresses or networks, got %r' % (host, variable, sources)]
    return ['host %s: %s entry %r is not an address or a network (a.b.c.d/prefix)' % (host, variable, item)
            for item in sources if _network(item) is None]


def port_range(first, count=1):
    """'first:last' of count ports from first ('29500' and 101 -> '29500:29600'); one port alone."""
    return cluster_defaults.port_range(first, count)


class FilterModule:
    def filters(self):
        return {
            'port_range': port_range,
            'firewall_controller_address': firewall_controller_address,
            'firewall_admin_errors': firewall_admin_errors,
            'firewall_port_errors': firewall_port_errors,
            'firewall_source_errors': firewall_source_errors,
        }
