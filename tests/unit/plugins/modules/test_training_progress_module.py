"""training_progress run as Ansible runs it, on a real process of a job and recorded progress files,
with an nvidia-smi stand-in that answers the recorded H100 query (and without one)."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'training_progress.py')
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')
FIX = os.path.join(ROOT, 'tests', 'unit', 'fixtures')
H100_QUERY = os.path.join(FIX, 'nvidia_smi', 'h100-sxm-x1-driver580', 'query-gpu.csv')

FAKE_SMI = textwrap.dedent('''\
    #!%s
    import sys
    if sys.argv[1:2] and sys.argv[1].startswith('--query-gpu='):
        sys.stdout.write(open(%r).read()); sys.exit(0)
    sys.exit(2)
''')


def run(tmp_path, check=False, **args):
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=check, _ansible_tmpdir=str(tmp_path))}
    (tmp_path / 'args.json').write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, MODULE, str(tmp_path / 'args.json')], capture_output=True, text=True,
                          env=env, check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))


@pytest.fixture
def job(tmp_path):
    """A job directory with the recorded progress of ranks 0-2 (rank 0 from this host, 1-2 from
    another) and a running process of the job that carries RANK=0."""
    job_dir = tmp_path / 'job'
    (job_dir / 'progress').mkdir(parents=True)
    for rank in (0, 1, 2):
        with open(os.path.join(FIX, 'job_monitor', 'slow-rank-2', 'rank-%d.log' % rank)) as handle:
            text = handle.read()
        host = socket.gethostname() if rank == 0 else 'another-node'
        text = text.replace(text.splitlines()[0], '# gpucluster-progress rank=%d host=%s pid=1 world=3' % (rank, host))
        (job_dir / 'progress' / ('rank-%d.log' % rank)).write_text(text.replace('# done', '# note'))
    env = dict(os.environ, GPUCLUSTER_JOB_ID='t-1', RANK='0', LOCAL_RANK='0')
    env.pop('CUDA_VISIBLE_DEVICES', None)
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env=env)
    yield job_dir, proc.pid
    proc.kill()
    proc.wait()


def test_a_rank_of_this_node_with_its_gpu_and_a_textfile(tmp_path, job):
    job_dir, pid = job
    smi = tmp_path / 'nvidia-smi'
    smi.write_text(FAKE_SMI % (sys.executable, H100_QUERY))
    smi.chmod(0o755)
    prom = tmp_path / 'training.prom'
    out = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(job_dir), sample_seconds=0.2,
              nvidia_smi=str(smi), textfile=str(prom), logs=True, log_lines=2)
    assert out.get('failed') is not True, out
    assert [r['rank'] for r in out['ranks']] == [0]  # ranks 1 and 2 ran on another node
    row = out['ranks'][0]
    assert row['alive'] and row['pid'] == pid and row['state'] in ('S', 'R')
    assert row['last_step'] == 60 and row['rss_kib'] > 1000 and isinstance(row['cpu_pct'], float)
    assert row['gpu']['index'] == 0 and row['gpu']['memory_total_mib'] == 81559 and out['gpu_note'] == ''
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    assert families['gpucluster_training_rank_step'].samples[0].labels == {'job_id': 't-1', 'node': 'node-a', 'rank': '0'}
    assert families['gpucluster_training_rank_gpu_memory_used_bytes'].samples[0].labels['gpu'] == '0'
    tails = out['log_tails']
    rank0 = tails[str(job_dir / 'progress' / 'rank-0.log')]
    assert len(rank0) == 2 and rank0[0].startswith('step=60 ') and rank0[1].startswith('# note')


def test_without_nvidia_smi_it_says_so_and_a_missing_job_dir_is_named(tmp_path, job):
    job_dir, _pid = job
    out = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(job_dir), sample_seconds=0,
              nvidia_smi=str(tmp_path / 'no-nvidia-smi'))
    assert out['gpu_note'] == 'no GPU: nvidia-smi not found'
    assert out['ranks'][0]['gpu'] is None and out['ranks'][0]['cpu_pct'] is None
    out = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(tmp_path / 'nowhere'))
    assert out['failed'] and 'node node-a: job_dir' in out['msg'] and 'nowhere' in out['msg']


def test_a_rank_whose_process_ended_is_reported_exited(tmp_path, job):
    job_dir, _pid = job
    out = run(tmp_path, job_id='other-job', node='node-a', job_dir=str(job_dir), sample_seconds=0)
    assert [(r['rank'], r['alive'], r['exit']) for r in out['ranks']] == [(0, False, 'exited')]


def test_the_textfile_is_removed_once_no_rank_runs_here(tmp_path, job):
    job_dir, pid = job
    prom = tmp_path / 'training.prom'
    out = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(job_dir), sample_seconds=0, textfile=str(prom))
    assert out['textfile'] == str(prom) and prom.exists()
    # the rank's process still runs: a check-mode read changes nothing, and the file stays
    out = run(tmp_path, check=True, job_id='t-1', node='node-a', job_dir=str(job_dir), sample_seconds=0,
              textfile=str(prom))
    assert prom.exists()
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    out = run(tmp_path, check=True, job_id='t-1', node='node-a', job_dir=str(job_dir), sample_seconds=0,
              textfile=str(prom))
    assert out['changed'] and prom.exists()  # check mode: it would be removed
    out = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(job_dir), sample_seconds=0, textfile=str(prom))
    assert [(r['rank'], r['alive']) for r in out['ranks']] == [(0, False)]
    assert out['changed'] and out['textfile_removed'] == str(prom) and not prom.exists()
    out = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(job_dir), sample_seconds=0, textfile=str(prom))
    assert not out['changed'] and out['textfile_removed'] == '' and not prom.exists()


def test_the_flight_recorder_dumps_of_the_job_are_read(tmp_path, job):
    job_dir, _pid = job
    out = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(job_dir), sample_seconds=0)
    assert out['flight'] == {}
    (job_dir / 'flight').mkdir()
    for rank in (0, 1):
        src = os.path.join(FIX, 'flight', 'gloo-rank1-stopped', 'rank_%d' % rank)
        (job_dir / 'flight' / ('rank_%d' % rank)).write_bytes(open(src, 'rb').read())
    out = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(job_dir), sample_seconds=0)
    assert out['flight']['not_entered'] == [1]
    assert out['flight']['lines'][0].startswith('process group 0: rank(s) 0 wait in gloo:all_reduce #5')


def test_a_rank_without_a_progress_file_takes_its_steps_from_the_node_log(tmp_path):
    job_dir = tmp_path / 'job'
    (job_dir / 'logs').mkdir(parents=True)
    (job_dir / 'logs' / 'node-a.log').write_text('starting\nit 41 loss 0.5\nit 42 loss 0.4\ngpucluster-heartbeat phase=eval step=42\n')
    env = dict(os.environ, GPUCLUSTER_JOB_ID='t-log', RANK='0', LOCAL_RANK='0')
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env=env)
    try:
        out = run(tmp_path, job_id='t-log', node='node-a', job_dir=str(job_dir), sample_seconds=0,
                  step_regex=r'it (?P<step>\d+) loss (?P<loss>[0-9.]+)')
        assert out.get('failed') is not True, out
        row = out['ranks'][0]
        assert row['tracked'] == 'log' and row['last_step'] == 42 and row['last_loss'] == 0.4
        assert row['phase'] == 'eval' and row['started_at'] > 1e9 and row['seconds_since_start'] >= 0
        assert out['step_regex'].startswith('it ')
        out = run(tmp_path, job_id='t-log', node='node-a', job_dir=str(job_dir), sample_seconds=0, step_regex='')
        assert out['ranks'][0]['tracked'] is None
    finally:
        proc.kill()
        proc.wait()


def test_a_worker_whose_own_log_holds_no_step_takes_the_steps_of_the_jobs_logs(tmp_path):
    # a user's script that prints on rank 0 only (torchrun: the head's log has the steps, the worker's none),
    # and the deepspeed launcher's head log, where every node's lines come prefixed with the node's name
    job_dir = tmp_path / 'job'
    (job_dir / 'logs').mkdir(parents=True)
    (job_dir / 'logs' / 'node-a.log').write_text('[default0]:it 7 loss 0.5\n[default0]:it 8 loss 0.4\n')
    (job_dir / 'logs' / 'node-b.log').write_text('[W] a warning, no step\n')
    regex = r'it (?P<step>\d+) loss (?P<loss>[0-9.]+)'
    env = dict(os.environ, GPUCLUSTER_JOB_ID='t-w', RANK='1', LOCAL_RANK='0')
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env=env)
    try:
        row = run(tmp_path, job_id='t-w', node='node-b', job_dir=str(job_dir), sample_seconds=0,
                  step_regex=regex)['ranks'][0]
        assert row['tracked'] == 'log of node-a' and row['last_step'] == 8 and row['last_loss'] == 0.4
        (job_dir / 'logs' / 'node-a.log').write_text('node-a: it 9 loss 0.3\nnode-b: it 5 loss 0.9\n'
                                                     'node-a: it 10 loss 0.2\n')
        row = run(tmp_path, job_id='t-w', node='node-b', job_dir=str(job_dir), sample_seconds=0,
                  step_regex=regex)['ranks'][0]
        assert row['tracked'] == 'log of node-a' and row['last_step'] == 5   # its own lines in the head's log
    finally:
        proc.kill()
        proc.wait()


def test_an_ended_job_of_a_script_without_progress_files_still_says_its_last_step(tmp_path):
    # no rank runs any more (the job failed at its 8th iteration): no rank rows, but its last step from the logs
    from ansible_collections.gpucluster.multinode.plugins.filter.training_monitor import training_progress_view
    job_dir = tmp_path / 'job'
    (job_dir / 'logs').mkdir(parents=True)
    (job_dir / 'logs' / 'node-a.log').write_text(''.join('it %d loss 0.5\n' % i for i in range(1, 9)) + 'ValueError\n')
    regex = r'it (?P<step>\d+) loss (?P<loss>[0-9.]+)'
    out = run(tmp_path, job_id='t-ended', node='node-a', job_dir=str(job_dir), sample_seconds=0, step_regex=regex)
    assert out['ranks'] == [] and out['log_last_step'] == 8
    assert training_progress_view([out], ['node-a'], job_id='t-ended')['summary']['steps'] == 8
    # the pattern of another script finds no step: none is claimed
    out = run(tmp_path, job_id='t-ended', node='node-a', job_dir=str(job_dir), sample_seconds=0,
              step_regex='step [0-9]+ loss')
    assert out['log_last_step'] is None
    assert training_progress_view([out], ['node-a'], job_id='t-ended')['summary']['steps'] is None


def test_bad_window_and_regex_are_refused_naming_them(tmp_path, job):
    job_dir, _pid = job
    out = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(job_dir), window=0)
    assert out['failed'] and out['msg'] == 'node node-a: window must be above 0, got 0.0'
    out = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(job_dir), step_regex='step (')
    assert out['failed'] and 'step_regex' in out['msg'] and 'not a regular expression' in out['msg']


def test_training_jobs_status_with_progress_reads_the_figures_as_this_module_does_in_the_same_pass(tmp_path, job):
    """The supervisor's read: one task on every node (training_job state=status, progress=...) gives the
    state and the same figures as this module."""
    job_dir, pid = job
    (tmp_path / 'train.py').write_text('print(1)\n')
    (tmp_path / 'env' / 'bin').mkdir(parents=True)
    alone = run(tmp_path, job_id='t-1', node='node-a', job_dir=str(job_dir), sample_seconds=0, nvidia_smi='/nonexistent')
    args = {'ANSIBLE_MODULE_ARGS': {
        'state': 'status', 'job_id': 't-1', 'launcher': 'torchrun', 'node': 'node-a',
        'nodes': [{'name': 'node-a', 'address': '127.0.0.1', 'slots': 1}], 'script': str(tmp_path / 'train.py'),
        'env_path': str(tmp_path / 'env'), 'master_addr': '127.0.0.1', 'job_dir': str(job_dir),
        'state_dir': str(tmp_path / 'state'), 'progress': {'sample_seconds': 0, 'nvidia_smi': '/nonexistent'},
        '_ansible_tmpdir': str(tmp_path)}}
    (tmp_path / 'status.json').write_text(json.dumps(args))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'plugins', 'modules', 'training_job.py'),
                           str(tmp_path / 'status.json')], capture_output=True, text=True, env=env, check=False)
    status = json.loads(proc.stdout)
    assert status.get('failed') is not True, status
    assert 'running' in status and 'exit_code' in status  # the state, as a status without progress has it
    both = status['progress']
    assert [r['rank'] for r in both['ranks']] == [r['rank'] for r in alone['ranks']] == [0]
    for key in ('pid', 'alive', 'last_step', 'attempt', 'gpu'):
        assert both['ranks'][0].get(key) == alone['ranks'][0].get(key), key
    assert both['ranks'][0]['pid'] == pid and both['ranks'][0]['last_step'] == 60
    assert both['gpu_note'] == alone['gpu_note'] == 'no GPU: nvidia-smi not found'
