#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: bandwidth
short_description: One node's part of a network bandwidth test (iperf3 over TCP, ib_write_bw over RDMA)
version_added: "0.1.0"
description:
  - A bandwidth test between two nodes needs a server on one and a client on the other; a
    matrix over many nodes needs rounds of such pairs. This module is one node's part; the
    C(bandwidth.yml) task file of the P(gpucluster.multinode.cluster_tests#role) role runs
    the rounds (disjoint pairs at the same time) and builds the matrix with the
    P(gpucluster.multinode.bandwidth_report#filter) filter.
  - O(state=check) reports whether this node can take part (the tool installed, the port
    free, the RDMA devices it has) and changes nothing. Problems are returned in RV(problems),
    one line each naming the node, so a play can report every node at once.
  - O(state=server) starts a server bound to O(bind) on O(port) in its own process group,
    limited to O(server_lifetime) seconds even if nobody stops it, and waits until it listens.
  - O(state=client) measures against the server at O(server). With iperf3, O(streams)
    parallel streams for O(duration) seconds from this node to the server, then (with
    O(both_directions)) from the server to this node (C(-R)); with ib_write_bw, one run on
    O(device). A test that fails (refused, timed out) is a result with an C(error) in RV(results),
    not a module failure.
  - O(state=schedule) runs this node's part of every round of O(rounds) in one run. The node
    measures as the client of its pair in each round, or serves its pair's client with one-off
    iperf3 servers (one per direction), in round order. A pair starts as soon as both its nodes
    are free. A round never waits for its slowest pair, and Ansible starts one task for the
    whole matrix instead of one per round. Round i uses port O(port) + i. Each part waits for
    its partner at most O(server_wait) seconds (0 means long enough for every round before
    it), then records an error and the node goes on.
  - O(state=stopped) stops the server this module started on O(port) and removes its pid
    file; it is safe to run when none runs. The pid file records the server's identity (pid,
    start time, owner, job id); a pid file that no longer names that very process (the server
    ended and the pid was reused) is removed without signalling anything.
  - Nothing is left behind; the module reports C(changed=false) in every state.
options:
  state:
    description: This node's part.
    type: str
    choices: [check, server, client, schedule, stopped]
    required: true
  node:
    description: Name of this node (the inventory name), used in messages and results.
    type: str
    required: true
  tool:
    description: C(iperf3) (TCP) or C(ib_write_bw) (perftest, RDMA).
    type: str
    choices: [iperf3, ib_write_bw]
    default: iperf3
  port:
    description: TCP port of the server (iperf3 data and control; perftest's exchange port).
    type: int
    default: 5201
  bind:
    description: Address the server listens on (its cluster address). Required with O(state=server) and iperf3.
    type: str
  server:
    description: Address of the server node. Required with O(state=client).
    type: str
  peer:
    description: Name of the server node, used in results. Required with O(state=client).
    type: str
  streams:
    description: Parallel TCP streams of iperf3 (C(-P)); ib_write_bw queue pairs (C(-q)).
    type: int
    default: 4
  duration:
    description: Seconds each direction is measured (C(-t) of iperf3, C(-D) of ib_write_bw).
    type: int
    default: 5
  both_directions:
    description: With iperf3, also measure from the server to this node (C(-R)).
    type: bool
    default: true
  device:
    description: RDMA device (HCA) for ib_write_bw, e.g. C(mlx5_0). Required with ib_write_bw in O(state=server) and O(state=client).
    type: str
  rdma:
    description:
      - With O(state=check), what to do about RDMA devices. C(auto) checks perftest only where
        C(/sys/class/infiniband) lists devices; C(required) makes a node without devices a
        problem; C(never) ignores them.
    type: str
    choices: [auto, required, never]
    default: auto
  server_lifetime:
    description: Seconds after which a started server ends on its own, stopped or not.
    type: int
    default: 300
  connect_timeout:
    description: Seconds the client waits for the server to answer.
    type: int
    default: 5
  server_wait:
    description:
      - Seconds the client tries again while the server refuses the connection (it is not
        listening yet), so a round can start its servers and clients in one task; 0 fails at
        once.
    type: int
    default: 0
  omit:
    description: Seconds of warm-up iperf3 leaves out of the result (C(-O)), on top of O(duration).
    type: int
    default: 0
  rounds:
    description:
      - With O(state=schedule), the rounds of the matrix, each a list of disjoint pairs
        C({client, server, server_address}) (the P(gpucluster.multinode.bandwidth_plan#filter)
        filter's C(rounds)). Every node of the schedule gets the same list.
    type: list
    elements: list
    default: []
  port_count:
    description: With O(state=check), how many ports from O(port) on must be free (a schedule of N rounds uses N).
    type: int
    default: 1
  run_dir:
    description: Directory under which each started server gets a private state directory (pid file, exit code, log).
    type: path
    default: /run/gpucluster
notes:
  - Servers and clients of one round run at the same time because Ansible runs a task on all
    hosts of a play at once (up to C(forks)); keep C(forks) at least the number of nodes.
extends_documentation_fragment: [gpucluster.multinode.attributes.posix, gpucluster.multinode.attributes.no_diff]
attributes:
  check_mode:
    support: full
    description: C(check) runs as usual; C(server) and C(client) start nothing and return no result; C(stopped) stops nothing.
seealso:
  - plugin: gpucluster.multinode.bandwidth_report
    plugin_type: filter
author: gpucluster.multinode contributors (!UNKNOWN)
'''

EXAMPLES = r'''
- name: Can this node take part?
  gpucluster.multinode.bandwidth:
    state: check
    node: "{{ inventory_hostname }}"
  register: bw_check

- name: A pair by hand, always stopping the server
  block:
    - name: Start the server on the worker
      gpucluster.multinode.bandwidth:
        state: server
        node: "{{ inventory_hostname }}"
        bind: "{{ cluster_address }}"
      when: inventory_hostname == 'gpu-worker-1'

    - name: Measure from the head
      gpucluster.multinode.bandwidth:
        state: client
        node: "{{ inventory_hostname }}"
        server: "{{ hostvars['gpu-worker-1'].cluster_address }}"
        peer: gpu-worker-1
        streams: 4
        duration: 10
      register: bw
      when: inventory_hostname == 'gpu-master'
  always:
    - name: Stop the server
      gpucluster.multinode.bandwidth:
        state: stopped
        node: "{{ inventory_hostname }}"
      when: inventory_hostname == 'gpu-worker-1'

- name: Every pair of three nodes, one task on all of them (round i on port 5201 + i)
  gpucluster.multinode.bandwidth:
    state: schedule
    node: "{{ inventory_hostname }}"
    port: 5201
    duration: 5
    omit: 1
    rounds:
      - [{client: gpu-master, server: gpu-worker-1, server_address: 10.0.0.11}]
      - [{client: gpu-worker-2, server: gpu-master, server_address: 10.0.0.10}]
      - [{client: gpu-worker-1, server: gpu-worker-2, server_address: 10.0.0.12}]
  register: bw_all
'''

RETURN = r'''
problems:
  description: With O(state=check), why this node cannot take part, one line each naming the node; empty when it can.
  returned: state is check
  type: list
  elements: str
  sample: ["host gpu-worker-2: iperf3 is not installed (install the package iperf3)"]
tool_version:
  description: First line of C(iperf3 --version).
  returned: state is check and iperf3 is installed
  type: str
  sample: iperf 3.12 (cJSON 1.7.15)
rdma_devices:
  description: RDMA devices of the node (names in C(/sys/class/infiniband)).
  returned: state is check
  type: list
  elements: str
  sample: [mlx5_0, mlx5_1]
perftest:
  description: Whether ib_write_bw is installed.
  returned: state is check
  type: bool
pid:
  description: Process id of the server started.
  returned: state is server and not in check mode
  type: int
results:
  description:
    - With O(state=client), one result per direction measured. C(client) is the sender and
      C(server) the receiver (so the C(-R) run has them swapped), C(gbps) the rate that arrived,
      in Gbit/s.
  returned: state is client or schedule
  type: list
  elements: dict
  sample:
    - {client: gpu-master, server: gpu-worker-1, gbps: 9.41, tool: iperf3, streams: 4, retransmits: 0, error: null}
    - {client: gpu-worker-1, server: gpu-master, gbps: 9.38, tool: iperf3, streams: 4, retransmits: 12, error: null}
parts:
  description: With O(state=schedule), this node's parts in round order (round from 0, role, peer, seconds, error).
  returned: state is schedule
  type: list
  elements: dict
  sample: [{round: 0, role: client, peer: gpu-worker-1, address: 10.0.0.11, seconds: 12.4, error: null}]
stopped:
  description: With O(state=stopped), the pids stopped (empty when no server ran).
  returned: state is stopped
  type: list
  elements: int
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpucluster.multinode.plugins.module_utils import bandwidth
from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type='str', required=True, choices=['check', 'server', 'client', 'schedule', 'stopped']),
            node=dict(type='str', required=True),
            tool=dict(type='str', default='iperf3', choices=['iperf3', 'ib_write_bw']),
            port=dict(type='int', default=cluster_defaults.BANDWIDTH_PORT),
            bind=dict(type='str'),
            server=dict(type='str'),
            peer=dict(type='str'),
            streams=dict(type='int', default=4),
            duration=dict(type='int', default=5),
            both_directions=dict(type='bool', default=True),
            device=dict(type='str'),
            rdma=dict(type='str', default='auto', choices=['auto', 'required', 'never']),
            server_lifetime=dict(type='int', default=300),
            connect_timeout=dict(type='int', default=5),
            server_wait=dict(type='int', default=0),
            omit=dict(type='int', default=0),
            run_dir=dict(type='path', default='/run/gpucluster'),
            rounds=dict(type='list', elements='list', default=[]),
            port_count=dict(type='int', default=1),
        ),
        supports_check_mode=True,
    )
    params = module.params
    node = params['node']
    for key, low, high in (('port', 1, 65535), ('streams', 1, 128), ('duration', 1, 3600),
                           ('server_lifetime', 10, 86400), ('connect_timeout', 1, 600), ('server_wait', 0, 600),
                           ('omit', 0, 60), ('port_count', 1, 1024)):
        if not low <= params[key] <= high:
            module.fail_json(msg='host %s: %s must be from %d to %d, got %d' % (node, key, low, high, params[key]))
    last = params['port'] + max(params['port_count'], len(params['rounds'])) - 1
    if last > 65535:
        module.fail_json(msg='host %s: the ports from %d on for %d round(s) go past 65535' % (
            node, params['port'], max(params['port_count'], len(params['rounds']))))
    state = params['state']
    try:
        if state == 'check':
            out = bandwidth.check(module, params)
        elif state == 'server':
            out = bandwidth.server(module, params)
        elif state == 'client':
            out = bandwidth.client(module, params)
        elif state == 'schedule':
            out = bandwidth.run_schedule(module, params)
        else:
            out = {'stopped': [] if module.check_mode else bandwidth.stop(params)}
    except bandwidth.BandwidthError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **out)


if __name__ == '__main__':
    main()
