#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: python_env_info
short_description: Versions of torch, CUDA, NCCL and DeepSpeed in a Python environment
description:
  - Runs the environment's own interpreter, imports C(torch) and C(deepspeed) and reports
    their versions, the CUDA version torch was built for (C(torch.version.cuda)), whether a
    GPU is usable, and the NCCL version (C(torch.cuda.nccl.version())) when torch has CUDA.
  - Fails, with the import error, when either package cannot be imported.
  - Changes nothing on the node.
version_added: 0.1.0
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
attributes:
  check_mode:
    support: full
    details: Only reads; runs the same in check mode.
  diff_mode:
    support: none
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
    msg: "torch {{ env_info.torch_version }}, deepspeed {{ env_info.deepspeed_version }}"
'''

RETURN = r'''
python_version:
  description: Version of the environment's interpreter.
  returned: success
  type: str
  sample: 3.11.2
torch_version:
  description: C(torch.__version__), local label included.
  returned: success
  type: str
  sample: 2.13.0+cpu
cuda_version:
  description: CUDA version torch was built for; null for a CPU build.
  returned: success
  type: str
  sample: "13.0"
cuda_available:
  description: Whether torch sees a usable GPU.
  returned: success
  type: bool
  sample: false
nccl_version:
  description: NCCL version bundled with torch as C(major.minor.patch); null without CUDA.
  returned: success
  type: str
  sample: 2.28.9
deepspeed_version:
  description: C(deepspeed.__version__).
  returned: success
  type: str
  sample: 0.19.8
'''

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import python_env


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

    environ = dict((str(k), str(v)) for k, v in module.params['environ'].items())
    cmd = ['timeout', str(module.params['timeout']), python, '-c', python_env.PROBE_SCRIPT]
    rc, out, err = module.run_command(cmd, environ_update=environ)
    try:
        info = python_env.parse_probe_output(out)
    except python_env.ProbeError as exc:
        tail = ' | '.join((err or out or '').strip().splitlines()[-3:])
        module.fail_json(msg='%s cannot import torch and deepspeed: %s' % (python, exc), rc=rc, stderr_tail=tail)
    module.exit_json(changed=False, **info)


if __name__ == '__main__':
    main()
