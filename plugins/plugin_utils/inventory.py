# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The hosts of a job read from the inventory, for the controller's filters (cluster_job_nodes,
hostfile_hosts): each host's cluster address and its slots, head first. module_utils/hostfile.py
renders the hostfiles from the host dicts this returns.

Slots per host (how many ranks a launcher starts there), resolved in ONE place, slots_of():
``node_slots`` in the inventory wins, then ``gpu_slots`` (the GPUs the node has), then the
detected GPU count (``ansible_facts.gpu_facts.gpu_count`` from ``gpucluster.multinode.gpu_facts``);
a host with no GPU, or whose GPU count is unknown, gets ``default_slots`` (1 unless told), so
a CPU-only lab still gets a usable hostfile (and asks for 2 ranks with ``node_slots: 2``
without claiming a GPU). Every problem raises hostfile.HostfileError naming the host and the variable.
"""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.inventory_contract import cluster_address


def _facts_gpu_count(hv, host):
    """(gpu_count, where it was read) from the GPU facts of a host, or (None, None).

    gpucluster.multinode.gpu_facts sets ansible_facts.gpu_facts.gpu_count; the older
    ansible_facts.gpu.gpu_count is read too.
    """
    facts = hv.get('ansible_facts') or {}
    if not isinstance(facts, dict):
        return None, None
    for key in ('gpu_facts', 'gpu'):
        gpu = facts.get(key)
        if isinstance(gpu, dict) and gpu.get('gpu_count') is not None:
            return gpu.get('gpu_count'), 'ansible_facts.%s.gpu_count' % key
    return None, None


def slots_of(hostvars_of_host, detected_gpus=None, default_slots=1, host=None):
    """Ranks a launcher starts on a host: node_slots, else gpu_slots, else the detected GPUs
    (detected_gpus, or the host's gpu_facts when None), else default_slots.

    hostvars_of_host: the host's hostvars (a dict). Raises hf.HostfileError naming the host and the
    variable when a value is not a whole number in range."""
    hv = hostvars_of_host or {}
    host = host or hv.get('inventory_hostname') or '?'
    default_slots = hf.check_default_slots(default_slots)
    for var in ('node_slots', 'gpu_slots'):
        if hv.get(var) not in (None, ''):
            return hf.whole_number(hv.get(var), host, var, 1)
    label = 'detected_gpus'
    if detected_gpus is None:
        detected_gpus, label = _facts_gpu_count(hv, host)
    if detected_gpus is not None:
        gpus = hf.whole_number(detected_gpus, host, label, 0)
        if gpus > 0:
            return gpus
    return default_slots


def hosts_from_inventory(names, hostvars, default_slots=1):
    """Host dicts from inventory names: address = cluster_address, slots from slots_of().

    The head (a host whose group_names holds 'head') comes first; when no host is in
    'head' the first name given is the head.
    """
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise hf.HostfileError('the hosts to list must be a list of inventory names, got %r (%s)'
                               % (names, hf.type_name(names)))
    heads = []
    entries = []
    for name in names:
        try:
            hv = hostvars[name]
        except KeyError:
            raise hf.HostfileError('host %s: not in hostvars (is it in the inventory?)' % name) from None
        if 'head' in (hv.get('group_names') or []):
            heads.append(name)
        entries.append({
            'name': name,
            'address': cluster_address(hostvars, name),
            'slots': slots_of(hv, default_slots=default_slots, host=name),
        })
    head = sorted(heads, key=hf.natural_key)[0] if heads else None
    return hf.normalize(entries, head=head, default_slots=default_slots, slots_label='node_slots')
