# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Hostfile filters: the launcher hostfile text, and the host list the hostfile module takes."""

from __future__ import annotations

DOCUMENTATION = r'''
---
name: hostfile
short_description: The hostfile text a launcher reads, built from inventory hosts and their GPU facts
version_added: "0.1.0"
description:
  - Builds the hostfile for C(deepspeed), C(openmpi) (C(host slots=N)), C(mpich) (C(host:N)),
    C(plain) (one host per line) or C(slurm) (a compressed node list like C(gpu-master,gpu-node[01-04])).
  - The head (the host whose C(group_names) holds C(head)) comes first, then the others in
    natural order (C(worker-2) before C(worker-10)).
  - "Slots of a host (ranks the launcher starts there): its C(node_slots) when set, else its C(gpu_slots),
    else its detected GPU count C(ansible_facts.gpu_facts.gpu_count) from P(gpucluster.multinode.gpu_facts#module);
    a host with no GPU, or whose GPU facts were not gathered, gets O(default_slots) (1 unless told), so a
    CPU-only lab still gets a usable hostfile. Each host keeps its own count."
  - A wrong C(node_slots) or C(gpu_slots) (not a whole number, below 1), an unknown name in O(include) or
    O(exclude), fails with a message that names the host and the variable.
  - The companion filter C(hostfile_hosts) returns the host list (name, address, slots) for the
    O(gpucluster.multinode.hostfile#module:hosts) option of the hostfile module.
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
  format:
    description: The launcher format.
    type: str
    choices: [deepspeed, openmpi, mpich, plain, slurm]
    default: deepspeed
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
  use_address:
    description: List the cluster address (C(cluster_address), else C(ansible_host)) instead of the name.
    type: bool
    default: false
'''

EXAMPLES = r'''
- name: The DeepSpeed hostfile as text
  ansible.builtin.debug:
    msg: "{{ groups['cluster'] | gpucluster.multinode.hostfile(hostvars, format='deepspeed') }}"

- name: A Slurm node list of the workers, by address
  ansible.builtin.set_fact:
    worker_nodelist: "{{ groups['workers'] | gpucluster.multinode.hostfile(hostvars, format='slurm', use_address=true) | trim }}"
'''

RETURN = r'''
_value:
  description: The hostfile text, one line per host (one line in all for C(slurm)), ending with a newline.
  type: str
'''

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf


def hostfile_hosts(names, hostvars, default_slots=1, include=None, exclude=None):
    """[{name, address, slots}], head first, from inventory names and hostvars."""
    try:
        hosts = hf.hosts_from_inventory(list(names) if not isinstance(names, str) else names,
                                        hostvars, default_slots)
        return hf.select(hosts, include, exclude)
    except hf.HostfileError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def hostfile(names, hostvars, format='deepspeed', default_slots=1, include=None, exclude=None,
             use_address=False):
    """The hostfile text for the given inventory hosts."""
    hosts = hostfile_hosts(names, hostvars, default_slots, include, exclude)
    try:
        return hf.render(hosts, format, bool(use_address))
    except hf.HostfileError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {
            'hostfile': hostfile,
            'hostfile_hosts': hostfile_hosts,
        }
