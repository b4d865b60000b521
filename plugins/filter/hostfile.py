# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The launcher host list (name, address, slots) from the inventory, head first."""

from __future__ import annotations

DOCUMENTATION = r'''
---
name: hostfile_hosts
short_description: The launcher host list (name, address, slots) built from inventory hosts and their GPU facts
version_added: "0.1.0"
description:
  - The head (the host whose C(group_names) holds C(head)) comes first, then the others in
    natural order (C(worker-2) before C(worker-10)).
  - "Slots of a host (ranks the launcher starts there): its C(node_slots) when set, else its C(gpu_slots),
    else its detected GPU count C(ansible_facts.gpu_facts.gpu_count) from P(gpucluster.multinode.gpu_facts#module);
    a host with no GPU, or whose GPU facts were not gathered, gets O(default_slots) (1 unless told)."
  - A wrong C(node_slots) or C(gpu_slots) (not a whole number, below 1), an unknown name in O(include) or
    O(exclude), fails with a message that names the host and the variable.
positional: _input, hostvars
options:
  _input:
    description: Inventory host names, for example C(groups['cluster']).
    type: list
    elements: str
    required: true
  hostvars:
    description: The C(hostvars) of the play.
    type: dict
    required: true
  default_slots:
    description: Slots for a host with no C(node_slots), no C(gpu_slots) and no GPU.
    type: int
    default: 1
  include:
    description: Only these hosts are listed.
    type: list
    elements: str
  exclude:
    description: These hosts are left out.
    type: list
    elements: str
'''

EXAMPLES = r'''
- name: The nodes of a cluster test, head first, with their addresses and slots
  ansible.builtin.set_fact:
    test_nodes: "{{ groups['cluster'] | gpucluster.multinode.hostfile_hosts(hostvars) }}"
'''

RETURN = r'''
_value:
  description: One dict per host, head first.
  type: list
  elements: dict
  contains:
    name: {description: The inventory name., type: str}
    address: {description: The cluster address (C(cluster_address), else C(ansible_host))., type: str}
    slots: {description: Ranks the launcher starts there., type: int}
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import inventory


def hostfile_hosts(names, hostvars, default_slots=1, include=None, exclude=None):
    """[{name, address, slots}], head first, from inventory names and hostvars."""
    try:
        hosts = inventory.hosts_from_inventory(list(names) if not isinstance(names, str) else names,
                                               hostvars, default_slots)
        return hf.select(hosts, include, exclude)
    except hf.HostfileError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {
            'hostfile_hosts': hostfile_hosts,
        }
