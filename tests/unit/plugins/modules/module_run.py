"""Run a module of this collection as Ansible runs it: its file with an args file, the collection on
PYTHONPATH; its JSON answer (the test fails naming rc and output when it printed none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')


def run_module(module, tmp_path, args, check=False, env=None):
    """Answer of the module file `module` to args; env (default: this process's) with the collection on
    PYTHONPATH."""
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=check, _ansible_tmpdir=str(tmp_path))}
    (tmp_path / 'args.json').write_text(json.dumps(payload))
    env = dict(os.environ if env is None else env)
    env['PYTHONPATH'] = os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')])
    proc = subprocess.run([sys.executable, module, str(tmp_path / 'args.json')], capture_output=True,
                          text=True, env=env, check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))
