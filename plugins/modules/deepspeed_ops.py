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
  - Each run first reads files only (the installed packages' metadata, C(torch/version.py), the
    stamp and the ops' C(.so) files), without importing torch or DeepSpeed. When they show the
    ops built for the installed versions, the run ends there, unchanged, in a fraction of a
    second; otherwise it probes the environment by importing DeepSpeed.
  - With O(state=checked) it only reads files and reports whether a job would build ops before
    its first step, and how long the last recorded build took. It never imports DeepSpeed.
version_added: 0.2.0
author: gpucluster.multinode contributors (!UNKNOWN)
extends_documentation_fragment: [gpucluster.multinode.attributes.no_diff]
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
      - C(checked) only reports, from files; it never builds and never imports torch or DeepSpeed.
    type: str
    choices: [built, checked]
    default: built
  environ:
    description: Extra environment of the interpreter, for example C(DS_ACCELERATOR=cpu) or C(TORCH_CUDA_ARCH_LIST).
      Never shown in the task result or log (it carries the job's environment, where tokens live).
    type: dict
    default: {}
  plain_environ:
    description:
      - Environment of the interpreter that is no secret (C(DS_ACCELERATOR), C(TORCH_EXTENSIONS_DIR),
        C(PATH), C(TORCH_CUDA_ARCH_LIST)), shown as it is. O(environ) wins where both name a variable.
      - Values given in O(environ) are masked wherever they appear in the output (C(cpu) too), so
        give the settings here and keep O(environ) for tokens.
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
    description: Can run in check mode and return changed status prediction without modifying the node.
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
  description: Ops a job would build before its first step as things are now; null when no build was
    ever recorded for this environment (O(state=checked) cannot tell then).
  returned: success
  type: list
  elements: str
  sample: []
read:
  description: C(files) when the answer came from the files alone, C(probe) when DeepSpeed was imported.
  returned: success
  type: str
  sample: files
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
    """Runs the environment's python with the probe (mode probe or build) or the file-only read
    (mode stamp) and returns its result line as a dict."""
    p = module.params
    names = dict((str(k), [str(x) for x in (v or [])]) for k, v in p['ops'].items())
    script = dso.STAMP_SCRIPT if mode == 'stamp' else dso.PROBE_SCRIPT
    inner = [p['python'], '-c', script, mode, module.jsonify(names)]
    if p['env_files']:
        prefix = 'set -a; ' + ''.join('[ -r %s ] && . %s; ' % (shlex.quote(f), shlex.quote(f)) for f in p['env_files'])
        inner = ['/bin/sh', '-c', prefix + 'set +a; exec "$@"', 'sh'] + inner
    environ = dict((str(k), str(v)) for k, v in p['plain_environ'].items())
    environ.update((str(k), str(v)) for k, v in p['environ'].items())
    rc, out, err = module.run_command(['timeout', str(p['timeout'])] + inner, environ_update=environ)
    if rc == 124:
        module.fail_json(msg='%s did not finish within timeout=%d s (%s of the DeepSpeed ops)'
                         % (p['python'], p['timeout'], mode), rc=rc)
    try:
        if mode == 'stamp':
            return dso.parse_probe_output(out, fields=('dist', 'extensions_dir', 'stamp'))
        return dso.parse_probe_output(out)
    except dso.ProbeError as exc:
        tail = ' | '.join((err or out or '').strip().splitlines()[-3:])
        what = 'read its package versions' if mode == 'stamp' else 'import torch and deepspeed'
        module.fail_json(msg='%s cannot %s: %s' % (p['python'], what, exc), rc=rc, stderr_tail=tail)


def write_stamp(module, path, stamp):
    tmp = '%s.tmp%d' % (path, os.getpid())
    with open(tmp, 'w') as handle:
        handle.write(module.jsonify(stamp) + '\n')
    os.chmod(tmp, 0o644)
    module.atomic_move(tmp, path)


def from_files(module, wanted):
    """state=checked, and the first look of state=built: read the stamp and the package versions
    without importing torch or DeepSpeed."""
    quick = run_probe(module, 'stamp')
    verdict, stamp, accelerator = dso.read_without_import(quick, wanted)
    if not quick['dist'].get('deepspeed') or not quick['dist'].get('torch'):
        missing = ' and '.join(name for name in ('torch', 'deepspeed') if not quick['dist'].get(name))
        return 'unknown', dict(accelerator=None, extensions_dir=quick['extensions_dir'], versions=None,
                               job_builds=None, build_seconds=None,
                               msg='%s not installed in %s: no DeepSpeed op to check' % (missing, module.params['python']))
    result = dict(accelerator=accelerator, extensions_dir=quick['extensions_dir'],
                  versions=stamp.get('key') if verdict == 'ready' else None)
    if verdict == 'ready':
        return verdict, dict(result, job_builds=[], build_seconds=None, msg=dso.ready_message(stamp, quick, wanted))
    names = [name for name, entry in stamp.get('ops', {}).items() if entry.get('builder') in wanted.get(accelerator, [])]
    return verdict, dict(result, job_builds=names if verdict == 'stale' else None,
                         build_seconds=dso.last_seconds(stamp, names) if stamp else None,
                         msg=dso.unread_message(verdict, stamp, wanted))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type='path', required=True),
            ops=dict(type='dict', default={}),
            state=dict(type='str', choices=['built', 'checked'], default='built'),
            environ=dict(type='dict', default={}, no_log=True),
            plain_environ=dict(type='dict', default={}),
            env_files=dict(type='list', elements='path', default=[]),
            timeout=dict(type='int', default=1800),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not os.access(p['python'], os.X_OK):
        module.fail_json(msg='python %s does not exist or is not executable; is the environment installed?' % p['python'])
    wanted = dict((str(k), [str(x) for x in (v or [])]) for k, v in p['ops'].items())

    verdict, quick = from_files(module, wanted)
    if p['state'] == 'checked' or verdict == 'ready':
        module.exit_json(changed=False, ops=[], built=[], read='files', **quick)

    info = run_probe(module, 'probe')
    path = dso.stamp_path(info['extensions_dir'])
    stamp = dso.read_stamp(path)
    result = dict(accelerator=info['accelerator'], extensions_dir=info['extensions_dir'],
                  versions=dso.version_key(info), read='probe')
    bad = dso.unusable_ops(info)
    if bad:
        module.fail_json(msg='DeepSpeed ops that cannot be built here: %s' % '; '.join(bad), ops=info['ops'],
                         **result)

    todo = dso.ops_to_build(info, stamp)
    if module.check_mode or not todo:
        job_builds = dso.ops_the_job_builds(info, stamp)
        changed = bool(todo)
        refreshed = dso.updated_stamp(stamp, info, None)
        if not todo and refreshed != stamp and not module.check_mode:
            # Nothing to build, but the stamp lacks what the file-only read needs (written by an
            # older release, the wheel holds the ops, or no op is asked for): record it once, so
            # later runs only read files.
            if not os.path.isdir(info['extensions_dir']):
                os.makedirs(info['extensions_dir'], 0o755)
            write_stamp(module, path, refreshed)
            changed = True
        module.exit_json(changed=changed, ops=info['ops'], built=todo, job_builds=job_builds, build_seconds=None,
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
