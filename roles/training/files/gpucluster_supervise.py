# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Supervise one training job from the head: stop it when a rank fails, a node stops answering or the
job stalls, judge its nodes with the quick health tier, restart it from its latest complete checkpoint.

    gpucluster_supervise.py <job dir>/supervise/settings.json
    gpucluster_supervise.py --report <job dir>      # who supervises it, the summary and the last events

When the job is done or it gives up, it writes the job's report page (train.yml -e training_state=report,
<job dir>/report.html); a report run that fails is an event (report_failed), never a crash.

Run by the unit gpucluster-supervise@<job id>.service as the training account (train.yml
-e training_supervise=true starts it; training_state=stopped stops it before the job). Every read and
action is a run of the collection's own playbooks on the head (train.yml status/stopped/started,
health.yml quick tier), the same reads `status` and `watch` make. What it sees and does is appended to
<job dir>/events.jsonl; supervise.json there says who supervises the job. One supervisor per job:
an exclusive lock on <job dir>/supervise/lock. Decisions are the pure functions observe(), decide()
and plan_restart(); summarize() counts restarts, steps lost and time lost from the events.
"""

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time

EVENTS = 'events.jsonl'
# The supervisor's playbook runs reach a frozen node: SSH gives up on it (a connection multiplexed over
# an open master gets no ConnectTimeout, so the server is asked to answer every 5 s), and a read ends.
SSH_ENV = {'ANSIBLE_SSH_ARGS': '-C -o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=5 '
                               '-o ServerAliveCountMax=3',
           'ANSIBLE_TIMEOUT': '10'}
FAULTS = ('failed', 'unreachable', 'stalled')


# ----- what the job's state says ----------------------------------------------------------------
def observe(status, now=None):
    """The supervisor's view of one status read: {state, failed_nodes, unreachable_nodes, stalled_nodes,
    step, last_step_time, why, time}.

    status: what train.yml -e training_state=status wrote (training_status_file): result (the job's
    verdict) and progress (every node's ranks), either may be missing. state is running, succeeded,
    stopped, failed (a rank or launcher exited non-zero), unreachable (a node could not be read),
    stalled (no rank logged a step or heartbeat for training_stall_seconds) or unknown (no read at all)."""
    now = time.time() if now is None else now
    result = (status or {}).get('result') or {}
    progress = (status or {}).get('progress') or {}
    ranks = progress.get('ranks') or []
    steps = [r.get('last_step') for r in ranks if isinstance(r.get('last_step'), int)]
    times = [r.get('last_step_time') for r in ranks if isinstance(r.get('last_step_time'), (int, float))]
    obs = {'time': now, 'state': 'unknown', 'failed_nodes': [], 'unreachable_nodes': [], 'stalled_nodes': [],
           'step': max(steps) if steps else None, 'last_step_time': max(times) if times else None, 'why': ''}
    unreachable = list(result.get('unknown_nodes') or []) + [n for n in sorted(progress.get('node_errors') or {})
                                                             if n not in (result.get('unknown_nodes') or [])]
    stall = progress.get('stall') or {}
    if unreachable:
        obs.update(state='unreachable', unreachable_nodes=unreachable,
                   why='%s could not be read' % ', '.join(unreachable))
    elif result.get('state') == 'failed':
        first = result.get('first_failure') or {}
        failed = list(result.get('failed_nodes') or [])
        culprit = first.get('node') or ', '.join(failed or ['?'])
        obs.update(state='failed', failed_nodes=failed,
                   why='a rank failed first on %s (exit %s)' % (culprit, first.get('exit_code')))
    elif progress.get('state') == 'stalled' or stall.get('stalled'):
        obs.update(state='stalled', stalled_nodes=list(stall.get('nodes') or []), why=stall.get('why') or 'stalled')
    elif result.get('state') in ('running', 'succeeded', 'stopped'):
        obs['state'] = result['state']
    elif not result and not progress:
        obs['why'] = 'the status read gave nothing'
    return obs


def culprits(obs):
    """The nodes to judge, in order: the node whose rank failed first, those that do not answer, the stalled."""
    out = []
    for node in obs['failed_nodes'][:1] + obs['unreachable_nodes'] + obs['stalled_nodes']:
        if node not in out:
            out.append(node)
    return out


def decide(obs):
    """What one read asks for: wait (running, or a read that said nothing), done (finished or stopped
    by someone), or stop (a fault: the whole job is stopped, then the nodes judged)."""
    if obs['state'] in FAULTS:
        return {'action': 'stop', 'seen': obs['state'], 'nodes': culprits(obs), 'why': obs['why']}
    if obs['state'] == 'succeeded':
        return {'action': 'done', 'why': 'the job finished'}
    if obs['state'] == 'stopped':
        return {'action': 'done', 'why': 'the job was stopped (not by its supervisor): nothing to restart'}
    return {'action': 'wait', 'why': obs['why'] or obs['state']}


def bad_nodes(health, nodes):
    """Nodes whose quick health check failed, or gave no answer (no record of it in the report that
    is ok or warn: a node that could not be reached has none, or only unknown ones)."""
    records = (health or {}).get('records') or []
    answered = set(r.get('node') for r in records if r.get('status') in ('ok', 'warn'))
    failing = set(r.get('node') for r in records if r.get('status') == 'fail')
    return [n for n in nodes if n in failing or n not in answered]


def plan_restart(state, fault, suspects, health_bad, checkpoint_step, settings):
    """restart {nodes, resume_step} or give_up {why}, after a fault.

    state: the supervisor's own record: nodes (the job's nodes now, head first), restarts (done so far),
    failures ([{resume_step, step}] of the earlier faults). fault: observe()'s view when the fault was
    seen. suspects: culprits(fault). health_bad: the nodes the quick health tier failed or could not
    reach. checkpoint_step: step of the latest complete checkpoint (None: none; 0 restarts from the
    beginning). settings: restarts (training_restarts), min_nodes (training_min_nodes)."""
    nodes = list(state['nodes'])
    head = nodes[0]
    left_out = [n for n in nodes if n in health_bad]
    if state['restarts'] >= settings['restarts']:
        return {'action': 'give_up', 'why': 'training_restarts (%d) used up' % settings['restarts']}
    previous = (state.get('failures') or [])[-1:]
    reached = fault.get('step')
    if previous and reached is not None and previous[0].get('step') is not None and reached <= previous[0]['step'] \
            and previous[0].get('resume_step') == checkpoint_step:
        return {'action': 'give_up',
                'why': 'step %s failed twice with no progress (resumed from step %s both times)'
                       % (reached + 1, checkpoint_step)}
    if head in left_out:
        return {'action': 'give_up', 'why': 'the head %s failed its check: the job is launched from it and runs '
                                            'rank 0 there' % head}
    remaining = [n for n in nodes if n not in left_out]
    if len(remaining) < settings['min_nodes']:
        return {'action': 'give_up', 'why': '%d node(s) would remain (%s) and training_min_nodes is %d; left out: %s'
                                            % (len(remaining), ', '.join(remaining), settings['min_nodes'],
                                               ', '.join(left_out))}
    recovered = [n for n in suspects if n not in left_out]
    return {'action': 'restart', 'nodes': remaining, 'left_out': left_out, 'recovered': recovered,
            'resume_step': checkpoint_step or 0,
            'why': ('without %s' % ', '.join(left_out)) if left_out
            else 'on all nodes (%s passed the check: a transient failure)' % (', '.join(recovered) or 'every node')}


# ----- events and summary -----------------------------------------------------------------------
def event(job_dir, kind, **fields):
    """Append one event to <job dir>/events.jsonl (one JSON object a line, written and synced at once)."""
    record = dict(fields, time=round(time.time(), 3), event=kind)
    with open(os.path.join(job_dir, EVENTS), 'a') as handle:
        handle.write(json.dumps(record, sort_keys=True) + '\n')
        handle.flush()
        os.fsync(handle.fileno())
    return record


def read_events(path):
    """The events of a job's events.jsonl, skipping a last line cut short."""
    out = []
    try:
        with open(path) as handle:
            for line in handle:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        return []
    return out


def summarize(events):
    """{restarts, steps_lost, time_lost_s, faults, left_out, outcome, why} from a job's events.

    steps lost: the steps a fault's run had reached past the checkpoint it resumed from; time lost: from
    the last step before the fault to the first step after its restart (the run of a fault that never
    trained again counts to its give-up)."""
    out = {'restarts': 0, 'steps_lost': 0, 'time_lost_s': 0.0, 'faults': 0, 'left_out': [],
           'outcome': 'supervised', 'why': None}
    open_fault = None
    for ev in events:
        kind = ev.get('event')
        if kind == 'fault':
            out['faults'] += 1
            open_fault = ev
        elif kind == 'restart':
            out['restarts'] += 1
            if ev.get('lost_steps') is not None:
                out['steps_lost'] += int(ev['lost_steps'])
            for node in ev.get('left_out') or []:
                if node not in out['left_out']:
                    out['left_out'].append(node)
        elif kind == 'training' and open_fault is not None:
            start = open_fault.get('last_step_time') or open_fault.get('time')
            out['time_lost_s'] += max(0.0, ev['time'] - start)
            open_fault = None
        elif kind in ('gave_up', 'done', 'stopped'):
            if open_fault is not None and kind == 'gave_up':
                start = open_fault.get('last_step_time') or open_fault.get('time')
                out['time_lost_s'] += max(0.0, ev['time'] - start)
                open_fault = None
            out['outcome'] = {'gave_up': 'gave up', 'done': 'finished', 'stopped': 'stopped'}[kind]
            out['why'] = ev.get('why')
    out['time_lost_s'] = round(out['time_lost_s'], 1)
    return out


def summary_lines(events, limit=8):
    """What status prints: the summary, then the last events one a line."""
    s = summarize(events)
    lines = ['supervision: %s%s; %d restart(s), %d step(s) lost, %.0f s lost%s'
             % (s['outcome'], (' (%s)' % s['why']) if s['why'] else '', s['restarts'], s['steps_lost'],
                s['time_lost_s'], ('; left out: %s' % ', '.join(s['left_out'])) if s['left_out'] else '')]
    for ev in events[-limit:]:
        words = [time.strftime('%H:%M:%S', time.localtime(ev.get('time', 0))), ev.get('event', '?')]
        for key in ('seen', 'nodes', 'step', 'resume_step', 'why'):
            if ev.get(key) not in (None, [], ''):
                value = ev[key]
                words.append('%s=%s' % (key, ','.join(value) if isinstance(value, list) else value))
        lines.append('  ' + ' '.join(str(w) for w in words))
    return lines


# ----- the loop on the head ---------------------------------------------------------------------
def lock(path):
    """Hold the job's supervisor lock for the life of this process; None when another one holds it."""
    handle = open(path, 'a+')
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


class Supervisor:
    def __init__(self, settings):
        self.s = settings
        self.job = settings['job_id']
        self.job_dir = settings['job_dir']
        self.dir = os.path.join(self.job_dir, 'supervise')
        self.state = {'nodes': list(settings['nodes']), 'restarts': 0, 'failures': []}
        self.child = None
        self.seen_step = None  # the last step a read saw: a read that reaches no rank (a node hangs) keeps it

    def playbook(self, playbook, extra, limit=None, timeout=None):
        cmd = [self.s['ansible_playbook'], '-i', self.s['inventory'], playbook, '-e', '@' + self.s['vars_file']]
        for key, value in extra.items():
            cmd += ['-e', json.dumps({key: value})]
        if limit:
            # node names (as the job's results say them) to inventory hosts
            cmd += ['--limit', ','.join(self.s.get('hosts', {}).get(n, n) for n in limit)]
        log = open(os.path.join(self.dir, 'ansible.log'), 'a')
        log.write('\n# %s %s\n' % (time.strftime('%Y-%m-%dT%H:%M:%S'), ' '.join(cmd)))
        log.flush()
        # its own process group: the supervisor ends it (and only it) when it is stopped; a job the run
        # starts lives in sessions of its own (training_job) and is not part of it
        self.child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                      env=dict(os.environ, **dict(SSH_ENV, **self.s.get('environment', {}))))
        try:
            return self.child.wait(timeout=timeout or self.s['action_timeout'])
        except subprocess.TimeoutExpired:
            self.end_child()
            return 124
        finally:
            self.child = None
            log.close()

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

    def train(self, state, limit=None, timeout=None, **extra):
        # training_supervisor_acting: stopped.yml leaves this supervisor's own unit alone
        return self.playbook(self.s['train_playbook'], dict(extra, training_state=state, training_job_id=self.job,
                                                            training_supervisor_acting=True), limit=limit,
                             timeout=timeout)

    def read(self):
        path = os.path.join(self.dir, 'status.json')
        try:
            os.unlink(path)
        except OSError:
            pass
        self.train('status', timeout=self.s.get('read_timeout', 300), training_status_file=path,
                   training_progress_report=True)
        try:
            with open(path) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def health(self, nodes):
        """(the quick tier's report, rc of its run); the report is None when the run wrote none."""
        # on the head's own disk (the health report is written as root, which shared storage may squash)
        report_dir = self.s['health_report_dir']
        try:
            os.unlink(os.path.join(report_dir, 'latest-quick.json'))
        except OSError:
            pass
        rc = self.playbook(self.s['health_playbook'], {'health_tier': 'quick', 'health_report_dir': report_dir},
                           limit=nodes)
        try:
            with open(os.path.join(report_dir, 'latest-quick.json')) as handle:
                return json.load(handle), rc
        except (OSError, ValueError):
            return None, rc

    def checkpoint(self):
        """Step of the latest complete checkpoint (None when the job declares no checkpoint directory)."""
        directory = self.s.get('checkpoint_dir')
        if not directory:
            return None
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpucluster_progress  # pylint: disable=import-outside-toplevel
        tag, record, _ = gpucluster_progress.latest_complete_checkpoint(directory)
        return None if tag is None else int((record or {}).get('step', 0))

    def heartbeat(self, what):
        record = {'pid': os.getpid(), 'host': socket.gethostname(), 'unit': self.s.get('unit'), 'time': time.time(),
                  'doing': what, 'nodes': self.state['nodes'], 'restarts': self.state['restarts'],
                  'step': self.seen_step}
        tmp = os.path.join(self.dir, 'supervisor.json.tmp')
        with open(tmp, 'w') as handle:
            json.dump(record, handle)
        os.replace(tmp, os.path.join(self.dir, 'supervisor.json'))

    def run(self):
        deadline = time.time() + self.s['seconds']
        event(self.job_dir, 'supervising', nodes=self.state['nodes'], why='restarts %d, min nodes %d, for %d s'
              % (self.s['restarts'], self.s['min_nodes'], self.s['seconds']))
        waiting_first_step = None
        while time.time() < deadline:
            self.heartbeat('reading')
            obs = observe(self.read())
            if obs['step'] is None and self.seen_step is not None:
                obs.update(step=self.seen_step, step_read='before the fault')
            self.seen_step = obs['step']
            if waiting_first_step is not None and obs['step'] is not None and obs['step'] > waiting_first_step:
                event(self.job_dir, 'training', step=obs['step'], why='training again after the restart')
                waiting_first_step = None
            act = decide(obs)
            if act['action'] == 'done':
                event(self.job_dir, 'done', why=act['why'], step=obs['step'])
                self.write_report()
                return 0
            if act['action'] == 'stop':
                waiting_first_step = self.recover(obs, act)
                if waiting_first_step is False:
                    self.write_report()
                    return 1
                self.seen_step = None  # the restarted job's steps start again from its checkpoint
                continue
            time.sleep(self.s['interval'])
        event(self.job_dir, 'stopped', why='training_supervise_seconds (%d) ended: the job runs on, unsupervised'
              % self.s['seconds'])
        return 0

    def write_report(self):
        """The job's report page (<job dir>/report.html, train.yml -e training_state=report), bounded in time; a
        run that fails is an event (report_failed), never the supervisor's end."""
        try:
            rc = self.train('report', timeout=self.s.get('report_timeout', 300), training_report_fetch=False)
            if rc != 0:
                event(self.job_dir, 'report_failed', why='train.yml report ended with rc %d (its output in %s)'
                      % (rc, os.path.join(self.dir, 'ansible.log')))
        except Exception as exc:  # pylint: disable=broad-except  # the supervision ended already: only say so
            try:
                event(self.job_dir, 'report_failed', why='the report page was not written: %s' % exc)
            except OSError:
                pass

    def recover(self, obs, act):
        event(self.job_dir, 'fault', seen=act['seen'], nodes=act['nodes'], step=obs['step'],
              last_step_time=obs['last_step_time'], why=act['why'],
              **({'step_read': obs['step_read']} if obs.get('step_read') else {}))
        self.heartbeat('stopping')
        rc = self.train('stopped')
        event(self.job_dir, 'job_stopped', why='every rank, container and launcher stopped' if rc == 0 else
              'stop ended with rc %d (a node that does not answer keeps its frozen ranks)' % rc)
        self.heartbeat('checking nodes')
        report, rc = self.health(self.state['nodes'])
        if report is None:
            # no verdict was read: no node is called failing for it; the fault's own culprits are judged
            bad = list(act['nodes'])
            why = ('the quick health tier wrote no report (health.yml rc %d; its output in %s): judged by the fault '
                   'alone: %s' % (rc, os.path.join(self.dir, 'ansible.log'), ', '.join(bad) or 'no node named'))
        else:
            bad = bad_nodes(report, self.state['nodes'])
            why = 'quick health tier: %s' % (('failing or not answering: ' + ', '.join(bad)) if bad else 'every node passed')
        event(self.job_dir, 'checked', nodes=bad, why=why)
        ckpt = self.checkpoint()
        plan = plan_restart(self.state, obs, act['nodes'], bad, ckpt, self.s)
        if plan['action'] == 'give_up':
            event(self.job_dir, 'gave_up', why=plan['why'], step=obs['step'])
            return False
        self.state['failures'].append({'resume_step': plan['resume_step'], 'step': obs['step']})
        self.state['restarts'] += 1
        self.state['nodes'] = plan['nodes']
        lost = None if obs['step'] is None else max(0, obs['step'] - plan['resume_step'])
        why = plan['why']
        if ckpt is None and self.s.get('checkpoint_dir'):
            why += '; no complete checkpoint under %s yet: restarting from the beginning' % self.s['checkpoint_dir']
        elif ckpt is None:
            why += '; no checkpoint directory declared (training_supervise_checkpoint_dir): restarting from the beginning'
        event(self.job_dir, 'restart', nodes=plan['nodes'], left_out=plan['left_out'], resume_step=plan['resume_step'],
              lost_steps=lost, attempt=self.state['restarts'], why=why)
        self.heartbeat('restarting')
        extra = {'training_wait': 'first_step'}
        if ckpt is not None:
            extra.update(training_resume_from=self.s['checkpoint_dir'], training_resume_if_present=True)
        rc = self.train('started', limit=plan['nodes'], **extra)
        if rc != 0:
            event(self.job_dir, 'restart_failed', nodes=plan['nodes'], why='train.yml started ended with rc %d' % rc)
        return plan['resume_step']


def report(job_dir, now=None):
    """What status prints of a supervised job: who supervises it (or that nobody does) and its events."""
    now = time.time() if now is None else now
    held = lock(os.path.join(job_dir, 'supervise', 'lock'))
    try:
        with open(os.path.join(job_dir, 'supervise', 'supervisor.json')) as handle:
            beat = json.load(handle)
    except (OSError, ValueError):
        beat = {}
    if held is not None:
        held.close()
        who = 'nobody supervises this job (no supervisor holds %s/supervise/lock)' % job_dir
    else:
        who = 'supervised by %s (pid %s on %s, %s %.0f s ago; restarts %s)' % (
            beat.get('unit') or 'a supervisor', beat.get('pid', '?'), beat.get('host', '?'), beat.get('doing', '?'),
            now - beat.get('time', now), beat.get('restarts', '?'))
    return [who] + summary_lines(read_events(os.path.join(job_dir, EVENTS)))


def main(argv):
    if len(argv) == 3 and argv[1] == '--report':
        print('\n'.join(report(argv[2])))
        return 0
    if len(argv) != 2:
        print('usage: gpucluster_supervise.py <settings.json> | --report <job dir>', file=sys.stderr)
        return 2
    with open(argv[1]) as handle:
        settings = json.load(handle)
    held = lock(os.path.join(settings['job_dir'], 'supervise', 'lock'))
    if held is None:
        print('job %s is supervised already (the lock %s/supervise/lock is held): this supervisor does nothing'
              % (settings['job_id'], settings['job_dir']), flush=True)
        return 3
    sup = Supervisor(settings)

    def stopped(signum, _frame):
        # systemctl stop (training_state=stopped does it first) or RuntimeMaxSec: the playbook run in
        # progress ends with it (a restart half done is stopped by training_state=stopped next); the
        # job's own processes are not touched here
        sup.end_child()
        event(settings['job_dir'], 'stopped', why='the supervisor was stopped (signal %d); the job itself is stopped '
              'by training_state=stopped, or runs on unsupervised' % signum)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stopped)
    return sup.run()


if __name__ == '__main__':
    sys.exit(main(sys.argv))
