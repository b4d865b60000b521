#!/usr/bin/env python3
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A rank with no framework, for benchmarks of the supervision on many light nodes (benchmarks/scale.sh).

It imports no torch (a few MB a rank, where a torch rank and its agent take about 0.3 GB), talks to no
other rank and trains nothing: it only does what the supervision reads of a job. Its rank and world come
from the launcher (RANK and WORLD_SIZE, which the collection's mpirun line sets from Open MPI's); every
--step-delay seconds it writes a step to its progress file (gpucluster_progress.Progress, the examples'
format), and rank 0 prints "step N loss X" to the head's log. A rank that is killed ends the job as any
rank would: its launcher (mpirun) ends the others and exits non-zero.

    mpirun ... python light_rank.py --steps 100000 --step-delay 1     # gpucluster_progress.py beside it
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpucluster_progress import Progress  # noqa: E402  pylint: disable=wrong-import-position


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=50)
    parser.add_argument('--step-delay', type=float, default=1.0, help='seconds between two steps')
    parser.add_argument('--progress-dir', default='progress', help='per-rank progress files')
    args = parser.parse_args(argv)
    rank = int(os.environ.get('RANK', os.environ.get('OMPI_COMM_WORLD_RANK', '0')))
    world = int(os.environ.get('WORLD_SIZE', os.environ.get('OMPI_COMM_WORLD_SIZE', '1')))
    progress = Progress(rank, world, args.progress_dir, tensorboard_dir='')
    loss = 1.0
    for step in range(1, args.steps + 1):
        time.sleep(args.step_delay)
        loss *= 0.99
        progress.step(step, loss)
        if rank == 0:
            print('step %d loss %.6f' % (step, loss), flush=True)
    progress.done(args.steps)
    if rank == 0:
        print('final loss %.6f steps %d world %d backend none' % (loss, args.steps, world), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
