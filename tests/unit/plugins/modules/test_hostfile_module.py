"""The hostfile module run as Ansible runs it: a subprocess reading a JSON args file."""

import json
import os
import stat
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'hostfile.py')
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')

LAN = {
    'head': {'name': 'gpu-master', 'address': '192.168.1.100', 'gpus': 1},
    'workers': [
        {'name': 'gpu-worker-2', 'address': '192.168.1.102', 'gpus': 1},
        {'name': 'gpu-worker-1', 'address': '192.168.1.101', 'gpus': 1},
    ],
}


def run(tmp_path, check=False, diff=False, **args):
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=check, _ansible_diff=diff,
                                           _ansible_tmpdir=str(tmp_path))}
    args_file = tmp_path / 'args.json'
    args_file.write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, MODULE, str(args_file)], capture_output=True, text=True, env=env,
                          check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))


@pytest.fixture
def out(tmp_path):
    d = tmp_path / 'shared'
    d.mkdir()
    return d


def test_first_run_writes_second_run_changes_nothing(tmp_path, out):
    path = out / 'hostfile'
    first = run(tmp_path, path=str(path), mode='0640', **LAN)
    assert first.get('failed') is not True, first
    assert first['changed'] is True
    assert path.read_text() == 'gpu-master slots=1\ngpu-worker-1 slots=1\ngpu-worker-2 slots=1\n'
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert first['total_slots'] == 3
    assert [h['name'] for h in first['hosts']] == ['gpu-master', 'gpu-worker-1', 'gpu-worker-2']
    mtime = path.stat().st_mtime_ns
    second = run(tmp_path, path=str(path), mode='0640', **LAN)
    assert second['changed'] is False
    assert path.stat().st_mtime_ns == mtime
    assert [p.name for p in out.iterdir()] == ['hostfile'], 'a temporary file was left behind'


def test_mode_change_alone_is_a_change(tmp_path, out):
    path = out / 'hostfile'
    run(tmp_path, path=str(path), mode='0644', **LAN)
    res = run(tmp_path, path=str(path), mode='0600', **LAN)
    assert res['changed'] is True and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_check_mode_reports_the_change_and_writes_nothing(tmp_path, out):
    path = out / 'hostfile'
    res = run(tmp_path, check=True, path=str(path), **LAN)
    assert res['changed'] is True
    assert res['content'].startswith('gpu-master slots=1\n')
    assert not path.exists()
    path.write_text('old\n')
    res = run(tmp_path, check=True, path=str(path), format='mpich', **LAN)
    assert res['changed'] is True and path.read_text() == 'old\n'


def test_diff_shows_before_and_after(tmp_path, out):
    path = out / 'hostfile'
    path.write_text('gpu-master slots=1\n')
    res = run(tmp_path, diff=True, path=str(path), format='slurm', **LAN)
    assert res['diff']['before'] == 'gpu-master slots=1\n'
    assert res['diff']['after'] == 'gpu-master,gpu-worker-[1-2]\n'
    assert path.read_text() == 'gpu-master,gpu-worker-[1-2]\n'


def test_hosts_list_with_heterogeneous_slots_and_addresses(tmp_path, out):
    path = out / 'hostfile'
    hosts = [{'name': 'dc-node01', 'address': '10.0.0.1', 'gpus': 8},
             {'name': 'dc-node03', 'address': '10.0.0.3', 'gpus': 8, 'slots': 4},
             {'name': 'dc-node02', 'address': '10.0.0.2', 'gpus': 0}]
    res = run(tmp_path, path=str(path), hosts=hosts, format='openmpi', use_address=True, default_slots=2)
    assert path.read_text() == '10.0.0.1 slots=8\n10.0.0.2 slots=2\n10.0.0.3 slots=4\n'
    assert res['total_slots'] == 14


def test_exclude_of_an_unknown_host_fails_naming_it(tmp_path, out):
    path = out / 'hostfile'
    res = run(tmp_path, path=str(path), exclude=['gpu-worker-3'], **LAN)
    assert res['failed'] is True
    assert res['msg'].startswith('exclude names gpu-worker-3, which is not in the host list')
    assert not path.exists()


def test_negative_slots_fail_naming_host_and_option(tmp_path, out):
    res = run(tmp_path, path=str(out / 'hostfile'), head='gpu-master',
              workers=[{'name': 'gpu-worker-1', 'slots': -8}])
    assert res['failed'] is True
    assert res['msg'] == 'host gpu-worker-1: slots must be from 1 to 1024, got -8'


def test_missing_directory_is_reported(tmp_path):
    res = run(tmp_path, path=str(tmp_path / 'nope' / 'hostfile'), **LAN)
    assert res['failed'] is True and 'directory' in res['msg'] and 'does not exist' in res['msg']


def test_hosts_and_workers_are_exclusive(tmp_path, out):
    res = run(tmp_path, path=str(out / 'hostfile'), hosts=[{'name': 'a'}], head='a', workers=['b'])
    assert res['failed'] is True and 'mutually exclusive' in res['msg']


def test_each_format_of_the_guides(tmp_path, out):
    hosts = [{'name': 'gpu-master', 'address': '192.168.1.100', 'slots': 2, 'host': 'gpu-master'},
             {'name': 'gpu-worker-1', 'address': '192.168.1.101', 'slots': 1, 'host': 'gpu-worker-1'},
             {'name': 'gpu-worker-2', 'address': '192.168.1.102', 'slots': 1, 'host': 'gpu-worker-2'}]
    expected = {
        'deepspeed': 'gpu-master slots=2\ngpu-worker-1 slots=1\ngpu-worker-2 slots=1\n',
        'openmpi': 'gpu-master slots=2\ngpu-worker-1 slots=1\ngpu-worker-2 slots=1\n',
        'slurm': 'gpu-master,gpu-worker-[1-2]\n',
    }
    for fmt, text in expected.items():
        res = run(tmp_path, path=str(out / fmt), format=fmt, hosts=hosts)
        assert res.get('failed') is not True, res
        assert (out / fmt).read_text() == text
        assert stat.S_IMODE((out / fmt).stat().st_mode) == 0o644
    res = run(tmp_path, path=str(out / 'torchrun.txt'), format='torchrun', hosts=hosts, master_port=29511)
    lines = (out / 'torchrun.txt').read_text().splitlines()
    assert lines[0].startswith('# node address torchrun-options')
    # the header's command reads this very file: a by-hand launch copies it as it stands
    assert lines[0].endswith("'$1 == n {$1 = $2 = \"\"; print}' %s) train.py)" % (out / 'torchrun.txt'))
    assert lines[1:] == [
        'gpu-master 192.168.1.100 --nnodes=3 --node-rank=0 --nproc-per-node=2 --master-addr=192.168.1.100 --master-port=29511',
        'gpu-worker-1 192.168.1.101 --nnodes=3 --node-rank=1 --nproc-per-node=1 --master-addr=192.168.1.100 --master-port=29511',
        'gpu-worker-2 192.168.1.102 --nnodes=3 --node-rank=2 --nproc-per-node=1 --master-addr=192.168.1.100 --master-port=29511',
    ]
    assert res['total_slots'] == 4
    again = run(tmp_path, path=str(out / 'torchrun.txt'), format='torchrun', hosts=hosts, master_port=29511)
    assert again['changed'] is False


def test_a_torchrun_port_out_of_range_is_refused(tmp_path, out):
    res = run(tmp_path, path=str(out / 'torchrun.txt'), format='torchrun', master_port=70000, **LAN)
    assert res['failed'] is True and res['msg'] == 'master_port must be a port from 1 to 65535, got 70000'
    assert not (out / 'torchrun.txt').exists()


def test_the_owner_is_set(tmp_path, out):
    import pwd
    me = pwd.getpwuid(os.getuid()).pw_name
    path = out / 'hostfile'
    res = run(tmp_path, path=str(path), owner=me, **LAN)
    assert res['changed'] is True and path.stat().st_uid == os.getuid()
    assert run(tmp_path, path=str(path), owner=me, **LAN)['changed'] is False
    res = run(tmp_path, path=str(path), owner='no-such-account-here', **LAN)
    assert res['failed'] is True
