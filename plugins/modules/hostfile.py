#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: hostfile
short_description: Write the hostfile a multi-node launcher reads (DeepSpeed, Open MPI, MPICH, Slurm, torchrun)
version_added: "0.1.0"
description:
  - Writes the list of cluster nodes, with the number of processes (slots) each one runs,
    in the format a launcher expects.
  - C(deepspeed) and C(openmpi) write C(host slots=N) lines (the syntax of DeepSpeed's C(--hostfile) and of
    Open MPI's C(mpirun --hostfile)), C(mpich) writes C(host:N), C(plain) one host per line, and C(slurm) a
    compressed node list such as C(gpu-master,gpu-node[01-04]), as C(scontrol show hostlist) would write it
    (zero padding kept; C(scontrol show hostnames) expands it back).
  - C(torchrun) writes a table, one line per node after a comment line - its name, its address, then the
    torchrun options it runs with - C(--nnodes), C(--node-rank), C(--nproc-per-node) (its slots),
    C(--master-addr) (O(master_addr), else the head's address) and C(--master-port) (O(master_port)).
  - The head comes first (it is rank 0), then the other hosts in natural order, so
    C(worker-2) comes before C(worker-10).
  - "Slots of a host: its O(hosts[].slots) when given; otherwise its detected GPU count
    O(hosts[].gpus) (for example C(ansible_facts.gpu_facts.gpu_count) from P(gpucluster.multinode.gpu_facts#module));
    a host with no GPU, or whose GPU count is not given, gets O(default_slots), 1 unless told, so a CPU-only cluster still gets a usable hostfile.
    Hosts may have different counts."
  - The file is written through a temporary file in the same directory and moved into place
    atomically; nothing is written when the content and attributes are already right.
  - To build the hosts from the inventory, use the P(gpucluster.multinode.cluster_job_nodes#filter)
    filter, which reads C(node_slots), C(gpu_slots), C(cluster_address) and the GPU facts of each host
    (the slots of the collection's jobs).
  - The file is written with mode C(0644) unless O(mode) says otherwise.
options:
  path:
    description:
      - The hostfile to write. Its directory must exist.
    type: path
    required: true
  format:
    description:
      - The launcher format.
    type: str
    choices: [deepspeed, openmpi, mpich, plain, slurm, torchrun]
    default: deepspeed
  master_addr:
    description:
      - The rendezvous address of the C(torchrun) format. Defaults to the head's address.
    type: str
  master_port:
    description:
      - The rendezvous port of the C(torchrun) format.
    type: int
    default: 29500
  hosts:
    description:
      - The cluster nodes, one dict per host.
      - The first host is the head unless O(head) names another one.
      - Mutually exclusive with O(workers).
    type: list
    elements: dict
    suboptions:
      name:
        description: Host name written to the file (unless O(use_address)).
        type: str
        required: true
      address:
        description: Cluster address of the host, written when O(use_address=true). Defaults to O(hosts[].name).
        type: str
      slots:
        description: Processes to start on this host; overrides the GPU count. Must be from 1 to 1024.
        type: int
      gpus:
        description: Detected GPU count of the host (0 or more). Used as the slot count when O(hosts[].slots) is not given.
        type: int
      host:
        description: The inventory name, as P(gpucluster.multinode.cluster_job_nodes#filter) gives it; not written.
        type: str
  head:
    description:
      - The head node (rank 0), written first.
      - With O(hosts), the name of one of them.
      - With O(workers), a host name or a dict with the keys of O(hosts).
    type: raw
  workers:
    description:
      - The other nodes, as host names or dicts with the keys of O(hosts). Needs O(head).
    type: list
    elements: raw
  default_slots:
    description:
      - Slots for a host with no O(hosts[].slots) and no GPU (O(hosts[].gpus) 0 or not given).
    type: int
    default: 1
  include:
    description:
      - Only these hosts are written. A name that is not one of the hosts is an error.
    type: list
    elements: str
  exclude:
    description:
      - These hosts are left out. A name that is not one of the hosts is an error.
    type: list
    elements: str
  use_address:
    description:
      - Write the cluster address of each host instead of its name.
    type: bool
    default: false
extends_documentation_fragment:
  - gpucluster.multinode.attributes.posix
  - ansible.builtin.files
attributes:
  check_mode:
    support: full
    description: Reports whether the file would change and writes nothing.
  diff_mode:
    support: full
    description: Shows the file content before and after.
seealso:
  - plugin: gpucluster.multinode.cluster_job_nodes
    plugin_type: filter
author: gpucluster.multinode contributors (!UNKNOWN)
'''

EXAMPLES = r'''
- name: DeepSpeed hostfile from the inventory and the gathered GPU facts
  gpucluster.multinode.hostfile:
    path: /shared/hostfile
    format: deepspeed
    hosts: "{{ groups | gpucluster.multinode.cluster_job_nodes(hostvars) }}"
    owner: train

- name: A torchrun table, one line of options per node
  gpucluster.multinode.hostfile:
    path: /shared/cluster/torchrun.txt
    format: torchrun
    head: {name: gpu-master, address: 192.168.1.100, slots: 2}
    workers: [{name: gpu-worker-1, address: 192.168.1.101, slots: 1}]
    master_port: 29500

- name: Open MPI hostfile, 8 slots on every node, written with cluster addresses
  gpucluster.multinode.hostfile:
    path: /shared/hostfile.ompi
    format: openmpi
    head: {name: gpu-master, address: 10.0.0.1, slots: 8}
    workers:
      - {name: gpu-worker-1, address: 10.0.0.2, slots: 8}
      - {name: gpu-worker-2, address: 10.0.0.3, slots: 8}
    use_address: true

- name: A Slurm node list without a node that is being repaired
  gpucluster.multinode.hostfile:
    path: /shared/nodelist
    format: slurm
    head: gpu-master
    workers: [gpu-node01, gpu-node02, gpu-node03, gpu-node04]
    exclude: [gpu-node03]
'''

RETURN = r'''
content:
  description: The hostfile text as written (or as it would be written in check mode).
  returned: success
  type: str
  sample: "gpu-master slots=1\ngpu-worker-1 slots=1\ngpu-worker-2 slots=1\n"
hosts:
  description: The hosts written, head first, with the address and slot count of each.
  returned: success
  type: list
  elements: dict
  sample: [{name: gpu-master, address: 192.168.1.100, slots: 1}, {name: gpu-worker-1, address: 192.168.1.101, slots: 1}]
total_slots:
  description: Sum of the slots of the hosts written (the world size of a one-process-per-slot launch).
  returned: success
  type: int
  sample: 3
path:
  description: The hostfile path.
  returned: success
  type: str
  sample: /shared/hostfile
'''

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native

from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf


def _entries(params):
    """Host entries and the head name from either hosts(+head) or head+workers."""
    if params['hosts'] is not None:
        head = params['head']
        if head is not None and not isinstance(head, str):
            raise hf.HostfileError('head must be the name of one of the hosts when hosts is given, got %r' % (head,))
        return params['hosts'], head
    head = params['head']
    if isinstance(head, dict):
        head_name = head.get('name')
    elif isinstance(head, str):
        head_name = head
    else:
        raise hf.HostfileError('head must be a host name or a dict with name, address, slots, got %r' % (head,))
    return [head] + list(params['workers'] or []), head_name


def _read(path):
    try:
        with open(path, 'rb') as handle:
            return handle.read().decode('utf-8', errors='replace')
    except FileNotFoundError:
        return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type='path', required=True),
            format=dict(type='str', default='deepspeed', choices=list(hf.FORMATS)),
            hosts=dict(type='list', elements='dict', options=dict(
                name=dict(type='str', required=True),
                address=dict(type='str'),
                slots=dict(type='int'),
                gpus=dict(type='int'),
                host=dict(type='str'),
            )),
            head=dict(type='raw'),
            workers=dict(type='list', elements='raw'),
            default_slots=dict(type='int', default=1),
            include=dict(type='list', elements='str'),
            exclude=dict(type='list', elements='str'),
            use_address=dict(type='bool', default=False),
            master_addr=dict(type='str'),
            master_port=dict(type='int', default=29500),
        ),
        mutually_exclusive=[('hosts', 'workers')],
        required_one_of=[('hosts', 'head')],
        required_by={'workers': 'head'},
        add_file_common_args=True,
        supports_check_mode=True,
    )
    params = module.params
    path = params['path']

    try:
        entries, head = _entries(params)
        result = hf.build(entries, fmt=params['format'], head=head, default_slots=params['default_slots'],
                          include=params['include'], exclude=params['exclude'],
                          use_address=params['use_address'], master_addr=params['master_addr'],
                          master_port=params['master_port'], path=path)
    except hf.HostfileError as exc:
        module.fail_json(msg=to_native(exc))

    directory = os.path.dirname(path) or '.'
    if not os.path.isdir(directory):
        module.fail_json(msg='path: directory %s does not exist; create it first (or mount /shared)' % directory,
                         path=path)
    if os.path.isdir(path):
        module.fail_json(msg='path: %s is a directory; give the file name of the hostfile' % path, path=path)

    content = result['content']
    before = _read(path)
    changed = before != content

    if changed and not module.check_mode:
        fd, tmp = tempfile.mkstemp(prefix='.hostfile.', dir=directory)
        try:
            with os.fdopen(fd, 'wb') as handle:
                handle.write(to_bytes(content))
            module.atomic_move(tmp, path, unsafe_writes=params['unsafe_writes'])
        except Exception as exc:  # the temp file must not be left behind
            if os.path.exists(tmp):
                os.unlink(tmp)
            module.fail_json(msg='path: could not write %s: %s' % (path, to_native(exc)), path=path)

    file_args = module.load_file_common_arguments(params, path=path)
    if file_args.get('mode') is None:
        file_args['mode'] = '0644'
    if module.check_mode and not os.path.exists(path):
        # attributes of a file that does not exist yet cannot be compared; the content change says it all
        attrs_changed = False
    else:
        attrs_changed = module.set_fs_attributes_if_different(file_args, False)

    out = dict(
        changed=changed or attrs_changed,
        path=path,
        content=content,
        hosts=result['hosts'],
        total_slots=result['total_slots'],
    )
    if module._diff:
        out['diff'] = dict(before=before or '', after=content,
                           before_header='%s (content)' % path, after_header='%s (content)' % path)
    module.exit_json(**out)


if __name__ == '__main__':
    main()
