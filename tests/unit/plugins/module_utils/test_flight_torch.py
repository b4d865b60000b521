"""The flight recorder's variables on real torch ranks (gloo on the CPU; skipped where torch is not
importable): two ranks start with the job's variables of attempt 2, rank 1 stops before an all_reduce
rank 0 enters, and the dumps torch writes of that ring give the stall verdict naming rank 1.

torch 2.13 on gloo makes no debug-info pipe and writes no dump on a timeout (both are ProcessGroupNCCL's
monitor thread): the ranks here write torch's dump themselves (_dump_fr_trace) to the file the job's
TORCH_FR_DUMP_TEMP_FILE names, as a rank asked through its pipe does on NCCL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import flight_recorder as fr

torch = pytest.importorskip('torch')
dist = pytest.importorskip('torch.distributed')
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip('torch without gloo', allow_module_level=True)

RANK = r'''
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group('gloo', init_method='tcp://127.0.0.1:%s' % sys.argv[2], rank=rank, world_size=2,
                        timeout=timedelta(seconds=20))
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
dist.broadcast(t, 0)
if rank == 0:
    work = dist.all_reduce(t, async_op=True)     # rank 1 never enters it
time.sleep(1.5)
data = torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)
with open(os.environ['TORCH_FR_DUMP_TEMP_FILE'] + str(rank), 'wb') as handle:
    handle.write(data)
os._exit(0)
'''


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_torch_ranks_with_the_jobs_variables_dump_a_stall_the_verdict_names(tmp_path):
    job = str(tmp_path)
    os.makedirs(fr.attempt_dir(job, 2))
    script = tmp_path / 'rank.py'
    script.write_text(RANK)
    env = dict(os.environ, **fr.job_env(job, 2))
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), port], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        outputs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sorted(os.listdir(fr.attempt_dir(job, 2))) == ['rank_0', 'rank_1']
    verdict = fr.stall_verdict(job, 2)
    assert (verdict['collective'], verdict['seq'], verdict['missing_ranks'], verdict['waiting_ranks']) == \
        ('gloo:all_reduce', 5, [1], [0])
    assert verdict['why'] == ('rank 1 never entered gloo:all_reduce #5 of process group default_pg (the other rank '
                              'waits in it; rank 1 last entered gloo:broadcast #4)')
    assert fr.stall_verdict(job, 1) is None
