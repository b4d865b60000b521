#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: python_env_info
short_description: Versions of Python, torch, CUDA, NCCL and DeepSpeed in a Python environment
description:
  - Runs the environment's own interpreter, imports C(torch) and C(deepspeed) and reports the
    versions with the keys of C(module_utils/env_versions.py) (the same keys the health probe
    reports), and whether torch sees a usable GPU.
  - Fails, with the import error, when either package cannot be imported, and when the import does
    not end within O(timeout) seconds.
  - Changes nothing on the node.
version_added: 0.1.0
extends_documentation_fragment: [gpucluster.multinode.attributes.read_only]
author: gpucluster.multinode contributors
options:
  python:
    description: Interpreter of the environment, for example C(/opt/gpucluster/env/bin/python).
    type: path
    required: true
  environ:
    description:
      - Extra environment variables for the import, for example C(DS_ACCELERATOR=cpu) on a
        node without GPUs (DeepSpeed picks its accelerator at import time).
    type: dict
    default: {}
  timeout:
    description: Seconds the import may take before the module gives up.
    type: int
    default: 300
notes:
  - Importing DeepSpeed the first time on a node can take several seconds.
'''

EXAMPLES = r'''
- name: Read the versions of the training environment
  gpucluster.multinode.python_env_info:
    python: /opt/gpucluster/env/bin/python
    environ:
      DS_ACCELERATOR: cpu
  register: env_info

- name: Show them
  ansible.builtin.debug:
    msg: "torch {{ env_info.versions.torch }}, deepspeed {{ env_info.versions.deepspeed }}"
'''

RETURN = r'''
versions:
  description:
    - The environment's versions, keys as in C(module_utils/env_versions.py) (null when not installed
      or not applicable) - C(python); C(torch) (local label included); C(torch_cuda), the CUDA torch
      was built with (null for a CPU build); C(torch_nccl), the NCCL torch uses (null without CUDA);
      C(nccl_wheel), the C(nvidia-nccl-cu*) distribution; C(deepspeed); C(ray).
  returned: success
  type: dict
  sample: {python: 3.11.2, torch: 2.13.0+cpu, torch_cuda: null, torch_nccl: null, nccl_wheel: null,
           deepspeed: 0.19.8, ray: null}
cuda_available:
  description: Whether torch sees a usable GPU.
  returned: success
  type: bool
  sample: false
'''

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type='path', required=True),
            environ=dict(type='dict', default={}),
            timeout=dict(type='int', default=300),
        ),
        supports_check_mode=True,
    )
    python = module.params['python']
    if not os.access(python, os.X_OK):
        module.fail_json(msg='python %s does not exist or is not executable; is the environment installed?' % python)
    if module.params['timeout'] <= 0:
        module.fail_json(msg='timeout must be a positive number of seconds, got %s' % module.params['timeout'])
    environ = dict((str(k), str(v)) for k, v in module.params['environ'].items())
    versions, error = env_versions.read(module, python, imports=True, environ=environ,
                                        timeout=module.params['timeout'])
    if error or not versions:
        module.fail_json(msg='%s cannot import torch and deepspeed: %s' % (python, error or 'no result'))
    cuda_available = bool(versions.pop('cuda_available', False))
    module.exit_json(changed=False, versions=versions, cuda_available=cuda_available)


if __name__ == '__main__':
    main()
