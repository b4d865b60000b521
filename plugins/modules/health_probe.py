#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: health_probe
short_description: Read, in one pass, what the quick health tier needs from a node
description:
  - Reads the node's interfaces (name, MTU, addresses), the NCCL/gloo interface settings of a
    profile script, how the cluster's names resolve here, a TCP connection to the rendezvous
    port on the head, shared storage (mounted, writable, the head's marker file, and the clock
    offset against the storage server from the modification time the server gives a fresh file),
    free space and inodes, the kernel release, the versions of torch, DeepSpeed and NCCL in a
    Python environment (from the installed distributions, without importing them), NVIDIA
    Xid events in the kernel log and, with O(gpus), the GPUs as M(gpucluster.multinode.gpu_facts)
    reads them (so a node is contacted once for the whole quick tier).
  - On the head, O(listen_port) checks whether the rendezvous port is free, names the processes
    holding it, and otherwise holds it open for O(listen_seconds) in a detached child, so that the
    other nodes can test the path to it; O(shared_token_write) writes the marker file.
  - Everything is reported, nothing fails. A missing file or a refused connection is a finding,
    judged by the health playbook; the module fails only on invalid arguments.
version_added: 0.1.0
author: gpucluster.multinode contributors (!UNKNOWN)
extends_documentation_fragment: [gpucluster.multinode.attributes.no_diff]
options:
  nccl_env_file:
    description: Profile script with C(NCCL_SOCKET_IFNAME)/C(GLOO_SOCKET_IFNAME) (written by the nccl_env role).
    type: path
    default: /etc/profile.d/gpucluster-nccl.sh
  resolve:
    description: Names to resolve here, each with the cluster address it must resolve to.
    type: list
    elements: dict
    default: []
  connect_host:
    description: Address of the head to connect to (the master address); empty skips the test.
    type: str
    default: ""
  connect_port:
    description: Rendezvous port on the head.
    type: int
    default: 29500
  connect_timeout:
    description: Seconds a connection may take; no answer by then is reported as a timeout.
    type: float
    default: 3.0
  listen_port:
    description: On the head, the rendezvous port to check and hold open; 0 skips it.
    type: int
    default: 0
  listen_seconds:
    description: How long the detached listener keeps the port open at most.
    type: int
    default: 60
  listen_expect:
    description: The listener exits once it has accepted this many connections (0 means wait the whole time).
    type: int
    default: 0
  release_port:
    description: Tell the listener this module left on this port to exit (on the head, after the other nodes connected); 0 skips it.
    type: int
    default: 0
  shared_path:
    description: Shared storage mount point; empty skips the shared storage and clock checks.
    type: path
  shared_must_be_mount:
    description: Report O(shared_path) as a problem when it is not a mount point of its own.
    type: bool
    default: true
  shared_token:
    description: Content of the head's marker file for this run.
    type: str
    default: ""
  shared_token_write:
    description: Write the marker file (on the head) instead of reading it.
    type: bool
    default: false
  disk_paths:
    description: Paths whose file system's free space and inodes are measured (missing ones are skipped).
    type: list
    elements: path
    default: [/]
  storage_timeout:
    description:
      - Seconds the shared storage and disk checks may take together. Each path is read in a child
        process of its own; a path with no answer by then (a hung NFS mount) is reported with
        C(timeout) true, naming the node and the path, and the other checks are still reported.
    type: float
    default: 15
  python:
    description: Interpreter of the training environment whose package versions are read; empty skips it.
    type: str
    default: ""
  kernel_log:
    description: Read the kernel log (dmesg) for NVIDIA Xid events.
    type: bool
    default: true
  gpus:
    description:
      - Also read the GPUs (PCI bus and C(nvidia-smi), without the topology matrix) and return
        them as RV(gpu). No GPU or no driver is a finding, not a failure.
    type: bool
    default: false
  nvidia_smi:
    description: The nvidia-smi program, as in M(gpucluster.multinode.gpu_facts).
    type: str
    default: nvidia-smi
  gpu_timeout:
    description: Seconds each nvidia-smi call may take (a hung driver makes it hang).
    type: int
    default: 30
attributes:
  check_mode:
    support: full
    details: >-
      Runs in check mode too: it only reads, apart from the small marker and clock files under
      O(shared_path)/.gpucluster-health and the short-lived listener, which are part of the measurement.
    description: Can run in check mode and return changed status prediction without modifying the node.
notes:
  - The clock offset is the node's time minus the modification time the storage server gave the
    node's fresh file; with NFS that is the server's (the head's) clock, the way C(make) detects skew.
'''

EXAMPLES = r'''
- name: Probe a worker
  gpucluster.multinode.health_probe:
    resolve:
      - {name: gpu-master, expected: 192.168.1.100}
    connect_host: 192.168.1.100
    connect_port: 29500
    shared_path: /shared
    shared_token: "{{ run_token }}"
    disk_paths: [/, /shared]
    python: /opt/gpucluster/env/bin/python
  register: probe
'''

RETURN = r'''
released:
  description: Whether the listener was told to exit.
  returned: when release_port is set
  type: bool
kernel:
  description: Kernel release.
  returned: unless release_port is set
  type: str
  sample: 6.1.0-18-amd64
interfaces:
  description: Interfaces with MTU and addresses.
  returned: always
  type: list
  elements: dict
  sample: [{name: eth0, mtu: 1500, addresses: [192.168.1.101]}]
nccl_env_file_found:
  description: Whether O(nccl_env_file) exists.
  returned: always
  type: bool
nccl_env:
  description: C(NCCL_SOCKET_IFNAME) and C(GLOO_SOCKET_IFNAME) as the profile script sets them.
  returned: always
  type: dict
  sample: {NCCL_SOCKET_IFNAME: eth0, GLOO_SOCKET_IFNAME: eth0}
resolve:
  description: Each name with the addresses it resolved to and the expected one.
  returned: always
  type: list
  elements: dict
  sample: [{name: gpu-master, expected: 192.168.1.100, addresses: [192.168.1.100], error: null}]
connect:
  description: Result of the connection to the head (C(connected), C(refused), C(timeout), C(error)).
  returned: when connect_host is set
  type: dict
  sample: {result: connected, seconds: 0.0004, timeout: 3.0, error: null}
listen:
  description: On the head, whether the port was in use (and by which processes) or is held for the test.
  returned: when listen_port is set
  type: dict
  sample: {port: 29500, in_use: false, holders: [], listener_pid: 4242}
shared:
  description: Shared storage findings.
  returned: when shared_path is set
  type: dict
  sample: {path: /shared, exists: true, mounted: true, fstype: nfs4, writable: true, token_read: abc, timeout: false}
clock:
  description: Clock offset (seconds) of this node against the storage server.
  returned: when shared_path is set
  type: dict
  sample: {offset_s: 0.002, reference: shared storage /shared}
disks:
  description: Free space and inodes per path, percent.
  returned: always
  type: list
  elements: dict
  sample: [{path: /, free_pct: 63.2, inodes_free_pct: 91.0, free_bytes: 12345678, timeout: false}]
versions:
  description:
    - The environment's versions with the keys of C(module_utils/env_versions.py) (C(python), C(torch),
      C(torch_cuda), C(torch_nccl), C(nccl_wheel), C(deepspeed), C(ray)), read from the installed
      distributions without importing them (so C(torch_nccl) is null), and C(kernel).
  returned: always
  type: dict
  sample: {python: 3.11.2, torch: 2.13.0+cpu, torch_cuda: null, torch_nccl: null, nccl_wheel: null,
           deepspeed: 0.19.8, ray: null, kernel: 6.1.0-18-amd64}
xid:
  description: NVIDIA Xid events found in the kernel log.
  returned: always
  type: list
  elements: dict
  sample: [{pci: "PCI:0000:3b:00", code: 79, text: "pid=0, GPU has fallen off the bus."}]
kernel_log_error:
  description: Why the kernel log could not be read, if it could not.
  returned: always
  type: str
gpu:
  description: The GPUs, with the keys M(gpucluster.multinode.gpu_facts) returns (C(topology) empty).
  returned: when gpus is true
  type: dict
  sample: {gpu_count: 0, reason: no NVIDIA GPU on the PCI bus and no nvidia-smi, pci_gpu_count: 0}
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_probes as probes


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nccl_env_file=dict(type='path', default=cluster_defaults.NCCL_PROFILE),
            resolve=dict(type='list', elements='dict', default=[]),
            connect_host=dict(type='str', default=''),
            connect_port=dict(type='int', default=cluster_defaults.MASTER_PORT),
            connect_timeout=dict(type='float', default=3.0),
            listen_port=dict(type='int', default=0),
            listen_seconds=dict(type='int', default=60),
            listen_expect=dict(type='int', default=0),
            release_port=dict(type='int', default=0),
            shared_path=dict(type='path'),
            shared_must_be_mount=dict(type='bool', default=True),
            shared_token=dict(type='str', default='', no_log=False),
            shared_token_write=dict(type='bool', default=False),
            disk_paths=dict(type='list', elements='path', default=['/']),
            storage_timeout=dict(type='float', default=15.0),
            python=dict(type='str', default=''),
            kernel_log=dict(type='bool', default=True),
            gpus=dict(type='bool', default=False),
            nvidia_smi=dict(type='str', default='nvidia-smi'),
            gpu_timeout=dict(type='int', default=30),
        ),
        supports_check_mode=True,
    )
    module.exit_json(**probes.probe(module))


if __name__ == '__main__':
    main()
