# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations


class ModuleDocFragment:
    """Options shared by the modules that start processes in the cluster environment
    (dist_check, nccl_test, training_job)."""

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
    description: Name of this node; one of O(nodes).
    type: str
    required: true
  nodes:
    description:
      - The nodes, head first, with their slots (ranks per node, each node its own; see the
        C(node_slots) inventory variable). The world size is the sum of the slots.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Inventory name (also the name other nodes reach it by).
        type: str
        required: true
      address:
        description: Cluster address.
        type: str
        required: true
      slots:
        description: Ranks on the node (GPUs; 1 on a CPU node unless C(node_slots) says more).
        type: int
        default: 1
      host:
        description: Inventory host the entry stands for, when O(nodes[].name) is its address; informative.
        type: str
'''
