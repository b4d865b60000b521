#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: slurm_drain
short_description: Drain failing nodes in Slurm and resume the ones it drained itself
description:
  - Reads every node's state and drain reason with C(scontrol show node -o).
  - Drains each node of O(failing) that is not drained yet, with the reason
    C(<reason_prefix> <failing[node]>), so that Slurm schedules no new job there.
  - Resumes a node of O(checked) that is not in O(failing) only when its drain reason starts with
    O(reason_prefix); a node an administrator drained (any other reason) is never resumed.
  - When more than O(max_pct) percent of the checked nodes fail, drains nothing and says so in
    RV(held). That many failures at once is a fault of the cluster (the head, the network),
    and draining every node would only stop the work that still runs.
  - With O(validate_only), only checks that C(scontrol) is installed and the Slurm controller
    answers (C(scontrol ping)), and fails with the reason otherwise.
version_added: 0.1.0
author: gpucluster.multinode contributors (!UNKNOWN)
extends_documentation_fragment: [gpucluster.multinode.attributes.no_diff]
options:
  failing:
    description: Nodes with a failed check, and the reason to record (a short list of checks).
    type: dict
    default: {}
  checked:
    description: Every node the health run judged; nodes not listed are left as they are.
    type: list
    elements: str
    default: []
  reason_prefix:
    description: Start of the drain reason that marks a drain as this module's.
    type: str
    default: "gpucluster-health:"
  max_pct:
    description: Drain nothing when more than this percent of the checked nodes fail.
    type: float
    default: 50
  scontrol:
    description: The scontrol program; a bare name is looked up on C(PATH).
    type: str
    default: scontrol
  validate_only:
    description: Only check that scontrol runs and the controller answers.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details: Reads the node states and reports what it would drain and resume, changing nothing.
    description: Can run in check mode and return changed status prediction without modifying the node.
notes:
  - Needs the rights to change node states (root or SlurmUser on the controller's host).
'''

EXAMPLES = r'''
- name: Drain the nodes that failed the health checks, resume those healthy again
  gpucluster.multinode.slurm_drain:
    failing:
      gpu-node-3: "gpu, version.torch"
    checked: [gpu-node-1, gpu-node-2, gpu-node-3]
  delegate_to: "{{ groups['head'][0] }}"
  run_once: true
'''

RETURN = r'''
drained:
  description: Nodes drained by this run, with the reason given to Slurm.
  returned: always
  type: dict
  sample: {gpu-node-3: "gpucluster-health: gpu, version.torch"}
resumed:
  description: Nodes this module had drained before that are healthy again and were resumed.
  returned: always
  type: list
  elements: str
kept:
  description: Failing nodes already drained by this module (left drained).
  returned: always
  type: list
  elements: str
foreign:
  description: Nodes drained for another reason (by an administrator); left as they are.
  returned: always
  type: list
  elements: str
not_in_slurm:
  description: Failing nodes Slurm does not know.
  returned: always
  type: list
  elements: str
held:
  description: Why nothing was drained, when too many nodes failed; empty otherwise.
  returned: always
  type: str
'''

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import slurm


def main():
    module = AnsibleModule(
        argument_spec=dict(
            failing=dict(type='dict', default={}),
            checked=dict(type='list', elements='str', default=[]),
            reason_prefix=dict(type='str', default='gpucluster-health:'),
            max_pct=dict(type='float', default=50.0),
            scontrol=dict(type='str', default='scontrol'),
            validate_only=dict(type='bool', default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not p['reason_prefix'].strip():
        module.fail_json(msg='reason_prefix must not be empty: it is how this module knows its own drains')
    if not 0 < p['max_pct'] <= 100:
        module.fail_json(msg='max_pct must be in (0, 100], got %s' % p['max_pct'])
    scontrol = module.get_bin_path(p['scontrol'], opt_dirs=['/usr/bin', '/usr/local/bin'])
    if not scontrol:
        module.fail_json(msg='scontrol not found: Slurm is not installed here (playbooks/slurm.yml installs it)')
    if p['validate_only']:
        rc, out, err = module.run_command([scontrol, 'ping'])
        if rc != 0 or 'UP' not in out:
            said = ' '.join(re.sub(r'\*{3,}', ' ', out + err).split())   # scontrol frames DOWN in asterisks
            module.fail_json(msg='the Slurm controller does not answer: %s' % said)
        module.exit_json(changed=False, drained={}, resumed=[], kept=[], foreign=[], not_in_slurm=[], held='')

    rc, out, err = module.run_command([scontrol, 'show', 'node', '-o'])
    if rc != 0:
        module.fail_json(msg='scontrol show node failed (rc %d): %s' % (rc, ' '.join((err or out).split())))
    records = slurm.node_records(out)
    failing = dict((str(k), ' '.join(str(v).split())) for k, v in p['failing'].items())
    plan = slurm.drain_plan(records, failing, p['checked'], p['reason_prefix'], p['max_pct'])
    if not module.check_mode:
        for done, (node, reason) in enumerate(plan['drain']):
            rc, out, err = module.run_command([scontrol, 'update', 'NodeName=' + node, 'State=DRAIN',
                                               'Reason=' + reason])
            if rc != 0:
                module.fail_json(msg='node %s: scontrol could not drain it: %s' % (node, ' '.join((err or out).split())),
                                 drained=dict(plan['drain'][:done]))
        for node in plan['resume']:
            rc, out, err = module.run_command([scontrol, 'update', 'NodeName=' + node, 'State=RESUME'])
            if rc != 0:
                module.fail_json(msg='node %s: scontrol could not resume it: %s' % (node, ' '.join((err or out).split())))
    module.exit_json(changed=bool(plan['drain'] or plan['resume']), drained=dict(plan['drain']),
                     resumed=plan['resume'], kept=plan['kept'], foreign=plan['foreign'],
                     not_in_slurm=plan['not_in_slurm'], held=plan['held'])


if __name__ == '__main__':
    main()
