# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Supervise one training job from the supervisor host: stop it when a rank fails, a node stops answering
or the job stalls, judge its nodes with the quick health tier, restart it from its latest complete
checkpoint.

    gpucluster_supervise.py <state dir>/settings.json   # supervise (the unit gpucluster-supervise@<job id>)
    gpucluster_supervise.py --report <state dir>        # who supervises it (or that it cannot read the
                                                         # job), the summary and the last events
    gpucluster_supervise.py --probe <state dir>/settings.json
        # one bounded check that the supervisor, as it will run, can do its reads: prints
        # {"problems": ["host X: ...", ...]}; exit 0 when there is none, 1 otherwise

Runs as root from root's own disk (/usr/local/lib/gpucluster, supervision.py, flight_recorder.py and
gpucluster_progress.py beside it) and keeps all its state in its state directory on the supervisor host's own
disk (settings.json's state_dir, e.g. /var/lib/gpucluster/supervise/<job id>; made by the role), never on the
shared storage:

    settings.json, vars.json   written by the role (mode 0600: vars.json may hold tokens)
    lock                       an exclusive lock held for the supervisor's life: one supervisor per job
    events.jsonl               what it saw and did, one JSON object a line (mode 0644); every event of
                               an attempt of the job carries its number (attempt)
    supervisor.json            its heartbeat (mode 0644): pid, host, unit, doing, time, attempt, restarts,
                               step, failed_reads, read_seconds, quick_seconds (the last quick read's),
                               last_read, glance (on, none or off: why),
                               glance_seconds, and blind/blind_since while it cannot read the job
    supervisor.prom            its figures in Prometheus' text format (mode 0644), written on every read
                               and heartbeat; also <metrics_dir>/gpucluster_supervisor_<job id>.prom when
                               settings.json names a node_exporter textfile directory (metrics_dir),
                               removed there when the supervision ends
    status.json                the last status read; ansible.log: the output of every run (mode 0600)
    memory.json                what it decided (mode 0600), written before it acts: attempt, restarts used,
                               the job's nodes and spares, the nodes to fence, the recovery in progress
                               (phase: stopping, checking, restarting with its plan), the run in progress
                               (child: pid and start time), its starts, its bound (until) and how the
                               supervision ended (ended). A supervisor that starts again (its own error:
                               the unit restarts it; its host's reboot: the unit is enabled) goes on from
                               there: the same attempt and budget, the run it left ended, a recovery half
                               done finished once (recall, finish_half_done)
Its files are written by gpucluster_progress.write_atomic (a temporary file of a random name, made with
O_CREAT|O_EXCL|O_NOFOLLOW, renamed over the file): metrics_dir is the training account's, and root never makes,
truncates, chmods or follows a name there. What it reads of the job's files (exit and progress files, the
checkpoint directory, the flight recorder's dumps) is a regular file only, opened with O_NOFOLLOW|O_NONBLOCK
and read up to a bound: a link planted there is not followed, a FIFO never holds it.
The quick health tier reports to settings.json's health_report_dir. The job's directory on the shared
storage (job_dir) is only named to the playbooks; the supervisor writes nothing there.

settings.json: job_id, job_dir, state_dir, unit, nodes, hosts (node: inventory host), addresses (node: address
for the direct probe; else its host), restarts, min_nodes, seconds, interval, action_timeout, read_timeout
(300), blind_reads (3), attempt (1), ssh_port (22), checkpoint_dir, ansible_playbook, ansible (default: the
ansible beside ansible_playbook), inventory, train_playbook, health_playbook, vars_file, health_report_dir,
metrics_dir (''), training_user (--probe, when vars.json names none), environment, launcher (''),
glance_seconds (2), stall_seconds (0: no quiet sign), late_seconds (0: no late sign), spares (the inventory's spares group less the job's
nodes), job_spares (the job's nodes of the spares group, from its start: every restart keeps them in its
layout).

With the slurm launcher (SlurmSupervisor, the Slurm driver) the job heals the way Slurm does: the stop requeues and holds the Slurm job
(training_slurm_hold: scontrol requeuehold), the health run drains the nodes that fail it (health_slurm_drain,
reason 'gpucluster-health: <checks>'), and the restart releases the same Slurm job id on the nodes the plan
keeps (the left-out excluded; the ranks see SLURM_RESTART_COUNT + 1 as their attempt); when it gives up, the
held job is cancelled.

Every read and action is a run of the collection's own playbooks (train.yml status/stopped/started,
health.yml quick tier), the same reads `status` and `watch` make. Between two reads (settings' interval) it
glances every glance_seconds (2; 0: never) at the job's files on the shared storage, read only, in a thread
bounded by GLANCE_TIMEOUT: every node's exit file (<job_dir>/exit/<node>) and the first line and end of every
rank's progress file (gpucluster_progress.rank_file_marks). A sign (a node's part exited, ranks of the attempt
wrote done, one wrote nothing for stall_seconds, or one that logged a step is late: it wrote nothing for
late_seconds or LATE_PACE times its longest gap) ends the wait: the read comes at once and decides (a sign is
never a fault by itself; the fault event keeps it: sign, sign_time). When the sign is of parts that exited
non-zero, or of late ranks whose nodes their headers name, the read is first a quick one of those nodes and the
head only (train.yml status with training_status_nodes, --limit; quick_seconds): a failure it reads is the fault
at once (the fault event's quick_read), and after a late sign a node it cannot reach is confirmed by a second
quick read of the same nodes and the direct probe, without a read of every node, whose cost grows with the
cluster; late nodes that the quick read reached with no failure are a late event (no fault); else the job is
read whole. A
sign a read judged is not read for again while it lasts. A glance that fails or hangs turns the glances off (a glance event, the heartbeat's glance)
until one works again; the reads go on at their interval. A node a read could not reach (and no
failed rank) is a fault only when a second read still cannot reach it and the direct probe fails: a TCP
connect to its SSH port (5 s, said in the why) and an ansible ping of it (bounded), which decides; else it
is one read_missed event. A node so confirmed lost is left out of the stop and of the health run (neither
waits out its SSH timeout), and its ranks are killed once it answers again (a fenced event). When
blind_reads reads in a row fail (no status, or no state in it), the supervisor says it is blind (a blind
event, its heartbeat, its figures, --report's first line) and stops nothing until a read works again (a
sighted event). Each start of the job is an attempt: the first is
settings.json's attempt, each restart the next (passed to train.yml as training_attempt); a read that
names an earlier attempt is ignored (the new one has not written yet), and is no failed read. A stop that
failed on a node that answered (failed_hosts of its output: a process of the job it could not end there) is
never followed by a restart, which would start beside what it left: it gives up at once. When the job
is done or it gives up, it writes the job's report page (train.yml -e training_state=report); a report run
that fails is an event (report_failed), never a crash.

Exit codes: 0 (done, stopped, or an ended supervision started again), 1 (an unexpected error: a supervisor_error
event first; the unit restarts it), EXIT_HELD 3 (another supervisor holds the job), EXIT_ENDED 4 (it gave up, or
its memory cannot be read); the unit restarts on 1 only. After START_LIMIT starts within START_WINDOW s it gives
up (gave_up, saying so); the job runs on. Its tools gone (a program that cannot be run) make a run that failed
(rc 127), so a supervisor without its venv is blind, not dead.

Events (each with time, event, attempt): supervising, resumed, supervisor_error, read_missed {nodes}, late {nodes}, blind {failed_reads},
sighted {failed_reads}, glance (off or on again), fault {seen, nodes, step, last_step_time, step_read, sign,
sign_time; seen: failed, unreachable, stalled, or rebooted: after the supervisor host's reboot the job was read
stopped with no part exited), job_stopped, checked {nodes},
restart {nodes, left_out, resume_step, lost_steps}, restart_failed {nodes; why: the failing task's message
from ansible.log}, training {step}, done {step}, gave_up {step}, stopped, report_failed, metrics_failed;
each with its why.

The job's state is decided on the controller, where the status read runs (plugins/plugin_utils/training/job_state.py:
the status file's job); the supervisor decides what to do about it with the supervision core (supervision.py,
installed beside it; plugins/module_utils/training/supervision.py, shared with the pod agent on Kubernetes):
decide() what a read asks for, the culprits' order, plan_restart(), the events' vocabulary and writer, and
the summary (restarts, steps lost and time lost). Its own pure functions read the reads: observe(),
confirm_unreachable(); run_error() and parse_adhoc() read ansible's output.
"""

import base64
import fcntl
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

# the supervision core (plugins/module_utils/training/supervision.py), the reader of the flight recorder's dumps
# (plugins/module_utils/training/flight_recorder.py) and the job's files (gpucluster_progress.py: their formats,
# and how root reads and writes them safely), installed beside this program (the training role's
# __training_supervisor_files): Python puts a program's own directory first on its path
import flight_recorder
import gpucluster_progress as progress
import supervision as core

LOCK = 'lock'
HEARTBEAT = 'supervisor.json'
STATUS = 'status.json'
LOG = 'ansible.log'
PROM = 'supervisor.prom'
MEMORY = 'memory.json'
# exit codes the unit does not restart on (RestartPreventExitStatus): another supervisor holds the job, the
# supervision ended (gave up, or it had ended before this start); an unexpected error is 1 and restarted
EXIT_HELD = 3
EXIT_ENDED = 4
START_LIMIT = 5        # starts of the supervisor within START_WINDOW s that make it give up (a crash loop)
START_WINDOW = 600
CKPT_TIMEOUT = 60      # the read of the checkpoint directory (as the training account)
# The supervisor's playbook runs reach a frozen node: SSH gives up on it (a connection multiplexed over
# an open master gets no ConnectTimeout, so the server is asked to answer every 5 s), and a read ends.
SSH_ENV = {'ANSIBLE_SSH_ARGS': '-C -o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=5 '
                               '-o ServerAliveCountMax=3',
           'ANSIBLE_TIMEOUT': '10'}
ENDED = 'ended'  # read(): a sign ended the read
TCP_TIMEOUT = 5        # the direct probe's connect to a node's SSH port
BANNER_TIMEOUT = 20    # and the wait for its sshd's banner (a loaded node's sshd forks before it answers)
PING_TIMEOUT = 60      # the direct probe's ansible ping (every node not read, in one run)
PROBE_TIMEOUT = 120    # each run of --probe
BEAT_EVERY = 15        # the heartbeat is written again this often while a run goes on
LOG_TAIL = 256 * 1024  # the most of a run's output read back for its error
ERROR_CHARS = 400      # a run's error, cut to this
GLANCE_EVERY = 2       # seconds between two glances at the job's files (settings' glance_seconds)
GLANCE_TIMEOUT = 10    # a glance that takes longer says the shared storage does not answer
LATE_PACE = 3          # a rank is late past late_seconds or this many times its longest gap between two lines


# ----- what the job's state says ----------------------------------------------------------------
JOB_KEYS = ('state', 'failed_nodes', 'unreachable_nodes', 'stalled_nodes', 'step', 'last_step_time', 'why', 'exit_code')


def observe(status, now=None, attempt=None):
    """The supervisor's view of one status read: {state, failed_nodes, unreachable_nodes, stalled_nodes,
    step, last_step_time, why, time} (and stale: true for a read of an earlier attempt).

    status: what train.yml -e training_state=status wrote (training_status_file). Its `job` is the job's one
    state, decided on the controller (plugins/plugin_utils/training/job_state.py, job_state()): running, succeeded,
    stopped, failed (a rank or launcher exited non-zero), unreachable (a node could not be read; a rank that
    failed as well is in failed_nodes), stalled (no rank logged a step or heartbeat for
    training_stall_seconds) or unknown; the supervisor takes it as it is. Its own: a read of an attempt
    before attempt is stale (the restarted job has not written yet), and a read without a job state is
    unknown."""
    now = time.time() if now is None else now
    obs = {'time': now, 'state': 'unknown', 'failed_nodes': [], 'unreachable_nodes': [], 'stalled_nodes': [],
           'step': None, 'last_step_time': None, 'why': ''}
    job = (status or {}).get('job')
    if not isinstance(job, dict):
        obs['why'] = 'the status read gave nothing' if not status else 'the status read holds no job state'
        return obs
    obs.update((key, job[key]) for key in JOB_KEYS if job.get(key) is not None)
    read_attempt = job.get('attempt')
    if attempt is not None and isinstance(read_attempt, int) and read_attempt < attempt:
        why = 'the read is of attempt %d: attempt %d has not written yet' % (read_attempt, attempt)
        obs.update(state='unknown', stale=True, step=None, last_step_time=None, failed_nodes=[], unreachable_nodes=[],
                   stalled_nodes=[], why=why)
    return obs


needs_confirming = core.needs_confirming


def confirm_unreachable(first, second, probes):
    """The nodes of the first read's unreachable ones that the second read could not reach either and whose
    direct probe failed (probes: {node: {answered, why}}; a node with no probe is taken as not answering)."""
    return [n for n in first['unreachable_nodes']
            if n in second['unreachable_nodes'] and not (probes.get(n) or {}).get('answered')]


def unread_too_long(counts, first, second, probes, limit):
    """The nodes both reads missed although they answered the direct probe, `limit` confirmations in a row
    (counts, {node: confirmations in a row}, is updated: a node either read reached starts again at 0): a
    node whose reads hang while it answers is a fault too, or it would hide a stall behind missed reads."""
    for node in list(counts):
        if node not in first['unreachable_nodes'] or node not in second['unreachable_nodes']:
            counts.pop(node)
    out = []
    for node in first['unreachable_nodes']:
        if node in second['unreachable_nodes'] and (probes.get(node) or {}).get('answered'):
            counts[node] = counts.get(node, 0) + 1
            if counts[node] >= limit:
                out.append(node)
    return out


def missed_why(first, second, probes):
    """Why the nodes the first read could not reach are not a fault (the read_missed event's why)."""
    confirmed = confirm_unreachable(first, second, probes)
    parts = []
    for node in first['unreachable_nodes']:
        if node in confirmed:
            continue
        probe = probes.get(node) or {}
        again = ('the second read could not reach it either' if node in second['unreachable_nodes']
                 else 'the second read %s' % ('reached it' if second['state'] not in ('unknown',)
                                              else 'gave no answer (%s)' % (second['why'] or 'nothing read')))
        direct = ('it answered the direct probe (%s)' % probe.get('why') if probe.get('answered')
                  else 'the direct probe failed (%s)' % (probe.get('why') or 'not probed'))
        parts.append('%s: %s; %s' % (node, again, direct))
    return 'not read once, not a fault: ' + '; '.join(parts)


# ----- the glance: the job's files on the shared storage, between two reads ------------------------
def read_exit_codes(job_dir, nodes):
    """{node: {code, mtime}} of the nodes whose exit file (<job_dir>/exit/<node>, written by the part of the
    job started there when it ends, removed by its start) holds a number. Only a regular file is read, and only
    its first 64 bytes (progress.open_regular: the training account writes the directory)."""
    out = {}
    for node in nodes:
        path = os.path.join(job_dir, 'exit', node)
        try:
            with os.fdopen(progress.open_regular(path), 'rb') as handle:
                first = handle.read(64).decode('ascii', 'replace').split('\n')[0].strip()
                mtime = os.fstat(handle.fileno()).st_mtime
        except OSError:
            continue
        if first.lstrip('-').isdigit():
            out[node] = {'code': int(first), 'mtime': mtime}
    return out


def read_rank_marks(job_dir, marks_of):
    """[rank_file_marks of each progress file under <job_dir>/progress]; marks_of reads one file."""
    folder = os.path.join(job_dir, 'progress')
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if re.match(r'^rank-\d+\.log$', name):
            marks = marks_of(os.path.join(folder, name))
            if marks is not None:
                out.append(marks)
    return out


def node_of_host(host, nodes):
    """The job's node a rank's progress header names (host=: the rank's hostname), by its name or short name;
    None when none is (an inventory whose names are not the nodes' hostnames)."""
    if not host:
        return None
    if host in nodes:
        return host
    short = host.split('.')[0]
    found = [n for n in nodes if n.split('.')[0] == short]
    return found[0] if len(found) == 1 else None


def glance_signs(exits, ranks, nodes, attempt, stall_seconds, now, late_seconds=0):
    """What one glance at the job's files saw that a read should judge now rather than at its interval:
    [{kind, nodes, since, why}], kind exit (the part of the job on a node ended, with its code; failed: true
    when a code is not 0, nodes then those, the first to end first), done (ranks of
    this attempt wrote their done line), quiet (a rank of this attempt wrote nothing for stall_seconds) or late
    (a rank of this attempt that logged a step wrote nothing for late_seconds, or LATE_PACE times its longest
    gap between two lines when that is longer, and is not quiet yet: nodes, those its header's host names, or
    none when one cannot be told; a frozen node's ranks write nothing); since: when what it shows began (the
    file's time; for quiet and late, its last write and the bound). Only the job's nodes now and the ranks of
    its attempt count. A sign decides nothing: the read does."""
    signs = []
    ended = sorted(((exits[n]['mtime'], n) for n in nodes if n in exits))
    failed = [n for _, n in ended if exits[n]['code'] != 0]
    if failed:
        signs.append({'kind': 'exit', 'nodes': failed, 'since': min(exits[n]['mtime'] for n in failed), 'failed': True,
                      'why': 'the job on %s exited with %s (its exit file%s)' % (
                          ', '.join(failed), ', '.join('code %d' % exits[n]['code'] for n in failed),
                          's' if len(failed) > 1 else '')})
    elif ended:
        signs.append({'kind': 'exit', 'nodes': [n for _, n in ended], 'since': ended[0][0],
                      'why': 'the job on %s ended with code 0' % ', '.join(n for _, n in ended)})
    mine = [r for r in ranks if r.get('attempt') == attempt]
    done = sorted((r['rank'], r['mtime']) for r in mine if r.get('done') is not None)
    if done:
        signs.append({'kind': 'done', 'nodes': [], 'since': min(t for _, t in done),
                      'why': 'rank(s) %s wrote done' % ', '.join(str(r) for r, _ in done)})
    if stall_seconds:
        quiet = sorted((r['rank'], r['mtime']) for r in mine
                       if r.get('done') is None and now - r['mtime'] > stall_seconds)
        if quiet:
            signs.append({'kind': 'quiet', 'nodes': [], 'since': min(t for _, t in quiet) + stall_seconds,
                          'why': 'rank(s) %s wrote nothing for more than %d s' % (
                              ', '.join(str(r) for r, _ in quiet), stall_seconds)})
    if late_seconds:
        late = []
        for r in sorted(mine, key=lambda r: (r['rank'] is None, r['rank'])):
            bound = max(float(late_seconds), LATE_PACE * (r.get('gap') or 0.0))
            silent = now - r['mtime']
            if (r.get('done') is None and r.get('step') is not None and silent > bound
                    and not (stall_seconds and silent > stall_seconds)):
                late.append((r, bound, node_of_host(r.get('host'), nodes)))
        if late:
            named = [n for _, _, n in late]
            late_nodes = [] if None in named else sorted(set(named), key=named.index)
            signs.append({'kind': 'late', 'nodes': late_nodes, 'since': min(r['mtime'] + b for r, b, _ in late),
                          'why': 'rank(s) late: %s' % '; '.join(
                              '%s on %s wrote nothing for %.0f s (its bound %.0f s)'
                              % (r['rank'], n or r.get('host') or '?', now - r['mtime'], b) for r, b, n in late)})
    return signs


class Glance:
    """The glance of one job's files on the shared storage, in a thread of its own so that a hung mount never
    holds the supervisor: start() begins one (never while one still runs), result() is (signs, seconds) once it
    ended, hung(now) the seconds the one in progress has run past its bound. off: why the glance cannot be
    made (a job directory the supervisor host cannot read), None while it can."""

    def __init__(self, job_dir, marks_of, timeout=GLANCE_TIMEOUT):
        self.job_dir, self.marks_of, self.timeout = job_dir, marks_of, timeout
        self.thread = None
        self.began = None
        self.done = None
        self.off = None

    def start(self, nodes, attempt, stall_seconds, late_seconds=0):
        if self.thread is not None and self.thread.is_alive():
            return False
        self.done = None
        self.began = time.time()

        def run():
            try:
                os.stat(self.job_dir)
                exits = read_exit_codes(self.job_dir, nodes)
                ranks = read_rank_marks(self.job_dir, self.marks_of)
                result = (glance_signs(exits, ranks, nodes, attempt, stall_seconds, time.time(), late_seconds), None)
            except OSError as exc:
                result = (None, '%s: %s' % (getattr(exc, 'filename', None) or self.job_dir, exc.strerror or exc))
            self.done = result + (round(time.time() - self.began, 3),)

        self.thread = threading.Thread(target=run, name='gpucluster-glance', daemon=True)
        self.thread.start()
        return True

    def wait(self, seconds):
        """The glance's (signs, error, seconds) once it ended within seconds, else None."""
        if self.thread is not None:
            self.thread.join(max(0.0, seconds))
            if not self.thread.is_alive():
                self.thread = None
        return self.done

    def running_for(self, now):
        return now - self.began if self.thread is not None and self.thread.is_alive() else 0.0


# ----- reads that fail: blind and sighted -------------------------------------------------------
def read_failure(rc, status, obs, error='', read_timeout=300):
    """What one failed read was: the run's rc (or its timeout), whether it wrote a status, its error."""
    if rc == 124:
        what = 'train.yml status did not end within %d s (read_timeout)' % read_timeout
    else:
        what = 'train.yml status ended with rc %s' % rc
    if status is None:
        what += ' and wrote no status'
    elif obs['state'] == 'unknown':
        what += '; its status named no state of the job (%s)' % (obs['why'] or 'unknown')
    return what + (': %s' % error if error else '')


def blind_why(count, failure, last_good, started, now):
    """The blind event's why: how many reads failed, the last one's failure, the last good read's age."""
    since = ('last good read %.0f s ago' % (now - last_good) if last_good is not None
             else 'no good read since the supervisor started %.0f s ago' % (now - started))
    return '%d reads in a row failed: %s; %s' % (count, failure, since)


# ----- ansible's output -------------------------------------------------------------------------
ANSI = re.compile(r'\x1b\[[0-9;]*[A-Za-z]')
FATAL = re.compile(r'^fatal: \[(?P<host>[^\]]+)\]: (?P<caption>FAILED!|UNREACHABLE!) =>\s?(?P<rest>.*)$')
ERROR = re.compile(r'^(?:ERROR!|\[ERROR\]:)\s*(?P<msg>.*)$')
ADHOC = re.compile(r'^(?P<host>\S+) \| (?P<caption>SUCCESS|CHANGED|FAILED!?|UNREACHABLE!?)(?P<rest>.*)$')
NO_MATCH = re.compile(r'Could not match supplied host pattern, ignoring: (?P<host>\S+)')


def one_line(text, limit=ERROR_CHARS):
    """text on one line (runs of white space one space), cut to limit characters."""
    text = ' '.join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3].rstrip() + '...'


def result_msg(lines):
    """The message of one result ansible printed (JSON on one or more lines, or YAML with
    callback_result_format=yaml): msg, with the module's stderr when the module itself failed."""
    text = '\n'.join(lines).strip()
    if text.startswith('{'):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            msg = data.get('msg') or ''
            msg = '; '.join(str(m) for m in msg) if isinstance(msg, list) else str(msg)
            for key in ('module_stderr', 'stderr'):
                extra = [x for x in str(data.get(key) or '').splitlines() if x.strip()]
                if extra and (not msg or 'MODULE FAILURE' in msg or 'non-zero return code' in msg
                              or 'deserialization' in msg):
                    msg = '%s: %s' % (msg, extra[-1]) if msg else extra[-1]
            return msg or text
        found = re.search(r'"msg":\s*"((?:[^"\\]|\\.)*)"', text)
        if found:
            try:
                return json.loads('"%s"' % found.group(1))
            except ValueError:
                return found.group(1)
        return text
    for i, line in enumerate(lines):
        found = re.match(r'^(\s*)msg:\s?(.*)$', line)
        if not found:
            continue
        indent, value = len(found.group(1)), found.group(2).strip()
        more = []
        for nxt in lines[i + 1:]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            more.append(nxt.strip())
        if value in ('|', '|-', '|+', '>', '>-', '>+'):
            value = ' '.join(more)
        else:
            value = ' '.join([value] + more)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1].replace("''", "'")
        elif len(value) >= 2 and value[0] == value[-1] == '"':
            try:
                value = json.loads(value)
            except ValueError:
                value = value[1:-1]
        return value
    return text


def clean_msg(msg):
    msg = one_line(msg, 100000)
    return msg[len('Task failed: '):] if msg.startswith('Task failed: ') else msg


def fatal_results(text):
    """[(line, task number, task, host, unreachable, msg)] of the fatal results in one ansible-playbook run's
    output (a host's FAILED! or UNREACHABLE!), those followed by ...ignoring left out."""
    lines = ANSI.sub('', text or '').splitlines()
    task, task_no, out = None, 0, []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith('TASK ['):
            task_no += 1
            task = line[len('TASK ['):].rstrip('* ').rstrip()
            task = task[:-1] if task.endswith(']') else task
        found = FATAL.match(line)
        if not found:
            i += 1
            continue
        block, j = [found.group('rest')], i + 1
        while j < len(lines) and lines[j][:1] in (' ', '\t') and lines[j].strip():
            block.append(lines[j])
            j += 1
        if j >= len(lines) or lines[j].strip() != '...ignoring':  # an ignored one: its line is read next
            out.append((i, task_no, task, found.group('host'), found.group('caption') == 'UNREACHABLE!',
                        clean_msg(result_msg(block))))
        i = j
    return out


def failed_hosts(text):
    """{host: message} of the hosts a run failed on although they answered (FAILED!, not ignored; a host
    that was UNREACHABLE! is not one): the last message of each."""
    return dict((host, msg) for _, _, _, host, unreachable, msg in fatal_results(text) if not unreachable)


def run_error(text, limit=ERROR_CHARS):
    """The error of one ansible-playbook run's output, on one line cut to limit: the last failing task's
    fatal lines ('task "<name>": <hosts>: <msg>'; those followed by ...ignoring skipped), or the last
    ERROR! / [ERROR]: message after the last ignored failure, whichever came last; '' when none."""
    lines = ANSI.sub('', text or '').splitlines()
    fatals = [(i, task_no, task, host, ('unreachable: ' + msg) if unreachable else msg)
              for i, task_no, task, host, unreachable, msg in fatal_results(text)]
    errors, last_ignored = [], -1
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == '...ignoring':
            last_ignored = i
        found = ERROR.match(line)
        if found:
            block, j = [found.group('msg')], i + 1
            while j < len(lines) and lines[j].strip() and not lines[j].startswith(('Origin:', 'fatal: [', 'TASK [')):
                block.append(lines[j])
                j += 1
            errors.append((i, one_line(' '.join(block), 100000)))
            i = j
            continue
        i += 1
    errors = [e for e in errors if e[0] > last_ignored]
    if fatals and (not errors or fatals[-1][0] > errors[-1][0]):
        last = fatals[-1][1]
        group = [f for f in fatals if f[1] == last]
        by_msg = []
        for _, _, _, host, msg in group:
            for entry in by_msg:
                if entry[1] == msg:
                    entry[0].append(host)
                    break
            else:
                by_msg.append(([host], msg))
        said = '; '.join('%s: %s' % (', '.join(hosts), msg) for hosts, msg in by_msg)
        return one_line(('task "%s": %s' % (group[-1][2], said)) if group[-1][2] else said, limit)
    if errors:
        return one_line(errors[-1][1], limit)
    return ''


def parse_adhoc(text, hosts):
    """{host: None (it answered) or why it failed} from the output of an `ansible` ad-hoc run, one line a
    host (-o: 'h | CHANGED | rc=0 | (stdout) ...', 'h | FAILED! => {...}', 'h | UNREACHABLE!: msg') or
    the minimal callback's blocks ('h | CHANGED | rc=0 >>', 'h | UNREACHABLE! => {' and the lines after
    it). A host the output does not name did not answer (not in the inventory, when ansible says so)."""
    lines = ANSI.sub('', text or '').splitlines()
    blocks = {}
    current = None
    for line in lines:
        found = ADHOC.match(line)
        if found:
            current = [found.group('caption'), found.group('rest'), []]
            blocks.setdefault(found.group('host'), []).append(current)
        elif current is not None and not line.startswith(('[WARNING]', '[DEPRECATION WARNING]')):
            current[2].append(line)
    unmatched = set(m.group('host') for m in (NO_MATCH.search(line) for line in lines) if m)
    error = run_error(text)
    out = {}
    for host in hosts:
        mine = blocks.get(host)
        if not mine:
            out[host] = ('not in the inventory (no host of that name)' if host in unmatched
                         else 'no answer in ansible\'s output' + (' (%s)' % error if error else ''))
            continue
        failing = [b for b in mine if b[0].startswith(('FAILED', 'UNREACHABLE'))]
        if not failing:
            out[host] = None
            continue
        said, bare = [], []
        for caption, rest, more in failing:
            kind = 'unreachable' if caption.startswith('UNREACHABLE') else 'failed'
            rest = rest.strip()
            if rest.startswith('=>'):
                msg = clean_msg(result_msg([rest[2:].strip()] + more))
                said.append('%s: %s' % (kind, msg))
            elif rest.startswith(':'):
                said.append('%s: %s' % (kind, clean_msg(rest[1:])))
            else:
                # a command's own failure: '| rc=1 | (stdout) ... (stderr) ...' or '| rc=1 >>' and its output
                detail = one_line(' '.join([rest.strip(' |').replace(' >>', '')] + more), 300)
                bare.append('%s: %s' % (kind, detail))
        unique = []
        for msg in said or bare:
            if msg not in unique:
                unique.append(msg)
        out[host] = one_line('; '.join(unique), 300)
    return out


# ----- figures for Prometheus -------------------------------------------------------------------
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


# ----- one supervisor per job -------------------------------------------------------------------
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


# ----- its memory: what it decided, on the supervisor host's disk --------------------------------
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


# ----- the loop on the supervisor host ----------------------------------------------------------
def state_dir_of(settings):
    """The supervisor's state directory (settings.json's state_dir; before it had one: <job dir>/supervise)."""
    return settings.get('state_dir') or os.path.join(settings['job_dir'], 'supervise')


def ansible_of(settings):
    """The ansible ad-hoc program: settings.json's ansible, else the one beside ansible_playbook."""
    return settings.get('ansible') or os.path.join(os.path.dirname(settings.get('ansible_playbook') or ''), 'ansible')


def control_dir_of(settings):
    """The directory of this supervisor's SSH control sockets: short (a socket's path is at most 107 bytes,
    whatever the job id), under /run where root may write (else the temporary directory), one per job."""
    base = '/run' if os.access('/run', os.W_OK) else tempfile.gettempdir()
    tag = hashlib.sha1(state_dir_of(settings).encode()).hexdigest()[:12]
    return os.path.join(base, 'gpucluster-supervise-cp', tag)


def run_env(settings):
    """The environment of every ansible run: the supervisor's own, settings' environment; SSH that gives up
    (SSH_ENV) only where no ANSIBLE_CONFIG is named (the supervisor host's ansible.cfg carries the same bounds
    and its timeout, which these variables would override). SSH's shared connections live in control_dir
    (control_dir_of): never in a directory other runs share, whose masters may have died with the
    session that started them and left sockets that fail the next run (`read from master failed`)."""
    environment = dict(settings.get('environment') or {})
    environment.setdefault('ANSIBLE_SSH_CONTROL_PATH_DIR', control_dir_of(settings))
    if environment.get('ANSIBLE_CONFIG') or os.environ.get('ANSIBLE_CONFIG'):
        return dict(os.environ, **environment)
    return dict(os.environ, **dict(SSH_ENV, **environment))


def as_account(user):
    """subprocess keywords that run a child as user (its uid, group and groups), {} for None."""
    if not user:
        return {}
    import pwd  # pylint: disable=import-outside-toplevel
    entry = pwd.getpwnam(user)
    if sys.version_info >= (3, 9):
        return {'user': entry.pw_uid, 'group': entry.pw_gid,
                'extra_groups': os.getgrouplist(user, entry.pw_gid)}

    def drop():  # Python 3.8: no user= yet
        os.setgid(entry.pw_gid)
        os.setgroups(os.getgrouplist(user, entry.pw_gid))
        os.setuid(entry.pw_uid)
    return {'preexec_fn': drop}


def tcp_probe(host, port, timeout=TCP_TIMEOUT, banner=BANNER_TIMEOUT):
    """(answered, why) of one TCP connect to host:port (bounded by timeout) and, with banner, the wait for its
    sshd's banner (bounded by banner): answered only when the banner came. It needs no login, no shell and no
    sudo, so a loaded node whose logins are slow answers it; the kernel of a frozen node accepts the
    connection, but its sshd sends nothing. banner 0: the connect alone answers."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except socket.timeout:
        return False, 'port %s on %s: no answer within %s s' % (port, host, timeout)
    except OSError as exc:
        return False, 'port %s on %s: %s' % (port, host, exc.strerror or exc)
    try:
        if not banner:
            return True, 'port %s on %s: open' % (port, host)
        conn.settimeout(banner)
        try:
            first = conn.recv(256)
        except socket.timeout:
            return False, 'port %s on %s: open, but no SSH banner within %s s (a frozen node?)' % (port, host, banner)
        except OSError as exc:
            return False, 'port %s on %s: open, then %s' % (port, host, exc.strerror or exc)
        line = first.split(b'\n')[0].strip().decode('ascii', 'replace')
        if line.startswith('SSH-'):
            return True, 'port %s on %s: sshd answered (%s)' % (port, host, line[:60])
        return False, 'port %s on %s: open, but no SSH banner (%r)' % (port, host, line[:60])
    finally:
        conn.close()


class Supervisor:
    def __init__(self, settings):
        self.s = settings
        self.job = settings['job_id']
        self.job_dir = settings['job_dir']  # the job's directory on the shared storage: named to the playbooks only
        self.dir = state_dir_of(settings)
        self.attempt = int(settings.get('attempt', 1))
        # False after a restart that failed: the new attempt may never write, so reads of the earlier one count
        self.attempt_began = True
        self.blind_reads = max(1, int(settings.get('blind_reads', 3)))
        # spares_used: the spares that ran this job (those it started on, job_spares, and those a restart took);
        # none is taken again in a left-out node's place, and each still among the job's nodes is passed to
        # every restart as training_spares (else train.yml would lay the job out without it)
        self.state = {'nodes': list(settings['nodes']), 'restarts': 0, 'failures': [],
                      'spares_used': [n for n in settings.get('job_spares') or [] if n in settings['nodes']]}
        self.child = None
        self.seen_step = None  # the last step a read saw: a read that reaches no rank (a node hangs) keeps it
        self.seen_step_time = None  # and when the ranks logged it
        self.doing = None
        self.failed_reads = 0  # reads in a row that failed
        self.blind = None      # why the supervisor cannot read the job (None: it can)
        self.blind_since = None
        self.last_good = None  # time of the last read that worked
        self.read_seconds = None
        self.quick_seconds = None  # the last quick read's (a failed exit sign's nodes and the head only)
        self.read_rc = None
        self.run_offset = 0    # where the output of the run in progress (or the last) begins in ansible.log
        self.missed = None     # the nodes of the read_missed event of this episode (no event again for them)
        self.unread = {}       # node: confirmations in a row whose reads missed it though it answered a ping
        self.to_fence = {}     # left-out node: the attempt whose start left it out (its older ranks are killed)
        self.fencing = None    # the fence run in progress: (Popen, output path, hosts, started)
        self.fence_next = 0.0
        self.metrics_failed = False
        self.started = time.time()
        # the glance at the job's files on the shared storage between two reads (glance_seconds: 0 is none)
        self.glance_every = float(settings.get('glance_seconds', GLANCE_EVERY) or 0)
        self.glance = None       # the Glance, made at the first wait
        self.glance_off = None   # why the glances cannot be made now (None: they can)
        self.glance_seconds = None
        self.sign = None         # the sign that ended the last wait ({time, kind, nodes, why}), for the fault event
        self.signs_read = set()  # the signs a read already judged: not read for again while they last
        # what it decided, on its host's disk (memory.json): a supervisor that starts again goes on from there
        self.memory = {}
        self.resumed = None      # the memory this run went on from (None: the supervision's first start)
        self.rebooted = None     # its host booted since its memory was last written: (host, boot time)
        self.fence_said = False  # a fence run that could not start was said (once, until one starts)

    def event(self, kind, **fields):
        """An event of the attempt in progress (fields may name another attempt)."""
        return core.append_event(self.dir, kind, **dict({'attempt': self.attempt}, **fields))

    # ----- runs of ansible ----------------------------------------------------------------------
    def command(self, cmd, timeout, watch=None):
        """rc of cmd, its output appended to ansible.log, bounded by timeout (rc 124 past it); the heartbeat
        is written again every BEAT_EVERY s while it runs. watch (a read's): called every glance_seconds while
        the run goes on; when it returns something, the run is ended and that is returned instead of an rc."""
        log = self.open_log()
        try:
            log.write('\n# %s %s\n' % (time.strftime('%Y-%m-%dT%H:%M:%S'), ' '.join(cmd)))
            log.flush()
            self.run_offset = os.fstat(log.fileno()).st_size
            # its own process group: the supervisor ends it (and only it) when it is stopped; a job the run
            # starts lives in sessions of its own (training_job) and is not part of it
            try:
                self.child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True, env=run_env(self.s))
            except OSError as exc:
                # its tools gone (a venv moved, a broken upgrade): a run that failed, read as one (blind after
                # blind_reads of them), never the supervisor's end
                log.write('ERROR! %s cannot be run: %s\n' % (cmd[0], exc.strerror or exc))
                log.flush()
                return 127
            # a supervisor killed now leaves this run: the next one ends it (recall) before it acts itself
            self.remember(child=[self.child.pid, proc_start(self.child.pid)])
            deadline = time.time() + timeout
            beat = time.time() + BEAT_EVERY
            step = min(BEAT_EVERY, self.glance_every) if watch else BEAT_EVERY
            while True:
                try:
                    return self.child.wait(timeout=max(0.0, min(step, deadline - time.time())))
                except subprocess.TimeoutExpired:
                    if time.time() >= deadline:
                        self.end_child()
                        return 124
                    if time.time() >= beat:
                        beat = time.time() + BEAT_EVERY
                        self.refresh()
                    seen = watch() if watch else None
                    if seen:
                        self.end_child()
                        return seen
        finally:
            if self.child is not None:
                self.child = None
                self.remember(child=None)
            log.close()

    def playbook(self, playbook, extra, limit=None, timeout=None, watch=None):
        cmd = [self.s['ansible_playbook'], '-i', self.s['inventory'], playbook, '-e', '@' + self.s['vars_file']]
        for key, value in extra.items():
            cmd += ['-e', json.dumps({key: value})]
        if limit:
            # node names (as the job's results say them) to inventory hosts
            cmd += ['--limit', ','.join(self.host_of(n) for n in limit)]
        return self.command(cmd, timeout or self.s['action_timeout'], watch=watch)

    def run_output(self):
        """The output of the last run (its end, at most LOG_TAIL bytes)."""
        try:
            with open(os.path.join(self.dir, LOG), 'rb') as handle:
                size = handle.seek(0, os.SEEK_END)
                handle.seek(max(self.run_offset, size - LOG_TAIL))
                return handle.read().decode('utf-8', 'replace')
        except OSError:
            return ''

    def last_error(self):
        """The last run's error (its last failing task's fatal lines, or its ERROR!), '' when none."""
        return run_error(self.run_output())

    def end_child(self):
        """End the playbook run in progress (its process group: SIGTERM, SIGKILL after 10 s)."""
        child = self.child
        if child is None or child.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(child.pid, sig)
            except OSError:
                return
            try:
                child.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def train(self, state, limit=None, timeout=None, watch=None, **extra):
        # training_supervisor_acting: stopped.yml leaves this supervisor's own unit alone
        return self.playbook(self.s['train_playbook'], dict(extra, training_state=state, training_job_id=self.job,
                                                            training_supervisor_acting=True), limit=limit,
                             timeout=timeout, watch=watch)

    # ----- reads --------------------------------------------------------------------------------
    def read(self, nodes=None, watch=True):
        """The status the job's read wrote (None when the run wrote none; ENDED when a sign ended it); its rc
        and seconds are kept. While it runs (watch) the glances go on: a sign of what began after the read
        began (the read may have passed that node already) ends it (self.sign, kept for the fault event), and
        look() reads the job again at once, without waiting for the rest of the read that began before the
        fault. nodes: a quick read of these nodes only (the head first; training_status_nodes, --limit),
        without the ranks' figures and without glances; its seconds are quick_seconds, not read_seconds."""
        path = os.path.join(self.dir, STATUS)
        watch = self.sign_during_read if watch and self.glance_every and not nodes else None
        extra = dict(training_status_nodes=list(nodes), training_progress_report=False) if nodes else dict(
            training_progress_report=True, training_progress_sample_seconds=0)
        try:
            os.unlink(path)
        except OSError:
            pass
        began = time.time()
        rc = self.train('status', limit=nodes, timeout=self.s.get('read_timeout', 300), training_status_file=path,
                        watch=(lambda: watch(began)) if watch else None, **extra)
        if isinstance(rc, dict):  # a sign ended it
            self.sign = rc
            self.log_text('# %s the read was ended: %s, after it began; the job is read again\n'
                          % (time.strftime('%Y-%m-%dT%H:%M:%S'), rc['why']))
            return ENDED
        self.read_rc = rc
        if nodes:
            self.quick_seconds = round(time.time() - began, 3)
        else:
            self.read_seconds = round(time.time() - began, 3)
        try:
            with open(path) as handle:
                status = json.load(handle)
        except (OSError, ValueError):
            return None
        return status if isinstance(status, dict) else None

    def look(self, nodes=None):
        """One status read and observe() of it. A read that failed (no status, or no state in it) is counted:
        blind_reads of them in a row make the supervisor blind (a blind event; its heartbeat and figures say
        so), the next read that works makes it sighted again. A read of an earlier attempt is no failure.
        nodes: a quick read of those nodes only (the head first; confirm() after a quick read)."""
        self.heartbeat('blind' if self.blind else 'reading')
        ended = False
        while True:
            if nodes:
                status = self.read(nodes=nodes)
                obs = self.observed(status, nodes)
                break
            obs = self.quick_look()
            if obs is not None:
                status = {'job': obs}
                break
            status = self.read(watch=not ended)  # one end by a sign a look: the read after it goes to its end
            if status is ENDED:
                ended = True
                continue
            obs = self.observed(status)
            break
        if obs['step'] is None and self.seen_step is not None:
            # a read that reached no rank's figures (a node hangs, a quick read): the last step read before
            obs.update(step=self.seen_step, step_read='before the fault',
                       last_step_time=obs['last_step_time'] or self.seen_step_time)
        self.seen_step, self.seen_step_time = obs['step'], obs['last_step_time']
        now = time.time()
        if status is None or (obs['state'] == 'unknown' and not obs.get('stale')):
            self.failed_reads += 1
            if self.blind is None and self.failed_reads >= self.blind_reads:
                failure = read_failure(self.read_rc, status, obs, self.last_error() if self.read_rc else '',
                                       self.s.get('read_timeout', 300))
                self.blind = blind_why(self.failed_reads, failure, self.last_good, self.started, now)
                self.blind_since = now
                self.event('blind', failed_reads=self.failed_reads, why=self.blind)
        else:
            if self.blind is not None:
                self.event('sighted', failed_reads=self.failed_reads,
                           why='reads again after %d failed reads' % self.failed_reads)
                self.blind = self.blind_since = None
            self.failed_reads = 0
            self.last_good = now
        self.heartbeat('blind' if self.blind else 'waiting')
        return obs

    def quick_look(self):
        """After a glance saw the part of the job on some nodes exit non-zero (a failed exit sign) or ranks late
        on some nodes (a late sign that names them), a quick read of those nodes and the head only: a failure
        it reads is the fault at once (observe()'s, with quick_read: the nodes read), and after a late sign so
        is a node it cannot reach, to be confirmed (confirm(): a second quick read and the direct probe),
        without a read of every node, which grows with the cluster. Anything else (no failure read there, a
        read that failed or is of an earlier attempt) is None, and the job is read whole; a failed quick read
        is no failed read. The stop, the check and the restart act on the whole job."""
        sign = self.sign
        nodes = self.state['nodes']
        if (not sign or sign.get('quick_read') or self.blind is not None
                or not ((sign.get('kind') == 'exit' and sign.get('failed'))
                        or (sign.get('kind') == 'late' and sign.get('nodes')))):
            return None
        ended = [n for n in sign.get('nodes') or [] if n in nodes[1:]]
        sign['quick_read'] = True  # one quick read a sign
        read = [nodes[0]] + ended
        status = self.read(nodes=read)
        obs = self.observed(status, read)
        lost = sign['kind'] == 'late' and needs_confirming(obs)
        if obs['state'] != 'failed' and not lost:
            self.log_text('# %s the quick read of %s (%.1f s) saw no failure (%s); the job is read whole\n'
                          % (time.strftime('%Y-%m-%dT%H:%M:%S'), ', '.join(read), self.quick_seconds,
                             obs['why'] or obs['state']))
            job = status.get('job') if isinstance(status, dict) else None
            # reached: the nodes read answered and read no failure (a read of part of the job cannot say more)
            reached = isinstance(job, dict) and not obs.get('stale') and (
                obs['state'] == 'running' or (obs['state'] == 'unknown' and job.get('left_out')))
            if sign['kind'] == 'late' and ended and reached:
                # the late nodes answered: no fault, but a frozen or slow node that came back is on record
                self.event('late', nodes=ended, why='%s; the quick read of %s (%.1f s) reached them and read no '
                           'failure: not a fault' % (sign['why'], ', '.join(read), self.quick_seconds))
            return None
        return obs

    def observed(self, status, nodes=None):
        """observe() of a status read, for the attempt in progress once it began (a read of an earlier one is
        stale); nodes: those a quick read read (the observation's quick_read)."""
        obs = observe(status, attempt=self.attempt if self.attempt_began else None)
        if nodes:
            obs['quick_read'] = list(nodes)
        return obs

    def start_probe(self, nodes):
        """Start the direct probe of nodes in the background (confirm() reads the job again meanwhile): a TCP
        connect to each node's SSH port (settings' ssh_port, at its address or else its host) that waits for
        its sshd's banner (tcp_probe, all nodes at once), then one ansible ping of them all (bounded by
        PING_TIMEOUT, no SSH retry: the second read has its own). A node answered when its sshd sent its banner
        (no login, shell or sudo needed: a loaded node with slow logins is alive) or the ping reached it (an
        inventory host may name no address the supervisor resolves); an open port alone is no answer (the
        kernel of a frozen node still accepts the connection)."""
        hosts = self.s.get('hosts') or {}
        names = dict((n, hosts.get(n, n)) for n in nodes)
        cmd = [ansible_of(self.s), ','.join(names[n] for n in nodes), '-i', self.s['inventory'],
               '-m', 'ansible.builtin.ping', '-o']
        handle, path = tempfile.mkstemp(prefix='probe.', dir=self.dir)
        try:
            child = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=dict(run_env(self.s), ANSIBLE_SSH_RETRIES='0'))
        except OSError as exc:
            child = exc
        finally:
            os.close(handle)
        # the banners are waited for meanwhile too: a frozen node's wait overlaps the second read and the ping
        port = int(self.s.get('ssh_port', 22))
        addresses = self.s.get('addresses') or {}
        tcp = {}

        def one(node):
            tcp[node] = tcp_probe(addresses.get(node) or names[node], port, TCP_TIMEOUT, BANNER_TIMEOUT)
        threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
        for thread in threads:
            thread.start()
        return {'nodes': list(nodes), 'names': names, 'child': child, 'path': path, 'began': time.time(),
                'tcp': tcp, 'threads': threads}

    def probe_result(self, probe):
        """{node: {answered, why}} of a probe start_probe() began: the TCP connects and banners (begun with it),
        then the ping's end (past PING_TIMEOUT from its start it is ended, and its nodes have not answered)."""
        nodes, names, child = probe['nodes'], probe['names'], probe['child']
        port = int(self.s.get('ssh_port', 22))
        for thread in probe['threads']:
            thread.join(max(0.0, probe['began'] + TCP_TIMEOUT + BANNER_TIMEOUT + 5 - time.time()))
        tcp = dict(probe['tcp'])  # a copy: a thread still waiting writes into the probe's, not into this one
        for node in nodes:  # a probe that is somehow still waiting has not answered
            tcp.setdefault(node, (False, 'port %s: no answer' % port))
        if isinstance(child, OSError):
            rc, answers = None, dict((names[n], 'not run: %s' % child) for n in nodes)
        else:
            try:
                rc = child.wait(timeout=max(0.0, probe['began'] + PING_TIMEOUT - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except OSError:
                    pass
                child.wait()
                rc = 124
            try:
                with open(probe['path'], 'rb') as handle:
                    text = handle.read().decode('utf-8', 'replace')
            except OSError:
                text = ''
            self.log_text('# %s %s (the direct probe, beside the second read)\n%s'
                          % (time.strftime('%Y-%m-%dT%H:%M:%S'), ' '.join(child.args), text))
            answers = parse_adhoc(text, [names[n] for n in nodes])
        try:
            os.unlink(probe['path'])
        except OSError:
            pass
        out = {}
        for node in nodes:
            ping = answers.get(names[node])
            if rc == 124 and ping and ping.startswith('no answer'):
                ping = 'no answer within %d s' % PING_TIMEOUT
            # alive: its sshd answered (no login needed: a loaded node's slow login stops nothing), or the ping
            out[node] = {'answered': ping is None or tcp[node][0],
                         'why': '%s; ansible ping: %s' % (tcp[node][1], 'pong' if ping is None else ping)}
        return out

    def open_log(self):
        """ansible.log (mode 0600), opened to append."""
        return os.fdopen(os.open(os.path.join(self.dir, LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), 'a')

    def host_of(self, node):
        """The inventory host of a node (as the job's results name it)."""
        return self.s.get('hosts', {}).get(node, node)

    def log_text(self, text):
        """Append text to ansible.log (a write that fails is only lost)."""
        try:
            with self.open_log() as log:
                log.write('\n' + text)
        except OSError:
            pass

    def confirm(self, obs):
        """A read found nodes it could not reach, and nothing else wrong: a direct probe of them beside a second
        read. (fault, stop) for those both confirm (confirm_unreachable); else a read_missed event and the
        second read with what it asks for (a node not reached again is waited on)."""
        nodes = list(obs['unreachable_nodes'])
        self.heartbeat('probing %s' % ', '.join(nodes))
        probe = self.start_probe(nodes)  # beside the second read: a lost node costs one SSH timeout, not two
        # a quick read's nodes are read again alone: the confirmation does not grow with the cluster either
        second = self.look(nodes=obs.get('quick_read'))
        probes = self.probe_result(probe)
        confirmed = confirm_unreachable(obs, second, probes)
        hung = unread_too_long(self.unread, obs, second, probes, self.blind_reads)
        if hung and not confirmed:
            why = ('%s answered a ping but its reads did not come back %d times in a row (a hung process or mount '
                   'on it?)' % (', '.join(hung), self.blind_reads))
            fault = dict(obs, unreachable_nodes=hung, why=why)
            return fault, {'action': 'stop', 'seen': 'unreachable', 'nodes': core.culprits(fault), 'why': why}
        if confirmed:
            why = '%s did not answer two reads and a direct probe (%s)' % (
                ', '.join(confirmed), '; '.join('%s: %s' % (n, (probes.get(n) or {}).get('why')) for n in confirmed))
            # lost: they are left out of the stop and of the health run (each would wait out its SSH timeout
            # there); their ranks are killed once they answer again (fence_step)
            fault = dict(obs, unreachable_nodes=confirmed, lost=confirmed, why=why)
            return fault, {'action': 'stop', 'seen': 'unreachable', 'nodes': core.culprits(fault), 'why': why}
        if self.missed != nodes:
            self.event('read_missed', nodes=nodes, why=missed_why(obs, second, probes))
            self.missed = nodes
        act = core.decide(second)
        if act['action'] != 'wait' and not needs_confirming(second):
            return second, act
        return second, {'action': 'wait', 'why': 'a read missed %s' % ', '.join(nodes)}

    def fence_step(self, now=None):
        """One step of fencing the left-out nodes, never a wait: a run in progress is read when it ended (or
        ended past FENCE_TIMEOUT); otherwise every FENCE_EVERY s a run starts, in the background, that kills
        the older attempts' processes of the job on the nodes still waiting. A node it reached is fenced
        (a fenced event with how many processes); one it did not reach is tried again later."""
        now = time.time() if now is None else now
        if self.fencing is not None:
            child, path, hosts, started = self.fencing
            if child.poll() is None and now - started < FENCE_TIMEOUT:
                return
            if child.poll() is None:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except OSError:
                    pass
                child.wait()
            try:
                with open(path) as handle:
                    text = handle.read()
            except OSError:
                text = ''
            for fd_path in (path,):
                try:
                    os.unlink(fd_path)
                except OSError:
                    pass
            self.fencing = None
            names = dict((self.host_of(n), n) for n in self.to_fence)
            for host, killed in sorted(fenced_counts(text, list(hosts)).items()):
                node = names.get(host, host)
                attempt = self.to_fence.pop(node, None)
                self.event('fenced', nodes=[node], killed=killed,
                           why='%s answers again: %d process(es) of the job from attempts before %s killed there'
                               % (node, killed, attempt))
            return
        if not self.to_fence or now < self.fence_next:
            return
        self.fence_next = now + FENCE_EVERY
        user = self.s.get('training_user') or 'train'
        hosts = [self.host_of(n) for n in sorted(self.to_fence)]
        handle, path = tempfile.mkstemp(prefix='fence.', dir=self.dir)
        try:
            child = subprocess.Popen(
                fence_command(ansible_of(self.s), self.s['inventory'], hosts, user, self.job,
                              min(self.to_fence.values())),
                stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env=run_env(self.s))
        except OSError as exc:
            os.close(handle)
            os.unlink(path)
            if not self.fence_said:  # the nodes still wait: tried again every FENCE_EVERY s
                self.fence_said = True
                self.event('fence_failed', nodes=sorted(self.to_fence),
                           why='the fence run could not start: %s (tried again every %d s)' % (exc, FENCE_EVERY))
            return
        os.close(handle)
        self.fence_said = False
        self.fencing = (child, path, hosts, now)

    def glance_once(self, until, wanted=None):
        """One glance at the job's files (begun now unless one still runs), waited for until `until`: the first
        sign no read judged yet (and that wanted(sign) takes, where given), else None. A glance that fails or runs past GLANCE_TIMEOUT turns the glances off
        (a glance event with why; the reads go on at their interval), the next one that works on again."""
        if self.glance is None:
            self.glance = Glance(self.job_dir, progress.rank_file_marks)
        stall = int(self.s.get('stall_seconds') or 0)
        self.glance.start(list(self.state['nodes']), self.attempt, stall, float(self.s.get('late_seconds') or 0))
        done = self.glance.wait(until - time.time())
        if done is None:
            late = self.glance.running_for(time.time())
            if late > GLANCE_TIMEOUT and self.glance_off is None:
                self.glance_off = 'the job directory %s did not answer within %g s' % (self.job_dir, GLANCE_TIMEOUT)
                self.event('glance', why='glances off: %s (the reads go on every %s s)'
                           % (self.glance_off, self.s['interval']))
            return None
        signs, error, seconds = done
        self.glance.done = None
        self.glance_seconds = seconds
        if error is not None:
            if self.glance_off is None:
                self.glance_off = error
                self.event('glance', why='glances off: %s (the reads go on every %s s)' % (error, self.s['interval']))
            return None
        if self.glance_off is not None:
            self.event('glance', why='glances on again (they were off: %s)' % self.glance_off)
            self.glance_off = None
        keys = set((g['kind'], tuple(g['nodes'])) for g in signs)
        self.signs_read &= keys  # a sign that went and comes again is read for again
        for sign in signs:
            key = (sign['kind'], tuple(sign['nodes']))
            if key not in self.signs_read and (wanted is None or wanted(sign)):
                self.signs_read.add(key)
                return dict(sign, time=time.time())
        return None

    def sign_during_read(self, began):
        """A glance while a read runs: a sign no read judged yet of what began after `began` (the read in
        progress may not see it), else None. A sign of what began before the read is left to the wait after
        it (a read at once if this one did not judge it a fault)."""
        return self.glance_once(time.time() + min(1.0, self.glance_every),
                                wanted=lambda sign: sign.get('since', 0) > began)

    def wait_next_read(self):
        """Sleep until the next read (settings' interval); every glance_seconds of it, a glance at the job's
        files: a sign no read judged yet ends the wait at once (returned; the read judges it)."""
        end = time.time() + self.s['interval']
        while True:
            now = time.time()
            if now >= end:
                return None
            if not self.glance_every:
                time.sleep(end - now)
                return None
            step_end = min(end, now + self.glance_every)
            sign = self.glance_once(step_end)
            if sign is not None:
                return sign
            rest = step_end - time.time()
            if rest > 0:
                time.sleep(rest)

    def hang_verdict(self):
        """What the flight recorder's dumps of this attempt say of a stall (flight_recorder.stall_verdict): the
        collective the ranks wait in and the rank that never entered it; None where there is no dump (a job
        without NCCL) or it cannot be read."""
        try:
            return flight_recorder.stall_verdict(self.job_dir, self.attempt)
        except Exception:  # pylint: disable=broad-except  # an explanation that cannot be read is only missing
            return None

    def health(self, nodes):
        """(the quick tier's report, rc of its run); the report is None when the run wrote none."""
        report_dir = self.s['health_report_dir']
        try:
            os.unlink(os.path.join(report_dir, 'latest-quick.json'))
        except OSError:
            pass
        extra = dict({'health_tier': 'quick', 'health_report_dir': report_dir}, **self.check_extra())
        rc = self.playbook(self.s['health_playbook'], extra, limit=nodes)
        try:
            with open(os.path.join(report_dir, 'latest-quick.json')) as handle:
                return json.load(handle), rc
        except (OSError, ValueError):
            return None, rc

    def checkpoint(self):
        """(step, None) of the checkpoint a restart resumes from, as the start's own resume check finds it
        (gpucluster_progress.py --resume-point: the newest complete one, else the newest a script saved without
        the marker), read as the training account (it owns the directory; root on a root_squash export reads
        nothing there, and root parses nothing it writes), bounded by CKPT_TIMEOUT; (None, None) when the job
        declares no checkpoint directory or none is saved yet; (None, why) when the directory cannot be read."""
        directory = self.s.get('checkpoint_dir')
        if not directory:
            return None, None
        user = self.s.get('training_user') if os.geteuid() == 0 else None
        who = user or 'the supervisor'
        cmd = [sys.executable, os.path.abspath(progress.__file__), '--resume-point', directory]
        try:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 timeout=CKPT_TIMEOUT, cwd='/', universal_newlines=True, **as_account(user)).stdout
        except subprocess.TimeoutExpired:
            return None, ('checkpoint directory %s gave no answer within %d s, read as %s (a hung mount?)'
                          % (directory, CKPT_TIMEOUT, who))
        except (OSError, KeyError, ValueError, subprocess.SubprocessError) as exc:
            return None, 'checkpoint directory %s could not be read as %s: %s' % (directory, who, exc)
        try:
            point = json.loads(out.strip().splitlines()[-1][:65536])
        except (ValueError, IndexError):
            point = None
        if not isinstance(point, dict):
            return None, 'checkpoint directory %s could not be read as %s: %s' % (directory, who, last_line(out))
        if point.get('tag') is None:
            note = point.get('note') or ''
            if 'cannot be read' in note:
                return None, '%s, read as %s' % (note, who)
            return None, None
        step = point.get('step')
        if not isinstance(step, int):
            numbers = re.findall(r'(\d+)', str(point['tag']))
            step = int(numbers[-1]) if numbers else 0
        return step, None

    # ----- what it says of itself ---------------------------------------------------------------
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

    # ----- the loop -----------------------------------------------------------------------------
    def run(self):
        """recall() its memory, then supervise(): the exit code (0, EXIT_ENDED; 1 after an unexpected error,
        which is a supervisor_error event first: the unit starts it again and it goes on from its memory)."""
        try:
            code = self.recall()
            return code if code is not None else self.supervise()
        except Exception as exc:  # pylint: disable=broad-except  # said, then the unit restarts it
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            why = ('%s: %s (%s line %d, in %s); it starts again and goes on from its memory (%s)'
                   % (type(exc).__name__, exc, os.path.basename(frame.filename), frame.lineno, frame.name,
                      os.path.join(self.dir, MEMORY)))
            traceback.print_exc()
            try:
                self.event('supervisor_error', why=why)
            except Exception:  # pylint: disable=broad-except  # its disk refuses even this: the journal has it
                pass
            return 1
        finally:
            self.metrics_gone()

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

    def supervise(self):
        """The supervision loop (supervision.Loop, this supervisor its driver: the methods below), then the
        job's report page where it ended: 0, or EXIT_ENDED when it gave up."""
        outcome = core.Loop(self).run()
        if outcome in ('done', 'gave_up'):
            self.write_report()
        return EXIT_ENDED if outcome == 'gave_up' else 0

    # ----- the loop's driver (supervision.Loop): reads and acts through the collection's playbooks ------
    @property
    def settings(self):
        return self.s

    def note(self, text):
        self.log_text('# %s %s\n' % (time.strftime('%Y-%m-%dT%H:%M:%S'), text))

    def begin(self):
        until = self.memory.get('until')
        if self.resumed:
            phase = self.resumed.get('phase') or {}
            self.event('resumed', nodes=self.state['nodes'], why=(
                'the supervisor started again (start %d of its last %d s): attempt %d, %d of %d restart(s) used, '
                '%s%s' % (len(self.memory['starts']), START_WINDOW, self.attempt, self.state['restarts'],
                          self.s['restarts'], ('until %s' % when(until)) if until else 'until the job ends',
                          ('; a recovery was half done (%s): it is finished now' % phase.get('phase'))
                          if phase else '')
                + ('; the run it left (pid %d) was ended' % self.resumed['leftover']
                   if self.resumed.get('leftover') else '')
                + ('; %s rebooted (up since %s)' % (self.rebooted[0], when(self.rebooted[1])) if self.rebooted else '')))
        else:
            self.event('supervising', nodes=self.state['nodes'], why='restarts %d, min nodes %d, %s'
                       % (self.s['restarts'], self.s['min_nodes'],
                          'for %d s' % self.s['seconds'] if until else 'until the job ends'))

    def bound(self):
        return 'training_supervise_seconds (%d)' % self.s['seconds']

    def platform_fault(self, obs):
        """Its host rebooted (recall): once a read says something, a job that ended with the reboot is a fault
        of the rebooted host, not of the first of the other nodes' ranks to exit after it."""
        if not self.rebooted or obs['state'] == 'unknown':
            return None
        host, booted = self.rebooted
        self.rebooted = None
        nodes = [n for n in self.state['nodes'] if n == host or (self.s.get('hosts') or {}).get(n) == host]
        # the job's ranks on the rebooted host ended with it; the other nodes' ranks then fail on their own
        # (a collective whose peer is gone): the fault is the reboot, not the first of them to exit
        if obs['state'] == 'stopped' or (obs['state'] == 'failed' and nodes):
            why = ('the job ended with the reboot of %s (up since %s): ' % (host, when(booted))
                   + ('nothing of it runs and no part of it exited' if obs['state'] == 'stopped' else
                      'its ranks there ended with it, then the others failed (%s)' % obs.get('why')))
            act = {'action': 'stop', 'seen': 'rebooted', 'nodes': nodes, 'why': why}
            return dict(obs, state='failed', why=why), act
        return None

    def reached(self):
        self.missed = None  # a read that reached every node ends an episode of missed reads
        self.unread = {}

    def between(self):
        self.fence_step()
        self.sign = self.wait_next_read()

    def after_restart(self):
        self.seen_step = self.seen_step_time = None  # the restarted job's steps start again from its checkpoint
        self.sign, self.signs_read = None, set()

    def look_half_started(self):
        self.attempt_began = True  # a read of an earlier attempt is stale: nothing of this one was read
        return self.look()

    def fault_fields(self, obs):
        more = {'step_read': obs['step_read']} if obs.get('step_read') else {}
        if self.sign:  # the glance that ended the wait for this read
            more.update(sign=self.sign['why'], sign_time=self.sign['time'])
        if obs.get('quick_read'):  # seen by the quick read of the sign's nodes and the head
            more.update(quick_read=obs['quick_read'], quick_seconds=self.quick_seconds)
        return more

    def fault_kind(self, obs, act):
        """The failure policy's kind of a fault: its host rebooted (the parts there started again), a node lost,
        a stall, a rank killed by a signal or another exit."""
        kinds = {'rebooted': 'restarted', 'unreachable': 'unreachable', 'stalled': 'stalled'}
        if act['seen'] in kinds:
            return kinds[act['seen']], None
        # a failed rank: the core's reading of its exit (a negative code is a signal's, -9 for SIGKILL)
        code = obs.get('exit_code')
        return core.failure_kind({'state': 'failed', 'reason': obs.get('why') or '', 'exit_code': code}), code

    def stop(self, obs, act, lost):
        """train.yml stopped on every node that answers (the lost are told to it, left out of its --limit)."""
        stalled = act['seen'] == 'stalled'
        answering = [n for n in self.state['nodes'] if n not in lost]
        # a stall: the ranks are asked for their NCCL flight recorder's dump before anything is signalled
        extra = {}
        if stalled:
            extra['training_flight_dump'] = True
        extra.update(self.stop_extra())
        if lost:  # the stop's --limit leaves them out: train.yml is told they may be
            extra['training_lost_nodes'] = [self.host_of(n) for n in lost]
        rc = self.train('stopped', limit=answering if lost else None, **extra)
        # nodes that answered and where the stop failed (processes of the job it could not end): the job may run
        # on there, and a restart would start beside it
        unstopped = failed_hosts(self.run_output()) if rc != 0 else {}
        if lost:
            why = ('every rank, container and launcher stopped on %s; %s lost: its ranks are killed when it answers '
                   'again' % (', '.join(answering), ', '.join(lost)) if rc == 0 else
                   'stop on %s ended with rc %d' % (', '.join(answering), rc))
        else:
            why = ('every rank, container and launcher stopped' if rc == 0 else
                   'stop ended with rc %d (a node that does not answer keeps its frozen ranks)' % rc)
        hang = self.hang_verdict() if stalled else None
        if unstopped:
            why += '; it failed on %s' % '; '.join('%s (%s)' % item for item in sorted(unstopped.items()))
        return {'why': why + ('; %s' % hang['why'] if hang else ''), 'unstopped': unstopped,
                'fields': {'collective': hang.get('collective'), 'missing_ranks': hang.get('missing_ranks')}
                if hang else {}}

    def check(self, nodes, spares, act, lost):
        """health.yml's quick tier on the nodes that answer and the ready spares."""
        report, rc = self.health(nodes + spares)
        if report is None:
            # no verdict was read: no node is called failing for it; the fault's own culprits are judged
            bad = list(act['nodes']) + spares  # an unchecked spare is not taken
            return {'bad': bad, 'why': 'the quick health tier wrote no report (health.yml rc %d; its output in %s): '
                                       'judged by the fault alone: %s'
                                       % (rc, os.path.join(self.dir, LOG), ', '.join(bad) or 'no node named')}
        bad = lost + core.bad_nodes(report, nodes + spares)
        why = 'quick health tier: %s' % (('failing or not answering: ' + ', '.join(bad)) if bad
                                         else 'every node passed')
        if lost:
            why += ' (%s lost: not checked)' % ', '.join(lost)
        return {'bad': bad, 'why': why}

    def no_checkpoint_why(self):
        return 'no checkpoint directory declared (training_supervise_checkpoint_dir)'

    def wait_back(self, left_out):
        return None  # a node left out is replaced or done without; the job is never held for it

    def restart_fields(self, plan, why):
        return {}

    def fence_later(self, nodes, attempt):
        for node in nodes:
            self.to_fence[node] = attempt  # the restart begins the next attempt: its events carry it

    def restart_extra(self, plan, ckpt):
        extra = {'training_wait': 'first_step', 'training_attempt': self.attempt,
                 # the spares the job runs on now (those it started on and those taken since, still among its nodes)
                 'training_spares': [self.host_of(n) for n in self.state['spares_used'] if n in plan['nodes']]}
        if ckpt is not None:
            extra.update(training_resume_from=self.s['checkpoint_dir'], training_resume_if_present=True)
        return extra

    def start(self, plan, extra):
        """train.yml started on the plan's nodes: '' or why it did not start."""
        rc = self.train('started', limit=plan['nodes'], **extra)
        self.attempt_began = rc == 0
        if rc == 0:
            return ''
        error = self.last_error()
        what = ('train.yml started did not end within %d s (action_timeout)' % self.s['action_timeout']
                if rc == 124 else 'train.yml started ended with rc %d' % rc)
        return '%s: %s' % (what, error) if error else \
            '%s (no fatal or ERROR line in its output; %s)' % (what, os.path.join(self.dir, LOG))

    def stop_part(self, nodes):
        rc = self.train('stopped', limit=nodes)
        return failed_hosts(self.run_output()) if rc != 0 else {}

    def stop_extra(self):
        return {}

    def check_extra(self):
        return {}

    def gave_up(self, why):
        pass

    def write_report(self):
        """The job's report page (train.yml -e training_state=report), bounded in time; a run that fails is an
        event (report_failed), never the supervisor's end."""
        try:
            rc = self.train('report', timeout=self.s.get('report_timeout', 300), training_report_fetch=False)
            if rc != 0:
                error = self.last_error()
                self.event('report_failed', why='train.yml report ended with rc %d (its output in %s)%s'
                           % (rc, os.path.join(self.dir, LOG), (': %s' % error) if error else ''))
        except Exception as exc:  # pylint: disable=broad-except  # the supervision ended already: only say so
            try:
                self.event('report_failed', why='the report page was not written: %s' % exc)
            except OSError:
                pass


class SlurmSupervisor(Supervisor):
    """The Slurm driver (the slurm launcher): the job heals the way Slurm does. The stop requeues and holds the
    Slurm job (training_slurm_hold: scontrol requeuehold), the quick tier drains the nodes that fail it
    (health_slurm_drain, reason 'gpucluster-health: <checks>'), the restart releases the same Slurm job id on
    the nodes the plan keeps (train.yml started: the left-out excluded), and giving up cancels the held job."""

    def stop_extra(self):
        return {'training_slurm_hold': True}

    def check_extra(self):
        return {'health_slurm_drain': True}

    def gave_up(self, why):
        # the Slurm job waits requeued and held: nothing will release it now
        rc = self.train('stopped')
        self.event('job_stopped', why='the held Slurm job cancelled' if rc == 0 else
                   'cancelling the held Slurm job ended with rc %d (scancel it by hand)' % rc)


def driver_for(settings):
    """The supervisor of a job's platform: Slurm's with the slurm launcher, else the SSH one."""
    return (SlurmSupervisor if settings.get('launcher') == 'slurm' else Supervisor)(settings)


# ----- fencing: a left-out node's ranks killed once it answers again ------------------------------
# Run on a left-out node as the training account: SIGKILL to the processes of the job (GPUCLUSTER_JOB_ID in
# their environment, which only the job's own processes carry) of an attempt before the given one; it prints
# how many. Nothing else is signalled (the account reads only its own processes' environment).
FENCE_SCRIPT = r"""
import os, signal, sys
job, keep, me, killed = sys.argv[1].encode(), int(sys.argv[2]), os.getpid(), 0
for pid in os.listdir('/proc'):
    if not pid.isdigit() or int(pid) == me:
        continue
    try:
        with open('/proc/%s/environ' % pid, 'rb') as handle:
            env = dict(item.split(b'=', 1) for item in handle.read().split(b'\0') if b'=' in item)
    except OSError:
        continue
    if env.get(b'GPUCLUSTER_JOB_ID') != job:
        continue
    try:
        attempt = int(env.get(b'GPUCLUSTER_ATTEMPT') or b'1')
    except ValueError:
        attempt = 1
    if attempt < keep:
        try:
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
        except OSError:
            pass
print('gpucluster-fenced %d' % killed)
"""
FENCE_EVERY = 30      # seconds between two tries to fence the nodes still waiting for it
FENCE_TIMEOUT = 60    # the most a try runs before it is ended


def fence_command(ansible, inventory, hosts, user, job_id, attempt):
    """The ad-hoc run that kills, on hosts, the job's processes of attempts before attempt, as user."""
    code = 'import base64;exec(base64.b64decode("%s"))' % base64.b64encode(FENCE_SCRIPT.encode()).decode()
    return [ansible, ','.join(hosts), '-i', inventory, '-b', '--become-user', user, '-m', 'ansible.builtin.command',
            '-a', "python3 -c '%s' %s %d" % (code, job_id, attempt), '-o']


def fenced_counts(text, hosts):
    """{host: processes killed} for the hosts the fence run reached (parse_adhoc), the others left out."""
    answers = parse_adhoc(text, hosts)
    out = {}
    for host in hosts:
        if answers.get(host) is None:
            found = re.search(r'^%s \|.*gpucluster-fenced (\d+)' % re.escape(host), text or '', re.M)
            out[host] = int(found.group(1)) if found else 0
    return out


# ----- --probe: can the supervisor, as it will run, read the job? -------------------------------
def capture(cmd, timeout, env):
    """(rc, output) of cmd, bounded by timeout (past it its process group is ended and rc is 124); (None, why)
    when it cannot start."""
    try:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env=env)
    except OSError as exc:
        return None, str(exc)
    try:
        out, _ = child.communicate(timeout=timeout)
        return child.returncode, out.decode('utf-8', 'replace')
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(child.pid, sig)
            except OSError:
                pass
            try:
                out, _ = child.communicate(timeout=5)
                return 124, out.decode('utf-8', 'replace')
            except subprocess.TimeoutExpired:
                continue
        return 124, ''


def last_line(text):
    lines = [line for line in ANSI.sub('', text or '').splitlines() if line.strip()
             and not line.startswith(('[WARNING]', '[DEPRECATION WARNING]'))]
    return one_line(lines[-1]) if lines else 'no output'


def probe(settings, timeout=PROBE_TIMEOUT):
    """The problems that would keep the supervisor from reading the job, each a line: (a) its programs,
    inventory and vars file are there; (b) every node's host runs `id` as the training account through the
    inventory (ansible ... -m ansible.builtin.command -a id -b --become-user <user>; each host that did not,
    named with why); (c) train.yml loads (ansible-playbook --syntax-check). Every run is bounded by timeout."""
    problems = []
    playbook = settings.get('ansible_playbook') or ''
    ansible = ansible_of(settings) if (playbook or settings.get('ansible')) else ''
    inventory = settings.get('inventory') or ''
    vars_file = settings.get('vars_file') or ''
    missing = set()
    for key, path in (('ansible_playbook', playbook), ('ansible', ansible), ('inventory', inventory),
                      ('vars_file', vars_file)):
        if not path or not os.path.exists(path):
            missing.add(key)
            problems.append('%s %s not found' % (key, path or '(not set in settings.json)'))
    # both are made by the start before the probe: one missing here was removed, or is a file
    if settings.get('state_dir') and not os.path.isdir(settings['state_dir']):
        problems.append('state_dir %s is not a directory (the start makes it; start the job again)'
                        % settings['state_dir'])
    if settings.get('metrics_dir') and not os.path.isdir(settings['metrics_dir']):
        problems.append('metrics_dir %s is not a directory (training_metrics_dir, where the supervisor writes its '
                        'figures for node_exporter; the start makes it where missing): remove what is there, name '
                        'another directory, or leave training_metrics_dir empty' % settings['metrics_dir'])
    user = settings.get('training_user')
    if 'vars_file' not in missing:
        try:
            with open(vars_file) as handle:
                user = (json.load(handle) or {}).get('training_user') or user
        except (OSError, ValueError, AttributeError) as exc:
            problems.append('vars_file %s cannot be read: %s' % (vars_file, getattr(exc, 'strerror', None) or exc))
    if not user:
        problems.append('no training_user in %s or settings.json: the account the job runs as'
                        % (vars_file or 'vars.json'))
    hosts_of = settings.get('hosts') or {}
    hosts = []
    for node in list(settings.get('nodes') or []) + list(settings.get('spares') or []):  # spares: it may take them
        if hosts_of.get(node, node) not in hosts:
            hosts.append(hosts_of.get(node, node))
    if not settings.get('nodes'):
        problems.append('settings.json names no nodes')
    # no shared SSH connection: the probe runs in the session of the controller's task, whose end may kill the
    # masters it would leave for the supervisor's runs
    env = dict(run_env(settings), ANSIBLE_NOCOLOR='1',
               ANSIBLE_SSH_ARGS='-C -o ControlMaster=no -o ServerAliveInterval=5 -o ServerAliveCountMax=3')
    if user and hosts and not missing & {'ansible', 'inventory'}:
        rc, out = capture([ansible, ','.join(hosts), '-i', inventory, '-m', 'ansible.builtin.command', '-a', 'id',
                           '-b', '--become-user', user, '-o'], timeout, env)
        if rc is None:
            problems.append('%s could not be run: %s' % (ansible, out))
        else:
            answers = parse_adhoc(out, hosts)
            for host in hosts:
                why = answers[host]
                if why is None:
                    continue
                if rc == 124 and why.startswith('no answer'):
                    why = 'no answer within %d s' % timeout
                problems.append('host %s: %s (as %s, through %s)' % (host, why, user, inventory))
            if rc != 0 and all(answers[h] is None for h in hosts):
                problems.append('ansible -m ansible.builtin.command -a id as %s ended with rc %d: %s'
                                % (user, rc, run_error(out) or last_line(out)))
    if not missing & {'ansible_playbook', 'inventory'}:
        train = settings.get('train_playbook') or 'gpucluster.multinode.train'
        rc, out = capture([playbook, '--syntax-check', '-i', inventory, train], timeout, env)
        if rc is None:
            problems.append('%s could not be run: %s' % (playbook, out))
        elif rc != 0:
            problems.append('ansible-playbook --syntax-check %s %s: %s' % (
                train, 'did not end within %d s' % timeout if rc == 124 else 'ended with rc %d' % rc,
                run_error(out) or last_line(out)))
    return problems


def main(argv):
    if len(argv) == 3 and argv[1] == '--report':
        print('\n'.join(report(argv[2])))
        return 0
    if len(argv) == 3 and argv[1] == '--probe':
        try:
            with open(argv[2]) as handle:
                settings = json.load(handle)
            problems = probe(settings) if isinstance(settings, dict) else ['%s is not a JSON object' % argv[2]]
        except (OSError, ValueError) as exc:
            problems = ['settings %s cannot be read: %s' % (argv[2], getattr(exc, 'strerror', None) or exc)]
        print(json.dumps({'problems': problems}), flush=True)
        return 1 if problems else 0
    if len(argv) != 2:
        print('usage: gpucluster_supervise.py <settings.json> | --report <state dir> | --probe <settings.json>',
              file=sys.stderr)
        return 2
    with open(argv[1]) as handle:
        settings = json.load(handle)
    path = os.path.join(state_dir_of(settings), LOCK)
    held = lock(path)
    for wait in (0.5, 1.0):  # a --report looks at the lock for an instant
        if held is not None:
            break
        time.sleep(wait)
        held = lock(path)
    if held is None:
        print('job %s is supervised already (the lock %s is held): this supervisor does nothing'
              % (settings['job_id'], path), flush=True)
        return EXIT_HELD
    sup = driver_for(settings)

    def stopped(signum, _frame):
        # systemctl stop (training_state=stopped does it first, and disables the unit), its host shutting
        # down, or RuntimeMaxSec: the playbook run in progress ends with it (a restart half done is stopped by
        # training_state=stopped next, or finished when the supervisor starts again: its memory is kept);
        # the job's own processes are not touched here
        sup.end_child()
        sup.event('stopped', why='the supervisor was stopped (signal %d: systemctl stop, or its host shutting '
                  'down); the job itself is stopped by training_state=stopped, or runs on unsupervised until the '
                  'supervisor starts again' % signum)
        sys.exit(0)  # through run(): its figures leave node_exporter's directory
    signal.signal(signal.SIGTERM, stopped)
    return sup.run()


if __name__ == '__main__':
    sys.exit(main(sys.argv))
