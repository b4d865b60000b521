# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Progress of one rank, in the form `train.yml -e training_state=status` reads, and TensorBoard.

Every rank appends to <progress dir>/rank-<RANK>.log (the job directory's progress/ by default):

    # gpucluster-progress rank=1 host=node-2 pid=4242 world=4 time=1764000000.0
    step=12 loss=0.4321 time=1764000000.125 wait=0.012
    # heartbeat phase=checkpoint step=12 since=1764000000.200 time=1764000000.200
    # heartbeat phase=checkpoint step=12 since=1764000000.200 time=1764000010.201
    # heartbeat phase=train step=12 time=1764000031.0
    # done step=100 time=1764000060.5 peak_rss_kib=412000

time is the wall clock when the step ended, wait the seconds the rank waited for the others at the
step's synchronisation point. A heartbeat says what the rank does between two steps (phase
checkpoint, eval, load or any word; train when it goes back to steps): it holds the stall clock.
since (optional) is when the phase began. A checkpoint save runs inside `with progress.saving(step):`,
which writes a checkpoint heartbeat every few seconds from a thread while the save runs (each with the
save's start as since) and a train heartbeat after it: a save longer than training_stall_seconds is
not a stall, and one longer than training_checkpoint_seconds is (the thread beats on while the main
thread hangs in a save, so the save's own age is judged). A script without a progress file can print
the same line to its log (heartbeat_line(): "gpucluster-heartbeat phase=checkpoint step=12
since=... time=..."). Rank 0 also writes TensorBoard event files (loss, steps per second)
when the tensorboard package is installed. Import it from a script that sits beside this file.

require_gpus() refuses to run a rank on the CPU when the launch said the job has GPUs
(GPUCLUSTER_EXPECT_GPUS=<n>, set by training_job in containers and under Slurm with GPUs).
"""

import contextlib
import json
import os
import resource
import socket
import threading
import time

# The file a checkpoint's tag directory holds once every rank wrote its part (the examples write it,
# then move `latest` onto the tag): a tag without it is a save that did not finish.
CHECKPOINT_DONE = 'gpucluster.json'
# Seconds between two heartbeats of a save in progress (Progress.saving, --heartbeat-seconds): well
# below training_stall_seconds, so a save whose heartbeats stop is told from one that runs.
HEARTBEAT_SECONDS = 10.0


def expected_gpus(environ=None):
    """GPUs the launch said the job has on each node (GPUCLUSTER_EXPECT_GPUS; 0 when not said)."""
    value = (environ if environ is not None else os.environ).get('GPUCLUSTER_EXPECT_GPUS', '') or '0'
    try:
        return max(int(value), 0)
    except ValueError:
        return 0


def gpu_refusal(expected, visible, node, local_rank=0):
    """The line a rank prints before exiting when the job asked for GPUs and this rank sees none (or
    fewer than its local rank needs): never a quiet fall back to gloo on the CPU. None when fine."""
    if not expected or visible > local_rank:
        return None
    return ('node %s: the job asked for %d GPU(s) per node (GPUCLUSTER_EXPECT_GPUS) but local rank %d sees %d: '
            'no fall back to the CPU; check the container runtime gives the GPUs (podman: the CDI spec, Apptainer: '
            '--nv, enroot: NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES=compute,utility, Slurm: '
            '--gpus-per-node)' % (node, expected, local_rank, visible))


def require_gpus(visible):
    """Exit with code 3 and one line naming the node when the job expects GPUs this rank does not see."""
    node = os.environ.get('SLURMD_NODENAME') or socket.gethostname()
    line = gpu_refusal(expected_gpus(), visible, node, int(os.environ.get('LOCAL_RANK', '0') or 0))
    if line:
        print(line, flush=True)
        raise SystemExit(3)


class Progress:
    def __init__(self, rank, world, progress_dir='progress', tensorboard_dir='tensorboard'):
        self.rank = rank
        self.world = world
        self.handle = None
        self.writer = None
        self.last = None
        # the saving() thread writes heartbeats while the main thread is in a save: one line at a time
        self.lock = threading.Lock()
        if progress_dir:
            os.makedirs(progress_dir, exist_ok=True)
            # line buffered: every step line reaches the shared storage when it is written; a run
            # of the same job id starts the file again
            self.handle = open(os.path.join(progress_dir, 'rank-%d.log' % rank), 'w', buffering=1)
            self.handle.write('# gpucluster-progress rank=%d host=%s pid=%d world=%d time=%.3f\n'
                              % (rank, socket.gethostname(), os.getpid(), world, time.time()))
        if rank == 0 and tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter  # pylint: disable=import-outside-toplevel
            except ImportError:
                print('tensorboard is not installed in this environment: no event files', flush=True)
            else:
                self.writer = SummaryWriter(log_dir=tensorboard_dir)

    def scalar(self, tag, value, step):
        if self.writer is not None:
            self.writer.add_scalar(tag, value, step)

    def _write(self, line):
        with self.lock:
            if self.handle:
                self.handle.write(line)

    def step(self, step, loss, wait=None):
        now = time.time()
        self._write('step=%d loss=%.6f time=%.3f%s\n' % (step, loss, now, '' if wait is None else ' wait=%.4f' % wait))
        if self.writer is not None:
            self.writer.add_scalar('train/loss', loss, step)
            if self.last is not None and now > self.last[1]:
                self.writer.add_scalar('train/steps_per_second', (step - self.last[0]) / (now - self.last[1]), step)
            if wait is not None:
                self.writer.add_scalar('train/wait_seconds', wait, step)
        self.last = (step, now)

    def heartbeat(self, phase, step=None, since=None):
        """Say what the rank does now (before and after a checkpoint save or an evaluation); since:
        when the phase began (seconds since the epoch), written by the heartbeats of a save."""
        self._write('# %s\n' % heartbeat_line(phase, step, since=since)[len('gpucluster-'):])

    @contextlib.contextmanager
    def saving(self, step, interval=None, phase='checkpoint', after='train'):
        """Around a blocking checkpoint save: a `phase` heartbeat now, one every interval seconds
        (HEARTBEAT_SECONDS when None) from a thread while the save runs, each naming the save's start
        (since=), and once it ended an `after` heartbeat (none when the save raised). The thread is
        stopped and joined on the way out, whatever the save did."""
        interval = HEARTBEAT_SECONDS if interval is None else float(interval)
        if interval <= 0:
            raise ValueError('the heartbeat interval must be above 0 seconds (got %s)' % interval)
        began = time.time()
        self.heartbeat(phase, step, since=began)
        stop = threading.Event()

        def beat():
            while not stop.wait(interval):
                self.heartbeat(phase, step, since=began)

        thread = threading.Thread(target=beat, name='gpucluster-heartbeat', daemon=True)
        thread.start()
        try:
            yield began
        finally:
            stop.set()
            thread.join()
        if after:
            self.heartbeat(after, step)

    def sync_point(self, dist, tensor, step, first_step, args):
        """Before the step's work: the delay injected on purpose (args), then the all-reduce of the
        previous step's loss, the step's synchronisation point; returns the seconds waited there
        (for the slowest rank) and logs the mean loss of the previous step."""
        slow_down(self.rank, args.slow_rank, args.slow_seconds, args.slow_host)
        waited = time.time()
        dist.all_reduce(tensor)
        waited = time.time() - waited
        if step > first_step:
            self.scalar('train/loss_mean_all_ranks', tensor.item() / self.world, step - 1)
        return waited

    def finish(self, dist, last_loss, steps, backend):
        """The end of a run: the last loss averaged over the ranks, the done line, the final line
        (rank 0) and the process group torn down."""
        dist.all_reduce(last_loss)
        self.done(steps)
        if self.rank == 0:
            print('final loss %.6f steps %d world %d backend %s'
                  % (last_loss.item() / self.world, steps, self.world, backend), flush=True)
        dist.barrier()
        dist.destroy_process_group()

    def done(self, step):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        with self.lock:
            if self.handle:
                self.handle.write('# done step=%d time=%.3f peak_rss_kib=%d\n' % (step, time.time(), peak))
                self.handle.close()
                self.handle = None
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None


def heartbeat_line(phase, step=None, now=None, since=None):
    """The heartbeat words: "gpucluster-heartbeat phase=checkpoint step=12 time=1764000000.200", with
    since=<when the phase began> before time when given ("... step=12 since=1764000000.000 time=...").
    Printed as is to a job's log, it is read from there (scripts without a progress file)."""
    words = 'gpucluster-heartbeat phase=%s' % phase
    if step is not None:
        words += ' step=%d' % step
    if since is not None:
        words += ' since=%.3f' % since
    return '%s time=%.3f' % (words, time.time() if now is None else now)


def _write_atomic(path, text):
    """Write text to path through a temporary file moved over it (os.replace): a crash leaves the
    old file or the new one, never half of one."""
    tmp = '%s.tmp.%d' % (path, os.getpid())
    with open(tmp, 'w') as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def commit_checkpoint(directory, tag, step, world, **extra):
    """Mark the tag complete (its gpucluster.json: step, world size, time), then point `latest` at it.

    Call it on one rank once every rank finished writing the tag (after a barrier). The pointer moves
    last: a crash before leaves `latest` on the previous complete tag."""
    record = dict(extra, step=int(step), world_size=int(world), saved=time.time())
    _write_atomic(os.path.join(directory, tag, CHECKPOINT_DONE), json.dumps(record, sort_keys=True) + '\n')
    _write_atomic(os.path.join(directory, 'latest'), tag + '\n')
    return record


def checkpoint_record(directory, tag):
    """The tag's gpucluster.json as a dict, or None when the tag is not complete (missing, unreadable)."""
    try:
        with open(os.path.join(directory, tag, CHECKPOINT_DONE)) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get('step'), int) else None


def latest_complete_checkpoint(directory):
    """(tag, record, note) of the checkpoint to resume from: the tag `latest` names when it is complete,
    else the complete tag with the highest step (a save cut short, or a `latest` written by a DeepSpeed
    without the marker: note says which was skipped and why); (None, None, note) when none is complete."""
    named = None
    try:
        with open(os.path.join(directory, 'latest')) as handle:
            named = handle.read().strip() or None
    except OSError:
        pass
    if named:
        record = checkpoint_record(directory, named)
        if record is not None:
            return named, record, None
    complete = []
    try:
        names = os.listdir(directory)
    except OSError:
        return None, None, 'checkpoint directory %s cannot be read' % directory
    for name in names:
        record = checkpoint_record(directory, name) if os.path.isdir(os.path.join(directory, name)) else None
        if record is not None:
            complete.append((record['step'], name, record))
    skipped = ('latest names %s, which is not complete (no %s: its save did not finish)' % (named, CHECKPOINT_DONE)
               if named else 'no latest file')
    if not complete:
        if named and os.path.isdir(os.path.join(directory, named)):
            # a directory saved before the marker existed (DeepSpeed's own `latest`): nothing tells
            # whether it is whole, so it is taken as DeepSpeed would take it, and said so
            return named, {}, 'latest names %s, saved without %s (an older save): loaded as it is' % (named, CHECKPOINT_DONE)
        return None, None, '%s under %s, and no complete checkpoint' % (skipped, directory)
    step, name, record = max(complete)
    return name, record, '%s; resuming from %s (step %d), the newest complete one' % (skipped, name, step)


def add_arguments(parser):
    """The examples' options for checkpoints, progress, TensorBoard and slowing ranks on purpose."""
    parser.add_argument('--checkpoint-dir', default=None, help='save checkpoints here (on shared storage)')
    parser.add_argument('--resume-from', default=None, help='checkpoint directory to resume from (its latest)')
    parser.add_argument('--save-every', type=int, default=0, help='save a checkpoint every N steps (0: only at the end)')
    parser.add_argument('--step-delay', type=float, default=0.0, help='seconds to sleep after each step')
    parser.add_argument('--slow-rank', type=int, default=-1, help='rank that sleeps --slow-seconds before each step')
    parser.add_argument('--slow-host', default='', help='host whose ranks sleep --slow-seconds before each step')
    parser.add_argument('--slow-seconds', type=float, default=0.0)
    parser.add_argument('--progress-dir', default='progress', help='per-rank progress files ("" for none)')
    parser.add_argument('--save-delay', type=float, default=0.0,
                        help='seconds every rank sleeps inside each save (stands in for a slow filer)')
    parser.add_argument('--heartbeat-seconds', type=float, default=HEARTBEAT_SECONDS,
                        help='seconds between two heartbeats while a checkpoint is saved')
    parser.add_argument('--tensorboard-dir', default='tensorboard', help='TensorBoard event files of rank 0 ("" for none)')
    parser.add_argument('--seed', type=int, default=1234)


def slow_down(rank, slow_rank, seconds, slow_host=''):
    """The delay a test injects before each step on one rank (--slow-rank R) or on every rank of
    one host (--slow-host NAME), --slow-seconds S."""
    if seconds and (rank == slow_rank or (slow_host and socket.gethostname() == slow_host)):
        time.sleep(seconds)
