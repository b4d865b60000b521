#!/usr/bin/env python3
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A small model trained with DeepSpeed (ZeRO stage 2 by default), or plain torch DDP.

Runs on GPUs with NCCL and on CPUs with gloo (DS_ACCELERATOR=cpu), under the deepspeed
launcher, torchrun, mpirun or srun. Rank 0 logs the loss of every step; checkpoints are saved
with DeepSpeed's own format (every --save-every steps and at the end) and training resumes from
the latest complete one with --resume-from. A save is atomic: every rank writes the tag step<N>,
then rank 0 writes step<N>/gpucluster.json (step, world size) and moves `latest` onto the tag
last (DeepSpeed's own `latest` is not written: it is rewritten in place while other ranks may
still write), so a node lost in the middle of a save leaves `latest` on the previous complete tag.
Attempts of the job (GPUCLUSTER_ATTEMPT, counted by the supervisor) are fenced: rank 0 claims
--checkpoint-dir for its attempt at start (<dir>/ATTEMPT), and a rank of an older attempt refuses
to save there ("attempt 1 is fenced: attempt 2 owns <dir>; not saving", exit code 75). On a resume
rank 0 picks the checkpoint and tells the other ranks, so every rank loads the same tag.
A checkpoint saved on another world size is loaded with its model weights and a fresh optimizer
state (ZeRO partitions the optimizer state by world size), and the script says so.
--engine ddp trains the same model with torch's DistributedDataParallel and never imports
DeepSpeed (no JIT build of its CPU ops: a quick check of a launcher).

    deepspeed --hostfile hostfile train_tiny.py --steps 50 --checkpoint-dir /shared/checkpoints/tiny
    torchrun --nnodes 3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint head:29500 train_tiny.py
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpucluster_progress import (  # noqa: E402  pylint: disable=wrong-import-position
    CHECKPOINT_DONE, Progress, add_arguments, agreed_checkpoint, attempt, checkpoint_fence, claim_checkpoints,
    commit_checkpoint, require_gpus)

STARTED = time.time()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=50, help='optimizer steps to run (in total, across resumes)')
    parser.add_argument('--hidden', type=int, default=256, help='width of the hidden layers')
    parser.add_argument('--micro-batch', type=int, default=16, help='samples per rank and step')
    parser.add_argument('--global-batch', type=int, default=0,
                        help='samples per optimizer step across all ranks, kept whatever the world size (gradient '
                             'accumulation; micro batches of at most --micro-batch); 0: --micro-batch x world')
    parser.add_argument('--zero-stage', type=int, default=2, help='ZeRO stage when no --deepspeed_config is given')
    parser.add_argument('--lr', type=float, default=1e-2)
    add_arguments(parser)
    parser.add_argument('--engine', choices=['deepspeed', 'ddp'], default='deepspeed',
                        help='deepspeed (ZeRO) or torch DDP (no DeepSpeed; no checkpoints)')
    parser.add_argument('--deepspeed_config', default=None, help='DeepSpeed JSON config file')
    parser.add_argument('--local_rank', type=int, default=int(os.environ.get('LOCAL_RANK', -1)))
    return parser.parse_args()


def batch_split(global_batch, world, most_micro):
    """(micro batch, accumulation steps) that make global_batch on world ranks exactly, micro batches of at
    most most_micro: a job that shrinks (or grows) keeps its global batch. SystemExit when none does."""
    if global_batch <= 0:
        return most_micro, 1
    accumulation = max(1, -(-global_batch // (most_micro * world)))
    while accumulation <= global_batch:
        micro, rest = divmod(global_batch, accumulation * world)
        if rest == 0 and 0 < micro <= most_micro:
            return micro, accumulation
        accumulation += 1
    raise SystemExit('--global-batch %d cannot be split over %d ranks in micro batches of at most %d: choose a '
                     'global batch that a multiple of each world size the job may run on divides'
                     % (global_batch, world, most_micro))


def ds_config(args, world):
    if args.deepspeed_config:
        with open(args.deepspeed_config) as handle:
            return json.load(handle)
    return {
        'train_micro_batch_size_per_gpu': args.micro_batch,
        'gradient_accumulation_steps': args.accumulation,
        'train_batch_size': args.micro_batch * args.accumulation * world,
        'zero_optimization': {'stage': args.zero_stage},
        'zero_allow_untested_optimizer': True,
        'steps_per_print': 10 ** 9,
        'wall_clock_breakdown': False,
    }


class DDPEngine:
    """The three calls the loop makes on a DeepSpeed engine, done with torch DDP and AdamW."""

    def __init__(self, model, lr, device_ids, accumulation=1):
        self.module = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=lr)
        self.accumulation, self.micro_steps = accumulation, 0

    def __call__(self, x):
        return self.module(x)

    def backward(self, loss):
        if self.micro_steps % self.accumulation == 0:
            self.optimizer.zero_grad()
        (loss / self.accumulation).backward()

    def step(self):
        self.micro_steps += 1
        if self.micro_steps % self.accumulation == 0:
            self.optimizer.step()


def save(engine, args, step, rank, world):
    """Every rank writes its part of step<N> (DeepSpeed's save ends with a barrier); then rank 0 marks
    the tag complete and moves `latest` onto it; a second barrier keeps the ranks together. First the
    fence: when a newer attempt owns the directory, every rank exits (75) before writing anything."""
    checkpoint_fence(args.checkpoint_dir, getattr(args, 'attempt', None), dist)
    tag = 'step%d' % step
    if rank == 0:
        # a tag written again (a run resumed from an older step) is not complete until it is marked again
        try:
            os.unlink(os.path.join(args.checkpoint_dir, tag, CHECKPOINT_DONE))
        except OSError:
            pass
    if args.save_delay:
        time.sleep(args.save_delay)
    engine.save_checkpoint(args.checkpoint_dir, tag=tag, client_state={'step': step}, save_latest=False)
    if rank == 0:
        commit_checkpoint(args.checkpoint_dir, tag, step, world, attempt=getattr(args, 'attempt', None),
                          zero_stage=engine.zero_optimization_stage())
        print('saved checkpoint %s (step %d, world %d)' % (os.path.join(args.checkpoint_dir, tag), step, world),
              flush=True)
    dist.barrier()


def resume(engine, args, rank, world):
    """Load the latest complete checkpoint under --resume-from; its step. Rank 0 picks it and tells the
    others (every rank loads the same tag, even when `latest` moves meanwhile). A tag whose save did not
    finish is passed over (said on rank 0); on another world size only the model weights are loaded."""
    tag, record, note = agreed_checkpoint(args.resume_from, rank, dist)
    if tag is None:
        raise SystemExit('no checkpoint to resume from: %s' % note)
    saved_world = record.get('world_size')
    resized = saved_world is not None and saved_world != world
    if resized and engine.zero_optimization_stage() >= 3:
        raise SystemExit('checkpoint %s was saved by %d ranks and this run has %d: ZeRO stage 3 partitions the model '
                         'itself by world size; resume it on %d ranks' % (tag, saved_world, world, saved_world))
    path, client_state = engine.load_checkpoint(args.resume_from, tag=tag, load_module_only=resized)
    if path is None:
        raise SystemExit('checkpoint %s under %s could not be loaded' % (tag, args.resume_from))
    step = int(record.get('step', (client_state or {}).get('step', 0)))
    if rank == 0:
        resized_note = (' (saved with world %d, now world %d: model weights loaded, the optimizer state starts afresh)'
                        % (saved_world, world)) if resized else ''
        print('resumed from %s at step %d%s' % (path, step, resized_note), flush=True)
    return step


def main():
    args = parse_args()
    on_gpu = torch.cuda.is_available()
    require_gpus(torch.cuda.device_count() if on_gpu else 0)
    backend = 'nccl' if on_gpu else 'gloo'
    if args.engine == 'ddp':
        if args.checkpoint_dir or args.resume_from:
            raise SystemExit('--engine ddp keeps no checkpoints: drop --checkpoint-dir/--resume-from')
        dist.init_process_group(backend=backend)
    else:
        import deepspeed  # pylint: disable=import-outside-toplevel
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get('LOCAL_RANK', max(args.local_rank, 0)))
    device = torch.device('cuda', local_rank) if on_gpu else torch.device('cpu')
    if on_gpu:
        torch.cuda.set_device(device)
    args.attempt = attempt()
    args.micro_batch, args.accumulation = batch_split(args.global_batch, world, args.micro_batch)
    if rank == 0:
        print('global batch %d = micro batch %d x accumulation %d x world %d'
              % (args.micro_batch * args.accumulation * world, args.micro_batch, args.accumulation, world), flush=True)
    if args.checkpoint_dir and rank == 0:
        # this attempt owns the directory from now on: a rank of an older one still running stops at its next save
        claim_checkpoints(args.checkpoint_dir, args.attempt)

    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 1))
    if args.engine == 'ddp':
        engine = DDPEngine(model.to(device), args.lr, [local_rank] if on_gpu else None, args.accumulation)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(args, world))

    # A fixed regression problem; every rank draws its own samples of it.
    true_w = torch.randn(32, 1, generator=torch.Generator().manual_seed(args.seed))
    data_gen = torch.Generator().manual_seed(args.seed + 1 + rank)

    progress = Progress(rank, world, args.progress_dir, args.tensorboard_dir, attempt=args.attempt)
    start_step = 0
    if args.resume_from:
        progress.heartbeat('load')
        start_step = resume(engine, args, rank, world)
        progress.heartbeat('train', start_step)

    dtype = next(engine.module.parameters()).dtype
    loss = torch.tensor(0.0)
    sync = torch.zeros(1, device=device)
    for step in range(start_step + 1, args.steps + 1):
        # the step's synchronisation point: the time spent there is the wait for the slowest rank
        waited = progress.sync_point(dist, sync, step, start_step + 1, args)
        for _ in range(args.accumulation):  # one optimizer step: accumulation micro batches on every rank
            x = torch.randn(args.micro_batch, 32, generator=data_gen)
            y = x @ true_w + 0.01 * torch.randn(args.micro_batch, 1, generator=data_gen)
            x, y = x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
        sync = loss.detach().to(device=device, dtype=torch.float32).reshape(1).clone()
        progress.step(step, loss.item(), waited)
        if rank == 0:
            print('step %d loss %.6f elapsed %.3f' % (step, loss.item(), time.time() - STARTED), flush=True)
        if args.checkpoint_dir and args.save_every and step % args.save_every == 0:
            # heartbeats while the save runs: a long save is not a stall (training_checkpoint_seconds bounds it)
            with progress.saving(step, args.heartbeat_seconds):
                save(engine, args, step, rank, world)
        if args.step_delay:
            time.sleep(args.step_delay)

    if args.checkpoint_dir and args.steps > start_step and not (args.save_every and args.steps % args.save_every == 0):
        with progress.saving(args.steps, args.heartbeat_seconds):
            save(engine, args, args.steps, rank, world)
    # The loss of the last step, averaged over ranks.
    progress.finish(dist, loss.detach().to(device=device, dtype=torch.float32), args.steps, backend)


if __name__ == '__main__':
    main()
