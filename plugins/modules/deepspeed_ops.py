#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: deepspeed_ops
short_description: Build the DeepSpeed ops a job would JIT-build, ahead of the first job
description:
  - Runs the environment's interpreter as the account the module runs as, lets DeepSpeed pick
    its accelerator as a job does, and loads the op builders listed for that accelerator with
    the builder's own load method, the JIT path of a job. The result lands in torch's
    extension directory of that account (C(TORCH_EXTENSIONS_DIR), else
    C(~/.cache/torch_extensions/pyXY_ACC)), where the job's ranks find it.
  - Records in that directory (C(gpucluster-deepspeed-ops.json)) the Python, torch, DeepSpeed
    and accelerator the ops were built for and how many seconds each build took. A later run
    with the same versions builds nothing; a version change rebuilds.
  - With O(state=checked) it only reports which ops a job would build before its first step,
    and how long the last recorded build took.
version_added: 0.2.0
author: gpucluster.multinode contributors
options:
  python:
    required: true
    type: path
    description: The environment's python (the job's), for example C(/opt/gpucluster/env/bin/python).
  ops:
    description:
      - "Op builder class names per DeepSpeed accelerator name, for example
        C({cpu: [ShareMemCommBuilder], cuda: [FusedAdamBuilder]}). Only the list of the
        accelerator DeepSpeed picks on the node is used."
    type: dict
    default: {}
  state:
    description:
      - C(built) builds what is missing or was built for other versions.
      - C(checked) only reports; it never builds.
    type: str
    choices: [built, checked]
    default: built
  environ:
    description: Extra environment of the interpreter, for example C(DS_ACCELERATOR=cpu) or C(TORCH_CUDA_ARCH_LIST).
      Never shown in the task result or log (it carries the job's environment, where tokens live).
    type: dict
    default: {}
  env_files:
    description: Shell files sourced (exported) before the interpreter starts, as the training job does.
    type: list
    elements: path
    default: []
  timeout:
    description: Seconds the probe and the builds together may take before the module gives up.
    type: int
    default: 1800
attributes:
  check_mode:
    support: full
    details: Probes only; reports as changed what it would build.
  diff_mode:
    support: none
notes:
  - The build needs what a JIT build needs on the node (a C++ compiler, the Python headers,
    ninja on PATH); the module fails naming the op and the compiler's last words otherwise.
'''

EXAMPLES = r'''
- name: Build the CPU ops of DeepSpeed for the training account
  gpucluster.multinode.deepspeed_ops:
    python: /opt/gpucluster/env/bin/python
    ops:
      cpu: [ShareMemCommBuilder]
    environ:
      PATH: /opt/gpucluster/env/bin:/usr/local/bin:/usr/bin:/bin
  become: true
  become_user: train

- name: Say whether a job will build ops first
  gpucluster.multinode.deepspeed_ops:
    python: /opt/gpucluster/env/bin/python
    ops:
      cpu: [ShareMemCommBuilder]
    state: checked
    env_files: [/etc/profile.d/gpucluster-nccl.sh]
  become: true
  become_user: train
  register: ops
'''

RETURN = r'''
accelerator:
  description: The accelerator DeepSpeed picked.
  returned: success
  type: str
  sample: cpu
extensions_dir:
  description: Torch's extension directory of this account, where the ops are built and the stamp lies.
  returned: success
  type: str
  sample: /home/train/.cache/torch_extensions/py311_cpu
versions:
  description: What the ops are built for.
  returned: success
  type: dict
  sample: {python: 3.11.2, torch: 2.13.0+cpu, deepspeed: 0.19.8, accelerator: cpu}
ops:
  description: The ops of this accelerator (name, builder, compatible, installed in the wheel, built, seconds).
  returned: success
  type: list
  elements: dict
  sample: [{builder: ShareMemCommBuilder, name: deepspeed_shm_comm, compatible: true, installed: false, built: true, seconds: 95.2}]
built:
  description: Ops built by this run (or, in check mode and with state=checked, that would be).
  returned: success
  type: list
  elements: str
  sample: [deepspeed_shm_comm]
job_builds:
  description: Ops a job would build before its first step as things are now.
  returned: success
  type: list
  elements: str
  sample: []
build_seconds:
  description: Seconds this run's builds took, or with state=checked the last recorded build of the ops a job would build; null when none.
  returned: success
  type: float
  sample: 95.2
msg:
  description: One line saying whether a job builds ops before step 1, and how long that took last time.
  returned: success
  type: str
  sample: "DeepSpeed ops ready in /home/train/.cache/torch_extensions/py311_cpu (deepspeed_shm_comm): no build before step 1"
'''

import os
import shlex
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import deepspeed_ops as dso


def run_probe(module, mode):
    p = module.params
    names = dict((str(k), [str(x) for x in (v or [])]) for k, v in p['ops'].items())
    inner = [p['python'], '-c', dso.PROBE_SCRIPT, mode, module.jsonify(names)]
    if p['env_files']:
        prefix = 'set -a; ' + ''.join('[ -r %s ] && . %s; ' % (shlex.quote(f), shlex.quote(f)) for f in p['env_files'])
        inner = ['/bin/sh', '-c', prefix + 'set +a; exec "$@"', 'sh'] + inner
    environ = dict((str(k), str(v)) for k, v in p['environ'].items())
    rc, out, err = module.run_command(['timeout', str(p['timeout'])] + inner, environ_update=environ)
    if rc == 124:
        module.fail_json(msg='%s did not finish within timeout=%d s (%s of the DeepSpeed ops)'
                         % (p['python'], p['timeout'], mode), rc=rc)
    try:
        return dso.parse_probe_output(out)
    except dso.ProbeError as exc:
        tail = ' | '.join((err or out or '').strip().splitlines()[-3:])
        module.fail_json(msg='%s cannot import torch and deepspeed: %s' % (p['python'], exc), rc=rc,
                         stderr_tail=tail)


def write_stamp(module, path, stamp):
    tmp = '%s.tmp%d' % (path, os.getpid())
    with open(tmp, 'w') as handle:
        handle.write(module.jsonify(stamp) + '\n')
    os.chmod(tmp, 0o644)
    module.atomic_move(tmp, path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type='path', required=True),
            ops=dict(type='dict', default={}),
            state=dict(type='str', choices=['built', 'checked'], default='built'),
            environ=dict(type='dict', default={}, no_log=True),
            env_files=dict(type='list', elements='path', default=[]),
            timeout=dict(type='int', default=1800),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not os.access(p['python'], os.X_OK):
        module.fail_json(msg='python %s does not exist or is not executable; is the environment installed?' % p['python'])

    info = run_probe(module, 'probe')
    path = dso.stamp_path(info['extensions_dir'])
    stamp = dso.read_stamp(path)
    result = dict(accelerator=info['accelerator'], extensions_dir=info['extensions_dir'],
                  versions=dso.version_key(info))
    bad = dso.unusable_ops(info)
    if bad and p['state'] == 'built':
        module.fail_json(msg='DeepSpeed ops that cannot be built here: %s' % '; '.join(bad), ops=info['ops'],
                         **result)

    if p['state'] == 'checked':
        todo = dso.ops_the_job_builds(info, stamp)
        seconds = dso.last_seconds(stamp, todo)
        module.exit_json(changed=False, ops=info['ops'], built=[], job_builds=todo, build_seconds=seconds,
                         msg=dso.preflight_message(todo, seconds, info), **result)

    todo = dso.ops_to_build(info, stamp)
    if not todo or module.check_mode:
        job_builds = dso.ops_the_job_builds(info, stamp)
        module.exit_json(changed=bool(todo), ops=info['ops'], built=todo, job_builds=job_builds, build_seconds=None,
                         msg=dso.preflight_message(job_builds, dso.last_seconds(stamp, job_builds), info), **result)

    built = run_probe(module, 'build')
    errors = dso.build_errors(built)
    if errors:
        module.fail_json(msg='building DeepSpeed ops failed (a job would fail the same way): %s'
                         % '; '.join(errors), ops=built['ops'], **result)
    stamp = dso.updated_stamp(stamp, built, time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()))
    write_stamp(module, path, stamp)
    seconds = dso.last_seconds(stamp, todo)
    module.exit_json(changed=True, ops=built['ops'], built=todo, job_builds=dso.ops_the_job_builds(built, stamp),
                     build_seconds=seconds,
                     msg='built DeepSpeed ops %s in %s s' % (', '.join(todo), seconds), **result)


if __name__ == '__main__':
    main()
