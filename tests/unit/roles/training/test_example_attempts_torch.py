"""The examples run as two ranks of gloo on the CPU (forked from this process), one attempt after the
other: attempt 2 resumes from the checkpoint rank 0 chose and owns the directory, and attempt 1 started
again afterwards (a rank of an old attempt still running) refuses to save there, with exit code 75.

train_fsdp.py runs as it is; train_tiny.py runs with a stand-in for DeepSpeed (a few lines over torch
DDP: DeepSpeed itself is not installed here). Skipped where torch is not importable."""

import importlib.util
import json
import multiprocessing
import os
import socket
import sys
import time
import types

import pytest

torch = pytest.importorskip('torch')
dist = pytest.importorskip('torch.distributed')
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip('torch without gloo', allow_module_level=True)

FILES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')
sys.path.insert(0, FILES)

import gpucluster_progress as gp  # noqa: E402


def _load(name):
    spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(FILES, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = _load('train_tiny.py')
FSDP = _load('train_fsdp.py')
# imported once here rather than in every forked rank (the first optimizer imports it: a second each)
importlib.import_module('torch._dynamo')


def _free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


class FakeEngine:
    """The calls train_tiny.py makes on a DeepSpeed engine, over torch DDP; each rank saves its own file."""

    def __init__(self, model, optimizer):
        self.module = torch.nn.parallel.DistributedDataParallel(model)
        self.optimizer = optimizer

    def __call__(self, x):
        return self.module(x)

    def backward(self, loss):
        self.optimizer.zero_grad()
        loss.backward()

    def step(self):
        self.optimizer.step()

    def zero_optimization_stage(self):
        return 2

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        path = os.path.join(save_dir, tag)
        os.makedirs(path, exist_ok=True)
        torch.save({'model': self.module.module.state_dict(), 'client_state': client_state},
                   os.path.join(path, 'rank%d.pt' % dist.get_rank()))
        dist.barrier()  # DeepSpeed's save ends with one

    def load_checkpoint(self, load_dir, tag, load_module_only=False):
        path = os.path.join(load_dir, tag)
        state = torch.load(os.path.join(path, 'rank%d.pt' % dist.get_rank()))
        self.module.module.load_state_dict(state['model'])
        print('rank %d loaded %s' % (dist.get_rank(), tag), flush=True)
        return path, state['client_state']


def _fake_deepspeed():
    module = types.ModuleType('deepspeed')
    module.init_distributed = lambda dist_backend, auto_mpi_discovery: dist.init_process_group(backend=dist_backend)
    module.initialize = lambda model, optimizer, config: (FakeEngine(model, optimizer), optimizer, None, None)
    return module


def _rank(rank, port, attempt, script, argv, log, before=None):
    """One rank in a forked process: its environment, its output to log, then the script's main()."""
    handle = open(log, 'w', buffering=1)
    os.dup2(handle.fileno(), 1)
    os.dup2(handle.fileno(), 2)
    sys.stdout = sys.stderr = handle
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(port), GLOO_SOCKET_IFNAME='lo', GPUCLUSTER_ATTEMPT=str(attempt),
                      GPUCLUSTER_JOB_ID='job-a')
    os.environ.pop('GPUCLUSTER_EXPECT_GPUS', None)
    torch.set_num_threads(1)
    sys.modules['deepspeed'] = _fake_deepspeed()
    sys.argv = [script.__name__] + argv
    if before:
        before(rank, script)
    script.main()


def run_ranks(tmp_path, name, script, attempt, argv, before=None):
    """Both ranks of one attempt: ([exit code of rank 0, of rank 1], [their output])."""
    ctx = multiprocessing.get_context('fork')
    port = _free_port()
    logs = [str(tmp_path / ('%s-rank%d.log' % (name, rank))) for rank in (0, 1)]
    procs = [ctx.Process(target=_rank, args=(rank, port, attempt, script, argv, logs[rank], before)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    deadline = time.time() + 60  # a rank that loaded another tag than its peer waits in a collective
    for proc in procs:
        proc.join(max(0.1, deadline - time.time()))
    hung = [proc for proc in procs if proc.is_alive()]
    for proc in hung:
        proc.kill()
        proc.join()
    outputs = [open(log).read() for log in logs]
    assert not hung, 'a rank hung:\n%s' % '\n'.join(outputs)
    return [proc.exitcode for proc in procs], outputs


def marker(ckpt, tag):
    return json.loads((ckpt / tag / gp.CHECKPOINT_DONE).read_text())


def headers(progress):
    return [(progress / ('rank-%d.log' % rank)).read_text().splitlines()[0] for rank in (0, 1)]


def test_fsdp_attempts_resume_from_rank_0_s_choice_and_an_older_attempt_never_saves(tmp_path):
    ckpt, progress = tmp_path / 'ckpt', tmp_path / 'progress'
    common = ['--d-model', '16', '--layers', '1', '--seq', '8', '--micro-batch', '2', '--save-every', '2',
              '--checkpoint-dir', str(ckpt), '--progress-dir', str(progress), '--tensorboard-dir', '']
    codes, out = run_ranks(tmp_path, 'a1', FSDP, 1, common + ['--steps', '4'])
    assert codes == [0, 0], out
    assert (ckpt / 'ATTEMPT').read_text() == '1\njob=job-a\n'
    assert (ckpt / 'latest').read_text() == 'step4\n' and marker(ckpt, 'step4')['attempt'] == 1
    assert all(' attempt=1 ' in line for line in headers(progress))

    # the supervisor starts the job again: attempt 2 claims the directory and resumes where 1 stopped
    codes, out = run_ranks(tmp_path, 'a2', FSDP, 2, common + ['--steps', '6', '--resume-from', str(ckpt)])
    assert codes == [0, 0], out
    assert 'resuming from step4 (step 4), chosen by rank 0\n' in out[0]
    assert 'resuming from' not in out[1]  # one line, on rank 0
    assert (ckpt / 'ATTEMPT').read_text() == '2\njob=job-a\n'
    assert (ckpt / 'latest').read_text() == 'step6\n'
    assert (marker(ckpt, 'step6')['attempt'], marker(ckpt, 'step6')['world_size']) == (2, 2)
    assert all(' attempt=2 ' in line for line in headers(progress))
    steps = [line for line in (progress / 'rank-1.log').read_text().splitlines() if line.startswith('step=')]
    assert steps[0].startswith('step=5 ')  # it went on from the chosen checkpoint

    # a rank of attempt 1 still running (started again here): it trains, but its first save is refused
    step2 = (ckpt / 'step2' / gp.CHECKPOINT_DONE).read_text()
    codes, out = run_ranks(tmp_path, 'stale', FSDP, 1, common + ['--steps', '8'])
    assert codes == [gp.FENCED_EXIT] * 2 == [75, 75], out
    for text in out:
        assert 'attempt 1 is fenced: attempt 2 owns %s; not saving\n' % ckpt in text
    assert 'attempt 1 starts after attempt 2 claimed %s: its saves will be refused' % ckpt in out[0]
    assert (ckpt / 'ATTEMPT').read_text() == '2\njob=job-a\n'
    assert (ckpt / 'latest').read_text() == 'step6\n'
    assert (ckpt / 'step2' / gp.CHECKPOINT_DONE).read_text() == step2  # not unmarked, not rewritten
    assert gp.latest_complete_checkpoint(str(ckpt))[0] == 'step6'


def test_tiny_ranks_load_the_tag_rank_0_chose_even_when_latest_moves_meanwhile(tmp_path):
    ckpt, progress = tmp_path / 'ckpt', tmp_path / 'progress'
    common = ['--hidden', '8', '--micro-batch', '4', '--save-every', '2', '--checkpoint-dir', str(ckpt),
              '--progress-dir', str(progress), '--tensorboard-dir', '']
    codes, out = run_ranks(tmp_path, 'a1', TINY, 1, common + ['--steps', '4'])
    assert codes == [0, 0], out
    assert 'saved checkpoint %s (step 4, world 2)' % (ckpt / 'step4') in out[0]
    assert marker(ckpt, 'step4')['attempt'] == 1 and (ckpt / 'ATTEMPT').read_text() == '1\njob=job-a\n'
    # another complete tag: the one `latest` will name by the time rank 1 would read it itself
    for rank in (0, 1):
        (ckpt / 'step99').mkdir(exist_ok=True)
        torch.save(torch.load(str(ckpt / 'step4' / ('rank%d.pt' % rank))), str(ckpt / 'step99' / ('rank%d.pt' % rank)))
    gp.commit_checkpoint(str(ckpt), 'step99', 99, 2, attempt=1)
    (ckpt / 'latest').write_text('step4\n')

    def race(rank, script):
        if rank == 0:
            # rank 0 chooses, then `latest` moves on before the other rank gets to the directory
            chosen = gp.latest_complete_checkpoint

            def choose_then_move(directory):
                choice = chosen(directory)
                (ckpt / 'latest').write_text('step99\n')
                dist.barrier()
                return choice
            gp.latest_complete_checkpoint = choose_then_move
        else:
            agreed = script.agreed_checkpoint

            def after_the_move(*args, **kwargs):
                dist.barrier()
                return agreed(*args, **kwargs)
            script.agreed_checkpoint = after_the_move

    codes, out = run_ranks(tmp_path, 'a2', TINY, 2, common + ['--steps', '6', '--resume-from', str(ckpt)], race)
    assert codes == [0, 0], out
    assert 'resuming from step4 (step 4), chosen by rank 0\n' in out[0]
    assert 'rank 0 loaded step4\n' in out[0] and 'rank 1 loaded step4\n' in out[1]
    assert 'resumed from %s at step 4' % (ckpt / 'step4') in out[0]
    assert marker(ckpt, 'step6')['attempt'] == 2 and (ckpt / 'ATTEMPT').read_text() == '2\njob=job-a\n'
    for rank in (0, 1):
        steps = [line for line in (progress / ('rank-%d.log' % rank)).read_text().splitlines() if line.startswith('step=')]
        assert [s.split()[0] for s in steps] == ['step=5', 'step=6']

    codes, out = run_ranks(tmp_path, 'stale', TINY, 1, common + ['--steps', '8'])
    assert codes == [75, 75], out
    assert all('attempt 1 is fenced: attempt 2 owns %s; not saving\n' % ckpt in text for text in out)
    assert (ckpt / 'latest').read_text() == 'step6\n' and marker(ckpt, 'step2')['attempt'] == 1
