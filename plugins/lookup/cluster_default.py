# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The collection-wide defaults that the roles chain to (module_utils/cluster_defaults.py)."""

from __future__ import annotations

DOCUMENTATION = r'''
name: cluster_default
short_description: A collection-wide default (environment path, NCCL profile, ports, slot limit)
version_added: "0.1.0"
description:
  - Returns the collection's own default for each name given, defined once in
    C(plugins/module_utils/cluster_defaults.py), whatever the inventory sets. A role reads a
    cluster-wide value with the C(gpucluster.multinode.cluster_value) lookup (the inventory's
    C(cluster_<name>), else this default); this one is for the values no inventory variable sets (port
    counts, the Ray unit's paths) and for the training image of given pins.
  - C(env_path) (C(/opt/gpucluster/env)), C(nccl_profile) (C(/etc/profile.d/gpucluster-nccl.sh)), C(shared_dir) (C(/shared)), C(user_uid) (2000),
    C(master_port) (29500), C(rendezvous_port_count), C(max_slots) (1024), C(ray_port),
    C(ray_dashboard_port), C(ray_client_server_port), C(ray_client_port_count), C(bandwidth_port)
    (5201), C(torch_version) (2.13.0), C(deepspeed_version) (0.19.8), C(ninja_version) (1.13.2).
  - C(train_image) is the training image the container role builds,
    C(localhost/gpucluster-train:torch<torch>-ds<deepspeed>), for the pins given in O(torch) and
    O(deepspeed) (the collection's own when empty).
  - An unknown name fails naming it and the names there are.
options:
  _terms:
    description: Names of the defaults.
    type: list
    elements: str
    required: true
  torch:
    description: The torch pin for C(train_image) (empty, the collection's).
    type: str
    default: ""
  deepspeed:
    description: The DeepSpeed pin for C(train_image) (empty, the collection's).
    type: str
    default: ""
'''

EXAMPLES = r'''
- name: The collection's environment path, whatever the inventory sets
  ansible.builtin.debug:
    msg: "{{ lookup('gpucluster.multinode.cluster_default', 'env_path') }}"

- name: The training image of the environment's pins
  ansible.builtin.debug:
    msg: "{{ lookup('gpucluster.multinode.cluster_default', 'train_image', torch=cluster_torch_version | default('')) }}"
'''

RETURN = r'''
_raw:
  description: The value of each name given (a string or an integer).
  type: list
  elements: raw
'''

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpucluster.multinode.plugins.module_utils.cluster_defaults import DEFAULTS, train_image


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        out = []
        for term in terms:
            if term == 'train_image':
                out.append(train_image(kwargs.get('torch'), kwargs.get('deepspeed')))
                continue
            if term not in DEFAULTS:
                raise AnsibleLookupError('cluster_default: no default named %r (there are %s)'
                                         % (term, ', '.join(sorted(list(DEFAULTS) + ['train_image']))))
            out.append(DEFAULTS[term])
        return out
