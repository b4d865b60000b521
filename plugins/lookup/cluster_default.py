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
    C(plugins/module_utils/cluster_defaults.py); the roles' defaults chain to it, for example
    C(python_env_path | default(lookup('gpucluster.multinode.cluster_default', 'env_path'))).
  - C(env_path) (C(/opt/gpucluster/env)), C(nccl_profile) (C(/etc/profile.d/gpucluster-nccl.sh)),
    C(master_port) (29500), C(rendezvous_port_count), C(max_slots) (1024), C(ray_port),
    C(ray_dashboard_port), C(ray_client_server_port), C(ray_client_port_count).
  - An unknown name fails naming it and the names there are.
options:
  _terms:
    description: Names of the defaults.
    type: list
    elements: str
    required: true
'''

EXAMPLES = r'''
- name: The environment path other roles fall back to
  ansible.builtin.debug:
    msg: "{{ python_env_path | default(lookup('gpucluster.multinode.cluster_default', 'env_path')) }}"
'''

RETURN = r'''
_raw:
  description: The value of each name given (a string or an integer).
  type: list
  elements: raw
'''

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpucluster.multinode.plugins.module_utils.cluster_defaults import DEFAULTS


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        out = []
        for term in terms:
            if term not in DEFAULTS:
                raise AnsibleLookupError('cluster_default: no default named %r (there are %s)'
                                         % (term, ', '.join(sorted(DEFAULTS))))
            out.append(DEFAULTS[term])
        return out
