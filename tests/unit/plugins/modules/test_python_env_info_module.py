"""python_env_info run as Ansible runs it, with stand-in interpreters that print recorded probe output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')
FIX = os.path.join(ROOT, 'tests', 'unit', 'fixtures', 'python_env')


def run(tmp_path, **args):
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, _ansible_tmpdir=str(tmp_path))}
    args_file = tmp_path / 'args.json'
    args_file.write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'plugins', 'modules', 'python_env_info.py'),
                           str(args_file)], capture_output=True, text=True, env=env, check=False, timeout=120)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))


def interpreter(tmp_path, body):
    """An executable that stands for the environment's python: it ignores its arguments."""
    path = tmp_path / 'env' / 'bin' / 'python'
    path.parent.mkdir(parents=True)
    path.write_text('#!/bin/sh\n' + body)
    path.chmod(0o755)
    return str(path)


def replay(tmp_path, fixture, rc=0, need_env=''):
    check = '[ "$%s" = cpu ] || { echo "%s is not set" >&2; exit 1; }\n' % (need_env, need_env) if need_env else ''
    return interpreter(tmp_path, '%scat %s\nexit %d\n' % (check, os.path.join(FIX, fixture), rc))


def test_a_cpu_environment(tmp_path):
    python = replay(tmp_path, 'cpu-deepspeed-0.19.8.txt', need_env='DS_ACCELERATOR')
    res = run(tmp_path, python=python, environ={'DS_ACCELERATOR': 'cpu'})
    assert res.get('failed') is not True, res
    assert res['versions'] == {'python': '3.11.7', 'torch': '2.13.0+cpu', 'torch_cuda': None, 'torch_nccl': None,
                               'nccl_wheel': None, 'deepspeed': '0.19.8', 'ray': None}
    assert res['cuda_available'] is False and res['changed'] is False


def test_a_cuda_environment_reports_torch_s_nccl(tmp_path):
    res = run(tmp_path, python=replay(tmp_path, 'cuda-h100-torch-2.11.txt'))
    assert res['versions']['torch_cuda'] == '13.0' and res['versions']['torch_nccl'] == '2.28.9'
    assert res['cuda_available'] is True


def test_an_import_error_fails_naming_it(tmp_path):
    python = replay(tmp_path, 'no-torch.txt', rc=1)
    res = run(tmp_path, python=python)
    assert res['failed'] is True
    assert res['msg'] == "%s cannot import torch and deepspeed: ModuleNotFoundError: No module named 'torch'" % python


def test_a_hung_import_is_bounded(tmp_path):
    python = interpreter(tmp_path, 'sleep 60\n')
    start = time.time()
    res = run(tmp_path, python=python, timeout=2)
    assert time.time() - start < 20
    assert res['failed'] is True and res['msg'].endswith('did not answer within 2 s')


def test_a_missing_interpreter_and_a_bad_timeout(tmp_path):
    res = run(tmp_path, python=str(tmp_path / 'nope' / 'python'))
    assert res['failed'] is True and 'does not exist or is not executable' in res['msg']
    res = run(tmp_path, python=replay(tmp_path, 'cpu-deepspeed-0.19.8.txt'), timeout=0)
    assert res['failed'] is True and 'timeout must be a positive number' in res['msg']


def venv_on_disk(tmp_path, deepspeed='0.19.8'):
    """The environment's metadata on disk (pyvenv.cfg, site-packages/*.dist-info), as a venv has it."""
    env = tmp_path / 'env'
    site = env / 'lib' / 'python3.11' / 'site-packages'
    for old in site.glob('deepspeed-*.dist-info') if site.exists() else []:
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    for name, version in (('torch', '2.13.0+cpu'), ('deepspeed', deepspeed)):
        meta = site / ('%s-%s.dist-info' % (name, version))
        meta.mkdir(parents=True, exist_ok=True)
        (meta / 'METADATA').write_text('Name: %s\nVersion: %s\n' % (name, version))
    (env / 'pyvenv.cfg').write_text('home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.7\n')
    return site


def test_a_recorded_verification_answers_until_a_package_changes(tmp_path):
    python = interpreter(tmp_path, 'echo called >> %s\ncat %s\n' % (tmp_path / 'calls', os.path.join(
        FIX, 'cpu-deepspeed-0.19.8.txt')))
    venv_on_disk(tmp_path)
    record = tmp_path / 'verified.json'
    first = run(tmp_path, python=python, record=str(record))
    assert first['read'] == 'imports' and first['versions']['deepspeed'] == '0.19.8', first
    assert first['record']['key']['versions']['deepspeed'] == '0.19.8'
    record.write_text(json.dumps(first['record']))          # what the role writes
    calls = (tmp_path / 'calls').read_text().count('called')
    again = run(tmp_path, python=python, record=str(record))
    assert again['read'] == 'record' and again['versions'] == first['versions'] and again['cuda_available'] is False
    assert (tmp_path / 'calls').read_text().count('called') == calls, 'the record answered: nothing was imported'
    # another DeepSpeed installed: the record no longer holds, torch and DeepSpeed are imported again
    venv_on_disk(tmp_path, deepspeed='0.19.9')
    upgraded = run(tmp_path, python=python, record=str(record))
    assert upgraded['read'] == 'imports' and upgraded['record']['key']['versions']['deepspeed'] == '0.19.9'
    # a package added by hand (any distribution, not only torch and DeepSpeed) means an import
    record.write_text(json.dumps(upgraded['record']))
    extra = tmp_path / 'env' / 'lib' / 'python3.11' / 'site-packages' / 'einops-0.8.1.dist-info'
    extra.mkdir()
    (extra / 'METADATA').write_text('Name: einops\nVersion: 0.8.1\n')
    added = run(tmp_path, python=python, record=str(record))
    assert added['read'] == 'imports' and added['record']['key']['distributions'] != upgraded['record']['key']['distributions']
    # a variable added to the import's environment also means an import
    record.write_text(json.dumps(added['record']))
    assert run(tmp_path, python=python, record=str(record), environ={'DS_ACCELERATOR': 'cpu'})['read'] == 'imports'


def test_requirements_already_satisfied_are_told_without_an_import(tmp_path):
    site = venv_on_disk(tmp_path)
    python = interpreter(tmp_path, 'PYTHONPATH=%s exec %s "$@"\n' % (site, sys.executable))
    res = run(tmp_path, python=python, imports=False,
              requirements=['torch==2.13.0', 'deepspeed==0.19.8', 'deepspeed==0.19.9', 'no-such-package',
                            'git+https://example.com/x.git'])
    assert res.get('failed') is not True, res
    assert res['read'] == 'metadata' and res['cuda_available'] is None
    assert res['unsatisfied'] == ['deepspeed==0.19.9', 'no-such-package', 'git+https://example.com/x.git']
    assert res['versions']['torch'] == '2.13.0+cpu'
    # no environment yet: everything is to install, nothing fails
    res = run(tmp_path, python=str(tmp_path / 'none' / 'python'), imports=False, requirements=['torch==2.13.0'])
    assert res.get('failed') is not True and res['unsatisfied'] == ['torch==2.13.0']


def test_a_dependency_removed_by_hand_leaves_its_requirement_unsatisfied(tmp_path):
    site = venv_on_disk(tmp_path)
    meta = site / 'deepspeed-0.19.8.dist-info' / 'METADATA'
    meta.write_text(meta.read_text() + 'Requires-Dist: hjson\nRequires-Dist: pywin32; sys_platform == "win32"\n')
    python = interpreter(tmp_path, 'PYTHONPATH=%s exec %s "$@"\n' % (site, sys.executable))
    res = run(tmp_path, python=python, imports=False, requirements=['torch==2.13.0', 'deepspeed==0.19.8'])
    assert res['unsatisfied'] == ['deepspeed==0.19.8'], res
    hjson = site / 'hjson-3.1.0.dist-info'
    hjson.mkdir()
    (hjson / 'METADATA').write_text('Name: hjson\nVersion: 3.1.0\n')
    res = run(tmp_path, python=python, imports=False, requirements=['torch==2.13.0', 'deepspeed==0.19.8'])
    assert res['unsatisfied'] == []


def _site_yml_run(tmp_path, python, record, steps):
    """One site.yml run as the record sees it: each step that verifies reads the record, and writes
    what the module returns after an import (verify.yml's copy); returns (step, read, written)."""
    out = []
    for step in steps:
        if step == 'ray installs Ray':
            ray = tmp_path / 'env' / 'lib' / 'python3.11' / 'site-packages' / 'ray-2.60.0.dist-info'
            if not ray.exists():
                ray.mkdir()
                (ray / 'METADATA').write_text('Name: ray\nVersion: 2.60.0\n')
            continue
        result = run(tmp_path, python=python, record=str(record))
        written = False
        if result['read'] == 'imports':
            content = json.dumps(result['record'])
            written = not record.exists() or record.read_text() != content
            record.write_text(content)
        out.append((step, result['read'], written))
    return out


def test_ray_installed_after_the_verification_leaves_the_second_site_run_unchanged(tmp_path):
    """With ray_enabled, site.yml's ray step installs Ray into python_env's environment after python_env
    recorded its verification. Every installed distribution counts in the record, so without the ray
    step verifying again the second run found the record stale on every node and rewrote it (changed=1
    each); with it, the second run reads the record in both steps and writes nothing."""
    python = interpreter(tmp_path, 'cat %s\n' % os.path.join(FIX, 'cpu-deepspeed-0.19.8.txt'))
    venv_on_disk(tmp_path)
    record = tmp_path / 'verified.json'
    # before: python_env verifies, Ray is installed, and nothing refreshes the record
    assert [r[1:] for r in _site_yml_run(tmp_path, python, record, ['python_env', 'ray installs Ray'])] == [('imports', True)]
    assert _site_yml_run(tmp_path, python, record, ['python_env']) == [('python_env', 'imports', True)], \
        'Ray in the environment makes the record stale: the second run rewrote it (the reported non-idempotence)'
    # now: the ray step verifies again after its install (roles/ray/tasks/started.yml)
    fresh = tmp_path / 'fresh'
    fresh.mkdir()
    python = interpreter(fresh, 'cat %s\n' % os.path.join(FIX, 'cpu-deepspeed-0.19.8.txt'))
    venv_on_disk(fresh)
    record = fresh / 'verified.json'
    steps = ['python_env', 'ray installs Ray', 'ray verifies again']
    assert _site_yml_run(fresh, python, record, steps) == [('python_env', 'imports', True), ('ray verifies again', 'imports', True)]
    assert _site_yml_run(fresh, python, record, steps) == [('python_env', 'record', False), ('ray verifies again', 'record', False)]


def test_the_ray_step_verifies_python_env_again_after_installing_ray():
    import yaml
    with open(os.path.join(ROOT, 'roles', 'ray', 'tasks', 'started.yml')) as handle:
        tasks = yaml.safe_load(handle)
    names = [t['name'] for t in tasks]
    install = next(i for i, n in enumerate(names) if n.startswith('Install in the environment Ray'))
    verify = [i for i, t in enumerate(tasks)
              if (t.get('ansible.builtin.include_role') or {}).get('name') == 'gpucluster.multinode.python_env'
              and t['ansible.builtin.include_role'].get('tasks_from') == 'verify']
    assert len(verify) == 1 and verify[0] > install, names
