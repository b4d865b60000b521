# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The supervision core: what every supervisor of a training job shares, where a restart is decided, and the loop.

Two supervisors run its loop (Loop: observe, decide, stop, check, plan, restart, record), each as the driver of
its platform: the head's (roles/training/files/gpucluster_supervise.py, a service on the supervisor host, whose
driver, supervisor_driver.py Supervisor, reads and acts on the job through the collection's playbooks;
SlurmSupervisor beside it, with the slurm launcher, holds the job at the stop and releases it at the restart)
and pod 0's agent on Kubernetes (roles/k8s/files/pod_driver.py PodDriver, which reads and acts on the pods
through their agents). Both write the same events, judge culprits in the same order, see a stall by the same
rule (stall, which the controller's job state reads too) and decide a restart with the same rules (the failure
policy, then the restart budget; plan_restart); the
training_report module reads their events with the same reader and counts them with the same summary.

Standard library only, Python 3.8 or later: it is both a module_util (shipped with training_report) and a
program's helper installed beside each supervisor, where it is imported as ``supervision``:
/usr/local/lib/gpucluster/supervision.py on the supervisor host (the training role, root's own disk) and
/etc/gpucluster/supervision.py in every pod (the StatefulSet's ConfigMap).

The events (events.jsonl, one JSON object a line, each with time and event; EVENT_KINDS is the
vocabulary, an unknown kind is refused): nodes are the job's nodes, or the pods on Kubernetes.
"""

from __future__ import annotations

import json
import os
import time

EVENTS = 'events.jsonl'

# Every kind of event a supervisor writes, and what it means.
EVENT_KINDS = {
    'supervising': 'the supervisor took the job (nodes, restarts)',
    'resumed': 'the supervisor started again (after its own error, a stop or its host\'s reboot) and goes on '
               'from its memory: the same attempt, restarts used and nodes; a recovery half done is finished',
    'supervisor_error': 'an unexpected error of the supervisor itself (what failed, where): it starts again and '
                        'goes on from its memory',
    'read_missed': 'a node a read could not reach and a second read or the direct probe did: not a fault',
    'late': "ranks wrote nothing for their late bound and a quick read of their nodes read no failure: not a fault",
    'blind': 'reads in a row failed: nothing is stopped until one works again',
    'sighted': 'a read works again after blind',
    'glance': "the glances at the job's files on the shared storage turned off or on again",
    'fault': 'the job failed, lost a node or stalled (seen: the kind; nodes: the culprits, first first)',
    'job_stopped': 'the supervisor stopped the whole job after a fault (unanswered: nodes that did not answer)',
    'fenced': 'a node that did not answer the stop answers again: its part of the job was stopped',
    'fence_failed': 'the nodes still waiting to be fenced could not be asked',
    'checked': "the culprits' quick health check after a fault",
    'restart': 'the job started again (nodes, left_out, resume_step, lost_steps, attempt)',
    'restart_failed': 'a restart did not start',
    'training': 'a step after a restart: training again',
    'done': 'the job finished: supervision ends',
    'gave_up': 'no restart is left or possible: supervision ends, the job failed',
    'stopped': 'supervision ends with nothing to restart: the job was stopped by someone else, or the '
               'supervisor itself ended (its time ran out, it was stopped)',
    'report_failed': "the job's report page could not be written",
    'metrics_failed': "the supervisor's figures could not be written",
}
ENDINGS = {'gave_up': 'gave up', 'done': 'finished', 'stopped': 'stopped'}

# What a read of the job says that stops it (the job's one state, plugins/plugin_utils/training/job_state.py).
FAULTS = ('failed', 'unreachable', 'stalled')

# The kinds of failure in the order they name a job's culprit: a part whose container started again (or that
# has no part), a node that cannot be reached, a rank killed by a signal, any other non-zero exit, a stall,
# a part stopped by someone (SIGTERM). When a node is lost the others' ranks fail too: the lost one is the
# cause, not the first collateral exit. Among equals, the one that ended first.
CULPRIT_ORDER = ('restarted', 'unreachable', 'signal', 'exit', 'stalled', 'stopped')


# ----- events -------------------------------------------------------------------------------------
def append_event(directory, kind, **fields):
    """Append one event to <directory>/events.jsonl (written and synced at once; mode 0644: the events hold
    no secret and users read them) and return it. An unknown kind is a ValueError."""
    if kind not in EVENT_KINDS:
        raise ValueError('unknown supervision event %r (supervision.EVENT_KINDS)' % (kind,))
    record = dict(fields, time=round(time.time(), 3), event=kind)
    fd = os.open(os.path.join(directory, EVENTS), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        try:
            os.fchmod(fd, 0o644)
        except OSError:
            pass
        os.write(fd, (json.dumps(record, sort_keys=True) + '\n').encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return record


def read_events(path):
    """The events of an events.jsonl in the order they were written (path: the file, or the directory that
    holds it); a line cut short or not an event is skipped. None when there is no such file (the job was not
    supervised); [] when it cannot be read."""
    if os.path.isdir(path):
        path = os.path.join(path, EVENTS)
    if not os.path.exists(path):
        return None
    out = []
    try:
        with open(path) as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and isinstance(record.get('time'), (int, float)) \
                        and not isinstance(record.get('time'), bool):
                    out.append(record)
    except (IOError, OSError, UnicodeDecodeError):
        return []
    return out


def summarize(events):
    """{restarts, steps_lost, time_lost_s, faults, left_out, outcome, why} from a job's events.

    steps lost: the steps a fault's run had reached past the checkpoint it resumed from (the restart's
    lost_steps); time lost: from the last step before the fault to the first step after its restart (the run
    of a fault that never trained again counts to its give-up)."""
    out = {'restarts': 0, 'steps_lost': 0, 'time_lost_s': 0.0, 'faults': 0, 'left_out': [],
           'outcome': 'supervised', 'why': None}
    open_fault = None
    for ev in events or []:
        kind = ev.get('event')
        if kind == 'fault':
            out['faults'] += 1
            open_fault = ev
        elif kind == 'restart':
            out['restarts'] += 1
            if isinstance(ev.get('lost_steps'), (int, float)):
                out['steps_lost'] += int(ev['lost_steps'])
            for node in ev.get('left_out') or []:
                if node not in out['left_out']:
                    out['left_out'].append(node)
        elif kind == 'training' and open_fault is not None:
            start = open_fault.get('last_step_time') or open_fault.get('time')
            out['time_lost_s'] += max(0.0, ev['time'] - start)
            open_fault = None
        elif kind == 'resumed':  # it ended (a stop, its host's reboot) and goes on: supervised again
            out['outcome'], out['why'] = 'supervised', None
        elif kind in ENDINGS:
            if open_fault is not None and kind == 'gave_up':
                start = open_fault.get('last_step_time') or open_fault.get('time')
                out['time_lost_s'] += max(0.0, ev['time'] - start)
                open_fault = None
            out['outcome'] = ENDINGS[kind]
            out['why'] = ev.get('why')
    out['time_lost_s'] = round(out['time_lost_s'], 1)
    return out


def summary_lines(events, limit=8, supervised=True):
    """What a supervised job's status prints: the summary, then the last events one a line. supervised: whether a
    supervisor follows the job now (False: a supervision that has not ended reads `not supervised now`)."""
    events = events or []
    s = summarize(events)
    if not supervised and s['outcome'] == 'supervised':
        s['outcome'] = 'not supervised now'

    lines = ['supervision: %s%s; %d restart(s), %d step(s) lost, %.0f s lost%s'
             % (s['outcome'], (' (%s)' % s['why']) if s['why'] else '', s['restarts'], s['steps_lost'],
                s['time_lost_s'], ('; left out: %s' % ', '.join(s['left_out'])) if s['left_out'] else '')]
    for ev in events[-limit:]:
        words = [time.strftime('%H:%M:%S', time.localtime(ev.get('time', 0))), ev.get('event', '?')]
        keys = ('seen', 'nodes', 'step', 'resume_step') + (('attempt',) if ev.get('event') == 'restart' else ()) \
            + ('why',)
        for key in keys:
            if ev.get(key) not in (None, [], ''):
                value = ev[key]
                words.append('%s=%s' % (key, ','.join(value) if isinstance(value, list) else value))
        lines.append('  ' + ' '.join(str(w) for w in words))
    return lines


# ----- culprits -----------------------------------------------------------------------------------
def failure_kind(part):
    """The kind of failure of one part of a job ({state, reason, exit_code}): restarted (its container
    started again, or it has no part), unreachable, signal (a rank or launcher killed by a signal, an
    out-of-memory kill and an eviction's SIGTERM among them) or exit (a non-zero exit): the kinds a failure
    policy names (the k8s cluster file's train.failure_policy)."""
    state, reason = part.get('state'), part.get('reason') or ''
    if state == 'absent' or reason.startswith('restarted') or reason.startswith('has no part'):
        return 'restarted'
    if state == 'unreachable' or reason.startswith('unreachable'):
        return 'unreachable'
    code = part.get('exit_code')
    if (isinstance(code, int) and not isinstance(code, bool) and code < 0) or 'killed by' in reason:
        return 'signal'
    return 'exit'


def order_culprits(entries):
    """The culprits of a fault, first first: entries [{node, kind, ended?, ...}] sorted by CULPRIT_ORDER, then
    by when each ended (earliest first), then as given; a node named twice keeps its first place."""
    ranked = sorted(enumerate(entries), key=lambda item: (
        CULPRIT_ORDER.index(item[1]['kind']) if item[1].get('kind') in CULPRIT_ORDER else len(CULPRIT_ORDER),
        item[1].get('ended') or 0, item[0]))
    out, seen = [], set()
    for _, entry in ranked:
        if entry['node'] not in seen:
            seen.add(entry['node'])
            out.append(entry)
    return out


def culprits(obs):
    """The nodes of a read of the whole job to judge, in CULPRIT_ORDER: those that do not answer, the node whose
    rank failed first (the read's failed_nodes hold it first), the stalled. obs: {failed_nodes,
    unreachable_nodes, stalled_nodes}."""
    entries = ([{'node': n, 'kind': 'exit'} for n in obs['failed_nodes'][:1]]
               + [{'node': n, 'kind': 'unreachable'} for n in obs['unreachable_nodes']]
               + [{'node': n, 'kind': 'stalled'} for n in obs['stalled_nodes']])
    return [e['node'] for e in order_culprits(entries)]


def decide(obs):
    """What one read of the job asks for: wait (running, or a read that said nothing), done (finished), ended
    (stopped by someone else: nothing to restart, and not a finish), or stop (a fault: the whole job is stopped,
    then its nodes judged)."""
    if obs['state'] in FAULTS:
        return {'action': 'stop', 'seen': obs['state'], 'nodes': culprits(obs), 'why': obs['why']}
    if obs['state'] == 'succeeded':
        return {'action': 'done', 'why': 'the job finished'}
    if obs['state'] == 'stopped':
        return {'action': 'ended', 'why': 'the job was stopped (not by its supervisor): nothing to restart'}
    return {'action': 'wait', 'why': obs['why'] or obs['state']}


# ----- restarts -----------------------------------------------------------------------------------
def restarts_used_up(used, allowed, variable):
    """Why no restart is left ('' while one is): used restarts of allowed (the variable that sets it)."""
    if used < allowed:
        return ''
    return '%s (%d) used up' % (variable, allowed) if allowed else '%s is 0' % variable


def policy_action(policy, kind, exit_code=None):
    """(action, rule index or None) of a failure policy ([{on: [kinds], exit_codes?: [codes], action: restart,
    ignore or fail}]) for a failure of a kind: the first rule whose `on` names its kind (and whose exit_codes,
    where given, hold its exit code) decides, as JobSet's failurePolicy rules do; no rule: restart (counted
    against the restarts)."""
    for index, rule in enumerate(policy or []):
        if kind in rule.get('on', ()) and (not rule.get('exit_codes') or exit_code in rule['exit_codes']):
            return rule.get('action', 'restart'), index
    return 'restart', None


def restart_decision(used, allowed, variable, policy=None, kind=None, exit_code=None,
                     policy_variable='train.failure_policy'):
    """Whether a fault is restarted, the one rule of both supervisors: {action: restart or give_up, counted,
    why}. The failure policy's first rule for the fault's kind decides (policy_action): fail gives up,
    restart_uncounted restarts without counting it; a counted restart is one of allowed (the variable that
    sets it, of which used are spent), and none left gives up."""
    action, rule = policy_action(policy, kind, exit_code)
    if action == 'fail':
        return {'action': 'give_up', 'counted': False,
                'why': '%s[%d] fails the job on a %s failure' % (policy_variable, rule, kind)}
    if action != 'restart':
        return {'action': 'restart', 'counted': False, 'why': 'restart not counted (%s[%d])' % (policy_variable, rule)}
    used_up = restarts_used_up(used, allowed, variable)
    if used_up:
        return {'action': 'give_up', 'counted': True, 'why': used_up}
    return {'action': 'restart', 'counted': True, 'why': 'restart %d of %d (%s)' % (used + 1, allowed, variable)}


def bad_nodes(health, nodes):
    """Nodes whose quick health check failed, or gave no answer (no record of it in the report that is ok or
    warn: a node that could not be reached has none, or only unknown ones)."""
    records = (health or {}).get('records') or []
    answered = set(r.get('node') for r in records if r.get('status') in ('ok', 'warn'))
    failing = set(r.get('node') for r in records if r.get('status') == 'fail')
    return [n for n in nodes if n in failing or n not in answered]


def plan_restart(state, fault, suspects, health_bad, checkpoint_step, settings):
    """restart {nodes, left_out, recovered, spares, resume_step, why} or give_up {why}, after a fault.

    state: the supervisor's own record: nodes (the job's nodes now, head first), restarts (done so far),
    failures ([{resume_step, step}] of the earlier faults), spares_used. fault: the read when the fault was
    seen ({step}). suspects: culprits(fault). health_bad: the nodes the quick health check failed or could not
    reach. checkpoint_step: step of the latest complete checkpoint (None: none; 0 restarts from the
    beginning). settings: restarts (training_restarts), min_nodes (training_min_nodes), spares (the inventory's
    spares group less the job's nodes). A node left out is replaced by a spare that passed the check and never
    ran this job, in the spares' order: the job keeps its size while spares last; then it shrinks, down to
    min_nodes. Whether the fault restarts at all (the failure policy, the restart budget) is decided before, by
    restart_decision (Loop.recover); settings min_variable names the minimum (training_min_nodes by default). A
    give_up for too few nodes says which were left out (short): they may come back (Loop, the driver's
    wait_back)."""
    nodes = list(state['nodes'])
    head = nodes[0]
    left_out = [n for n in nodes if n in health_bad]
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
    used = list(state.get('spares_used') or [])
    ready = [n for n in settings.get('spares') or [] if n not in nodes and n not in used and n not in health_bad]
    spares = ready[:len(left_out)]
    remaining = [n for n in nodes if n not in left_out] + spares
    if len(remaining) < settings['min_nodes']:
        why = '%d node(s) would remain (%s) and %s is %d; left out: %s' % (
            len(remaining), ', '.join(remaining), settings.get('min_variable', 'training_min_nodes'),
            settings['min_nodes'], ', '.join(left_out))
        return {'action': 'give_up', 'short': left_out, 'why': why}
    recovered = [n for n in suspects if n in nodes and n not in left_out]
    if spares:
        why = 'without %s; spare %s in %s place' % (
            ', '.join(left_out), ', '.join(spares), 'its' if len(spares) == 1 else 'their')
        if len(spares) < len(left_out):
            why += ' (no more ready spares: %d node(s) fewer)' % (len(left_out) - len(spares))
    elif left_out:
        # the inventory has spares (the job may already run on them): say none was ready
        why = 'without %s%s' % (', '.join(left_out), ' (no ready spare: the job shrinks)'
                                if settings.get('spares') or used else '')
    else:
        why = 'on all nodes (%s passed the check: a transient failure)' % (', '.join(recovered) or 'every node')
    return {'action': 'restart', 'nodes': remaining, 'left_out': left_out, 'recovered': recovered,
            'spares': spares, 'resume_step': checkpoint_step or 0, 'why': why}


# ----- the loop -----------------------------------------------------------------------------------
class Loop:
    """The supervision loop, one for every platform: observe, decide, stop, check, plan, restart, record.

    The loop decides (decide, plan_restart, the culprits) and writes the story (the events); a driver reads and
    acts on its platform and keeps the supervisor's memory. A driver has:

      attempt (int) and state ({nodes, restarts, failures, spares_used}: plan_restart's), memory (a dict with
      until (None: until the job ends) and phase, the recovery in progress), settings (plan_restart's: restarts,
      min_nodes, spares; checkpoint_dir; failure_policy and the names of the variables that set them:
      restarts_variable, policy_variable, min_variable; failed_start: give_up where a restart that did not
      start ends the supervision)
      event(kind, **fields)     an event of the attempt in progress
      remember(**changes)       keep in the memory what was decided, before it is acted on
      heartbeat(what)           say what it does now
      note(text)                a line in its own log (no event)
      begin()                   the supervising event, or resumed when it goes on from its memory
      bound()                   what bounds the supervision in time (memory's until), named for its end
      look()                    one read of the whole job: {state (decide's), step, last_step_time, why,
                                failed_nodes, unreachable_nodes, stalled_nodes; lost: nodes confirmed lost;
                                stale: a read of an earlier attempt}
      look_half_started()       look() of an attempt a restart decided before the supervisor ended
      platform_fault(obs)       (obs, act) of a fault only the platform knows (its host rebooted), else None
      confirm(obs)              (obs, act) of a read that could not reach nodes and read nothing else wrong
                                (needs_confirming): a second read and a direct probe decide
      reached()                 a read reached every node: a run of missed reads ends
      between()                 until the next read (fences, glances); what ended the wait is its own
      after_restart()           a restarted job: its steps start again from its checkpoint
      fault_fields(obs)         what the fault event adds (the sign that led to the read, the quick read)
      fault_kind(obs, act)      (kind, exit code) of the fault's first culprit, as a failure policy names it
                                (failure_kind: restarted, unreachable, signal, exit; or stalled)
      stop(obs, act, lost)      stop the whole job (the lost nodes are not asked): {why, unstopped: {node:
                                why} where processes of the job were left, fields: more of the event; ended:
                                why the job was stopped by someone else meanwhile}
      check(nodes, spares, act, lost)  the quick health check of the nodes that answer and of the spares ready
                                to take a left-out node's place: {bad: failing or not answering, why}
      no_checkpoint_why()       why a restart begins from step 0 where no checkpoint directory is declared
      checkpoint()              (step of the latest complete checkpoint or None, why it cannot be read or None)
      wait_back(left_out)       too few nodes would remain: wait a while for those left out to answer again
                                ({back: True, why} to restart on the same nodes; {back: False, why}), or None
      restart_extra(plan, ckpt) what the next attempt is started with (the platform's own)
      restart_fields(plan, why) what the restart event adds or says otherwise (its why, the world size)
      start(plan, extra)        start the attempt a plan decided: '' or the problem
      stop_part(nodes)          stop what a restart half started there: {node: why} where it failed
      fence_later(nodes, attempt)  stop what older attempts left on nodes once they answer again
      gave_up(why)              the platform's part of giving up (a held Slurm job cancelled)
    """

    def __init__(self, driver):
        self.d = driver

    def run(self):
        """Supervise until the job ends or memory's until passes: done, ended (stopped by someone else), gave_up
        or stopped (the bound)."""
        d = self.d
        until = d.memory.get('until')
        d.begin()
        waiting_first_step = self.finish_half_done()
        if isinstance(waiting_first_step, str):
            return waiting_first_step
        while until is None or time.time() < until:
            obs = d.look()
            fault = d.platform_fault(obs)
            if fault:
                obs, act = fault
            else:
                if waiting_first_step is not None and obs['step'] is not None and obs['step'] > waiting_first_step:
                    d.event('training', step=obs['step'], why='training again after the restart')
                    waiting_first_step = None
                act = decide(obs)
                if act['action'] == 'stop' and needs_confirming(obs):
                    obs, act = d.confirm(obs)
                elif obs['state'] != 'unknown':
                    d.reached()
            if act['action'] == 'done':
                d.remember(ended='done')
                d.event('done', why=act['why'], step=obs['step'])
                return 'done'
            if act['action'] == 'ended':  # stopped by someone else: the summary says stopped, not finished
                d.remember(ended='stopped')
                d.event('stopped', why=act['why'], step=obs['step'])
                return 'ended'
            if act['action'] == 'stop':
                waiting_first_step = self.recover(obs, act)
                if isinstance(waiting_first_step, str):
                    return waiting_first_step
                d.after_restart()
                continue
            d.between()
        d.remember(ended='stopped')
        d.event('stopped', why='%s ended: the job runs on, unsupervised' % d.bound())
        return 'stopped'

    def finish_half_done(self):
        """Finish the recovery an earlier run of this supervision left half done (memory's phase): one that had
        not restarted the job yet goes again from the stop (a stop and a check only end and judge, and the
        restarts used were not counted yet); one whose restart was decided (counted, its plan kept) starts that
        attempt again only when a read shows nothing of it, after a stop of what it may have half started.
        None when there was none; else what recover() answers."""
        d = self.d
        phase = d.memory.get('phase') or {}
        if phase.get('phase') in ('stopping', 'checking'):
            return self.recover(phase['obs'], phase['act'], again=True)
        if phase.get('phase') != 'restarting':
            return None
        plan, extra = phase['plan'], phase['extra']
        obs = d.look_half_started()
        if obs['state'] != 'unknown' and not obs.get('stale'):
            d.note('attempt %d was started before the supervisor ended (read: %s): not started again'
                   % (d.attempt, obs['state']))
            d.remember(phase=None)
            return plan['resume_step']
        d.heartbeat('stopping')
        unstopped = d.stop_part(plan['nodes'])
        if unstopped:
            return self.give_up('not restarted: attempt %d was half started when the supervisor ended, and its stop '
                                'failed on %s' % (d.attempt, ', '.join(sorted(unstopped))), obs['step'])
        return self.start_attempt(plan, extra, obs['step'])

    def start_attempt(self, plan, extra, step=None):
        """Start the attempt a plan decided; the recovery is then done. A start that failed is an event: the
        reads go on (a job that never began is a fault of its own), or, where the platform says so (settings'
        failed_start: give_up), the supervision ends."""
        d = self.d
        d.heartbeat('restarting')
        problem = d.start(plan, extra)
        if problem:
            d.event('restart_failed', nodes=plan['nodes'], why=problem)
            if d.settings.get('failed_start') == 'give_up':
                return self.give_up('restart failed: %s' % problem, step)
        d.remember(phase=None)
        return plan['resume_step']

    def recover(self, obs, act, again=False):
        """Stop the job, decide whether it restarts, check its nodes, plan and start the next attempt (the
        answer: the step it resumes from; gave_up or stopped when the supervision ends). Each phase is
        remembered before it is acted on; again: a recovery an earlier run of this supervision began (its fault
        event was written then)."""
        d = self.d
        kind, exit_code = d.fault_kind(obs, act)
        if not again:
            d.event('fault', seen=act['seen'], failure=kind, nodes=act['nodes'], step=obs['step'],
                    last_step_time=obs['last_step_time'], why=act['why'],
                    **dict({'exit_code': exit_code} if exit_code is not None else {}, **d.fault_fields(obs)))
        phase = {'phase': 'stopping', 'obs': obs, 'act': act, 'time': time.time()}
        d.remember(phase=phase)
        d.heartbeat('stopping')
        # nodes confirmed lost (two reads and a direct probe): not stopped nor checked (each would wait out its
        # bound), left out of the restart, and fenced when they answer again (the head is never left out)
        lost = [n for n in obs.get('lost') or [] if n != d.state['nodes'][0]]
        answering = [n for n in d.state['nodes'] if n not in lost]
        stopped = d.stop(obs, act, lost)
        d.event('job_stopped', why=stopped['why'], **stopped.get('fields') or {})
        if stopped.get('ended'):
            d.remember(phase=None, ended='stopped')
            d.event('stopped', why=stopped['ended'])
            return 'stopped'
        if stopped.get('unstopped'):
            return self.give_up('not restarted: the stop failed on %s, where the job may still run; a restart would '
                                'start beside it (end what is left there, then start the job again)'
                                % ', '.join(sorted(stopped['unstopped'])), obs['step'])
        # whether it restarts: the failure policy's rule for the fault's kind, else the restart budget
        settings = d.settings
        decision = restart_decision(d.state['restarts'], settings['restarts'],
                                    settings.get('restarts_variable', 'training_restarts'),
                                    settings.get('failure_policy'), kind, exit_code,
                                    settings.get('policy_variable', 'training_failure_policy'))
        if decision['action'] == 'give_up':
            return self.give_up(decision['why'], obs['step'])
        d.remember(phase=dict(phase, phase='checking'))
        d.heartbeat('checking nodes')
        # the spares that may take a left-out node's place are checked with the job's nodes
        ready = [n for n in settings.get('spares') or [] if n not in d.state['nodes']
                 and n not in d.state.get('spares_used', [])]
        checked = d.check(answering, ready, act, lost)
        d.event('checked', nodes=checked['bad'], why=checked['why'], **checked.get('fields') or {})
        ckpt, unreadable = d.checkpoint()
        if unreadable:  # never silently from the beginning, past a checkpoint that may well be there
            return self.give_up('not restarted: %s; a restart would begin again from step 0 beside the checkpoints '
                                'it cannot see (make the directory readable to the training account, then start '
                                'the job again: it resumes from there)' % unreadable, obs['step'])
        plan = plan_restart(d.state, obs, act['nodes'], checked['bad'], ckpt, settings)
        if plan['action'] == 'give_up' and plan.get('short'):
            # too few nodes without those left out: they may answer again (a node that was only slow)
            back = d.wait_back(plan['short'])
            if back and back['back']:
                plan = {'action': 'restart', 'nodes': list(d.state['nodes']), 'left_out': [], 'spares': [],
                        'recovered': list(plan['short']), 'resume_step': ckpt or 0, 'why': back['why']}
            elif back:
                plan = dict(plan, why='%s; %s' % (plan['why'], back['why']))
        if plan['action'] == 'give_up':
            return self.give_up(plan['why'], obs['step'])
        d.state['failures'].append({'resume_step': plan['resume_step'], 'step': obs['step']})
        if decision['counted']:
            d.state['restarts'] += 1
        d.state['nodes'] = plan['nodes']
        d.state['spares_used'] = list(d.state.get('spares_used') or []) + list(plan.get('spares') or [])
        d.attempt += 1
        # their ranks, where the stop did not reach them, are stopped once they answer
        d.fence_later(list(plan['left_out']) + [n for n in lost if n not in plan['left_out']], d.attempt)
        lost_steps = None if obs['step'] is None else max(0, obs['step'] - plan['resume_step'])
        why = plan['why']
        if ckpt is None and settings.get('checkpoint_dir'):
            why += '; no complete checkpoint under %s yet: restarting from the beginning' % settings['checkpoint_dir']
        elif ckpt is None and d.no_checkpoint_why():
            why += '; %s: restarting from the beginning' % d.no_checkpoint_why()
        extra = d.restart_extra(plan, ckpt)
        # decided: the restart counted, its plan kept; a supervisor that ends now starts this attempt when it
        # comes back (finish_half_done), unless it was started already
        d.remember(phase={'phase': 'restarting', 'plan': plan, 'extra': extra, 'time': time.time()})
        fields = dict({'nodes': plan['nodes'], 'left_out': plan['left_out'], 'resume_step': plan['resume_step'],
                       'lost_steps': lost_steps, 'why': why, 'counted': decision['counted'],
                       'restarts_used': d.state['restarts']},
                      **({'spares': plan['spares']} if plan.get('spares') else {}))
        fields.update(d.restart_fields(plan, why))
        d.event('restart', **fields)
        return self.start_attempt(plan, extra, obs['step'])

    def give_up(self, why, step):
        """The gave_up event (supervision ends, the job failed); recover()'s answer for it."""
        d = self.d
        d.remember(phase=None, ended='gave_up')
        d.event('gave_up', why=why, step=step)
        d.gave_up(why)
        return 'gave_up'


# ----- when a job is stalled: the same rule on every platform (the controller's job_state, pod 0) -----------
PHASE_NAMES = {'checkpoint': 'saving checkpoint', 'eval': 'evaluating', 'load': 'loading checkpoint'}


def phase_text(row):
    """'saving checkpoint since 40 s' of a rank between two steps, '' when it steps."""
    if not row.get('phase'):
        return ''
    age = row.get('phase_s')
    return '%s since %s s' % (PHASE_NAMES.get(row['phase'], row['phase']), '-' if age is None else '%.0f' % age)


def activity_age(row):
    """Seconds since the rank last showed life: its last step or heartbeat, and before its first
    step the time since it started (its progress header, else its process start); None when
    nothing tracks it."""
    if not row.get('tracked'):
        return None
    ages = [row.get('seconds_since_step'), row.get('seconds_since_heartbeat')]
    if row.get('last_step') is None:
        ages.append(row.get('seconds_since_start'))
    ages = [a for a in ages if isinstance(a, (int, float))]
    return min(ages) if ages else None


SAVE_PHASES = ('checkpoint',)


def saving_age(row):
    """Seconds a rank has been saving a checkpoint (its latest heartbeat's phase is checkpoint: since
    the save began), None when it is not saving."""
    if row.get('phase') not in SAVE_PHASES:
        return None
    age = row.get('phase_s')
    return age if isinstance(age, (int, float)) else 0.0


def _quiet(row, stall_seconds, checkpoint_seconds):
    """(quiet, overlong) of a tracked rank: quiet when it showed no life for stall_seconds; with
    checkpoint_seconds, a rank saving a checkpoint whose heartbeats still come is quiet (overlong)
    only once its save began checkpoint_seconds ago or more."""
    age = activity_age(row)
    if checkpoint_seconds is None or saving_age(row) is None:
        return age >= stall_seconds, False
    beat = row.get('seconds_since_heartbeat')
    if not isinstance(beat, (int, float)) or beat >= stall_seconds:
        return age >= stall_seconds, False  # its heartbeats stopped: judged as any rank
    return saving_age(row) >= checkpoint_seconds, saving_age(row) >= checkpoint_seconds


def stall(rows, stall_seconds, checkpoint_seconds=None):
    """{stalled, off, ranks: [...first to stop...], nodes, why, collectives} of a job.

    Stalled: every rank alive and none of the tracked ones showed life (a step, a heartbeat, or
    before the first step its start) for stall_seconds. With checkpoint_seconds, a rank whose latest
    heartbeat says it saves a checkpoint (phase checkpoint, its heartbeats still coming) is judged by
    the save's age instead: it shows no life once its save began checkpoint_seconds ago or more (a
    heartbeat thread beats on while the main thread hangs in the save); a rank whose heartbeats
    stopped for stall_seconds is judged as before. None keeps every rank on stall_seconds.

    The ranks named are the ones held by the kernel (stopped, traced) when any is, else those in a
    save past checkpoint_seconds, else those without a step (a start-up hang), else those with the
    lowest last step, earliest first. When every rank stopped at the same step (a collective that
    never completed: the usual NCCL hang) all are named; collectives is left for a reader of the
    collectives in flight (NCCL's flight recorder) to fill: a list of lines.
    off: nothing tracks the job's steps (no progress file, no log line matching the regex)."""
    out = {'stalled': False, 'off': False, 'ranks': [], 'nodes': [], 'why': '', 'collectives': None}
    if rows and not any(r.get('tracked') for r in rows):
        out.update(off=True, why='no steps tracked')
        return out
    alive = [r for r in rows if r.get('alive')]
    if not alive or len(alive) != len(rows):
        return out
    tracked = [r for r in alive if activity_age(r) is not None]
    if not tracked:
        return out
    judged = [(r,) + _quiet(r, stall_seconds, checkpoint_seconds) for r in tracked]
    if not all(quiet for _, quiet, _ in judged):
        return out
    overlong = sorted([r for r, _, long in judged if long], key=lambda r: -saving_age(r))
    others = [r for r, _, long in judged if not long]
    held = [r for r in alive if r.get('held')]
    no_step = [r for r in tracked if r.get('last_step') is None]
    if held:
        first = held
        why = ', '.join('rank %d on %s is %s' % (r['rank'], r['node'], r['held']) for r in held)
    elif overlong:
        first = overlong
        why = ''
    elif no_step:
        first = no_step
        why = ('no rank logged a first step since it started: a start-up hang (rendezvous, NCCL '
               'initialisation, loading)' if len(no_step) == len(tracked) else
               '%s logged no step since it started' % ', '.join('rank %d' % r['rank'] for r in no_step))
    else:
        low = min(r['last_step'] for r in tracked)
        first = sorted([r for r in tracked if r['last_step'] == low], key=lambda r: r['last_step_time'])
        if len(first) == len(tracked) and len(tracked) > 1:
            why = ('every rank stopped after step %d: they wait in the same collective (a rank, GPU or '
                   'link that never joined it; the steps cannot tell which)' % low)
        else:
            why = 'lowest last step %d' % low
    phases = ['rank %d on %s has been %s' % (r['rank'], r['node'], phase_text(r).replace(' since ', ' for '))
              for r in others if r.get('phase')]
    if phases:
        why += ('; ' if why else '') + ', '.join(phases)
    if overlong:
        saves = 'a checkpoint save running for %d s (training_checkpoint_seconds %d) on %s' % (
            int(saving_age(overlong[0])), int(checkpoint_seconds),
            ', '.join('rank %d on %s' % (r['rank'], r['node']) for r in overlong))
        if others:
            saves += '; no other rank logged a step or heartbeat for %d s or more' % int(
                min(activity_age(r) for r in others))
        why = '%s%s' % (saves, ' (%s)' % why if why else '')
    else:
        why = 'no rank logged a step or heartbeat for %d s or more (%s)' % (
            int(min(activity_age(r) for r in tracked)), why)
    out.update(stalled=True, ranks=[r['rank'] for r in first], nodes=sorted({r['node'] for r in first}), why=why)
    return out


def needs_confirming(obs):
    """A read that found nodes it could not reach and nothing else wrong (no failed rank): one missed read is
    no fault until a second read and a direct probe agree."""
    return obs['state'] == 'unreachable' and not obs['failed_nodes']
