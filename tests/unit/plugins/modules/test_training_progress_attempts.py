"""training_progress run as Ansible runs it on a job the supervisor restarted with fewer ranks: the
progress file attempt 1 left behind, and a process of attempt 1 still hanging on, are no ranks of the
job; the module lists them as stale and the textfile's world size is attempt 2's."""

import os
import socket
import subprocess
import sys

from module_run import ROOT, run_module
from prometheus_client.parser import text_string_to_metric_families

MODULE = os.path.join(ROOT, 'plugins', 'modules', 'training_progress.py')


def header(rank, host, world, attempt):
    return '# gpucluster-progress rank=%d host=%s pid=1 world=%d attempt=%d time=1795600000.0\n' % (
        rank, host, world, attempt)


def test_the_old_attempt_s_file_and_process_are_stale_and_the_world_is_three(tmp_path):
    host = socket.gethostname()
    folder = tmp_path / 'job' / 'progress'
    folder.mkdir(parents=True)
    # attempt 1: 4 ranks, all on this host; attempt 2: 3 ranks, written over ranks 0-2
    for rank in range(4):
        (folder / ('rank-%d.log' % rank)).write_text(header(rank, host, 4, 1) + 'step=7 loss=0.5 time=1795600010.0\n')
    for rank in range(3):
        (folder / ('rank-%d.log' % rank)).write_text(header(rank, host, 3, 2) + 'step=8 loss=0.4 time=1795600020.0\n')
    procs = []
    for rank, attempt in ((0, 2), (3, 1)):
        env = dict(os.environ, GPUCLUSTER_JOB_ID='t-att', RANK=str(rank), LOCAL_RANK=str(rank),
                   GPUCLUSTER_ATTEMPT=str(attempt))
        procs.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env=env))
    prom = tmp_path / 'training.prom'
    try:
        out = run_module(MODULE, tmp_path, {'job_id': 't-att', 'node': 'node-a', 'job_dir': str(tmp_path / 'job'),
                                            'sample_seconds': 0, 'textfile': str(prom), 'nvidia_smi': '/nonexistent'})
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert out.get('failed') is not True, out
    assert out['attempt'] == 2
    assert [(r['rank'], r['alive'], r['attempt']) for r in out['ranks']] == [(0, True, 2), (1, False, 2), (2, False, 2)]
    assert out['ranks'][0]['pid'] == procs[0].pid
    assert out['stale'] == [{'rank': 3, 'attempt': 1, 'kind': 'process', 'pid': procs[1].pid, 'host': 'node-a'},
                            {'rank': 3, 'attempt': 1, 'kind': 'progress file', 'host': host}]
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    assert families['gpucluster_training_world_size'].samples[0].value == 3
    assert sorted(s.labels['rank'] for s in families['gpucluster_training_rank_up'].samples) == ['0', '1', '2']
