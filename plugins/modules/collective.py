#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: collective
short_description: Collective bandwidth test with nccl-tests, or a torch.distributed all-reduce benchmark
version_added: "0.1.0"
description:
  - O(method=nccl_tests) runs an nccl-tests binary (C(all_reduce_perf) and friends) from the
    node it runs on (run it once, on the head); on one node with C(-g) GPUs, on several
    through C(mpirun) with one rank per slot, each node with its own slots (an Open MPI
    hostfile written by the collection's one hostfile renderer). The table is read by its column header (the
    columns differ across versions), with the C(Out of bounds values) and
    C(Avg bus bandwidth) lines.
  - O(method=torch) is one node's part of the built-in all-reduce benchmark; every node runs
    it at the same time (start it with C(async)); each starts C(torchrun) with its own
    slots as C(--nproc-per-node) (nodes may differ), the head (node rank 0) holds the
    rendezvous; the world size is the sum of the slots. C(nccl) on GPUs, C(gloo) on CPUs. For each size it reports
    time, algbw and busbw by the nccl-tests formulas (algbw = size / time, busbw = algbw x
    2(n-1)/n) and checks that the reduced values are right. Rows are returned by the head.
  - O(probe=true) only reports what this node has (nccl-tests binary, mpirun, the Python
    environment) so a play can choose the method for all nodes.
  - RV(ok) is true only when the test exited 0, every size of O(sizes) is in the table
    (RV(missing_sizes) lists those that are not, e.g. after a timeout, exit 124), every
    reduced value is right and no size is under its threshold (O(thresholds); a size never
    reached counts as under it, RV(below_threshold)). The module itself fails only on bad
    input, a missing tool or a port in use.
options:
  method:
    description: C(nccl_tests) or C(torch).
    type: str
    choices: [nccl_tests, torch]
    default: torch
  probe:
    description: Only report what this node has; run nothing.
    type: bool
    default: false
  collective:
    description: Collective to test. The torch benchmark does C(all_reduce) only.
    type: str
    default: all_reduce
  sizes:
    description:
      - Message sizes in bytes, increasing (C(1048576) or C(1M); K, M, G are powers of 1024).
        nccl-tests gets the smallest and largest (C(-b), C(-e)) and the factor between the first two (C(-f)).
    type: list
    elements: raw
    default: [1M, 16M, 64M]
  iterations:
    description: Timed iterations per size (C(-n) of nccl-tests).
    type: int
    default: 5
  warmup:
    description: Untimed iterations per size first (C(-w) of nccl-tests).
    type: int
    default: 2
  thresholds:
    description: "Minimum busbw in GB/s per size, e.g. C({64M: 10.0}); each key must be one of O(sizes)."
    type: dict
    default: {}
  node:
    description: Name of this node; one of O(nodes).
    type: str
    required: true
  nodes:
    description: The nodes, head first, with their slots (ranks per node).
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Inventory name.
        type: str
        required: true
      address:
        description: Cluster address.
        type: str
        required: true
      slots:
        description: Ranks on the node, its C(node_slots) (its GPUs, else 1 on a CPU node).
        type: int
        default: 1
  master_port:
    description: Rendezvous port of torchrun on the head.
    type: int
    default: 29500
  backend:
    description: Backend of the torch benchmark; C(auto) is C(nccl) where CUDA is available, else C(gloo).
    type: str
    choices: [auto, nccl, gloo]
    default: auto
  env_path:
    description: Prefix of the Python environment with torch (its C(bin/torchrun) starts the benchmark).
    type: path
    default: /opt/gpucluster/env
  script:
    description: Path of C(collective.py) on the node (method torch).
    type: path
  nccl_tests_dir:
    description: Directory of the nccl-tests binaries; empty for the one found on C(PATH).
    type: path
  mpirun:
    description: mpirun for multi-node nccl-tests; empty for the one found on C(PATH).
    type: path
  timeout:
    description: Seconds the whole test may take.
    type: int
    default: 600
  env:
    description: Extra environment variables (they win); passed to every rank.
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
    description: Checks the input (and with nccl-tests the binary); runs no test and returns no rows.
seealso:
  - module: gpucluster.multinode.bandwidth
author: gpucluster.multinode contributors (!UNKNOWN)
extends_documentation_fragment: [gpucluster.multinode.launch_env, gpucluster.multinode.attributes.posix, gpucluster.multinode.attributes.no_diff]
'''

EXAMPLES = r'''
- name: nccl-tests all_reduce_perf on the 8 GPUs of one node
  gpucluster.multinode.collective:
    method: nccl_tests
    node: gpu-node01
    nodes: [{name: gpu-node01, address: 10.0.0.1, slots: 8}]
    sizes: [8M, 16M, 32M, 64M, 128M, 256M, 512M, 1G]
    thresholds: {1G: 150}
  register: nccl

- name: The torch all-reduce benchmark on every node (see roles/cluster_tests/tasks/collective.yml)
  gpucluster.multinode.collective:
    method: torch
    node: "{{ inventory_hostname }}"
    nodes: "{{ groups | gpucluster.multinode.cluster_job_nodes(hostvars) }}"
    script: /var/tmp/gpucluster/cluster_tests/collective.py
    sizes: [64K, 1M, 16M]
  async: 900
  poll: 0
  register: bench_job
'''

RETURN = r'''
method:
  description: The method run (C(nccl_tests) or C(torch)).
  returned: always
  type: str
algorithm:
  description: What measured, e.g. C(nccl-tests all_reduce_perf) or C(torch.distributed all_reduce (gloo)).
  returned: when a test ran
  type: str
  sample: torch.distributed all_reduce (gloo)
backend:
  description: C(nccl) or C(gloo).
  returned: when a test ran
  type: str
reporter:
  description: Whether this node's result holds the rows (the head with the torch method, always with nccl-tests).
  returned: always
  type: bool
world_size:
  description: Ranks in the test.
  returned: when a test ran
  type: int
  sample: 3
nnodes:
  description: Nodes in the test.
  returned: when a test ran
  type: int
ranks:
  description: Where the ranks ran, node by node (ranks are numbered in this order).
  returned: when a test ran
  type: list
  elements: dict
  sample: [{node: alpha, slots: 2, first_rank: 0}, {node: bravo-2, slots: 1, first_rank: 2}]
missing_sizes:
  description: Sizes of O(sizes) that have no row (the test ended before it reached them).
  returned: on the reporter
  type: list
  elements: int
  sample: [16777216]
rows:
  description:
    - One row per size. C(time_us) is the mean time of one collective (the slowest rank), C(algbw_gbs) and
      C(busbw_gbs) in GB/s (10^9 bytes per second), C(wrong) the elements found wrong after the check.
  returned: on the reporter
  type: list
  elements: dict
  sample: [{size: 1048576, count: 262144, time_us: 5321.4, algbw_gbs: 0.197, busbw_gbs: 0.263, wrong: 0}]
correct:
  description: Whether every reduced value was right (no wrong element, no out-of-bounds value).
  returned: on the reporter
  type: bool
avg_busbw_gbs:
  description: Mean busbw over the sizes (as the C(Avg bus bandwidth) line of nccl-tests).
  returned: on the reporter
  type: float
max_busbw_gbs:
  description: busbw at the largest size.
  returned: on the reporter
  type: float
below_threshold:
  description: Sizes whose busbw is under their threshold, or that have a threshold and no row (busbw null).
  returned: on the reporter
  type: list
  elements: dict
  sample: [{size: 67108864, busbw_gbs: 0.9, threshold_gbs: 2.0}]
ok:
  description: The test exited 0, every size is there, the values are right and no size is under its threshold.
  returned: always
  type: bool
error:
  description: Why the test did not run through.
  returned: when it failed
  type: str
output:
  description: Last lines of the output.
  returned: when a test ran
  type: str
found:
  description: With O(probe=true), what the node has.
  returned: with probe
  type: dict
  sample: {nccl_tests: null, mpirun: null, torchrun: /opt/gpucluster/env/bin/torchrun}
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults
from ansible_collections.gpucluster.multinode.plugins.module_utils import collective
from ansible_collections.gpucluster.multinode.plugins.module_utils import nccl_tests_output as nt
from ansible_collections.gpucluster.multinode.plugins.module_utils.cluster_test_inputs import (
    ClusterTestError,
    check_sizes,
    check_thresholds,
)
from ansible_collections.gpucluster.multinode.plugins.module_utils.node_commands import node_environment


def main():
    module = AnsibleModule(
        argument_spec=dict(
            method=dict(type='str', default='torch', choices=['nccl_tests', 'torch']),
            probe=dict(type='bool', default=False),
            collective=dict(type='str', default='all_reduce'),
            sizes=dict(type='list', elements='raw', default=['1M', '16M', '64M']),
            iterations=dict(type='int', default=5),
            warmup=dict(type='int', default=2),
            thresholds=dict(type='dict', default={}),
            node=dict(type='str', required=True),
            nodes=dict(type='list', elements='dict', required=True, options=dict(
                name=dict(type='str', required=True),
                address=dict(type='str', required=True),
                slots=dict(type='int', default=1),
            )),
            master_port=dict(type='int', default=cluster_defaults.MASTER_PORT),
            backend=dict(type='str', default='auto', choices=['auto', 'nccl', 'gloo']),
            env_path=dict(type='path', default=cluster_defaults.ENV_PATH),
            script=dict(type='path'),
            nccl_tests_dir=dict(type='path'),
            mpirun=dict(type='path'),
            timeout=dict(type='int', default=600),
            env_files=dict(type='list', elements='path', default=[cluster_defaults.NCCL_PROFILE]),
            env=dict(type='dict', default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    node = p['node']
    names = [n['name'] for n in p['nodes']]
    if node not in names:
        module.fail_json(msg='host %s: node %s is not in nodes (%s)' % (node, node, ', '.join(names)))
    if nt.collective_name(p['collective']) not in nt.COLLECTIVES:
        module.fail_json(msg='host %s: collective %s is not one of %s' % (node, p['collective'], ', '.join(nt.COLLECTIVES)))
    for n in p['nodes']:
        if not 1 <= n['slots'] <= cluster_defaults.MAX_SLOTS:
            module.fail_json(msg='host %s: slots of node %s must be from 1 to %d, got %d'
                                 % (node, n['name'], cluster_defaults.MAX_SLOTS, n['slots']))
    for key, low, high in (('iterations', 1, 100000), ('warmup', 0, 100000), ('master_port', 1, 65535),
                           ('timeout', 10, 86400)):
        if not low <= p[key] <= high:
            module.fail_json(msg='host %s: %s must be from %d to %d, got %d' % (node, key, low, high, p[key]))
    try:
        sizes = check_sizes(p['sizes'], 'sizes', multiple_of=4)
        thresholds = check_thresholds(p['thresholds'], sizes)
    except ClusterTestError as exc:
        module.fail_json(msg='host %s: %s' % (node, exc))

    if p['probe']:
        module.exit_json(changed=False, method=p['method'], reporter=False, ok=True,
                         found=collective.probe(module, p))
    env = node_environment(module, p['env_files'], p['env'])
    run = collective.run_nccl_tests if p['method'] == 'nccl_tests' else collective.run_torch
    try:
        module.exit_json(**run(module, p, sizes, thresholds, env))
    except collective.CollectiveError as exc:
        module.fail_json(msg=str(exc))


if __name__ == '__main__':
    main()
