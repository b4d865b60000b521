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
    deepspeed = state.get('deepspeed', '0.19.8')
    if mode == 'stamp':
        # The real file-only read, over a site directory holding the packages' metadata only.
        site = os.path.join(os.path.dirname(%(state)r), 'site')
        os.makedirs(os.path.join(site, 'torch'), exist_ok=True)
        open(os.path.join(site, 'torch', '__init__.py'), 'w').close()
        open(os.path.join(site, 'torch', 'version.py'), 'w').write("cuda: Optional[str] = None\\nhip = None\\n")
        dists = {'torch': '2.13.0+cpu'}
        if not state.get('broken'):
            dists['deepspeed'] = deepspeed
        for name in os.listdir(site):
            if name.endswith('.dist-info'):
                for f in os.listdir(os.path.join(site, name)):
                    os.remove(os.path.join(site, name, f))
                os.rmdir(os.path.join(site, name))
        for name, version in dists.items():
            meta = os.path.join(site, '%%s-%%s.dist-info' %% (name, version))
            os.makedirs(meta)
            open(os.path.join(meta, 'METADATA'), 'w').write('Name: %%s\\nVersion: %%s\\n' %% (name, version))
        sys.path.insert(0, site)
        os.environ['TORCH_EXTENSIONS_DIR'] = %(ext)r
        script, sys.argv = sys.argv[2], ['-c'] + sys.argv[3:]
        exec(compile(script, '<stamp>', 'exec'))
        sys.exit(0)
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
    info['deepspeed'] = deepspeed
    info['dist'] = {'python': '%%d.%%d.%%d' %% sys.version_info[:3], 'torch': info['torch'], 'deepspeed': deepspeed}
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
    assert calls(node) == ['stamp cpu', 'probe cpu', 'build cpu']
    # a converged run and the training preflight read files only: torch and DeepSpeed are not imported
    again = run(node, environ={'DS_ACCELERATOR': 'cpu'})
    assert again['changed'] is False and again['built'] == [] and again['read'] == 'files', again
    assert calls(node)[3:] == ['stamp cpu']
    checked = run(node, state='checked')
    assert checked['job_builds'] == [] and 'no build before step 1' in checked['msg']
    assert checked['read'] == 'files' and calls(node)[4:] == ['stamp -']
    # DS_ACCELERATOR naming another accelerator than the recorded build sends the run to the probe
    run(node, environ={'DS_ACCELERATOR': 'cuda'})
    assert calls(node)[5:7] == ['stamp cuda', 'probe cuda']


def test_a_deleted_op_is_seen_from_the_files_and_rebuilt(node):
    run(node)
    os.remove(str(node / 'ext' / 'deepspeed_shm_comm' / 'deepspeed_shm_comm.so'))
    checked = run(node, state='checked')
    assert checked['job_builds'] == ['deepspeed_shm_comm'] and 'the job builds them before step 1' in checked['msg']
    again = run(node)
    assert again['changed'] is True and again['built'] == ['deepspeed_shm_comm']


def test_a_stamp_without_what_the_file_read_needs_is_completed_once(node):
    run(node)
    old = stamp(node)
    del old['dist']
    old['ops']['deepspeed_shm_comm'].pop('builder')
    (node / 'ext' / 'gpucluster-deepspeed-ops.json').write_text(json.dumps(old))
    first = run(node)
    assert first['changed'] is True and first['built'] == [] and first['read'] == 'probe', first
    assert stamp(node)['ops']['deepspeed_shm_comm']['builder'] == 'ShareMemCommBuilder'
    second = run(node)
    assert second['changed'] is False and second['read'] == 'files'


def test_check_mode_and_state_checked_build_nothing(node):
    out = run(node, check=True)
    assert out['changed'] is True and out['built'] == ['deepspeed_shm_comm']
    checked = run(node, state='checked')
    assert checked['changed'] is False and checked['job_builds'] is None
    assert 'no record of DeepSpeed ops built for this environment' in checked['msg']
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
    assert out['built'] == [] and out['msg'] == 'no DeepSpeed op to build for accelerator cpu'
    assert 'build cpu' not in calls(node)
    # recorded once, so that later runs read files only
    again = run(node, ops={'cuda': ['FusedAdamBuilder']})
    assert again['changed'] is False and again['read'] == 'files'
    assert again['msg'] == 'no DeepSpeed op to build for accelerator cpu'


def test_settings_given_as_plain_environ_reach_the_interpreter_and_are_not_masked(node):
    first = run(node, plain_environ={'DS_ACCELERATOR': 'cpu'})
    assert first['accelerator'] == 'cpu' and calls(node)[0] == 'stamp cpu'
    # the same value given as environ (where tokens go) is masked wherever it appears
    masked = run(node, environ={'DS_ACCELERATOR': 'cpu'})
    assert masked['accelerator'] != 'cpu'
