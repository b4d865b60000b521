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
        assert watched['first_step'] == 'step 0 loss 1.0 token %d' % len(SECRET) and watched['failures'] == []
        status, raw = run(tmp_path, state='status', **base)
        assert status['running'] is True and status['pids'] and SECRET not in raw
    finally:
        stopped, raw = run(tmp_path, state='stopped', stop_timeout=5, **base)
    assert stopped['changed'] is True and stopped['stopped_pids'], stopped
    status, _ = run(tmp_path, state='status', **base)
    assert status['running'] is False


def test_status_on_a_node_without_the_job_directory_fails_naming_it_never_stopped(tmp_path, base):
    # the shared storage of the jobs is not mounted on this node: its state cannot be read
    out, _ = run(tmp_path, state='status', **base)
    assert out['failed'] is True and 'running' not in out
    assert out['msg'] == ('node solo: the job directory %s does not exist here (is the shared storage of '
                          'training_jobs_dir mounted?)' % base['job_dir'])


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


class _Spec(Exception):
    """Raised by the stand-in AnsibleModule with the argument spec the module really takes."""


def _real_options(monkeypatch):
    from ansible_collections.gpucluster.multinode.plugins.modules import training_job

    def capture(argument_spec, **_kwargs):
        raise _Spec(argument_spec)

    monkeypatch.setattr(training_job, 'AnsibleModule', capture)
    with pytest.raises(_Spec) as caught:
        training_job.main()
    return training_job, caught.value.args[0]


def _filters():
    """Every filter of the collection, by its full name."""
    import glob
    import importlib
    found = {}
    for path in glob.glob(os.path.join(ROOT, 'plugins', 'filter', '*.py')):
        plugin = importlib.import_module('ansible_collections.gpucluster.multinode.plugins.filter.'
                                         + os.path.basename(path)[:-3])
        found.update(('gpucluster.multinode.' + k, v) for k, v in plugin.FilterModule().filters().items())
    return found


def _variables(value, env):
    """The variables a task's value reads in its templates (a filter it names must exist; lookups are
    no variables)."""
    from jinja2 import meta
    if isinstance(value, dict):
        return set().union(set(), *[_variables(v, env) for v in value.values()])
    if isinstance(value, list):
        return set().union(set(), *[_variables(v, env) for v in value])
    if not isinstance(value, str) or '{{' not in value:
        return set()
    return meta.find_undeclared_variables(env.parse(value)) - {'lookup', 'query'}


def _expanded(task, option):
    """An option's value with a bare '{{ name }}' of the task's vars replaced by what vars gives it."""
    value = task['gpucluster.multinode.training_job'][option]
    name = value.strip('{} ') if isinstance(value, str) else None
    return (task.get('vars') or {}).get(name, value)


def test_the_examples_use_real_options_and_define_every_variable_they_read(monkeypatch):
    import jinja2
    import yaml
    module, spec = _real_options(monkeypatch)
    env = jinja2.Environment()
    env.filters.update(_filters())
    examples = yaml.safe_load(module.EXAMPLES)
    assert examples, 'no examples'
    magic = {'inventory_hostname', 'groups', 'hostvars'}
    for task in examples:
        args = task['gpucluster.multinode.training_job']
        name = task['name']
        assert set(args) <= set(spec), (name, sorted(set(args) - set(spec)))
        assert [o for o, s in spec.items() if s.get('required') and o not in args] == [], name
        for option, value in args.items():
            if 'choices' in spec[option] and '{{' not in str(value):
                assert value in spec[option]['choices'], (name, option, value)
        defined = magic | set(task.get('vars') or {})
        assert _variables(args, env) <= defined, (name, sorted(_variables(args, env) - defined))
        assert _variables(task.get('vars') or {}, env) <= magic, name
        assert task.get('become_user'), (name, 'the job runs as the cluster user (notes)')
    # a stop names the job as its start did: the same id, launcher, nodes, head and directory
    start = next(t for t in examples if t['gpucluster.multinode.training_job'].get('state') == 'started')
    stops = [t for t in examples if t['gpucluster.multinode.training_job'].get('state') == 'stopped']
    assert stops
    for task in stops:
        for option in ('job_id', 'launcher', 'nodes', 'master_addr', 'job_dir', 'script', 'env_path'):
            assert _expanded(task, option) == _expanded(start, option), option
        assert task['become_user'] == start['become_user']


def test_the_job_id_rule_refuses_a_path():
    from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as training
    for good in ('tiny-001', 'a', 'train_tiny-20261127-101500', 'v1.2', 'x' * 64):
        assert training.is_job_id(good), good
    for bad in ('', '.', '..', '../x', 'a/b', '/abs', '.hidden', '-x', 'a b', 'x' * 65, 'tiny\n', 7, None):
        assert not training.is_job_id(bad), bad
