#!/usr/bin/env python3
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Seconds of one node's read of a job's progress files (what every status read and every supervisor read
runs on each node: monitor.read_progress, then the figures of the node's ranks), with progress files of
SHORT and LONG lines per rank (a job's first minutes and its week), and the ratio; beside it, the whole-file
read the node made before (every rank's whole file parsed), for comparison.

    .venv/bin/python benchmarks/progress_read.py            # RANKS=32 MINE=8 SHORT=1000 LONG=1000000 ROUNDS=5

The files are written once in a temporary directory (LONG lines of 32 ranks: about 2.7 GB; make LONG or RANKS
smaller where the disk is small) and removed at the end. Figures: the median of ROUNDS reads, after one read
that warms the page cache (a node reads its files from the shared storage's cache too).
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, '.build', 'collections'))
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm  # noqa: E402

T0 = 1795589360.0


def write_job(folder, ranks, mine, lines):
    os.makedirs(os.path.join(folder, 'progress'))
    for rank in range(ranks):
        host = 'this' if rank < mine else 'other-%d' % (rank // mine)
        with open(os.path.join(folder, 'progress', 'rank-%d.log' % rank), 'w') as handle:
            handle.write('# gpucluster-progress rank=%d host=%s pid=%d world=%d time=%.3f\n'
                         % (rank, host, 1000 + rank, ranks, T0))
            block = []
            for step in range(1, lines + 1):
                block.append('step=%d loss=%.6f time=%.3f wait=0.0010\n' % (step, 10.0 / step, T0 + step * 6.0))
                if len(block) == 10000:
                    handle.write(''.join(block))
                    block = []
            handle.write(''.join(block))


def node_read(job):
    progress = jm.read_progress(job, lambda header, rank: header.get('host') == 'this')
    now = T0 + 10 ** 8
    return [jm.progress_figures(parsed, now) for rank, parsed in progress.items() if parsed['header'].get('host') == 'this']


def whole_read(job):
    progress = dict((rank, jm.parse_progress(text)) for rank, text in jm.read_progress_files(job).items())
    now = T0 + 10 ** 8
    return [jm.progress_figures(parsed, now) for rank, parsed in progress.items() if parsed['header'].get('host') == 'this']


def timed(func, job, rounds):
    func(job)
    seconds = []
    for _ in range(rounds):
        began = time.perf_counter()
        rows = func(job)
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds), rows


def main():
    ranks, mine = int(os.environ.get('RANKS', 32)), int(os.environ.get('MINE', 8))
    short, long_ = int(os.environ.get('SHORT', 1000)), int(os.environ.get('LONG', 1000000))
    rounds = int(os.environ.get('ROUNDS', 5))
    base = tempfile.mkdtemp(prefix='progress-read.')
    try:
        figures = {}
        for lines in (short, long_):
            job = os.path.join(base, str(lines))
            began = time.time()
            write_job(job, ranks, mine, lines)
            print('%d ranks (%d of this node) of %d lines: written in %.1f s' % (ranks, mine, lines, time.time() - began),
                  flush=True)
            figures[lines] = {}
            for name, func in (('bounded', node_read), ('whole', whole_read)):
                if name == 'whole' and lines > 100000 and os.environ.get('WHOLE', '1') == '0':
                    continue
                seconds, rows = timed(func, job, rounds if name == 'bounded' else max(1, rounds // 5))
                assert len(rows) == mine and all(r['last_step'] == lines for r in rows), rows[:1]
                figures[lines][name] = seconds
                print('  %-7s read: %.4f s (median)' % (name, seconds), flush=True)
            shutil.rmtree(job)
        load = os.getloadavg()[0]
        print('node read, %d ranks (%d of the node): %d lines %.4f s, %d lines %.4f s: %.2fx (the whole-file read: '
              '%.4f s, %s); load %.1f, %s' % (
                  ranks, mine, short, figures[short]['bounded'], long_, figures[long_]['bounded'],
                  figures[long_]['bounded'] / figures[short]['bounded'], figures[short]['whole'],
                  ('%.2f s' % figures[long_]['whole']) if 'whole' in figures[long_] else 'not run',
                  load, time.strftime('%Y-%m-%d %H:%M')))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
