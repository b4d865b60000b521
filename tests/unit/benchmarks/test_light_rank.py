"""benchmarks/light_rank.py: the scale benchmark's rank with no framework writes what the supervision reads."""
import os
import re
import shutil
import subprocess
import sys

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STEP_REGEX = 'step [0-9]+ loss'  # the training role's training_step_regex default: the head's first-step wait


def run_rank(tmp_path, rank, world, steps=3):
    """Run the script as a job directory holds it (the progress helper beside it), with a torch that refuses to
    be imported on its path: the rank must need no framework."""
    job = tmp_path / 'job'
    job.mkdir(exist_ok=True)
    shutil.copy(os.path.join(ROOT, 'benchmarks', 'light_rank.py'), job)
    shutil.copy(os.path.join(ROOT, 'roles', 'training', 'files', 'gpucluster_progress.py'), job)
    fake = tmp_path / 'fake'
    (fake / 'torch').mkdir(parents=True, exist_ok=True)
    (fake / 'torch' / '__init__.py').write_text('raise ImportError("light_rank.py imported torch")\n')
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), GPUCLUSTER_ATTEMPT='2', PYTHONPATH=str(fake))
    return subprocess.run([sys.executable, str(job / 'light_rank.py'), '--steps', str(steps), '--step-delay', '0'],
                          cwd=str(job), env=env, capture_output=True, text=True, timeout=60, check=False)


def test_a_rank_writes_its_progress_file_as_the_examples_do_without_torch(tmp_path):
    done = run_rank(tmp_path, 2, 4)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ''  # only rank 0 logs steps on the head
    text = (tmp_path / 'job' / 'progress' / 'rank-2.log').read_text()
    parsed = jm.parse_progress(text)
    assert parsed['header']['rank'] == 2 and parsed['header']['world'] == 4 and parsed['header']['attempt'] == 2
    assert [s['step'] for s in parsed['steps']] == [1, 2, 3]
    assert parsed['done']['step'] == 3


def test_rank_zero_logs_the_steps_the_head_waits_for(tmp_path):
    done = run_rank(tmp_path, 0, 4, steps=2)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [bool(re.search(STEP_REGEX, line)) for line in lines] == [True, True, False]
    assert lines[-1].startswith('final loss ') and 'world 4' in lines[-1]
