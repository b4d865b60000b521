#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: nccl_test
short_description: Collective bandwidth test with nccl-tests, or a torch.distributed all-reduce benchmark
version_added: "0.1.0"
description:
  - O(method=nccl_tests) runs an nccl-tests binary (C(all_reduce_perf) and friends) from the
    node it runs on (run it once, on the head); on one node with C(-g) GPUs, on several
    through C(mpirun) with one rank per slot. The table is read by its column header (the
    columns differ across versions), with the C(Out of bounds values) and
    C(Avg bus bandwidth) lines.
  - O(method=torch) is one node's part of the built-in all-reduce benchmark; every node runs
    it at the same time (start it with C(async)); each starts C(torchrun) with its node rank,
    the head holds the rendezvous. C(nccl) on GPUs, C(gloo) on CPUs. For each size it reports
    time, algbw and busbw by the nccl-tests formulas (algbw = size / time, busbw = algbw x
    2(n-1)/n) and checks that the reduced values are right. Rows are returned by the head.
  - O(probe=true) only reports what this node has (nccl-tests binary, mpirun, the Python
    environment) so a play can choose the method for all nodes.
  - A size whose busbw is under its threshold (O(thresholds)) is listed in
    RV(below_threshold) and makes RV(ok) false; the module itself fails only on bad input, a
    missing tool or a port in use.
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
        description: Ranks on the node (GPUs; 1 on a CPU node).
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
    description: Path of C(allreduce_bench.py) on the node (method torch).
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
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: gpucluster.multinode.net_bandwidth
author:
  - gpucluster.multinode contributors
extends_documentation_fragment: [gpucluster.multinode.launch_env]
'''

EXAMPLES = r'''
- name: nccl-tests all_reduce_perf on the 8 GPUs of one node
  gpucluster.multinode.nccl_test:
    method: nccl_tests
    node: gpu-node01
    nodes: [{name: gpu-node01, address: 10.0.0.1, slots: 8}]
    sizes: [8M, 16M, 32M, 64M, 128M, 256M, 512M, 1G]
    thresholds: {1G: 150}
  register: nccl

- name: The torch all-reduce benchmark on every node (see roles/cluster_tests/tasks/collective.yml)
  gpucluster.multinode.nccl_test:
    method: torch
    node: "{{ inventory_hostname }}"
    nodes: "{{ groups | gpucluster.multinode.cluster_job_nodes(hostvars) }}"
    script: /var/tmp/gpucluster/cluster_tests/allreduce_bench.py
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
  description: Sizes whose busbw is under their threshold.
  returned: on the reporter
  type: list
  elements: dict
  sample: [{size: 67108864, busbw_gbs: 0.9, threshold_gbs: 2.0}]
ok:
  description: The test ran, the values are right and no size is under its threshold.
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

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_tests as ct
from ansible_collections.gpucluster.multinode.plugins.module_utils import nccl_tests as nt

PREFIX = 'GPUCLUSTER_ALLREDUCE '


def _binary(module, p):
    name = '%s_perf' % nt.collective_name(p['collective'])
    if p['nccl_tests_dir']:
        path = os.path.join(p['nccl_tests_dir'], name)
        return path if os.access(path, os.X_OK) else None
    return module.get_bin_path(name)


def _torchrun(p):
    path = os.path.join(p['env_path'], 'bin', 'torchrun')
    return path if os.access(path, os.X_OK) else None


def _mpirun(module, p):
    if p['mpirun']:
        return p['mpirun'] if os.access(p['mpirun'], os.X_OK) else None
    return module.get_bin_path('mpirun')


def _finish(module, p, rows, world, nnodes, algorithm, backend, thresholds, extra):
    below = ct.collective_report(rows, thresholds)
    correct = all(not r.get('wrong') for r in rows) and not extra.pop('oob_bad', False)
    out = dict(changed=False, method=p['method'], reporter=True, algorithm=algorithm, backend=backend,
               world_size=world, nnodes=nnodes, rows=rows, correct=correct,
               max_busbw_gbs=rows[-1].get('busbw_gbs') if rows else None,
               below_threshold=below, ok=bool(rows) and correct and not below)
    busbws = [r['busbw_gbs'] for r in rows if isinstance(r.get('busbw_gbs'), (int, float))]
    out['avg_busbw_gbs'] = sum(busbws) / len(busbws) if busbws else None
    out.update(extra)
    module.exit_json(**out)


def run_nccl_tests(module, p, sizes, thresholds, env):
    node = p['node']
    binary = _binary(module, p)
    name = '%s_perf' % nt.collective_name(p['collective'])
    if not binary:
        module.fail_json(msg='host %s: %s not found (%s); build nccl-tests or use method torch'
                         % (node, name, p['nccl_tests_dir'] or 'on PATH'))
    factor = sizes[1] // sizes[0] if len(sizes) > 1 and sizes[1] % sizes[0] == 0 else 2
    args = ['-b', str(sizes[0]), '-e', str(sizes[-1]), '-f', str(max(2, factor)),
            '-n', str(p['iterations']), '-w', str(p['warmup']), '-c', '1']
    nodes = p['nodes']
    if len(nodes) == 1:
        command = [binary] + args + ['-g', str(nodes[0]['slots'])]
        world = nodes[0]['slots']
    else:
        mpirun = _mpirun(module, p)
        if not mpirun:
            module.fail_json(msg='host %s: mpirun not found; multi-node nccl-tests runs through Open MPI '
                             '(install openmpi-bin, or use method torch)' % node)
        world = sum(n['slots'] for n in nodes)
        command = [mpirun, '-np', str(world), '-H', ','.join('%s:%d' % (n['address'], n['slots']) for n in nodes),
                   '--bind-to', 'none']
        for key in sorted(env):
            if key.startswith('NCCL_') or key in p['env']:
                command += ['-x', key]  # Open MPI forwards these to every rank
        command += [binary] + args + ['-g', '1']
    if module.check_mode:
        module.exit_json(changed=False, method='nccl_tests', reporter=True, ok=True, rows=[], command=command)
    timeout = module.get_bin_path('timeout')
    full = ([timeout, '-k', '10', str(p['timeout'])] if timeout else []) + command
    rc, out, err = module.run_command(full, environ_update=env)
    try:
        parsed = nt.parse_nccl_tests(out, nranks=world, collective=p['collective'])
    except ValueError as exc:
        module.exit_json(changed=False, method='nccl_tests', reporter=True, ok=False, rows=[], command=command,
                         error='%s (exit %d)' % (exc, rc), output=ct.tail(out + '\n' + err))
    rows = []
    for r in parsed['rows']:
        part = r.get('out_of_place') or {}
        wrong = sum(int(r[g].get('wrong') or 0) for g in ('out_of_place', 'in_place') if isinstance(r.get(g), dict)
                    and isinstance(r[g].get('wrong'), int))
        rows.append({'size': r['size'], 'count': r.get('count'), 'type': r.get('type'), 'redop': r.get('redop'),
                     'time_us': part.get('time_us'), 'algbw_gbs': part.get('algbw_gbs'),
                     'busbw_gbs': part.get('busbw_gbs'), 'wrong': wrong,
                     'in_place': r.get('in_place')})
    oob = parsed.get('out_of_bounds')
    extra = {'oob_bad': bool(oob and not oob['ok']), 'out_of_bounds': oob, 'command': command,
             'nccl_tests_avg_busbw_gbs': parsed.get('avg_busbw_gbs'), 'hosts': parsed.get('hosts'),
             'output': ct.tail(out, 40)}
    if rc != 0:
        extra['error'] = 'exit %d' % rc
    _finish(module, p, rows, parsed.get('nranks') or world, len(nodes), 'nccl-tests %s' % name, 'nccl',
            thresholds, extra)


def run_torch(module, p, sizes, thresholds, env):
    node, nodes = p['node'], p['nodes']
    names = [n['name'] for n in nodes]
    if nt.collective_name(p['collective']) != 'all_reduce':
        module.fail_json(msg='host %s: collective %s: the torch benchmark does all_reduce only '
                         '(nccl-tests does the others)' % (node, p['collective']))
    rank = names.index(node)
    if module.check_mode:
        # the environment and the script may come with this same run
        module.exit_json(changed=False, method='torch', reporter=rank == 0, ok=True, rows=[])
    torchrun = _torchrun(p)
    if not torchrun:
        module.fail_json(msg='host %s: %s/bin/torchrun not found; install torch (the python_env role) or set env_path'
                         % (node, p['env_path']))
    if not p['script'] or not os.path.isfile(p['script']):
        module.fail_json(msg='host %s: script %s does not exist (copied by roles/cluster_tests/tasks/collective.yml)'
                         % (node, p['script']))
    head = nodes[0]
    slots = nodes[rank]['slots']
    if rank == 0:
        users = ct.port_users(_ss(module), p['master_port'])
        if users:
            module.fail_json(msg='host %s: port %d (the rendezvous port, master_port) is already in use by %s'
                             % (node, p['master_port'], ct.describe_users(users)))
    if any(n['slots'] != slots for n in nodes):
        module.fail_json(msg='host %s: torchrun starts the same number of ranks on every node; slots differ (%s)'
                         % (node, ', '.join('%s: %d' % (n['name'], n['slots']) for n in nodes)))
    command = [torchrun, '--nnodes', str(len(nodes)), '--nproc-per-node', str(slots), '--node-rank', str(rank),
               '--master-addr', head['address'], '--master-port', str(p['master_port']), '--max-restarts', '0',
               p['script'], '--sizes', ','.join(str(s) for s in sizes), '--iters', str(p['iterations']),
               '--warmup', str(p['warmup']), '--backend', p['backend'], '--timeout', str(p['timeout'])]
    timeout = module.get_bin_path('timeout')
    full = ([timeout, '-k', '10', str(p['timeout'])] if timeout else []) + command
    rc, out, err = module.run_command(full, environ_update=env)
    found = ct.json_lines(out, PREFIX)
    if rc != 0 or (rank == 0 and not any(f.get('kind') == 'end' for f in found)):
        module.exit_json(changed=False, method='torch', reporter=rank == 0, ok=False, rows=[], command=command,
                         error='torchrun on %s exited %d%s' % (node, rc, ' (timed out after %d s)' % p['timeout']
                                                               if rc in (124, 137) else ''),
                         output=ct.tail(out + '\n' + err, 25))
    if rank != 0:
        module.exit_json(changed=False, method='torch', reporter=False, ok=True, rows=[], command=command)
    start = next(f for f in found if f.get('kind') == 'start')
    raw = [f for f in found if f.get('kind') == 'row']
    rows = ct.allreduce_rows(raw, start['world_size'])
    _finish(module, p, rows, start['world_size'], start['nnodes'],
            'torch.distributed all_reduce (%s)' % start['backend'], start['backend'], thresholds,
            {'torch': start.get('torch'), 'device': start.get('device'), 'command': command,
             'output': ct.tail(err, 5)})


def _ss(module):
    ss = module.get_bin_path('ss')
    if not ss:
        return ''
    rc, out, _ = module.run_command([ss, '-Hltnp'])
    return out if rc == 0 else ''


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
            master_port=dict(type='int', default=29500),
            backend=dict(type='str', default='auto', choices=['auto', 'nccl', 'gloo']),
            env_path=dict(type='path', default='/opt/gpucluster/env'),
            script=dict(type='path'),
            nccl_tests_dir=dict(type='path'),
            mpirun=dict(type='path'),
            timeout=dict(type='int', default=600),
            env_files=dict(type='list', elements='path', default=['/etc/profile.d/gpucluster-nccl.sh']),
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
        if not 1 <= n['slots'] <= 1024:
            module.fail_json(msg='host %s: slots of node %s must be from 1 to 1024, got %d' % (node, n['name'], n['slots']))
    for key, low, high in (('iterations', 1, 100000), ('warmup', 0, 100000), ('master_port', 1, 65535),
                           ('timeout', 10, 86400)):
        if not low <= p[key] <= high:
            module.fail_json(msg='host %s: %s must be from %d to %d, got %d' % (node, key, low, high, p[key]))
    try:
        sizes = ct.check_sizes(p['sizes'], 'sizes', multiple_of=4)
        thresholds = ct.check_thresholds(p['thresholds'], sizes)
    except ct.ClusterTestError as exc:
        module.fail_json(msg='host %s: %s' % (node, exc))

    if p['probe']:
        module.exit_json(changed=False, method=p['method'], reporter=False, ok=True, found={
            'nccl_tests': _binary(module, p), 'mpirun': _mpirun(module, p), 'torchrun': _torchrun(p)})
    env = ct.node_environment(module, p['env_files'], p['env'])
    if p['method'] == 'nccl_tests':
        run_nccl_tests(module, p, sizes, thresholds, env)
    run_torch(module, p, sizes, thresholds, env)


if __name__ == '__main__':
    main()
