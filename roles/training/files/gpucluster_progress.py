# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Progress of one rank, in the form `train.yml -e training_state=status` reads, and TensorBoard.

Every rank appends to <progress dir>/rank-<RANK>.log (the job directory's progress/ by default):

    # gpucluster-progress rank=1 host=node-2 pid=4242 world=4 attempt=2 time=1764000000.0
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

attempt= is the job's attempt (GPUCLUSTER_ATTEMPT, 1 for the first start; the supervisor starts the same
job id again as attempt 2, 3...): a file of an older attempt left in the progress dir (a rank the new
attempt does not have) is told from the current ones, and the monitor leaves it out.

Attempts are fenced from each other on the checkpoint directory: at start rank 0 of attempt N writes
<checkpoint dir>/ATTEMPT atomically (the number N on its first line, then job=<GPUCLUSTER_JOB_ID>)
unless a newer attempt of the same job already did (claim_checkpoints; another job that resumes from
the directory takes it over whatever its number); before each save every rank reads it, and the
ranks agree on what any of them read (checkpoint_fence): when it names a newer attempt, no rank
saves, each prints "attempt 1 is fenced: attempt 2 owns <dir>; not saving" and exits with
FENCED_EXIT (75). commit_checkpoint reads
it again before it writes the marker and moves `latest`, and records the attempt in the marker. On a
resume rank 0 alone picks the checkpoint (latest_complete_checkpoint) and broadcasts its choice
(agreed_checkpoint): every rank loads the same tag even when `latest` moves in between.

require_gpus() refuses to run a rank on the CPU when the launch said the job has GPUs
(GPUCLUSTER_EXPECT_GPUS=<n>, set by training_job in containers and under Slurm with GPUs).
"""

import contextlib
import errno
import json
import os
import re
import resource
import socket
import stat
import sys
import threading
import time

# The file a checkpoint's tag directory holds once every rank wrote its part (the examples write it,
# then move `latest` onto the tag): a tag without it is a save that did not finish.
CHECKPOINT_DONE = 'gpucluster.json'
# The job's attempt (1, 2, 3... each start of the same job id by the supervisor), set in every rank's environment.
ATTEMPT_ENV = 'GPUCLUSTER_ATTEMPT'
# The job's id, set by training_job in every rank's environment.
JOB_ENV = 'GPUCLUSTER_JOB_ID'
# The file of the checkpoint directory that names the attempt which owns it (the newest that started):
# the number on its first line, then job=<the job id>.
ATTEMPT_FILE = 'ATTEMPT'
# The exit code of a rank of an older attempt that refuses to save over a newer one's directory
# (EX_TEMPFAIL: nothing is wrong with the rank, another attempt owns its checkpoints).
FENCED_EXIT = 75
# Seconds between two heartbeats of a save in progress (Progress.saving, --heartbeat-seconds): well
# below training_stall_seconds, so a save whose heartbeats stop is told from one that runs.
HEARTBEAT_SECONDS = 10.0
# The most bytes read of one of the job's small files (latest, gpucluster.json, ATTEMPT, an exit file).
READ_MAX = 65536


def expected_gpus(environ=None):
    """GPUs the launch said the job has on each node (GPUCLUSTER_EXPECT_GPUS; 0 when not said)."""
    value = (environ if environ is not None else os.environ).get('GPUCLUSTER_EXPECT_GPUS', '') or '0'
    try:
        return max(int(value), 0)
    except ValueError:
        return 0


def attempt(environ=None):
    """The job's attempt from GPUCLUSTER_ATTEMPT: a whole number of 1 or more; 1 when the variable is
    missing or not such a number (a job started before attempts were counted is attempt 1)."""
    value = str((environ if environ is not None else os.environ).get(ATTEMPT_ENV, '') or '').strip()
    try:
        number = int(value)
    except ValueError:
        return 1
    return number if number >= 1 else 1


_env_attempt = attempt  # for the functions below whose argument is called attempt


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


def keep_earlier_attempt(progress_dir, rank, attempt):
    """Before a rank of attempt `attempt` starts its progress file: the file an earlier attempt of the job left
    (its header's attempt below this one) moves to <progress_dir>/attempt-<that attempt>/rank-<rank>.log, so that
    the report page spans every attempt; status reads the top-level files only. A first attempt (a new start of
    the job id) removes this rank's files of attempts of an earlier start. Each rank moves its own file only."""
    path = os.path.join(progress_dir, 'rank-%d.log' % rank)
    if attempt <= 1:
        for name in os.listdir(progress_dir):
            if name.startswith('attempt-'):
                try:
                    os.unlink(os.path.join(progress_dir, name, 'rank-%d.log' % rank))
                except OSError:
                    pass
        return None
    try:
        head = read_regular(path, 512).split(b'\n', 1)[0].decode('utf-8', 'replace')
    except OSError:
        return None
    if not head.startswith('# gpucluster-progress '):
        return None
    earlier = _int(_words(head).get('attempt')) or 1
    if earlier >= attempt:
        return None
    folder = os.path.join(progress_dir, 'attempt-%d' % earlier)
    os.makedirs(folder, exist_ok=True)
    os.replace(path, os.path.join(folder, 'rank-%d.log' % rank))
    return earlier


class Progress:
    def __init__(self, rank, world, progress_dir='progress', tensorboard_dir='tensorboard', attempt=None):
        self.rank = rank
        self.world = world
        self.attempt = _env_attempt() if attempt is None else int(attempt)
        self.handle = None
        self.writer = None
        self.last = None
        # the saving() thread writes heartbeats while the main thread is in a save: one line at a time
        self.lock = threading.Lock()
        if progress_dir:
            os.makedirs(progress_dir, exist_ok=True)
            keep_earlier_attempt(progress_dir, rank, self.attempt)
            # line buffered: every step line reaches the shared storage when it is written; a run
            # of the same job id starts the file again
            self.handle = open(os.path.join(progress_dir, 'rank-%d.log' % rank), 'w', buffering=1)
            self.handle.write('# gpucluster-progress rank=%d host=%s pid=%d world=%d attempt=%d time=%.3f\n'
                              % (rank, socket.gethostname(), os.getpid(), world, self.attempt, time.time()))
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


_WORD_RE = re.compile(r'(\w+)=(\S+)')


def _words(line):
    """{word: value} of a progress line's key=value words."""
    return dict(_WORD_RE.findall(line))


def rank_file_marks(path, tail_bytes=4096):
    """What one rank's progress file says, read without a parse of all of it: {rank, attempt, host, header_time,
    mtime, step, step_time, gap, done} from its first line, its last tail_bytes and its stat (step: the last step
    line's; gap: the longest time between two lines in a row of those last bytes that carry a time, steps and
    heartbeats, None with fewer than two; done: the step of a done line, else None). None when the file cannot
    be read or has no header. The supervisor's glance reads every rank's file this way from the shared storage."""
    try:
        with os.fdopen(open_regular(path), 'rb') as handle:
            info = os.fstat(handle.fileno())
            head = handle.readline(512).decode('utf-8', 'replace')
            handle.seek(max(len(head), info.st_size - tail_bytes))
            tail = handle.read(tail_bytes).decode('utf-8', 'replace')
    except OSError:
        return None
    if not head.startswith('# gpucluster-progress '):
        return None
    header = _words(head)
    out = {'rank': _int(header.get('rank')), 'attempt': _int(header.get('attempt')) or 1,
           'host': header.get('host'), 'header_time': _float(header.get('time')), 'mtime': info.st_mtime,
           'step': None, 'step_time': None, 'gap': None, 'done': None}
    last = None
    for line in tail.splitlines():
        at = None
        if line.startswith('step='):
            words = _words(line)
            out['step'], out['step_time'] = _int(words.get('step')), _float(words.get('time'))
            at = out['step_time']
        elif line.startswith('# done '):
            out['done'] = _int(_words(line).get('step'))
        elif line.startswith('# heartbeat '):
            at = _float(_words(line).get('time'))
        if at is not None:
            if last is not None and at >= last:
                out['gap'] = max(out['gap'] or 0.0, at - last)
            last = at
    return out


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


# ----- the job's files, in directories the training account writes --------------------------------
# The supervisor runs as root and reads and writes files in directories the training account can write (the job's
# directory, the checkpoint directory, training_metrics_dir), and the head's resume check reads the checkpoint
# directory as root: root never makes, truncates, chmods or follows a name there, and reads only regular files,
# bounded, never waiting on a FIFO.
def write_atomic(path, text, mode=0o644):
    """Write text to path whole at once, with mode: a crash leaves the old file or the new one, never half of one.
    The temporary file beside it has a random name and is made with O_CREAT | O_EXCL | O_NOFOLLOW in the
    directory, opened once (a name planted there, a link or a file, is refused: never followed nor truncated);
    its mode is set on the open file, it is written and synced, then renamed over path (a link at path is
    replaced, not followed). Two nodes writing the same shared directory never share a temporary name."""
    folder, name = os.path.split(os.path.abspath(path))
    data = text.encode() if isinstance(text, str) else bytes(text)
    tmp = '.%s.%s.tmp' % (name, os.urandom(8).hex())
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    made = False
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
        made = True
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        if made:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
        raise
    finally:
        os.close(dir_fd)


def open_regular(path):
    """A descriptor of path open for reading, when it is a regular file: a link at its name is not followed
    and a FIFO or device is not waited on (O_NOFOLLOW | O_NONBLOCK, then fstat); OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, 'not a regular file', path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path, limit=READ_MAX):
    """At most limit bytes of path, a regular file (open_regular); OSError when it is none."""
    with os.fdopen(open_regular(path), 'rb') as handle:
        return handle.read(limit)


def _distributed(dist):
    return dist is not None and dist.is_available() and dist.is_initialized()


def _device(dist, device=None):
    """The device of a collective's tensor: the one given, else the current GPU under NCCL (it reduces
    GPU tensors only), else the CPU."""
    import torch  # pylint: disable=import-outside-toplevel
    if device is None and dist.get_backend() == 'nccl':
        return torch.device('cuda', torch.cuda.current_device())
    return device


def checkpoint_claim(directory):
    """(attempt, job id) that own the checkpoint directory, from its ATTEMPT file: the number on its first
    line, the job on a `job=<id>` line (None when not written); (None, None) when no attempt claimed it
    (no file, or no number: a directory of a run before attempts were fenced)."""
    try:
        lines = read_regular(os.path.join(directory, ATTEMPT_FILE)).decode('utf-8', 'replace').splitlines()
        number = int(lines[0].strip())
    except (OSError, ValueError, IndexError):
        return None, None
    if number < 1:
        return None, None
    job = next((line.strip()[len('job='):] for line in lines[1:] if line.strip().startswith('job=')), None)
    return number, job or None


def checkpoint_owner(directory):
    """The attempt that owns the checkpoint directory (the number in its ATTEMPT file), None when none does."""
    return checkpoint_claim(directory)[0]


def _job(job):
    return (os.environ.get(JOB_ENV, '') if job is None else job).strip() or None


def _outranked(claim, number, job):
    """Whether the claim (attempt, job) on a directory keeps attempt `number` of `job` from saving there:
    a newer attempt of the same job, or another job that claimed the directory since (it resumes from
    there: the newest start owns it). Without a job id on either side only the numbers are compared."""
    owner, owner_job = claim
    if owner is None:
        return False
    if owner_job and job and owner_job != job:
        return True
    return owner > number


def claim_checkpoints(directory, attempt=None, job=None):
    """At the start of an attempt, on rank 0: write the attempt's number (and the job id, GPUCLUSTER_JOB_ID,
    on a job= line) to <directory>/ATTEMPT, atomically, when it is newer than or the same as the one there,
    when there is none, or when another job wrote it (a new job that resumes from an older one's
    directory takes it over). Returns the owning attempt afterwards: a number above attempt means a newer
    attempt of the job owns the directory, and this one's saves will be refused (checkpoint_fence)."""
    number = _env_attempt() if attempt is None else int(attempt)
    job = _job(job)
    owner, owner_job = checkpoint_claim(directory)
    if owner is not None and (not owner_job or not job or owner_job == job) and owner > number:
        print('attempt %d starts after attempt %d claimed %s: its saves will be refused'
              % (number, owner, directory), flush=True)
        return owner
    os.makedirs(directory, exist_ok=True)
    write_atomic(os.path.join(directory, ATTEMPT_FILE), '%d\n%s' % (number, 'job=%s\n' % job if job else ''))
    return number


def fence_message(attempt, owner, directory, owner_job=None, job=None):
    """"attempt 1 is fenced: attempt 2 owns <dir>; not saving" (another job: "attempt 2 of job B owns")."""
    other = ' of job %s' % owner_job if owner_job and job and owner_job != job else ''
    return 'attempt %d is fenced: attempt %d%s owns %s; not saving' % (attempt, owner, other, directory)


def fenced(directory, attempt=None, job=None):
    """The line saying why this attempt may not save into directory (a newer attempt owns it), None
    when it may."""
    number, job = _env_attempt() if attempt is None else int(attempt), _job(job)
    claim = checkpoint_claim(directory)
    return fence_message(number, claim[0], directory, claim[1], job) if _outranked(claim, number, job) else None


def checkpoint_fence(directory, attempt=None, dist=None, device=None, job=None):
    """Before a save, on every rank: read <directory>/ATTEMPT; with dist (an initialised
    torch.distributed), the ranks agree on what any of them read (one all-reduce of a flag), so they all
    save or all stop together. When a newer attempt owns the directory: print "attempt N is fenced:
    attempt M owns <dir>; not saving" and exit with FENCED_EXIT (75), before a byte of the save is
    written. Returns the owning attempt (None when no attempt claimed the directory)."""
    number, job = _env_attempt() if attempt is None else int(attempt), _job(job)
    claim = checkpoint_claim(directory)
    refused = _outranked(claim, number, job)
    if _distributed(dist):
        import torch  # pylint: disable=import-outside-toplevel
        seen = torch.tensor([int(refused), claim[0] or 0], dtype=torch.int64, device=_device(dist, device))
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        if int(seen[0].item()) and not refused:
            # another rank read a newer owner (the file changed between the reads): stop with it
            refused, claim = True, (max(int(seen[1].item()), claim[0] or 0), claim[1])
    if refused:
        print(fence_message(number, claim[0], directory, claim[1], job), flush=True)
        raise SystemExit(FENCED_EXIT)
    return claim[0]


def commit_checkpoint(directory, tag, step, world, attempt=None, job=None, **extra):
    """Mark the tag complete (its gpucluster.json: step, world size, attempt, time), then point `latest`
    at it.

    Call it on one rank once every rank finished writing the tag (after a barrier). The pointer moves
    last: a crash before leaves `latest` on the previous complete tag. A newer attempt that claimed the
    directory in the meantime (ATTEMPT) stops it before either is written: it prints the fence line and
    exits with FENCED_EXIT."""
    number = _env_attempt() if attempt is None else int(attempt)
    refused = fenced(directory, number, job)
    if refused:
        print(refused, flush=True)
        raise SystemExit(FENCED_EXIT)
    record = dict(extra, step=int(step), world_size=int(world), attempt=number, saved=time.time())
    write_atomic(os.path.join(directory, tag, CHECKPOINT_DONE), json.dumps(record, sort_keys=True) + '\n')
    write_atomic(os.path.join(directory, 'latest'), tag + '\n')
    return record


def checkpoint_record(directory, tag):
    """The tag's gpucluster.json as a dict, or None when the tag is not complete (missing, unreadable)."""
    try:
        data = json.loads(read_regular(os.path.join(directory, tag, CHECKPOINT_DONE)).decode('utf-8'))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get('step'), int) else None


def latest_complete_checkpoint(directory):
    """(tag, record, note) of the checkpoint to resume from: the tag `latest` names when it is complete,
    else the complete tag with the highest step (a save cut short, or a `latest` written by a DeepSpeed
    without the marker: note says which was skipped and why); (None, None, note) when none is complete."""
    named = None
    try:
        named = read_regular(os.path.join(directory, 'latest')).decode('utf-8', 'replace').strip() or None
    except OSError:
        pass
    if named and (os.sep in named or named in (os.curdir, os.pardir)):
        named = None  # a tag is a name in the directory, never a path out of it
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


def resume_point(directory):
    """What a start with training_resume_from resumes from, as the training role asks the head before the start
    (``python3 gpucluster_progress.py --resume-point DIR``): {tag, step, complete, note}.

    The checkpoint is latest_complete_checkpoint's, the one the examples load and the supervisor counts
    from. Where it finds none, a directory that a script which does not write gpucluster.json saved is
    still something to resume from (the script decides whether it is whole): the newest by the number at
    the end of its name, then by its time, complete false. tag None: nothing to resume from."""
    tag, record, note = latest_complete_checkpoint(directory)
    if tag is not None:
        return {'tag': tag, 'step': (record or {}).get('step'), 'complete': bool(record), 'note': note}
    try:
        dirs = [(name, os.stat(os.path.join(directory, name)).st_mtime) for name in os.listdir(directory)
                if os.path.isdir(os.path.join(directory, name))]
    except OSError as exc:
        return {'tag': None, 'step': None, 'complete': False,
                'note': 'checkpoint directory %s cannot be read (%s)' % (directory, exc.strerror or exc)}
    if not dirs:
        return {'tag': None, 'step': None, 'complete': False, 'note': note}

    def newest(entry):
        numbers = re.findall(r'(\d+)', entry[0])
        return (int(numbers[-1]) if numbers else -1, entry[1])
    name = max(dirs, key=newest)[0]
    return {'tag': name, 'step': None, 'complete': False,
            'note': '%s; %s, the newest by its name, was saved without %s (the script that resumes from it '
                    'decides whether it is whole)' % (note, name, CHECKPOINT_DONE)}


def _step_text(tag, record):
    """The step of a chosen checkpoint: its record's, else the number that ends its tag (step40)."""
    step = (record or {}).get('step')
    if isinstance(step, int):
        return str(step)
    found = re.search(r'(\d+)$', str(tag or ''))
    return found.group(1) if found else 'unknown'


def resume_line(tag, record):
    """The line rank 0 logs once it chose the checkpoint every rank loads."""
    return 'resuming from %s (step %s), chosen by rank 0' % (tag, _step_text(tag, record))


def agreed_checkpoint(directory, rank, dist, device=None):
    """(tag, record, note) of the checkpoint to resume from, the same on every rank: rank 0 alone reads
    the directory (latest_complete_checkpoint) and broadcasts its choice (broadcast_object_list), so a
    `latest` that moves while the ranks start (a save of another run landing) cannot make two ranks load
    two tags. Rank 0 prints the note, if any, and "resuming from <tag> (step N), chosen by rank 0"."""
    choice = [latest_complete_checkpoint(directory) if rank == 0 else None]
    if _distributed(dist):
        dist.broadcast_object_list(choice, src=0, device=device)
    tag, record, note = choice[0]
    if rank == 0:
        if note:
            print(note, flush=True)
        if tag is not None:
            print(resume_line(tag, record), flush=True)
    return tag, record, note


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


def main(argv):
    """``--resume-point DIR``: resume_point(DIR) as one JSON line (the training role's check before a start)."""
    if len(argv) == 2 and argv[0] == '--resume-point':
        print(json.dumps(resume_point(argv[1]), sort_keys=True))
        return 0
    print('usage: gpucluster_progress.py --resume-point <checkpoint directory>', file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
