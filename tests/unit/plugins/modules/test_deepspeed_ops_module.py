"""deepspeed_ops run as Ansible runs it, against a stand-in interpreter that answers with the probe
lines recorded on a CPU node (fixtures/deepspeed_ops) and "builds" by creating the op's .so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')
FIXTURES = os.path.join(ROOT, 'tests', 'unit', 'fixtures', 'deepspeed_ops')

FAKE = textwrap.dedent('''\
    #!%(python)s
    import json, os, sys
    state = json.load(open(%(state)r))
    mode, wanted = sys.argv[3], json.loads(sys.argv[4])
    open(%(log)r, 'a').write(mode + ' ' + os.environ.get('DS_ACCELERATOR', '-') + '\\n')
    if state.get('broken'):
        print("ModuleNotFoundError: No module named 'deepspeed'")
        sys.exit(1)
    so = os.path.join(%(ext)r, 'deepspeed_shm_comm', 'deepspeed_shm_comm.so')
    if mode == 'build':
        os.makedirs(os.path.dirname(so), exist_ok=True)
        open(so, 'w').close()
        name = 'cpu-build.txt'
    else:
        name = 'cpu-probe-built.txt' if os.path.exists(so) else 'cpu-probe-not-built.txt'
    line = [l for l in open(os.path.join(%(fixtures)r, name)) if l.startswith('GPUCLUSTER_DS_OPS ')][-1]
    info = json.loads(line.split(' ', 1)[1])
    info['extensions_dir'] = %(ext)r
    info['deepspeed'] = state.get('deepspeed', info['deepspeed'])
    if 'cpu' not in wanted:
        info['ops'] = []
    print('GPUCLUSTER_DS_OPS ' + json.dumps(info))
''')


@pytest.fixture
def node(tmp_path):
    (tmp_path / 'state.json').write_text('{}')
    fake = tmp_path / 'python'
    fake.write_text(FAKE % {'python': sys.executable, 'state': str(tmp_path / 'state.json'),
                            'log': str(tmp_path / 'calls.log'), 'ext': str(tmp_path / 'ext'), 'fixtures': FIXTURES})
    fake.chmod(0o755)
    return tmp_path


def run(tmp_path, check=False, **args):
    args.setdefault('ops', {'cpu': ['ShareMemCommBuilder'], 'cuda': []})
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, python=str(tmp_path / 'python'), _ansible_check_mode=check,
                                           _ansible_tmpdir=str(tmp_path))}
    (tmp_path / 'args.json').write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'plugins', 'modules', 'deepspeed_ops.py'),
                           str(tmp_path / 'args.json')], capture_output=True, text=True, env=env, check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))


def calls(tmp_path):
    return (tmp_path / 'calls.log').read_text().split('\n')[:-1]


def stamp(tmp_path):
    return json.loads((tmp_path / 'ext' / 'gpucluster-deepspeed-ops.json').read_text())


def test_builds_once_records_the_versions_and_the_seconds_then_builds_nothing(node):
    first = run(node, environ={'DS_ACCELERATOR': 'cpu'})
    assert first['changed'] is True and first['built'] == ['deepspeed_shm_comm'], first
    assert first['build_seconds'] > 0 and first['job_builds'] == []
    assert stamp(node)['key'] == {'python': '3.11.7', 'torch': '2.13.0+cpu', 'deepspeed': '0.19.8', 'accelerator': 'cpu'}
    assert calls(node) == ['probe cpu', 'build cpu']
    again = run(node, environ={'DS_ACCELERATOR': 'cpu'})
    assert again['changed'] is False and again['built'] == [], again
    assert calls(node)[2:] == ['probe cpu']
    checked = run(node, state='checked')
    assert checked['job_builds'] == [] and 'no build before step 1' in checked['msg']


def test_check_mode_and_state_checked_build_nothing(node):
    out = run(node, check=True)
    assert out['changed'] is True and out['built'] == ['deepspeed_shm_comm']
    checked = run(node, state='checked')
    assert checked['changed'] is False and checked['job_builds'] == ['deepspeed_shm_comm']
    assert 'no build recorded here' in checked['msg']
    assert 'build' not in ' '.join(calls(node)).replace('probe', '')
    assert not (node / 'ext').exists()


def test_a_deepspeed_upgrade_rebuilds_and_the_preflight_quotes_the_last_build(node):
    seconds = run(node)['build_seconds']
    (node / 'state.json').write_text(json.dumps({'deepspeed': '0.19.9'}))
    checked = run(node, state='checked')
    assert checked['job_builds'] == ['deepspeed_shm_comm']
    assert 'the last build here took %.0f s' % seconds in checked['msg']
    rebuilt = run(node)
    assert rebuilt['changed'] is True and stamp(node)['key']['deepspeed'] == '0.19.9'


def test_an_environment_without_deepspeed_is_named(node):
    (node / 'state.json').write_text(json.dumps({'broken': True}))
    out = run(node)
    assert out['failed'] is True and 'cannot import torch and deepspeed' in out['msg']
    assert "No module named 'deepspeed'" in out['stderr_tail']


def test_no_ops_for_the_accelerator_builds_nothing(node):
    out = run(node, ops={'cuda': ['FusedAdamBuilder']})
    assert out['changed'] is False and out['built'] == []
    assert out['msg'] == 'no DeepSpeed op to build for accelerator cpu'
