"""The training examples refuse to fall back to the CPU when the launch said the job has GPUs
(roles/training/files/gpucluster_progress.py, imported by train_tiny.py and train_fsdp.py)."""

import os
import subprocess
import sys

FILES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')
sys.path.insert(0, FILES)

import gpucluster_progress as gp  # noqa: E402


def test_a_job_that_asked_for_gpus_is_refused_on_a_rank_without_one():
    assert gp.expected_gpus({'GPUCLUSTER_EXPECT_GPUS': '8'}) == 8
    assert gp.expected_gpus({}) == 0 and gp.expected_gpus({'GPUCLUSTER_EXPECT_GPUS': 'x'}) == 0
    line = gp.gpu_refusal(8, 0, 'gpu-3', local_rank=0)
    assert line.startswith('node gpu-3: the job asked for 8 GPU(s) per node (GPUCLUSTER_EXPECT_GPUS) but local '
                           'rank 0 sees 0: no fall back to the CPU')
    assert gp.gpu_refusal(8, 4, 'gpu-3', local_rank=5) is not None
    assert gp.gpu_refusal(8, 8, 'gpu-3', local_rank=7) is None
    # a CPU job (nothing asked) runs on the CPU as before
    assert gp.gpu_refusal(0, 0, 'cpu-1') is None


def test_the_refusal_exits_non_zero_naming_the_node():
    code = 'import gpucluster_progress as gp; gp.require_gpus(0); print("ran on the CPU")'
    env = dict(os.environ, GPUCLUSTER_EXPECT_GPUS='2', SLURMD_NODENAME='gpu-7', LOCAL_RANK='1', PYTHONPATH=FILES)
    done = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True)
    assert done.returncode == 3 and 'ran on the CPU' not in done.stdout
    assert done.stdout.startswith('node gpu-7: the job asked for 2 GPU(s) per node')
    env['GPUCLUSTER_EXPECT_GPUS'] = ''
    done = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == 'ran on the CPU\n'
