# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""What the supervisor keeps of itself on its host's disk (its state directory, root's): its lock (one
supervisor per job), its memory (memory.json: what it decided, written before it acts; recall() goes on from
it after its own error or its host's reboot), its heartbeat (supervisor.json) and figures (supervisor.prom,
Prometheus' text format), and what `--report` prints of a supervised job from them.

Record is the part of the supervisor (supervisor_driver.Supervisor) that writes them; it uses the
supervisor's dir, job, s (settings), state, attempt, attempt_began, memory, to_fence and the fields of its
heartbeat, and its event(). Every file is written by gpucluster_progress.write_atomic, and read as a regular
file only, up to a bound (gpucluster_progress.read_regular)."""

import fcntl
import json
import os
import signal
import socket
import time

import gpucluster_progress as progress
import supervision as core


LOCK = 'lock'


HEARTBEAT = 'supervisor.json'


STATUS = 'status.json'


LOG = 'ansible.log'


PROM = 'supervisor.prom'


MEMORY = 'memory.json'


EXIT_ENDED = 4


START_LIMIT = 5        # starts of the supervisor within START_WINDOW s that make it give up (a crash loop)


START_WINDOW = 600


METRICS = (
    ('last_read_timestamp_seconds', 'Time of the supervisor\'s last status read that succeeded.'),
    ('read_seconds', 'Seconds the supervisor\'s last status read took.'),
    ('failed_reads', 'Status reads in a row that failed.'),
    ('blind', '1 while the supervisor cannot read the job (blind_reads reads in a row failed), else 0.'),
    ('restarts', 'Restarts of the job by its supervisor.'),
    ('attempt', 'The attempt of the job the supervisor follows (1: its first start).'),
    ('heartbeat_timestamp_seconds', 'Time of the supervisor\'s last heartbeat.'),
    ('glance_seconds', 'Seconds the supervisor\'s last glance at the job\'s files on the shared storage took.'),
    ('glance_off', '1 while the glances cannot be made (the job directory does not answer or cannot be read).'),
    ('until_timestamp_seconds', 'When training_supervise_seconds ends the supervision (absent: it follows the job '
                                'until the job ends).'),
)


def label(value):
    return str(value).replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


def metrics_text(job, values):
    """The supervisor's figures in Prometheus' text format (gauges gpucluster_supervisor_<name>{job=...}, with
    HELP and TYPE); a value that is None (no read yet) is left out."""
    out = []
    for name, text in METRICS:
        value = values.get(name)
        if value is None:
            continue
        if isinstance(value, bool):
            value = int(value)
        metric = 'gpucluster_supervisor_' + name
        out += ['# HELP %s %s' % (metric, text), '# TYPE %s gauge' % metric,
                '%s{job="%s"} %s' % (metric, label(job), repr(float(value)) if isinstance(value, float) else value)]
    return '\n'.join(out) + '\n'


def lock(path):
    """Hold the job's supervisor lock for the life of this process; None when another one holds it."""
    handle = open(path, 'a+')
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def lock_held(path):
    """Whether a supervisor holds the lock at path (read only: a shared lock, let go at once; no file: no)."""
    try:
        handle = open(path)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        handle.close()
    return False


def report(state_dir, now=None):
    """What status prints of a supervised job: who supervises it (or that nobody does, or that its
    supervisor cannot read the job), then its summary and last events."""
    now = time.time() if now is None else now
    path = os.path.join(state_dir, LOCK)
    who = None
    try:
        held = lock_held(path)
    except OSError as exc:
        held = None
        who = 'cannot tell who supervises this job (%s: %s)' % (path, exc.strerror or exc)
    try:
        with open(os.path.join(state_dir, HEARTBEAT)) as handle:
            beat = json.load(handle)
    except (OSError, ValueError):
        beat = {}
    if not isinstance(beat, dict):
        beat = {}
    memory = read_memory(state_dir)
    events = core.read_events(state_dir)
    if held is False:
        who = 'nobody supervises this job (no supervisor holds %s)' % path
        if memory and memory.get('ended'):
            who += ': its supervision ended (%s)' % ended_why(memory)
        elif memory:
            last = (events or [None])[-1]
            who += (': its supervisor is not running (attempt %s, %s restart(s) used; %s); the job runs on '
                    'unsupervised until it starts again (systemctl status %s)'
                    % (memory.get('attempt', '?'), (memory.get('state') or {}).get('restarts', '?'),
                       ('its last event at %s: %s: %s' % (time.strftime('%H:%M:%S', time.localtime(last['time'])),
                                                          last.get('event'), last.get('why') or ''))
                       if last else 'no event of it', beat.get('unit') or 'gpucluster-supervise@<job id>.service'))
    elif held and beat.get('blind'):
        since = beat.get('blind_since')
        who = 'supervisor cannot read the job: %s (since %s)' % (
            beat['blind'], time.strftime('%H:%M:%S', time.localtime(since)) if isinstance(since, (int, float)) else '?')
    elif held:
        who = 'supervised by %s (pid %s on %s, %s %.0f s ago; attempt %s, restarts %s; %s)' % (
            beat.get('unit') or 'a supervisor', beat.get('pid', '?'), beat.get('host', '?'), beat.get('doing', '?'),
            now - beat.get('time', now), beat.get('attempt', '?'), beat.get('restarts', '?'),
            ('until %s (training_supervise_seconds)' % when(beat['until'])) if beat.get('until')
            else 'for as long as the job runs')
    return [who] + core.summary_lines(events, supervised=held is not False)


def read_memory(state_dir):
    """memory.json of a state directory: {} when there is none, None when it cannot be read or is not a record."""
    return read_record(os.path.join(state_dir, MEMORY))


def read_record(path):
    """A JSON object the supervisor wrote (its memory, its heartbeat): {} when there is none, None when it cannot
    be read or is not an object (a regular file only, read up to a bound)."""
    try:
        data = progress.read_regular(path)
    except FileNotFoundError:
        return {}
    except OSError:
        return None
    try:
        record = json.loads(data.decode('utf-8', 'replace'))
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def ended_why(memory):
    """How a supervision its memory says ended, ended (memory's ended: done, gave_up, stopped)."""
    return core.ENDINGS.get(memory.get('ended'), memory.get('ended'))


def proc_start(pid):
    """The start time of process pid (/proc/<pid>/stat's 22nd field, in clock ticks since boot): with its pid it
    names one process, never another that took the pid since; None when there is no such process."""
    try:
        with open('/proc/%d/stat' % int(pid)) as handle:
            fields = handle.read().rsplit(')', 1)[1].split()
        return None if fields[0] in ('Z', 'X') else int(fields[19])  # a zombie has ended
    except (OSError, ValueError, IndexError):
        return None


def end_leftover(child, wait=10.0):
    """End the run an earlier supervisor left running (child: [pid, start] from its memory; the run leads its
    own process group): SIGTERM to the group, SIGKILL after wait. Only that very process's group (the same pid
    and start time) is signalled. The pid when one was ended, else None."""
    try:
        pid, start = int(child[0]), child[1]
    except (TypeError, ValueError, IndexError):
        return None
    if start is None or proc_start(pid) != start:
        return None
    for sig, grace in ((signal.SIGTERM, wait), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except OSError:
            return pid
        end = time.time() + grace
        while time.time() < end:
            if proc_start(pid) != start:
                return pid
            time.sleep(0.1)
    return pid


def boot_time():
    """When this host booted, seconds since the epoch: when its init (pid 1) started, from /proc/stat's btime
    and pid 1's start (a system container that restarts has a new init on the same kernel); None where it
    cannot be read."""
    try:
        with open('/proc/stat') as handle:
            btime = next(float(line.split()[1]) for line in handle if line.startswith('btime '))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    init = proc_start(1)
    return btime + (init / float(os.sysconf('SC_CLK_TCK')) if init is not None else 0.0)


def when(stamp):
    return time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(stamp)) if isinstance(stamp, (int, float)) else '?'


def state_dir_of(settings):
    """The supervisor's state directory (settings.json's state_dir; before it had one: <job dir>/supervise)."""
    return settings.get('state_dir') or os.path.join(settings['job_dir'], 'supervise')


class Record:
    """The supervisor's own files: heartbeat and figures, memory (remember, recall)."""

    def heartbeat(self, what):
        """supervisor.json (mode 0644) and the figures, at once."""
        self.doing = what
        now = time.time()
        record = {'pid': os.getpid(), 'host': socket.gethostname(), 'unit': self.s.get('unit'), 'time': now,
                  'doing': what, 'nodes': self.state['nodes'], 'restarts': self.state['restarts'],
                  'attempt': self.attempt, 'step': self.seen_step, 'failed_reads': self.failed_reads,
                  'read_seconds': self.read_seconds, 'quick_seconds': self.quick_seconds, 'last_read': self.last_good,
                  'glance': (('off: %s' % self.glance_off) if self.glance_off
                             else ('on' if self.glance_every else 'none')),
                  'glance_seconds': self.glance_seconds, 'until': self.memory.get('until')}
        if self.blind:
            record.update(blind=self.blind, blind_since=self.blind_since)
        progress.write_atomic(os.path.join(self.dir, HEARTBEAT), json.dumps(record) + '\n', 0o644)
        self.write_metrics(now)

    def refresh(self):
        """The heartbeat again while a run goes on (a write that fails waits for the next)."""
        if self.doing is not None:
            try:
                self.heartbeat(self.doing)
            except OSError:
                pass

    def metrics_path(self):
        directory = self.s.get('metrics_dir') or ''
        return os.path.join(directory, 'gpucluster_supervisor_%s.prom' % self.job) if directory else None

    def write_metrics(self, now):
        text = metrics_text(self.job, {
            'last_read_timestamp_seconds': self.last_good, 'read_seconds': self.read_seconds,
            'failed_reads': self.failed_reads, 'blind': 1 if self.blind else 0, 'restarts': self.state['restarts'],
            'attempt': self.attempt, 'heartbeat_timestamp_seconds': now, 'glance_seconds': self.glance_seconds,
            'glance_off': 1 if self.glance_off else 0,
            # when a bound (training_supervise_seconds) ends the supervision; absent: none, it follows the job
            'until_timestamp_seconds': self.memory.get('until')})
        progress.write_atomic(os.path.join(self.dir, PROM), text, 0o644)
        where = self.metrics_path()
        if where:
            try:
                progress.write_atomic(where, text, 0o644)  # training_metrics_dir: the training account's
            except OSError as exc:
                if not self.metrics_failed:  # said once; the figures stay in the state directory
                    self.metrics_failed = True
                    self.event('metrics_failed', why='%s not written: %s (the figures are in %s)'
                               % (where, exc.strerror or exc, os.path.join(self.dir, PROM)))

    def metrics_gone(self):
        """The supervision ended: its figures leave node_exporter's directory (supervisor.prom stays)."""
        where = self.metrics_path()
        if where:
            try:
                os.unlink(where)
            except OSError:
                pass

    def remember(self, **changes):
        """Write what it decided to memory.json (root's, mode 0600, on its host's disk) before acting on it:
        attempt, restarts used, the job's nodes and spares, the nodes to fence, the recovery in progress
        (phase) and how the supervision ended (ended)."""
        self.memory.update(changes)
        self.memory.update(job_id=self.job, attempt=self.attempt, attempt_began=self.attempt_began,
                           state=self.state, to_fence=self.to_fence, time=time.time())
        progress.write_atomic(os.path.join(self.dir, MEMORY), json.dumps(self.memory, sort_keys=True, default=str)
                              + '\n', 0o600)

    def recall(self, now=None):
        """Go on from memory.json where an earlier run of this supervision left it (same attempt, restarts,
        nodes, fences; a recovery half done is finished by supervise()), or begin it. None to supervise; else
        the exit code: EXIT_ENDED when the supervision had ended, when its memory cannot be read (it does not
        guess), or when it started START_LIMIT times within START_WINDOW s (a gave_up that says so)."""
        now = time.time() if now is None else now
        memory = read_memory(self.dir)
        if memory is None:
            self.event('supervisor_error', why='%s cannot be read: the supervisor does not guess what it did; the '
                       'job runs on unsupervised (move the file aside to supervise the job as new)'
                       % os.path.join(self.dir, MEMORY))
            return EXIT_ENDED
        if memory.get('job_id') not in (None, self.job):
            memory = {}
        if memory.get('ended'):
            print('the supervision of job %s ended (%s): nothing to do' % (self.job, ended_why(memory)), flush=True)
            return 0
        seconds = int(self.s.get('seconds') or 0)
        if not memory:
            self.memory = {'started': now, 'until': now + seconds if seconds > 0 else None, 'starts': [now],
                           'phase': None}
            self.remember()
            return None
        self.memory = memory
        self.attempt = int(memory.get('attempt') or self.attempt)
        self.attempt_began = bool(memory.get('attempt_began', True))
        self.state = dict(self.state, **(memory.get('state') or {}))
        self.to_fence = dict(memory.get('to_fence') or {})
        # the step it read last, in its heartbeat (root's own file): a fault that its first read finds (a quick
        # read of a few nodes, which may read no step) still counts the steps lost to it
        beat = read_record(os.path.join(self.dir, HEARTBEAT)) or {}
        if beat.get('attempt') == self.attempt and isinstance(beat.get('step'), int) \
                and not isinstance(beat.get('step'), bool):
            self.seen_step = beat['step']
        starts = [t for t in memory.get('starts') or [] if isinstance(t, (int, float)) and now - t < START_WINDOW]
        starts.append(now)
        self.resumed = dict(memory)
        booted = boot_time()
        if booted is not None and isinstance(memory.get('time'), (int, float)) and memory['time'] < booted:
            # its host rebooted under it: the job's processes there ended with it, and a read that finds the job
            # stopped (nothing running, no exit code) is that, not a stop by someone (who stops the unit first)
            self.rebooted = (socket.gethostname(), booted)
        # the run it was making when it ended (a read, or a stop or start half done) ends before it acts again
        self.resumed['leftover'] = end_leftover(memory.get('child')) if memory.get('child') else None
        self.memory['child'] = None
        if len(starts) > START_LIMIT:
            why = ('the supervisor started %d times within %d s (its supervisor_error events say why): it gives up; '
                   'the job runs on unsupervised (train.yml -e training_state=stopped, then started, supervises it '
                   'again)' % (len(starts), START_WINDOW))
            self.remember(starts=starts, ended='gave_up')
            self.event('gave_up', why=why, step=None)
            return EXIT_ENDED
        self.remember(starts=starts)
        return None
