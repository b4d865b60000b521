# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The supervisor's reads of the job: a read is a run of train.yml status (the same read `status` and `watch`
make), observe()d into {state, failed_nodes, unreachable_nodes, stalled_nodes, step, ...}.

When a glance's sign is of parts that exited non-zero, or of late ranks whose nodes their headers name, the read
is first a quick one of those nodes and the head only (train.yml status with training_status_nodes, --limit;
quick_seconds): a failure it reads is the fault at once (the fault event's quick_read), and after a late sign a
node it cannot reach is confirmed by a second quick read of the same nodes and the direct probe, without a read
of every node, whose cost grows with the cluster; late nodes that the quick read reached with no failure are a
late event (no fault); else the job is read whole. A node a read could not reach (and no failed rank) is a fault
only when a second read still cannot reach it and the direct probe fails (supervisor_runs: a TCP connect to its
SSH port and an ansible ping); else it is one read_missed event. When blind_reads reads in a row fail (no
status, or no state in it), the supervisor is blind (a blind event, its heartbeat, its figures, --report's
first line) and stops nothing until a read works again (a sighted event). A read that names an earlier attempt
is ignored (the new one has not written yet), and is no failed read.

Reads is the part of the supervisor (supervisor_driver.Supervisor) that reads; it uses the supervisor's runs
(train, last_error, log_text, start_probe, probe_result), its glances (sign_during_read) and its heartbeat."""

import json
import os
import time

import supervision as core
from supervisor_record import STATUS


JOB_KEYS = ('state', 'failed_nodes', 'unreachable_nodes', 'stalled_nodes', 'step', 'last_step_time', 'why', 'exit_code')


ENDED = 'ended'  # read(): a sign ended the read


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


class Reads:
    """A read of the job, quick or whole, observed; a missed node confirmed."""

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
        lost = sign['kind'] == 'late' and core.needs_confirming(obs)
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
        if act['action'] != 'wait' and not core.needs_confirming(second):
            return second, act
        return second, {'action': 'wait', 'why': 'a read missed %s' % ', '.join(nodes)}
