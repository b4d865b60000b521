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
  - With O(record), the answer of an earlier import (written by the caller from RV(record)) is
    used instead of importing again while the installed distributions, the interpreter and the
    NVIDIA kernel module are the ones it was recorded with; reading that takes a fraction of a
    second where the import takes seconds per node.
  - With O(requirements), it also says which requirement strings the installed distributions do
    not satisfy (RV(unsatisfied)), so a caller can leave pip alone when nothing is to install.
  - Changes nothing on the node.
version_added: 0.1.0
extends_documentation_fragment: [gpucluster.multinode.attributes.read_only]
author: gpucluster.multinode contributors (!UNKNOWN)
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
  imports:
    description:
      - C(false) reads the versions from the distributions' metadata only (no torch import,
        RV(cuda_available) and C(torch_nccl) are then null) and never fails on a missing package.
    type: bool
    default: true
  record:
    description:
      - Path of the record of an earlier import on this node (RV(record), written by the caller).
        Used when it matches; a missing or stale record means an import.
    type: path
  requirements:
    description:
      - Requirement strings (C(torch==2.13.0), C(ray[default]>=2.40)) to check against the installed
        distributions with pip's own requirement parser, with their dependencies all the way down
        (and those of the extras asked for). A URL or anything unparsable counts as not satisfied.
    type: list
    elements: str
    default: []
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
  description: Whether torch sees a usable GPU; null with O(imports=false).
  returned: success
  type: bool
  sample: false
read:
  description: C(imports) when torch and DeepSpeed were imported, C(record) when O(record) answered,
    C(metadata) with O(imports=false).
  returned: success
  type: str
  sample: record
record:
  description: What to write to O(record) after an import (the versions, RV(cuda_available) and what
    they hold for).
  returned: after an import, when O(record) is given
  type: dict
unsatisfied:
  description: The O(requirements) the installed distributions do not satisfy; null when the
    environment could not tell (no interpreter, no requirement parser).
  returned: when O(requirements) is given
  type: list
  elements: str
  sample: []
'''

import hashlib
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions

NVIDIA_MODULE_VERSION = '/sys/module/nvidia/version'


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return None


def distributions_digest(python):
    """sha256 of every distribution installed in the environment (name==version), read on disk;
    None when only the interpreter knows its site-packages."""
    dirs = env_versions.site_dirs(python)
    if not dirs:
        return None
    # imported here: importlib.metadata is Python 3.8+, and ansible-core 2.16 (requires_ansible) still
    # runs modules with an older node Python, where only this reading should fail, not the whole module
    from importlib import metadata
    names = sorted('%s==%s' % ((d.metadata.get('Name') or '?').lower(), d.version)
                   for d in metadata.distributions(path=list(dirs)))
    return hashlib.sha256('\n'.join(names).encode('utf-8')).hexdigest()


def record_key(module, python, environ, timeout):
    """What an import's answer holds for: the interpreter, the versions, every installed
    distribution, the NVIDIA kernel module's version and the import's environment (its names
    only: values may be secrets)."""
    versions, error = env_versions.read(module, python, imports=False, environ=environ, timeout=timeout)
    return {'python': python, 'versions': versions, 'distributions': distributions_digest(python),
            'nvidia_module': read_text(NVIDIA_MODULE_VERSION), 'environ': sorted(environ)}, error


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type='path', required=True),
            environ=dict(type='dict', default={}),
            timeout=dict(type='int', default=300),
            imports=dict(type='bool', default=True),
            record=dict(type='path'),
            requirements=dict(type='list', elements='str', default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    python = p['python']
    if not os.access(python, os.X_OK):
        if not p['imports']:
            module.exit_json(changed=False, versions=env_versions.empty(), cuda_available=None, read='metadata',
                             unsatisfied=list(p['requirements']) if p['requirements'] else None)
        module.fail_json(msg='python %s does not exist or is not executable; is the environment installed?' % python)
    if p['timeout'] <= 0:
        module.fail_json(msg='timeout must be a positive number of seconds, got %s' % p['timeout'])
    environ = dict((str(k), str(v)) for k, v in p['environ'].items())
    extra = {}
    if p['requirements']:
        extra['unsatisfied'] = env_versions.unsatisfied(module, python, p['requirements'], timeout=p['timeout'])
    if not p['imports']:
        versions, error = env_versions.read(module, python, imports=False, environ=environ, timeout=p['timeout'])
        module.exit_json(changed=False, versions=versions or env_versions.empty(), cuda_available=None,
                         read='metadata', **extra)
    key = None
    if p['record']:
        key, error = record_key(module, python, environ, p['timeout'])
        try:
            with open(p['record']) as handle:
                saved = json.load(handle)
        except (IOError, OSError, ValueError):
            saved = {}
        if not error and isinstance(saved, dict) and saved.get('key') == key and saved.get('versions'):
            module.exit_json(changed=False, versions=saved['versions'], cuda_available=saved.get('cuda_available'),
                             read='record', **extra)
    versions, error = env_versions.read(module, python, imports=True, environ=environ, timeout=p['timeout'])
    if error or not versions:
        module.fail_json(msg='%s cannot import torch and deepspeed: %s' % (python, error or 'no result'))
    cuda_available = bool(versions.pop('cuda_available', False))
    if key is not None:
        extra['record'] = {'key': key, 'versions': versions, 'cuda_available': cuda_available}
    module.exit_json(changed=False, versions=versions, cuda_available=cuda_available, read='imports', **extra)


if __name__ == '__main__':
    main()
