#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: ray_status
short_description: The Ray cluster as its head sees it
description:
  - Runs C(ray status -v) against the head's GCS and C(ray list nodes --format json) against the
    dashboard, and returns both texts parsed.
  - Optionally waits, bounded by O(wait_timeout), until every address of O(expect_addresses) is
    alive in the cluster.
  - Changes nothing; runs the same in check mode.
version_added: 0.2.0
author: gpucluster.multinode contributors (!UNKNOWN)
extends_documentation_fragment: [gpucluster.multinode.attributes.no_diff]
options:
  ray:
    description: The C(ray) command of the cluster's environment, e.g. C(/opt/gpucluster/env/bin/ray).
    type: path
    required: true
  address:
    description: The head's GCS address, C(host:port).
    type: str
    required: true
  dashboard_url:
    description: The dashboard's URL, e.g. C(http://10.0.0.1:8265), for the list of nodes.
    type: str
    required: true
  expect_addresses:
    description: Node addresses that should be alive; with O(wait_timeout) the module waits for them.
    type: list
    elements: str
    default: []
  wait_timeout:
    description: Seconds to wait for O(expect_addresses) to be alive (0 reads once).
    type: int
    default: 0
  command_timeout:
    description: Seconds each Ray command may take.
    type: int
    default: 30
attributes:
  check_mode:
    support: full
    details: Only reads.
    description: Can run in check mode and return changed status prediction without modifying the node.
'''

EXAMPLES = r'''
- name: Read the Ray cluster on the head
  gpucluster.multinode.ray_status:
    ray: /opt/gpucluster/env/bin/ray
    address: 10.0.0.1:6379
    dashboard_url: http://10.0.0.1:8265
    expect_addresses: [10.0.0.1, 10.0.0.2]
    wait_timeout: 120
  register: ray
'''

RETURN = r'''
status_text:
  description: The output of C(ray status -v).
  returned: always
  type: str
status:
  description: C(ray status) parsed (active node ids, pending, failures, usage, per-node usage).
  returned: when ray status answered
  type: dict
  sample: {active: ["689e43..."], pending: [], failures: [], usage: {CPU: {used: 0.0, total: 2.0}}, nodes: {}}
nodes:
  description: C(ray list nodes) parsed; memory sizes in bytes.
  returned: always
  type: list
  elements: dict
  sample: [{node_id: "689e43...", node_ip: 10.0.0.1, state: ALIVE, is_head: true, resources: {CPU: 2.0}, labels: {}}]
missing:
  description: Addresses of O(expect_addresses) not alive in the cluster.
  returned: always
  type: list
  elements: str
error:
  description: Why the cluster could not be read (empty when it was).
  returned: always
  type: str
waited:
  description: Seconds spent waiting.
  returned: always
  type: float
'''

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import ray_cluster


def _ask(module, argv, env, what, parse, result, key):
    """Run one ray command and parse its output into result[key]; False (with result['error']) when
    the command fails or its output does not parse."""
    rc, out, err = module.run_command(argv, environ_update=env)
    if key == 'status':
        result['status_text'] = out
    if rc != 0:
        result['error'] = '%s exited %d: %s' % (what, rc, ' '.join((err or out).strip().splitlines()[-3:]))
        return False
    try:
        result[key] = parse(out)
    except ValueError as exc:
        result['error'] = exc.args[0] if what == 'ray status' else '%s: %s' % (what, exc)
        return False
    return True


def read(module, p):
    env = {'RAY_USAGE_STATS_ENABLED': '0', 'TERM': 'dumb'}
    result = {'status_text': '', 'status': None, 'nodes': [], 'error': ''}
    status = ['timeout', str(p['command_timeout']), p['ray'], 'status', '-v', '--address', p['address']]
    nodes = [p['ray'], 'list', 'nodes', '--format', 'json', '--limit', '10000',
             '--timeout', str(p['command_timeout']), '--address', p['dashboard_url']]
    if _ask(module, status, env, 'ray status', ray_cluster.parse_ray_status, result, 'status'):
        _ask(module, nodes, env, 'ray list nodes', ray_cluster.parse_ray_nodes, result, 'nodes')
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ray=dict(type='path', required=True),
            address=dict(type='str', required=True),
            dashboard_url=dict(type='str', required=True),
            expect_addresses=dict(type='list', elements='str', default=[]),
            wait_timeout=dict(type='int', default=0),
            command_timeout=dict(type='int', default=30),
        ),
        supports_check_mode=True,
    )
    p = module.params
    start = time.time()
    while True:
        result = read(module, p)
        alive = set(n['node_ip'] for n in result['nodes'] if n['state'] == 'ALIVE')
        result['missing'] = [a for a in p['expect_addresses'] if a not in alive]
        if (not result['missing'] and not result['error']) or time.time() - start >= p['wait_timeout']:
            break
        time.sleep(3)
    result['waited'] = round(time.time() - start, 1)
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
