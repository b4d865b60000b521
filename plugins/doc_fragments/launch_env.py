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
