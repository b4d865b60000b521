#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: ray_node
short_description: The Ray service of a node - its state, processes, log, version, or a stop that leaves nothing
description:
  - O(action=inspect) reads the systemd unit's state, the processes in its cgroup, the last lines
    of its journal, the Ray version installed in O(env_path) (from the package metadata on disk)
    and the node's manifest (what it should bring to the cluster).
  - O(action=stop) stops the unit, then reads its cgroup; processes still there are killed with
    C(systemctl kill --signal=SIGKILL) and waited for, at most O(stop_timeout) seconds. It fails
    naming what is left. Processes are found by the unit's cgroup, never by their names.
version_added: 0.2.0
author: gpucluster.multinode contributors (!UNKNOWN)
extends_documentation_fragment: [gpucluster.multinode.attributes.no_diff]
options:
  unit:
    description: The systemd unit of the Ray node, e.g. C(gpucluster-ray.service).
    type: str
    required: true
  action:
    description: What to do.
    type: str
    choices: [inspect, stop]
    default: inspect
  env_path:
    description: The Python environment Ray is installed in (its version is read from there).
    type: path
  manifest:
    description: JSON file the role wrote with what the node should bring to the cluster.
    type: path
  log_lines:
    description: How many lines of the unit's journal to return.
    type: int
    default: 15
  stop_timeout:
    description: Seconds the stop and the kill of what is left may take, each.
    type: int
    default: 30
attributes:
  check_mode:
    support: full
    details: O(action=stop) says whether it would stop anything and changes nothing.
    description: Can run in check mode and return changed status prediction without modifying the node.
'''

EXAMPLES = r'''
- name: Stop Ray on the node and make sure nothing of it is left
  gpucluster.multinode.ray_node:
    unit: gpucluster-ray.service
    action: stop
'''

RETURN = r'''
active_state:
  description: The unit's ActiveState (C(active), C(failed), C(inactive)...) before any stop.
  returned: always
  type: str
sub_state:
  description: The unit's SubState.
  returned: always
  type: str
control_group:
  description: The unit's cgroup (empty when it runs nothing).
  returned: always
  type: str
processes:
  description: Processes in the unit's cgroup (after the stop for O(action=stop)).
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4242, cmdline: "/opt/gpucluster/env/bin/python .../ray start --block ..."}]
log_tail:
  description: The last O(log_lines) lines of the unit's journal.
  returned: always
  type: list
  elements: str
ray_version:
  description: Ray's version in O(env_path) (empty when it is not installed there).
  returned: when env_path is set
  type: str
manifest:
  description: The node's manifest (empty when there is none).
  returned: when manifest is set
  type: dict
stopped:
  description: Pids that were in the cgroup and are gone.
  returned: when action is stop
  type: list
  elements: int
'''

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes
from ansible_collections.gpucluster.multinode.plugins.module_utils import ray_cluster

PROPS = 'ActiveState,SubState,ControlGroup,MainPID,LoadState'


def show(module, unit):
    rc, out, err = module.run_command(['systemctl', 'show', '-p', PROPS, unit])
    if rc != 0:
        module.fail_json(msg='systemctl show %s failed: %s' % (unit, err.strip()))
    return ray_cluster.parse_systemctl_show(out)


def procs(props):
    return [{'pid': pid, 'cmdline': processes.read_cmdline(pid)[:300]}
            for pid in ray_cluster.cgroup_pids(props.get('ControlGroup', ''))]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type='str', required=True),
            action=dict(type='str', choices=['inspect', 'stop'], default='inspect'),
            env_path=dict(type='path'),
            manifest=dict(type='path'),
            log_lines=dict(type='int', default=15),
            stop_timeout=dict(type='int', default=30),
        ),
        supports_check_mode=True,
    )
    p = module.params
    unit = p['unit']
    props = show(module, unit)
    result = {'active_state': props.get('ActiveState', ''), 'sub_state': props.get('SubState', ''),
              'load_state': props.get('LoadState', ''), 'control_group': props.get('ControlGroup', ''),
              'processes': procs(props), 'log_tail': []}
    if p['env_path']:
        result['ray_version'] = env_versions.ray_version(p['env_path'])
    if p['manifest']:
        try:
            with open(p['manifest']) as f:
                result['manifest'] = json.load(f)
        except (IOError, OSError, ValueError):
            result['manifest'] = {}
    if p['log_lines'] > 0 and result['load_state'] == 'loaded':
        rc, out, _err = module.run_command(['journalctl', '-u', unit, '-n', str(p['log_lines']),
                                            '--no-pager', '-o', 'short-iso'])
        result['log_tail'] = out.splitlines()[-p['log_lines']:] if rc == 0 else []
    if p['action'] == 'inspect':
        module.exit_json(changed=False, **result)

    before = [x['pid'] for x in result['processes']]
    active = result['active_state'] in ('active', 'activating', 'reloading', 'deactivating')
    changed = active or bool(before)
    if module.check_mode or not changed:
        module.exit_json(changed=changed, stopped=[], **result)
    if active:
        rc, _out, err = module.run_command(['timeout', str(p['stop_timeout']), 'systemctl', 'stop', unit])
        if rc not in (0, 124):
            module.fail_json(msg='systemctl stop %s failed: %s' % (unit, err.strip()), **result)
    left = procs(show(module, unit)) or procs(props)
    if left:
        module.run_command(['systemctl', 'kill', '--signal=SIGKILL', unit])
        deadline = time.time() + p['stop_timeout']
        while time.time() < deadline:
            left = [x for x in procs(props) if os.path.exists('/proc/%d' % x['pid'])]
            if not left:
                break
            time.sleep(0.5)
    result['processes'] = left
    result['stopped'] = [pid for pid in before if pid not in [x['pid'] for x in left]]
    if left:
        module.fail_json(msg='%d process(es) of %s are still running after the stop and a SIGKILL: %s'
                         % (len(left), unit, ', '.join('%d (%s)' % (x['pid'], x['cmdline'][:80]) for x in left)),
                         **result)
    module.exit_json(changed=True, **result)


if __name__ == '__main__':
    main()
