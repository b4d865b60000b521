# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The one rule for a node's cluster address, as a filter.

    {{ hostvars[host] | gpucluster.multinode.cluster_address(host) }}
    {{ hostvars[inventory_hostname] | gpucluster.multinode.cluster_address }}

cluster_address, else ansible_host, else the inventory name; an unset, null or blank value counts
as not set (Jinja's ``default`` would keep an empty string, Python's ``or`` would not: this decides).
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import inventory_contract

DOCUMENTATION = r'''
name: cluster_address
short_description: the address a node is known by inside the cluster
description:
  - C(cluster_address) of the node, else its C(ansible_host), else its inventory name.
  - An unset, null or blank value counts as not set.
options:
  _input:
    description: the node's variables, C(hostvars[host]).
    type: dict
    required: true
  host:
    description: the node's inventory name; default the C(inventory_hostname) in its variables.
    type: str
'''


def cluster_address(host_vars, host=None):
    """cluster_address, else ansible_host, else the inventory name of one node."""
    try:
        return inventory_contract.address_of(host_vars, host)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {'cluster_address': cluster_address}
