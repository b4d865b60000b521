# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations


class ModuleDocFragment:
    """Options shared by the modules that start processes in the cluster environment
    (smoke, collective, training_job)."""

    DOCUMENTATION = r'''
options:
  env_files:
    description:
      - Shell files sourced in order, each only when it is readable, for the environment of what
        the module starts (for example the NCCL settings of P(gpucluster.multinode.nccl_env#role)).
    type: list
    elements: path
    default: [/etc/profile.d/gpucluster-nccl.sh]
'''

    # The nodes of a job, as the gpucluster.multinode.cluster_job_nodes filter gives them
    # (extends_documentation_fragment: gpucluster.multinode.launch_env.nodes).
    NODES = r'''
options:
  node:
    type: str
    required: true
    description: This node's name, as it is listed in O(nodes).
  nodes:
    type: list
    elements: dict
    required: true
    description:
      - The nodes, head first, with their slots (ranks per node, each node its own; see the
        C(node_slots) inventory variable). The world size is the sum of the slots.
    suboptions:
      name:
        type: str
        required: true
        description: Inventory name (also the name other nodes reach it by).
      address:
        type: str
        required: true
        description: The node's address on the cluster network.
      slots:
        type: int
        default: 1
        description: Ranks on the node (GPUs; 1 on a CPU node unless C(node_slots) says more).
      host:
        type: str
        description: Inventory host the entry stands for, when O(nodes[].name) is its address; informative.
'''
