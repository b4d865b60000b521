#!/usr/bin/env python3
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A small transformer trained with PyTorch FSDP (fully_shard), sharded checkpoints on shared storage.

Parameters, gradients and optimizer state are sharded over every rank (FSDP2's fully_shard on a
one-dimensional device mesh): NCCL and bf16 mixed precision on GPUs, gloo and float32 on CPUs.
Every --save-every steps the sharded state is saved with torch.distributed.checkpoint to
<--checkpoint-dir>/step<N> (each rank writes its own shards; rank 0 then marks the tag complete,
step<N>/gpucluster.json, and moves <dir>/latest onto it); --resume-from <dir> loads the latest
complete one, chosen by rank 0 and told to the other ranks, and continues from its step. A checkpoint
saved on another world size is loaded resharded (DCP redistributes the shards), and the script says so.
Attempts of the job (GPUCLUSTER_ATTEMPT) are fenced: rank 0 claims --checkpoint-dir for its attempt at
start (<dir>/ATTEMPT), and the ranks of an older attempt refuse to save there ("attempt 1 is fenced:
attempt 2 owns <dir>; not saving", exit code 75).
Started by torchrun (train.yml -e training_launcher=torchrun -e training_script=.../train_fsdp.py).

    torchrun --nnodes 3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint head:29500 \\
        train_fsdp.py --steps 200 --checkpoint-dir /shared/checkpoints/fsdp --save-every 20
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpucluster_progress import (  # noqa: E402  pylint: disable=wrong-import-position
    CHECKPOINT_DONE, Progress, add_arguments, agreed_checkpoint, attempt, checkpoint_fence, claim_checkpoints,
    commit_checkpoint, require_gpus)

VOCAB = 64
STARTED = time.time()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=100, help='optimizer steps in total, across resumes')
    parser.add_argument('--d-model', type=int, default=64)
    parser.add_argument('--layers', type=int, default=2)
    parser.add_argument('--seq', type=int, default=32, help='tokens per sample')
    parser.add_argument('--micro-batch', type=int, default=8, help='samples per rank and step')
    parser.add_argument('--lr', type=float, default=3e-3)
    add_arguments(parser)
    return parser.parse_args()


class TinyTransformer(torch.nn.Module):
    def __init__(self, d_model, layers, seq):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, d_model)
        self.pos = torch.nn.Parameter(torch.zeros(seq, d_model))
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model, dropout=0.0,
                                             batch_first=True, norm_first=True)
            for _ in range(layers))
        self.head = torch.nn.Linear(d_model, VOCAB)
        self.register_buffer('mask', torch.nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, src_mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
        return self.head(x).clone()  # not a view: FSDP hooks its backward on the output


def batch(seed, rank, step, micro_batch, seq):
    """Sequences of a fixed rule (x[t+1] = 5 x[t] + 3 mod VOCAB, with some noise): a rank's batch of a
    step is the same whenever it is drawn, so a resumed run sees the data it would have seen."""
    gen = torch.Generator().manual_seed(seed * 1000003 + rank * 7919 + step)
    start = torch.randint(0, VOCAB, (micro_batch, 1), generator=gen)
    tokens = [start]
    for _ in range(seq):
        tokens.append((tokens[-1] * 5 + 3) % VOCAB)
    tokens = torch.cat(tokens, dim=1)
    noise = torch.rand(tokens.shape, generator=gen) < 0.05
    tokens = torch.where(noise, torch.randint(0, VOCAB, tokens.shape, generator=gen), tokens)
    return tokens[:, :-1], tokens[:, 1:]


def resume_point(directory, rank):
    """(path, step, saved world) of the checkpoint to resume from under directory, the same on every rank:
    rank 0 picks the latest complete one (its gpucluster.json written once every rank saved) and tells
    the others; a tag without .metadata (DCP's index, written last) cannot be loaded and is refused."""
    tag, record, note = agreed_checkpoint(directory, rank, dist)
    if tag is None:
        raise SystemExit('no checkpoint to resume from: %s' % note)
    path = os.path.join(directory, tag)
    if not os.path.exists(os.path.join(path, '.metadata')):
        raise SystemExit('checkpoint %s has no .metadata: it is not a torch.distributed.checkpoint save' % path)
    step = record.get('step')
    if not isinstance(step, int):
        step = int(tag[4:]) if tag.startswith('step') and tag[4:].isdigit() else 0
    return path, step, record.get('world_size')


def save(directory, step, model, optimizer, world, rank, progress, heartbeat_seconds=None, attempt_number=None):
    # heartbeats while the save runs: a long save is not a stall (training_checkpoint_seconds bounds it)
    with progress.saving(step, heartbeat_seconds):
        # a newer attempt owns the directory: every rank exits (75) before writing anything
        checkpoint_fence(directory, attempt_number, dist)
        tag = 'step%d' % step
        path = os.path.join(directory, tag)
        if rank == 0:
            # a tag written again (a run resumed from an older step) is not complete until it is marked again
            try:
                os.unlink(os.path.join(path, CHECKPOINT_DONE))
            except OSError:
                pass
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({'model': model_sd, 'optim': optim_sd}, checkpoint_id=path)
        dist.barrier()
        if rank == 0:
            # the marker (step, world size, attempt), then `latest` moved onto the tag, last
            commit_checkpoint(directory, tag, step, world, attempt=attempt_number)
            print('saved sharded checkpoint %s (step %d, world %d)' % (path, step, world), flush=True)
        dist.barrier()


def main():
    args = parse_args()
    on_gpu = torch.cuda.is_available()
    require_gpus(torch.cuda.device_count() if on_gpu else 0)
    backend = 'nccl' if on_gpu else 'gloo'
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get('LOCAL_RANK', 0))
    device = torch.device('cuda', local_rank) if on_gpu else torch.device('cpu')
    if on_gpu:
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (world,))
    current = attempt()
    if args.checkpoint_dir and rank == 0:
        # this attempt owns the directory from now on: a rank of an older one still running stops at its next save
        claim_checkpoints(args.checkpoint_dir, current)

    torch.manual_seed(args.seed)
    model = TinyTransformer(args.d_model, args.layers, args.seq).to(device)
    # bf16 compute with fp32 gradient reduction where the device has it; full precision on CPUs
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if on_gpu else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if rank == 0:
        print('fsdp: world %d, backend %s, %s, %d parameters sharded over %d ranks'
              % (world, backend, 'bf16 mixed precision' if on_gpu else 'float32 (CPU)',
                 sum(p.numel() for p in model.parameters()), world), flush=True)

    progress = Progress(rank, world, args.progress_dir, args.tensorboard_dir, attempt=current)
    start_step = 0
    if args.resume_from:
        progress.heartbeat('load')
        path, start_step, saved_world = resume_point(args.resume_from, rank)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {'model': model_sd, 'optim': optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state['model'], optim_state_dict=state['optim'])
        if rank == 0:
            print('resumed from %s at step %d (saved with world %s, now world %d%s)'
                  % (path, start_step, saved_world, world,
                     '; the shards were redistributed' if saved_world not in (None, world) else ''), flush=True)
        progress.heartbeat('train', start_step)

    sync = torch.zeros(1, device=device)
    loss = torch.zeros(())
    for step in range(start_step + 1, args.steps + 1):
        inputs, targets = batch(args.seed, rank, step, args.micro_batch, args.seq)
        inputs, targets = inputs.to(device), targets.to(device)
        # the step's synchronisation point: the time spent there is the wait for the slowest rank
        waited = progress.sync_point(dist, sync, step, start_step + 1, args)
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync = loss.detach().float().reshape(1).clone()
        progress.step(step, loss.item(), waited)
        if rank == 0:
            print('step %d loss %.6f elapsed %.3f' % (step, loss.item(), time.time() - STARTED), flush=True)
        if args.checkpoint_dir and args.save_every and step % args.save_every == 0:
            save(args.checkpoint_dir, step, model, optimizer, world, rank, progress, args.heartbeat_seconds, current)
        if args.step_delay:
            time.sleep(args.step_delay)

    if args.checkpoint_dir and start_step < args.steps and not (args.save_every and args.steps % args.save_every == 0):
        save(args.checkpoint_dir, args.steps, model, optimizer, world, rank, progress, args.heartbeat_seconds, current)
    progress.finish(dist, loss.detach().float().reshape(1).clone(), args.steps, backend)


if __name__ == '__main__':
    main()
