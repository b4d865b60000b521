# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The launchers the collection starts jobs with, declared once in plugins/module_utils/training/launchers.py."""

from __future__ import annotations

DOCUMENTATION = r'''
name: launchers
short_description: The launchers training jobs start with, and what each needs on the nodes
version_added: "0.1.0"
description:
  - Returns one declaration per launcher named (every launcher when none is named), from
    C(plugins/module_utils/training/launchers.py), the same declaration the M(gpucluster.multinode.training_job)
    module takes its choices from.
  - Each declaration has C(name), C(tools) (the node_tools package groups it needs, C(pdsh) for
    C(deepspeed), C(openmpi) for C(mpirun) and for C(deepspeed) with O(deepspeed_launcher=openmpi)),
    C(uses_ssh) (the head reaches every node over SSH), C(per_node) (every node starts its own part)
    and C(options) (the training_job options only it reads).
  - An unknown name fails naming it and the launchers there are.
options:
  _terms:
    description: Launcher names; none for every launcher.
    type: list
    elements: str
  deepspeed_launcher:
    description: How the deepspeed launcher reaches the other nodes (C(pdsh) or C(openmpi)).
    type: str
    default: pdsh
'''

EXAMPLES = r'''
- name: Refuse a launcher the collection does not know
  ansible.builtin.assert:
    that: training_launcher in lookup('gpucluster.multinode.launchers', wantlist=true) | map(attribute='name')

- name: The package groups the job's launcher needs
  ansible.builtin.debug:
    msg: "{{ lookup('gpucluster.multinode.launchers', training_launcher, deepspeed_launcher='openmpi').tools }}"
'''

RETURN = r'''
_raw:
  description: One declaration per launcher.
  type: list
  elements: dict
'''

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpucluster.multinode.plugins.module_utils.training.launchers import LAUNCHERS, declaration


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        via = kwargs.get('deepspeed_launcher') or 'pdsh'
        try:
            return [declaration(name, via) for name in (terms or list(LAUNCHERS))]
        except ValueError as e:
            raise AnsibleLookupError('launchers: %s' % e)
