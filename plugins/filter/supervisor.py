# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The supervisor host's inventory of the cluster, written from the controller's (roles/supervisor)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import inventory_contract

DOCUMENTATION = r'''
name: supervisor_inventory
short_description: the cluster's inventory as the supervisor host reaches it
description:
  - The groups and hosts of the controller's inventory that the cluster is made of (every group that
    holds a host of the cluster, the spares or the supervisor), each host by its cluster address, reached
    as root with the supervisor's own key and its pinned host keys.
  - The settings the supervisor's runs read are kept (C(cluster_*), the settings of the roles train.yml and
    health.yml run, C(node_slots), C(gpu_slots), C(ansible_python_interpreter)); the controller's connection
    settings, facts, results a run computed and C(training_local_jobs_dir) (a path on the controller) are not.
    Values equal on every host go to C(all.vars).
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  groups:
    description: C(groups).
    type: dict
    required: true
  hosts:
    description: the hosts to write (the cluster's, the spares, the supervisor host).
    type: list
    elements: str
    required: true
  key_file:
    description: the supervisor's private key on the supervisor host.
    type: str
    required: true
  known_hosts:
    description: the known_hosts file of the pinned host keys on the supervisor host.
    type: str
    required: true
'''

# What the supervisor's runs (train.yml, health.yml) read: the cluster-wide settings, the settings of the
# roles they run and chain to, and the contract's per-node values. Results a run computes (set_fact) and the
# controller's own paths are not settings.
KEPT_PREFIXES = ('cluster_', 'training_', 'health_', 'nccl_env_', 'python_env_', 'container_', 'slurm_', 'ray_',
                 'nvidia_driver_', 'node_tools_', 'nfs_client_')
KEPT_NAMES = frozenset(('node_slots', 'gpu_slots', 'ansible_python_interpreter'))
# set_fact results of site.yml's own steps (a run with --tags supervisor alone would not have them, and the
# inventory would change between the two) and settings of roles the supervisor never runs (cluster_tests).
COMPUTED = frozenset(('training_result', 'training_progress', 'training_local_jobs_dir', 'node_tools_os_packages',
                      'node_tools_os_name', 'nvidia_driver_state'))
SKIPPED_PREFIXES = ('cluster_tests_',)


def _plain(value):
    if isinstance(value, dict) or hasattr(value, 'items'):
        return dict((str(k), _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


def kept(name):
    """Whether a host variable of the controller's inventory goes to the supervisor's."""
    if name in COMPUTED or name.startswith(SKIPPED_PREFIXES):
        return False
    return name in KEPT_NAMES or name.startswith(KEPT_PREFIXES)


def supervisor_inventory(hostvars, groups, hosts, key_file, known_hosts):
    hosts = [h for h in hosts]
    per_host = {}
    for host in hosts:
        if host not in hostvars:
            raise AnsibleFilterError('supervisor_inventory: host %s is not in the inventory' % host)
        here = hostvars[host]
        keep = {}
        for name in sorted(here.keys()):
            if kept(name):
                keep[name] = _plain(here[name])
        keep['ansible_host'] = inventory_contract.address_of(here, host)
        per_host[host] = keep
    common = {}
    if per_host:
        first = per_host[hosts[0]]
        for name, value in first.items():
            if name != 'ansible_host' and all(per_host[h].get(name, object()) == value for h in hosts[1:]) \
                    and all(name in per_host[h] for h in hosts):
                common[name] = value
    common.update({
        'ansible_user': 'root',
        'ansible_ssh_private_key_file': key_file,
        'ansible_ssh_common_args': '-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes'
                                   % known_hosts,
    })
    children = {}
    for group in sorted(groups.keys()):
        if group in ('all', 'ungrouped'):
            continue
        members = [h for h in groups[group] if h in per_host]
        if members:
            children[group] = {'hosts': dict((h, dict((k, v) for k, v in sorted(per_host[h].items())
                                                      if k not in common or k == 'ansible_host'))
                                             for h in members)}
    for group in children.values():
        for name, host_vars in group['hosts'].items():
            if not host_vars:
                group['hosts'][name] = None
    return {'all': {'vars': dict(sorted(common.items())), 'children': children}}


class FilterModule:
    def filters(self):
        return {'supervisor_inventory': supervisor_inventory}
