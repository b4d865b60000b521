# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The host that supervises training jobs: one definition for site.yml's supervisor step and train.yml."""

from __future__ import annotations

DOCUMENTATION = r'''
name: supervisor_host
short_description: The host that supervises training jobs
version_added: "0.1.0"
description:
  - C(supervisor_host) where the inventory or C(-e) sets it, else the first host of the inventory's
    C(supervisor) group, else the head.
  - The supervisor role's default of C(supervisor_host) is this lookup (site.yml prepares that host), and
    the training role finds the host a supervised start is checked on and supervised from with it, so the
    two never name different hosts.
  - The value is read from the host's variables as the inventory and C(-e) give them (C(hostvars)), never
    from a role's defaults; whether it is a host of the inventory is checked by the roles, naming the variable.
options: {}
'''

EXAMPLES = r'''
- name: Say where supervised jobs are supervised
  ansible.builtin.debug:
    msg: "{{ lookup('gpucluster.multinode.supervisor_host') }}"
'''

RETURN = r'''
_raw:
  description: The supervisor host's inventory name, one item.
  type: list
  elements: str
'''

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.supervisor import (
    SupervisorHostError, supervisor_host)


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if terms or kwargs:
            raise AnsibleLookupError('supervisor_host takes no terms or options')
        variables = variables or {}
        host = variables.get('inventory_hostname')
        setting = None
        hostvars = variables.get('hostvars') or {}
        if host is not None and host in hostvars:
            found = hostvars[host].get('supervisor_host')
            setting = self._templar.template(found) if found is not None else None
        try:
            return [supervisor_host(variables.get('groups') or {}, setting)]
        except SupervisorHostError as exc:
            raise AnsibleLookupError('supervisor_host: %s' % exc) from exc
