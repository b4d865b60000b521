# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Pod 0's driver of the supervision loop (supervision.Loop, the same loop as the SSH supervisor's): reads the
job from every pod's agent, stops and starts their parts, checks the spare pods with a hello, and keeps the
loop's memory in the job record. Standard library only; mounted beside the pod entrypoint."""

import time

import pod_net as net
import supervision
from pod_checks import blame
from pod_cluster import admin_step, all_status, hello_of, start_all, stop_all, wait_for_peers
from pod_job import job_event, layout_of, read_job_record, working_pods, write_job_record
from pod_progress import stall_rows


SETTLE_POLLS = 5        # polls pod 0 gathers the parts' states after the first failure before it names one


class PodDriver:
    """Pod 0's driver of the supervision loop (supervision.Loop, the same loop as the SSH supervisor's): it reads
    the job from every pod's agent, stops and starts their parts, checks the spare pods with a hello and keeps
    the loop's memory in the job record (phase: fault or restarting, what status reads; recovery: the loop's).

    A part that failed (a rank's exit, a signal, a container started again, a part stopped by someone), a
    pod that has not answered for train.unreachable_after seconds, or a job whose running parts logged no step
    or heartbeat for train.stall_seconds (supervision.stall, the controller's rule over SSH, on the rows of the
    parts' progress: pod_progress) is a fault. After a failure the other
    pods' parts fail too once a peer is gone: the states are gathered for a few polls and the cause is named
    (blame, the core's order) rather than the first collateral exit. The failure policy and train.restarts
    decide; a spare pod that answers takes a lost pod's place (and slots), else the job shrinks down to
    train.min_pods, else it waits train.lost_pod_wait for the pods left out, else it fails naming the pod,
    its node and what an administrator runs."""

    def __init__(self, agent, job_id, poll=1.0, settle=SETTLE_POLLS, resumed=False):
        self.agent, self.job, self.job_id = agent, agent.job, job_id
        self.root = agent.state_root()
        self.poll, self.settle, self.resumed = poll, settle, resumed
        record = read_job_record(self.root, job_id) or {}
        self.layout = layout_of(self.job, record)
        self.attempt = int(record.get('attempt', 0))
        self.state = {'nodes': [p['name'] for p in self.layout], 'restarts': int(record.get('restarts_used', 0)),
                      'failures': [], 'spares_used': list(record.get('spares_used') or [])}
        self.memory = {'until': None, 'phase': record.get('recovery')}
        self.since = {}         # pod -> when it first did not answer, in this run of misses
        self.unanswered = []    # pods that did not answer the last stop: left out, fenced once they answer
        self.failed_pod = None  # the pod the job's end names
        self.reason = ''        # and what it did (the fault's)
        self.finished = False   # the last read found every part finished

    @property
    def settings(self):
        record = read_job_record(self.root, self.job_id) or {}
        lost = record.get('lost') or []
        return {'restarts': int(record.get('restarts', self.job.get('restarts', 0))),
                'min_nodes': int(self.job.get('min_pods', len(working_pods(self.job)))),
                'spares': [p['name'] for p in self.job['pods'] if p['name'] not in lost + self.state['nodes']],
                'failure_policy': self.job.get('failure_policy'), 'restarts_variable': 'train.restarts',
                'policy_variable': 'train.failure_policy', 'min_variable': 'train.min_pods',
                'failed_start': 'give_up'}

    # the record
    def event(self, kind, **fields):
        # the attempt as its ranks see it (GPUCLUSTER_ATTEMPT) and the SSH supervisor counts it: from 1; the record
        # keeps the restarts' count (0 for the first attempt: status' attempt)
        return job_event(self.root, self.job_id, kind, **dict({'attempt': self.attempt + 1}, **fields))

    def remember(self, **changes):
        record = read_job_record(self.root, self.job_id) or {}
        record.update(attempt=self.attempt, restarts_used=self.state['restarts'],
                      spares_used=list(self.state['spares_used']), updated=time.time())
        if 'phase' in changes:
            phase = changes['phase']
            self.memory['phase'] = phase
            if phase:
                record.update(phase='restarting' if phase['phase'] == 'restarting' else 'fault', recovery=phase)
                if phase['phase'] == 'restarting':
                    record['layout'] = phase['extra']['layout']
            else:
                record.pop('phase', None)
                record.pop('recovery', None)
        if changes.get('ended') == 'done' and self.finished:
            record['state'] = 'finished'
            self.agent.say('job %s finished (attempt %d)' % (self.job_id, self.attempt))
        write_job_record(self.root, self.job_id, record)

    def heartbeat(self, what):
        pass

    def note(self, text):
        self.agent.say('job %s: %s' % (self.job_id, text))

    def begin(self):
        if self.resumed:
            self.event('resumed', nodes=self.state['nodes'],
                       why="pod 0's agent started again: attempt %d, %d of %d restart(s) used"
                           % (self.attempt, self.state['restarts'], self.settings['restarts']))
            return
        self.event('supervising', nodes=self.state['nodes'], restarts=self.settings['restarts'],
                   spares=[p['name'] for p in self.job['pods'] if p['name'] not in self.state['nodes']])

    def bound(self):
        return 'no bound'

    # the reads
    def look(self):
        record = read_job_record(self.root, self.job_id) or {}
        if record.get('state') != 'running':
            return self._obs('stopped', why='the job was stopped')
        states = all_status(self.job, self.job_id, lines=5, pods=self.layout, slow=self.since)
        now = time.time()
        for st in states:
            if st.get('state') == 'unreachable':
                self.since.setdefault(st['pod'], now)
            else:
                self.since.pop(st['pod'], None)
        bound = float(self.job.get('unreachable_after', 30))
        lost = [st for st in states if st['pod'] in self.since and now - self.since[st['pod']] >= bound]
        trouble = [st for st in states if st.get('state') in ('failed', 'absent', 'stopped')] + lost
        self.finished = bool(states) and all(st.get('state') == 'finished' for st in states)
        rows = stall_rows(states, now)
        steps = [r for r in rows if r['last_step'] is not None]
        step = {'step': max(r['last_step'] for r in steps),
                'last_step_time': max(r['last_step_time'] for r in steps)} if steps else {}
        if not trouble:
            stall_seconds = int(self.job.get('stall_seconds') or 0)
            stalled = supervision.stall(rows, stall_seconds, self.job.get('checkpoint_seconds')) \
                if stall_seconds and not self.finished else {}
            if stalled.get('stalled'):
                return self._obs('stalled', stalled_nodes=stalled['nodes'], why=stalled['why'], failure='stalled',
                                 reason='stalled: %s' % stalled['why'], **step)
            return self._obs('succeeded' if self.finished else 'running', **step)
        for st in lost:
            st['error'] = 'no answer for %.0f s: %s' % (now - self.since[st['pod']], st.get('error', ''))
        seen = {st['pod']: st for st in states}
        if not lost:
            # gather for a few polls, then blame the cause (a restarted container, a killed rank) rather than the
            # first collateral exit; a pod that has not answered long enough is the cause already
            for _ in range(self.settle):
                if all(st.get('state') in ('failed', 'absent', 'stopped', 'finished', 'unreachable')
                       for st in seen.values()):
                    break
                time.sleep(self.poll)
                for st in all_status(self.job, self.job_id, lines=5, pods=self.layout, slow=self.since):
                    if st.get('state') != 'unreachable' or seen[st['pod']].get('state') in ('running', 'unreachable'):
                        seen[st['pod']] = st
        bad = blame(list(seen.values())) or blame(trouble)
        if bad is None:
            return self._obs('running')
        pod, reason = bad
        culprit = seen.get(pod) or next((st for st in trouble if st['pod'] == pod), {'pod': pod})
        kind = supervision.failure_kind(dict(culprit, reason=reason))
        state, culprits = ('unreachable', 'unreachable_nodes') if kind == 'unreachable' else ('failed', 'failed_nodes')
        return self._obs(state, **{culprits: [pod]}, lost=[st['pod'] for st in lost], why='pod %s %s' % (pod, reason),
                         reason=reason, failure=kind, exit_code=culprit.get('exit_code'), **step)

    @staticmethod
    def _obs(state, why='', **more):
        return dict({'state': state, 'step': None, 'last_step_time': None, 'why': why, 'failed_nodes': [],
                     'unreachable_nodes': [], 'stalled_nodes': []}, **more)

    look_half_started = look

    def platform_fault(self, obs):
        return None

    def confirm(self, obs):
        # a pod that did not answer for train.unreachable_after is confirmed by that bound
        return obs, {'action': 'stop', 'seen': 'unreachable', 'nodes': list(obs['unreachable_nodes']),
                     'why': obs['why']}

    def reached(self):
        pass

    def between(self):
        time.sleep(self.poll)

    def after_restart(self):
        self.since = {}

    def fault_fields(self, obs):
        return {}

    def fault_kind(self, obs, act):
        return obs.get('failure') or 'exit', obs.get('exit_code')

    # the acts
    def stop(self, obs, act, lost):
        pod, reason = act['nodes'][0], obs.get('reason') or obs['why']
        self.failed_pod, self.reason = pod, reason
        self.agent.say('job %s: pod %s %s; stopping the job on every pod' % (self.job_id, pod, reason))
        replies = stop_all(self.job, self.job_id, reason='stopped: pod %s %s' % (pod, reason), pods=self.layout,
                           slow=self.since)
        self.unanswered = [r['pod'] for r in replies if r.get('state') == 'unreachable']
        fields = dict({'nodes': [p['name'] for p in self.layout]},
                      **({'unanswered': self.unanswered} if self.unanswered else {}))
        why = 'stopped on every pod after pod %s %s' % (pod, reason)
        record = read_job_record(self.root, self.job_id) or {}
        if record.get('state') != 'running':
            return {'why': why, 'fields': fields, 'ended': 'stopped by the user meanwhile'}
        record.setdefault('history', []).append({'attempt': self.attempt, 'failed_pod': pod, 'reason': reason,
                                                 'kind': obs.get('failure'), 'at': time.time()})
        write_job_record(self.root, self.job_id, record)
        return {'why': why, 'unstopped': {}, 'fields': fields}

    def check(self, nodes, spares, act, lost):
        """The pods that did not answer the stop, or were lost, are left out; a spare pod that answers as
        itself and runs nothing is ready."""
        candidates = [p for p in self.job['pods'] if p['name'] in spares]
        ready = [p['name'] for p, hello in zip(candidates, net.each(candidates, lambda p: hello_of(self.job, p)))
                 if hello and not hello.get('running')]
        left = [n for n in self.state['nodes'] if n in lost or n in self.unanswered]
        if left:
            record = read_job_record(self.root, self.job_id) or {}
            record['lost'] = sorted(set(record.get('lost') or []) | set(left))
            write_job_record(self.root, self.job_id, record)
        bad = left + [n for n in spares if n not in ready]
        return {'bad': bad, 'fields': {'failed': left, 'spares_ready': ready},
                'why': '%s; spare pods ready: %s' % (('did not answer: %s' % ', '.join(left)) if left
                                                     else 'every pod answered', ', '.join(ready) or 'none')}

    def checkpoint(self):
        return None, None  # the job's script resumes from its own (train.resume_args)

    def no_checkpoint_why(self):
        return ''

    def wait_back(self, left_out):
        """Wait train.lost_pod_wait for the pods left out (a node that was only slow): back, what they still
        ran of this attempt is stopped and the job restarts on the same pods."""
        wait = int(self.job.get('lost_pod_wait', 60))
        lost = [p for p in self.layout if p['name'] in left_out]
        deadline = time.time() + wait
        while True:
            gone = [p['name'] for p, hello in zip(lost, net.each(lost, lambda p: hello_of(self.job, p))) if not hello]
            if not gone or time.time() >= deadline:
                break
            time.sleep(1.0)
        if gone:
            nodes_of = (read_job_record(self.root, self.job_id) or {}).get('nodes_of') or {}
            return {'back': False, 'why': '%s did not answer again within train.lost_pod_wait (%d s): %s' % (
                ', '.join(gone), wait, '; '.join(admin_step(self.job, n, nodes_of.get(n)) for n in gone))}
        stop_all(self.job, self.job_id, reason='stopped: pod %s answered again; the job restarts' % ', '.join(left_out),
                 pods=lost, before_attempt=self.attempt + 1)
        record = read_job_record(self.root, self.job_id) or {}
        record['lost'] = [n for n in record.get('lost') or [] if n not in left_out]
        write_job_record(self.root, self.job_id, record)
        self.unanswered = [n for n in self.unanswered if n not in left_out]
        return {'back': True, 'why': 'on the same pods (%s answered again)' % ', '.join(left_out)}

    def restart_extra(self, plan, ckpt):
        """The next attempt's layout: a spare in a left-out pod's place, with its slots."""
        by_name = {p['name']: p for p in self.job['pods']}
        take, layout = list(plan.get('spares') or []), []
        for p in self.layout:
            if p['name'] not in plan['left_out']:
                layout.append({'name': p['name'], 'slots': p['slots']})
            elif take:
                layout.append({'name': by_name[take.pop(0)]['name'], 'slots': p['slots']})
        self.state['nodes'] = [p['name'] for p in layout]
        return {'layout': layout}

    def restart_fields(self, plan, why):
        layout = (self.memory.get('phase') or {}).get('extra', {}).get('layout') or []
        return {'nodes': [p['name'] for p in layout], 'world_size': sum(p['slots'] for p in layout),
                'why': 'pod %s %s: %s' % (self.failed_pod, self.reason, why)}

    def start(self, plan, extra):
        layout = layout_of(self.job, {'layout': extra['layout']})
        self.layout = layout
        self.agent.say('job %s: attempt %d on %s' % (self.job_id, self.attempt, ', '.join(p['name'] for p in layout)))
        peer_wait = int(self.job.get('peer_wait', 300))
        why_peers, _ = wait_for_peers(self.job, peer_wait, pods=layout, root=self.root)
        if why_peers:
            first = sorted(why_peers)[0]
            problem = 'pod %s: %s after %d s' % (first, why_peers[first], peer_wait)
        else:
            problem = start_all(self.job, self.job_id, self.attempt, pods=layout)
        if problem:
            self.failed_pod = problem.split(': ', 1)[0].replace('pod ', '')
            stop_all(self.job, self.job_id, reason='stopped: restart failed', pods=layout)
        return problem

    def stop_part(self, nodes):
        replies = stop_all(self.job, self.job_id, reason='stopped: a restart half done', pods=self.layout)
        return {r['pod']: r.get('error', '') for r in replies if r.get('state') == 'unreachable' and r['pod'] in nodes}

    def fence_later(self, nodes, attempt):
        if nodes:
            self.agent.fence(self.job_id, list(nodes), attempt)

    def gave_up(self, why):
        record = read_job_record(self.root, self.job_id) or {}
        reason = why if why.startswith('restart failed') or not self.reason else '%s; %s' % (self.reason, why)
        record.update(state='failed', failed_pod=self.failed_pod, reason=reason, updated=time.time())
        record.pop('phase', None)
        record.pop('recovery', None)
        write_job_record(self.root, self.job_id, record)
        self.agent.say('job %s failed: pod %s %s (attempt %d); nothing of it runs'
                       % (self.job_id, self.failed_pod, reason, self.attempt))
        if self.unanswered:
            self.agent.fence(self.job_id, self.unanswered, self.attempt + 1)
