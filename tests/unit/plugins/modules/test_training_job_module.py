"""The training_job module run as Ansible runs it (a subprocess reading a JSON args file), with a
stand-in torchrun: start, status, stop, the secret kept out of results, bad input refused."""

import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'training_job.py')
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')
SECRET = 'wandb-S3cret-value'


def run(tmp_path, **args):
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, _ansible_tmpdir=str(tmp_path))}
    args_file = tmp_path / 'args.json'
    args_file.write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, MODULE, str(args_file)], capture_output=True, text=True, env=env,
                          check=False)
    try:
        return json.loads(proc.stdout), proc.stdout
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))


@pytest.fixture
def base(tmp_path):
    env = tmp_path / 'env' / 'bin'
    env.mkdir(parents=True)
    # python stand-in: answers the versions probe as an environment with torch and DeepSpeed does
    (env / 'python').write_text('#!/bin/bash\necho \'GPUCLUSTER_ENV_VERSIONS {"torch": "2.13.0+cpu", '
                                '"deepspeed": "0.19.8", "python": "3.11.2"}\'\n')
    (env / 'python').chmod(0o755)
    # torchrun stand-in: prints a step line with the job's token length, then sleeps like a rank
    (env / 'torchrun').write_text('#!/bin/bash\necho "args: $*"\necho "step 0 loss 1.0 token ${#WANDB_API_KEY}"\n'
                                  'exec sleep 120\n')
    (env / 'torchrun').chmod(0o755)
    (tmp_path / 'train.py').write_text('print(1)\n')
    return dict(job_id='unit-%d' % os.getpid(), launcher='torchrun', node='solo',
                nodes=[{'name': 'solo', 'address': '127.0.0.1', 'slots': 2}], script=str(tmp_path / 'train.py'),
                env_path=str(tmp_path / 'env'), env={'WANDB_API_KEY': SECRET}, env_files=[],
                master_addr='127.0.0.1', master_port=0, job_dir=str(tmp_path / 'jobs' / 'j'),
                state_dir=str(tmp_path / 'state'))


def test_start_status_stop_of_a_torchrun_job_and_no_secret_in_any_result(tmp_path, base):
    started, raw = run(tmp_path, state='started', **base)
    try:
        assert started.get('failed') is not True, started.get('msg')
        assert started['changed'] is True and started['world_size'] == 2 and started['ranks'] == [0, 1]
        assert '--nproc-per-node 2' in started['command']
        assert SECRET not in raw
        env_file = tmp_path / 'jobs' / 'j' / 'job.env'
        assert os.stat(str(env_file)).st_mode & 0o777 == 0o600
        log = tmp_path / 'jobs' / 'j' / 'logs' / 'solo.log'
        deadline = time.time() + 20
        while time.time() < deadline and 'step 0' not in (log.read_text() if log.exists() else ''):
            time.sleep(0.2)
        # the agent saw the token (from job.env), which never appeared in what the module returned
        assert 'token %d' % len(SECRET) in log.read_text()
        watched, raw = run(tmp_path, state='first_step', watch_timeout=20, **base)
        assert watched['first_step'] == 'step 0 loss' and watched['failures'] == []
        status, raw = run(tmp_path, state='status', **base)
        assert status['running'] is True and status['pids'] and SECRET not in raw
    finally:
        stopped, raw = run(tmp_path, state='stopped', stop_timeout=5, **base)
    assert stopped['changed'] is True and stopped['stopped_pids'], stopped
    status, _ = run(tmp_path, state='status', **base)
    assert status['running'] is False


def test_bad_input_is_refused_naming_the_node_and_option(tmp_path, base):
    out, _ = run(tmp_path, state='started', **dict(base, launcher='slurm', slurm_time='1:00\n#SBATCH --uid=0'))
    assert out['failed'] is True and out['msg'].startswith('node solo: slurm_time')
    out, _ = run(tmp_path, state='started', **dict(base, node='other'))
    assert out['failed'] is True and out['msg'] == 'node other is not in nodes (solo)'
    out, _ = run(tmp_path, state='first_step', **dict(base, node='w', nodes=base['nodes'] + [
        {'name': 'w', 'address': '127.0.0.2', 'slots': 1}]))
    assert out['failed'] is True and 'runs on the head (solo) only' in out['msg']


def test_checked_shows_versions_unmasked_and_only_what_the_launcher_compares_with_the_secret_masked(tmp_path, base):
    """DS_ACCELERATOR=cpu must not turn 2.13.0+cpu into 2.13.0+********; the token stays out."""
    args = dict(base, env={'DS_ACCELERATOR': 'cpu', 'WANDB_API_KEY': SECRET})
    out, raw = run(tmp_path, state='checked', **args)
    assert out.get('failed') is not True, out.get('msg')
    assert out['versions'] == {'python': '3.11.2', 'torch': '2.13.0+cpu', 'torch_cuda': None, 'torch_nccl': None,
                               'nccl_wheel': None}
    assert '********' not in json.dumps(out['versions']) and SECRET not in raw
    assert out['invocation']['module_args']['env']['DS_ACCELERATOR'] == 'cpu'
    assert out['invocation']['module_args']['env']['WANDB_API_KEY'] == 'VALUE_SPECIFIED_IN_NO_LOG_PARAMETER'
