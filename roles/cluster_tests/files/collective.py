#!/usr/bin/env python3
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""All-reduce benchmark over torch.distributed, started by torchrun on every node.

For each message size (bytes, float32 elements): a few warm-up all-reduces, then --iters
timed ones; the time of a size is the slowest rank's mean time per all-reduce. algbw and
busbw are left to the caller (the nccl-tests formulas: algbw = size / time, busbw = algbw x
2(n-1)/n). After the timed runs every rank fills the buffer with rank + 1 and all-reduces it
once more: every element must then be n(n+1)/2; the elements that are not are counted.

Rank 0 prints one JSON object per line, each prefixed with GPUCLUSTER_ALLREDUCE: a start
line (backend, world size, nodes, torch version), a row per size, and an end line.
"""

import argparse
import datetime
import json
import os
import socket
import sys
import time

MARKER = 'GPUCLUSTER_ALLREDUCE '


def emit(obj):
    sys.stdout.write(MARKER + json.dumps(obj, sort_keys=True) + '\n')
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--sizes', required=True, help='comma-separated message sizes in bytes, increasing')
    parser.add_argument('--iters', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--backend', default='auto', choices=['auto', 'nccl', 'gloo'])
    parser.add_argument('--timeout', type=int, default=300, help='seconds a collective may take')
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(',')]

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backend = args.backend if args.backend != 'auto' else ('nccl' if cuda else 'gloo')
    local_rank = int(os.environ.get('LOCAL_RANK', '0'))
    if backend == 'nccl':
        torch.cuda.set_device(local_rank)
        device = torch.device('cuda', local_rank)
    else:
        device = torch.device('cpu')
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()

    def sync():
        if device.type == 'cuda':
            torch.cuda.synchronize(device)

    if rank == 0:
        emit({'kind': 'start', 'backend': backend, 'world_size': world,
              'nnodes': int(os.environ.get('GROUP_WORLD_SIZE', '1')),
              'local_world_size': int(os.environ.get('LOCAL_WORLD_SIZE', '1')),
              'device': device.type, 'torch': torch.__version__, 'host': socket.gethostname(),
              'iters': args.iters, 'warmup': args.warmup})
    expected = world * (world + 1) / 2.0
    for size in sizes:
        count = size // 4
        buf = torch.zeros(count, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        sync()
        elapsed = torch.tensor([(time.perf_counter() - start) / args.iters], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)

        buf.fill_(float(rank + 1))
        dist.all_reduce(buf)
        sync()
        wrong = torch.tensor([int((buf != expected).sum().item())], dtype=torch.int64, device=device)
        dist.all_reduce(wrong)
        if rank == 0:
            emit({'kind': 'row', 'size': size, 'count': count, 'type': 'float', 'redop': 'sum',
                  'time_us': elapsed.item() * 1e6, 'wrong': int(wrong.item()),
                  'value': buf[0].item(), 'expected': expected})
    dist.barrier()
    if rank == 0:
        emit({'kind': 'end'})
    dist.destroy_process_group()
    return 0


if __name__ == '__main__':
    sys.exit(main())
