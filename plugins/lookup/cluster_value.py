# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The one way a role reads a cluster-wide value: the inventory's cluster_<name>, else the
collection's default (module_utils/cluster_defaults.py)."""

from __future__ import annotations

DOCUMENTATION = r'''
name: cluster_value
short_description: A cluster-wide value, the inventory's C(cluster_<name>) or the collection's default
version_added: "0.1.0"
description:
  - For each name given, the value of the host's C(cluster_<name>) variable where the inventory (or
    C(-e)) sets it, else the collection's own default for it, defined once in
    C(plugins/module_utils/cluster_defaults.py) (the C(gpucluster.multinode.cluster_default) lookup
    returns the default alone).
  - The roles' defaults read every cluster-wide value through it (the training role's C(training_user)
    is C(lookup('gpucluster.multinode.cluster_value', 'user'))), so a fallback is written once and
    cannot differ from one role to the next.
  - An unknown name fails naming it and the names there are.
options:
  _terms:
    description: Names without the C(cluster_) prefix (C(user) reads C(cluster_user)).
    type: list
    elements: str
    required: true
  unset:
    description:
      - What a role that is only run when asked for takes where the inventory does not set the
        value (the ray role is enabled when run on its own); the collection's default otherwise.
    type: raw
  host:
    description: Read another host's C(cluster_<name>) (its inventory name), e.g. the head's; this host's when empty.
    type: str
    default: ""
  empty_is_unset:
    description: An empty value set in the inventory counts as unset (as C(default(..., true)) does).
    type: bool
    default: false
'''

EXAMPLES = r'''
- name: The account that runs the training
  ansible.builtin.debug:
    msg: "{{ lookup('gpucluster.multinode.cluster_value', 'user') }}"

- name: Where the shared storage is mounted and the cluster's Python environment
  ansible.builtin.debug:
    msg: "{{ lookup('gpucluster.multinode.cluster_value', 'shared_dir', 'env_path', wantlist=True) }}"
'''

RETURN = r'''
_raw:
  description: The value of each name given, as the inventory sets it or the collection's default.
  type: list
  elements: raw
'''

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}
        unset = kwargs.pop('unset', cluster_defaults.UNSET)
        empty_is_unset = bool(kwargs.pop('empty_is_unset', False))
        host = kwargs.pop('host', '')
        if host:
            hostvars = variables.get('hostvars') or {}
            if host not in hostvars:
                raise AnsibleLookupError('cluster_value: host %r is not in the inventory' % host)
            variables = hostvars[host]
        if kwargs:
            raise AnsibleLookupError('cluster_value: unknown option(s) %s' % ', '.join(sorted(kwargs)))

        def read(name):
            found = variables.get(name, cluster_defaults.UNSET)
            return found if found is cluster_defaults.UNSET else self._templar.template(found)

        try:
            return [cluster_defaults.cluster_value(term, read, unset, empty_is_unset) for term in terms]
        except KeyError as exc:
            raise AnsibleLookupError('cluster_value: %s' % exc.args[0]) from exc
