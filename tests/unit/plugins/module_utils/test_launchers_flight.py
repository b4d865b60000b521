"""The flight recorder in a job's launch and stop: its variables reach the ranks after the nccl_env
profile (TORCH_NCCL_ASYNC_ERROR_HANDLING=3 over the profile's 1, training_env over both), each attempt
dumps in its own directory, and a stop with flight_dump asks the ranks for their dumps before any signal."""

import os
import subprocess
import threading
import time

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import flight_recorder as fr
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import job as jb
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import launchers as ln
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr

from test_launchers import FakeRunner, Spawn, job, lab, probe_ok, proc  # noqa: F401 (lab, proc are fixtures)
from test_processes import ME, fake_proc, kills  # noqa: F401 (kills is a fixture)

PROFILE = ('# written by nccl_env\nexport NCCL_DEBUG=WARN\nexport TORCH_NCCL_ASYNC_ERROR_HANDLING=1\n'
           'export TORCH_FR_BUFFER_SIZE=0\n')


@pytest.fixture
def gpu(lab, monkeypatch):
    device = lab / 'nvidiactl'
    device.write_text('')
    monkeypatch.setattr(jb.Job, 'GPU_DEVICE', str(device))
    (lab / 'gpucluster-nccl.sh').write_text(PROFILE)
    return lab


def shell_value(prefix, env, name):
    """What the rank's shell has for name after the launch line's prefix (env files, then job.env)."""
    out = subprocess.run(['bash', '-c', prefix + 'printf %s "${%s-unset}"' % ('%s', name)], env=env,
                         capture_output=True, text=True, check=True, timeout=30)
    return out.stdout


def test_a_gpu_job_gets_both_generations_and_its_attempts_own_directory(gpu):
    jobdir = gpu / 'jobs' / 'tiny-001'
    j = job(gpu, 'torchrun', env={'GPUCLUSTER_ATTEMPT': '3'}, env_files=[str(gpu / 'gpucluster-nccl.sh')])
    j.start(spawn=Spawn())
    prefix = str(jobdir / 'flight' / 'attempt-3' / 'rank_')
    assert j.flight_dir == str(jobdir / 'flight' / 'attempt-3') and os.path.isdir(j.flight_dir)
    text = (jobdir / 'job.env').read_text()
    for name in ('TORCH_FR_DUMP_TEMP_FILE', 'TORCH_NCCL_DEBUG_INFO_TEMP_FILE', 'TORCH_NCCL_DEBUG_INFO_PIPE_FILE',
                 'TORCH_FR_DEBUG_INFO_PIPE_FILE'):
        assert "export %s='%s'" % (name, prefix) in text or 'export %s=%s\n' % (name, prefix) in text, name
    for line in ('TORCH_FR_BUFFER_SIZE=2000', 'TORCH_NCCL_TRACE_BUFFER_SIZE=2000', 'TORCH_NCCL_DUMP_ON_TIMEOUT=1',
                 'TORCH_NCCL_ASYNC_ERROR_HANDLING=3'):
        assert 'export %s\n' % line in text, line


@pytest.mark.parametrize('launcher', ['torchrun', 'mpirun', 'deepspeed'])
def test_error_handling_3_wins_over_the_nccl_profile_but_not_over_training_env(gpu, launcher):
    spawn = Spawn()
    j = job(gpu, launcher, env={}, env_files=[str(gpu / 'gpucluster-nccl.sh')])
    j.home = str(gpu / 'home')                                   # ~/.deepspeed_env as nccl_env writes it
    os.makedirs(j.home)
    with open(os.path.join(j.home, '.deepspeed_env'), 'w') as handle:
        handle.write('TORCH_NCCL_ASYNC_ERROR_HANDLING=1\nNCCL_DEBUG=WARN\n')
    j.start(spawn=spawn)
    env = dict(spawn.calls[0]['env'], TORCH_NCCL_ASYNC_ERROR_HANDLING='1')  # even from the module's own environment
    assert shell_value(j.shell_prefix(), env, 'TORCH_NCCL_ASYNC_ERROR_HANDLING') == '3'
    assert shell_value(j.shell_prefix(), env, 'TORCH_FR_BUFFER_SIZE') == '2000'
    assert shell_value(j.shell_prefix(), env, 'NCCL_DEBUG') == 'WARN'      # the profile's own settings stay
    if launcher == 'deepspeed':   # what pdsh exports on every node
        lines = (gpu / 'jobs' / 'tiny-001' / 'deepspeed_env').read_text().splitlines()
        assert 'TORCH_NCCL_ASYNC_ERROR_HANDLING=3' in lines and 'TORCH_NCCL_ASYNC_ERROR_HANDLING=1' not in lines
    # the launch line (and mpirun's prefix of each rank on its node) sources the job's file after the profile
    line, profile, job_env = spawn.calls[0]['line'], str(gpu / 'gpucluster-nccl.sh'), str(gpu / 'jobs' / 'tiny-001' / 'job.env')
    assert line.index(profile) < line.index(job_env) and line.rindex(profile) < line.rindex(job_env)
    own = job(gpu, launcher, env={'TORCH_NCCL_ASYNC_ERROR_HANDLING': '1'}, job_id='own-1',
              job_dir=str(gpu / 'jobs' / 'own-1'), env_files=[str(gpu / 'gpucluster-nccl.sh')])
    own.home = j.home
    own.start(spawn=Spawn())
    assert shell_value(own.shell_prefix(), env, 'TORCH_NCCL_ASYNC_ERROR_HANDLING') == '1'   # training_env's


def test_slurm_sources_the_jobs_environment_after_the_profile_on_every_node(gpu):
    j = job(gpu, 'slurm', env={}, env_files=[str(gpu / 'gpucluster-nccl.sh')], slurm_gpus_per_node=1)
    j.prepare()
    script = (gpu / 'jobs' / 'tiny-001' / 'job.sbatch').read_text()
    body = script[script.index('srun '):]
    assert body.index(str(gpu / 'gpucluster-nccl.sh')) < body.index(str(gpu / 'jobs' / 'tiny-001' / 'job.env'))
    assert 'TORCH_NCCL_ASYNC_ERROR_HANDLING=3' in (gpu / 'jobs' / 'tiny-001' / 'job.env').read_text()


def test_a_cpu_job_keeps_the_profiles_error_handling(lab, monkeypatch):
    monkeypatch.setattr(jb.Job, 'GPU_DEVICE', str(lab / 'no-nvidiactl'))
    job(lab, 'torchrun', env={}).start(spawn=Spawn())
    assert 'TORCH_NCCL_ASYNC_ERROR_HANDLING' not in (lab / 'jobs' / 'tiny-001' / 'job.env').read_text()


def test_a_start_sets_aside_the_dumps_an_earlier_run_of_its_attempt_left(gpu):
    flight = gpu / 'jobs' / 'tiny-001' / 'flight'
    flight.mkdir(parents=True)
    (flight / 'rank_0').write_bytes(b'old')
    job(gpu, 'torchrun', env={}).start(spawn=Spawn())
    assert not (flight / 'rank_0').exists() and (flight / 'rank_0.previous').read_bytes() == b'old'


# ----- stop with flight_dump ---------------------------------------------------------------------------
class Rank(threading.Thread):
    """A rank's monitor thread polling its pipe; on a line it records how many signals the stop had sent
    by then, and writes its dump."""

    def __init__(self, job_dir, rank, attempt, kills):
        super().__init__(daemon=True)
        self.pipe, self.path = fr.pipe_path(job_dir, attempt, rank), fr.dump_path(job_dir, attempt, rank)
        os.makedirs(os.path.dirname(self.pipe), exist_ok=True)
        os.mkfifo(self.pipe)
        self.fd = os.open(self.pipe, os.O_RDONLY | os.O_NONBLOCK)
        self.kills, self.seen, self.done = kills, [], threading.Event()
        self.start()

    def run(self):
        while not self.done.is_set():
            try:
                data = os.read(self.fd, 128)
            except BlockingIOError:
                data = b''
            if data:
                self.seen.append(len(self.kills))
                with open(self.path, 'wb') as handle:
                    handle.write(b'\x80\x04}\x94.')
            time.sleep(0.05)

    def close(self):
        self.done.set()
        self.join(2)
        os.close(self.fd)


def rank_proc(lab, pid, rank, attempt):
    return fake_proc(lab / 'proc', pid, env={pr.JOB_ENV: 'tiny-001', 'RANK': str(rank), 'GPUCLUSTER_ATTEMPT': str(attempt)})


def test_a_stop_with_flight_dump_asks_the_ranks_here_before_any_signal(gpu, kills):
    jobdir = str(gpu / 'jobs' / 'tiny-001')
    rank_proc(gpu, 800, 1, 2)
    rank_proc(gpu, 801, 2, 2)      # its monitor thread is gone: its pipe has no reader
    os.makedirs(fr.attempt_dir(jobdir, 2))
    os.mkfifo(fr.pipe_path(jobdir, 2, 2))
    rank = Rank(jobdir, 1, 2, kills)
    stale = Rank(jobdir, 1, 1, kills)    # attempt 1's pipe of the same rank: not asked
    try:
        out = job(gpu, 'torchrun', env={}).stop(sleep=time.sleep, flight_dump=True, flight_dump_timeout=5)
    finally:
        rank.close()
        stale.close()
    assert rank.seen == [0] and stale.seen == []          # asked once, before the stop signalled anything
    assert out['flight_dumps'] == {1: fr.dump_path(jobdir, 2, 1)} and out['flight_attempt'] == 2
    assert [m['rank'] for m in out['flight_dump_missing']] == [2]
    assert out['flight_dump_missing'][0]['why'].startswith('no process reads its pipe')
    assert out['stopped_pids'] == [800, 801]


def test_a_stop_without_flight_dump_or_in_check_mode_writes_to_no_pipe(gpu, kills):
    jobdir = str(gpu / 'jobs' / 'tiny-001')
    rank_proc(gpu, 800, 0, 1)
    rank = Rank(jobdir, 0, 1, kills)
    try:
        checked = job(gpu, 'torchrun', env={}, runner=FakeRunner({'ssh-probe': probe_ok}, check_mode=True)).stop(
            sleep=time.sleep, flight_dump=True)
        out = job(gpu, 'torchrun', env={}).stop(sleep=time.sleep)
        time.sleep(0.2)
    finally:
        rank.close()
    assert rank.seen == [] and 'flight_dumps' not in out and 'flight_dumps' not in checked
    assert out['stopped_pids'] == [800]


def test_a_node_without_ranks_of_the_job_asks_nothing(gpu, kills):
    out = job(gpu, 'torchrun', env={}).stop(sleep=time.sleep, flight_dump=True, flight_dump_timeout=5)
    assert out['flight_dumps'] == {} and out['flight_dump_missing'] == [] and out['flight_attempt'] == 1
