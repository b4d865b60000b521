#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: smoke
short_description: One node's part of the distributed smoke test (join one torch.distributed group, all-reduce, check)
version_added: "0.1.0"
description:
  - Runs on every node at the same time (start it with C(async) so that C(forks) does not
    matter). Each node runs the C(smoke.py) script of the
    P(gpucluster.multinode.cluster_tests#role) role, which starts that node's O(slots) ranks
    (ranks numbered node by node; the world size is the sum of the slots); the head's first
    rank (rank 0) holds the rendezvous store on O(master_addr):O(master_port).
  - Every rank joins one process group (C(gloo) unless told), all-reduces a tensor of
    rank + 1, checks that every element is n(n+1)/2 for a world of n ranks, and leaves.
  - When a node does not join within O(timeout) seconds, the head's result names which nodes
    joined (RV(joined)) and the node's own result says where it stopped (RV(stage)) and the
    likely cause (RV(cause)) from quick probes (the head's name does not resolve, its port is
    closed or filtered, or the socket interface (C(GLOO_SOCKET_IFNAME)) does not exist or
    does not hold the node's cluster address).
  - A failed check is a result with RV(ok=false), not a module failure; the
    P(gpucluster.multinode.dist_check_report#filter) filter makes one verdict of all nodes.
    Bad input, and the rendezvous port already in use on the head, fail the module.
options:
  node:
    description: Name of this node; one of O(nodes).
    type: str
    required: true
  nodes:
    description: Names of the nodes, head first.
    type: list
    elements: str
    required: true
  slots:
    description:
      - Ranks on each node, in the order of O(nodes) (each node's C(node_slots)); default 1 on
        every node.
    type: list
    elements: int
  address:
    description: Cluster address of this node (checked against the socket interface).
    type: str
  master_addr:
    description: Address (or name) of the head's rendezvous.
    type: str
    required: true
  master_port:
    description: Port of the head's rendezvous store.
    type: int
    default: 29500
  backend:
    description: C(gloo) (CPU, any node) or C(nccl) (GPUs).
    type: str
    choices: [gloo, nccl]
    default: gloo
  python:
    description: Python of the environment that has torch.
    type: path
    default: /opt/gpucluster/env/bin/python
  script:
    description: Path of C(smoke.py) on the node.
    type: path
    required: true
  timeout:
    description: Seconds to wait for every node to join.
    type: int
    default: 120
  socket_ifname:
    description:
      - Interface gloo and NCCL use (C(GLOO_SOCKET_IFNAME), C(NCCL_SOCKET_IFNAME)); empty for the
        value from O(env_files), else none (the libraries pick one).
    type: str
    default: ""
  env:
    description: Extra environment variables (they win).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    description: Checks the input only (the environment and the script may come with the same run); runs nothing; RV(stage) is C(skipped).
seealso:
  - plugin: gpucluster.multinode.dist_check_report
    plugin_type: filter
author: gpucluster.multinode contributors (!UNKNOWN)
extends_documentation_fragment: [gpucluster.multinode.launch_env, gpucluster.multinode.attributes.posix, gpucluster.multinode.attributes.no_diff]
'''

EXAMPLES = r'''
- name: Every node joins the group (see roles/cluster_tests/tasks/smoke.yml)
  gpucluster.multinode.smoke:
    node: "{{ inventory_hostname }}"
    nodes: "{{ groups | gpucluster.multinode.cluster_nodes }}"
    slots: "{{ groups | gpucluster.multinode.cluster_nodes | gpucluster.multinode.hostfile_hosts(hostvars) | map(attribute='slots') }}"
    address: "{{ hostvars[inventory_hostname] | gpucluster.multinode.cluster_address(inventory_hostname) }}"
    master_addr: "{{ hostvars[groups['head'][0]] | gpucluster.multinode.cluster_address(groups['head'][0]) }}"
    script: /var/tmp/gpucluster/cluster_tests/smoke.py
  async: 300
  poll: 0
  register: dist_job
'''

RETURN = r'''
ok:
  description: Whether this node joined, all-reduced and found the right sum.
  returned: always
  type: bool
stage:
  description: Where this node stopped (C(connect), C(store), C(init), C(reduce)), C(done) when it passed, C(skipped) in check mode.
  returned: always
  type: str
  sample: connect
cause:
  description: The likely cause when it failed, e.g. C(name not resolvable), C(port closed ...), C(interface mismatch ...).
  returned: always
  type: str
  sample: "interface mismatch: socket interface eth9 does not exist here (eth0 holds 10.0.0.12)"
error:
  description: The error text behind the cause.
  returned: always
  type: str
joined:
  description: On the head, the nodes that reached the rendezvous, in rank order.
  returned: on the head (rank 0) once its store is up
  type: list
  elements: str
  sample: [gpu-master, gpu-worker-1]
joined_store:
  description: Whether this node registered in the head's store.
  returned: always
  type: bool
sum:
  description: The all-reduced value this node got.
  returned: when the group formed
  type: float
  sample: 6.0
expected:
  description: n(n+1)/2 for a world of n ranks.
  returned: when the group formed
  type: float
  sample: 6.0
rank:
  description: The first rank of this node.
  returned: always
  type: int
slots:
  description: Ranks this node ran.
  returned: always
  type: int
  sample: 2
world_size:
  description: Ranks in the group (the sum of the slots).
  returned: always
  type: int
  sample: 5
backend:
  description: The backend used.
  returned: always
  type: str
rendezvous:
  description: C(master_addr:master_port).
  returned: always
  type: str
socket_ifname:
  description: The socket interface in effect, if any.
  returned: always
  type: str
output:
  description: Last lines of the script's output when it failed.
  returned: when the script failed
  type: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults
from ansible_collections.gpucluster.multinode.plugins.module_utils import smoke


def main():
    module = AnsibleModule(
        argument_spec=dict(
            node=dict(type='str', required=True),
            nodes=dict(type='list', elements='str', required=True),
            slots=dict(type='list', elements='int'),
            address=dict(type='str'),
            master_addr=dict(type='str', required=True),
            master_port=dict(type='int', default=cluster_defaults.MASTER_PORT),
            backend=dict(type='str', default='gloo', choices=['gloo', 'nccl']),
            python=dict(type='path', default=cluster_defaults.ENV_PATH + '/bin/python'),
            script=dict(type='path', required=True),
            timeout=dict(type='int', default=120),
            socket_ifname=dict(type='str', default=''),
            env_files=dict(type='list', elements='path', default=[cluster_defaults.NCCL_PROFILE]),
            env=dict(type='dict', default={}),
        ),
        supports_check_mode=True,
    )
    try:
        result = smoke.run(module, module.params)
    except smoke.SmokeError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
