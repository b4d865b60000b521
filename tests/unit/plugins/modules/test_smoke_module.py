"""smoke run as Ansible runs it on a worker, with a stand-in for the environment's python that prints what
roles/cluster_tests/files/smoke.py prints (its result line) and records the command line it was given."""

from __future__ import annotations

import json
import os
import sys
import textwrap

from module_run import run_module

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'smoke.py')
MARKER = 'GPUCLUSTER_DIST_CHECK '
NODES = ['gpu-master', 'gpu-worker-1', 'gpu-worker-2']

# prints cfg['stdout'] and cfg['stderr'], exits cfg['rc']
FAKE = textwrap.dedent('''\
    #!%(python)s
    import json, sys
    cfg = json.load(open(%(cfg)r))
    open(%(log)r, 'a').write(json.dumps(sys.argv[1:]) + '\\n')
    sys.stdout.write(cfg['stdout']); sys.stderr.write(cfg['stderr']); sys.exit(cfg['rc'])
''')


def make_python(tmp_path, stdout='', stderr='', rc=0):
    (tmp_path / 'cfg.json').write_text(json.dumps({'stdout': stdout, 'stderr': stderr, 'rc': rc}))
    fake = tmp_path / 'python'
    fake.write_text(FAKE % {'python': sys.executable, 'cfg': str(tmp_path / 'cfg.json'),
                            'log': str(tmp_path / 'calls.log')})
    fake.chmod(0o755)
    (tmp_path / 'smoke.py').write_text('# the script the role copies; the stand-in python does not read it\n')
    return str(fake)


def result_line(**result):
    return MARKER + json.dumps(result, sort_keys=True) + '\n'


def run(tmp_path, check=False, **args):
    args = dict({'node': 'gpu-worker-1', 'nodes': NODES, 'slots': [1, 2, 1], 'address': '10.0.0.11',
                 'master_addr': '10.0.0.10', 'master_port': 29500, 'python': str(tmp_path / 'python'),
                 'script': str(tmp_path / 'smoke.py'), 'timeout': 60, 'env_files': []}, **args)
    env = {k: v for k, v in os.environ.items() if k not in ('GLOO_SOCKET_IFNAME', 'NCCL_SOCKET_IFNAME')}
    return run_module(MODULE, tmp_path, args, check=check, env=env)


def calls(tmp_path):
    path = tmp_path / 'calls.log'
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_worker_that_joined_and_summed_right_is_ok(tmp_path):
    make_python(tmp_path, stdout='rank 1 joined\n' + result_line(
        node='gpu-worker-1', rank=1, world_size=4, backend='gloo', stage='done', ok=True, cause=None, error=None,
        joined_store=True, sum=10.0, expected=10.0))
    out = run(tmp_path)
    assert out.get('failed') is not True, out
    assert out['changed'] is False
    assert out['ok'] is True and out['stage'] == 'done'
    assert (out['sum'], out['expected']) == (10.0, 10.0)
    # ranks are numbered node by node: the head has rank 0, this worker ranks 1 and 2 of 4
    assert (out['rank'], out['slots'], out['world_size']) == (1, 2, 4)
    assert out['rendezvous'] == '10.0.0.10:29500'
    assert out['node'] == 'gpu-worker-1'
    [argv] = calls(tmp_path)
    assert argv == [str(tmp_path / 'smoke.py'), '--nodes', json.dumps(NODES), '--slots', '[1, 2, 1]',
                    '--node-index', '1', '--master-addr', '10.0.0.10', '--master-port', '29500',
                    '--backend', 'gloo', '--timeout', '60']


def test_a_worker_that_could_not_reach_the_head_says_where_it_stopped_and_why(tmp_path):
    make_python(tmp_path, rc=1, stdout=result_line(
        node='gpu-worker-1', rank=1, world_size=4, backend='gloo', stage='connect', ok=False,
        cause='port closed (nothing listens on 10.0.0.10:29500, or a firewall rejects it)',
        error='[Errno 111] Connection refused', joined_store=False))
    out = run(tmp_path)
    assert out.get('failed') is not True, out       # a failed check is a result, not a module failure
    assert out['ok'] is False and out['stage'] == 'connect'
    assert out['cause'] == 'port closed (nothing listens on 10.0.0.10:29500, or a firewall rejects it)'
    assert out['error'] == '[Errno 111] Connection refused'
    assert MARKER in out['output']


def test_a_script_that_died_before_its_result_gives_the_exit_and_the_last_lines(tmp_path):
    make_python(tmp_path, rc=1, stderr='Traceback (most recent call last):\n  File "smoke.py", line 240, in main\n'
                                       '    import torch\nModuleNotFoundError: No module named \'torch\'\n')
    out = run(tmp_path)
    assert out.get('failed') is not True, out
    assert out['ok'] is False and out['stage'] == 'start'
    assert out['cause'] == 'the check did not run (exit 1)'
    assert out['error'].endswith("ModuleNotFoundError: No module named 'torch'")
    assert out['node'] == 'gpu-worker-1'


def test_a_node_not_in_nodes_fails_naming_the_host(tmp_path):
    make_python(tmp_path)
    out = run(tmp_path, node='gpu-worker-9', slots=None)
    assert out['failed'] is True
    assert out['msg'] == 'host gpu-worker-9: node gpu-worker-9 is not in nodes (gpu-master, gpu-worker-1, gpu-worker-2)'
    assert calls(tmp_path) == []


def test_an_environment_without_python_fails_naming_the_host_and_the_path(tmp_path):
    make_python(tmp_path)
    out = run(tmp_path, python=str(tmp_path / 'env' / 'bin' / 'python'))
    assert out['failed'] is True
    assert out['msg'] == ('host gpu-worker-1: python %s does not exist; install torch first (the python_env role)'
                          % (tmp_path / 'env' / 'bin' / 'python'))


def test_check_mode_runs_nothing(tmp_path):
    make_python(tmp_path)
    out = run(tmp_path, check=True)
    assert out.get('failed') is not True, out
    assert out['ok'] is True and out['stage'] == 'skipped'
    assert calls(tmp_path) == []
