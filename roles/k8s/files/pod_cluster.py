# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Pod 0's acts on every pod of a job, through their agents: wait until each answers as itself
(wait_for_peers), read every part (all_status) and the job's state from them (summary), start (start_all)
and stop (stop_all, stop_job) every part, and launch: the checks before the start, the start, the supervision
asked of pod 0's agent, and the wait for the end. Standard library only; mounted beside the pod entrypoint."""

import sys
import time

import pod_net as net
from pod_checks import claim_verdict, rdma_verdict
from pod_job import layout_of, pod_ip, read_job_record, state_root, working_pods, write_job_record


def hello_of(job, pod, timeout=3.0):
    """A pod's hello reply when its agent answers as itself, else None."""
    try:
        reply = net.request(pod['address'], int(job['agent_port']), {'op': 'hello'}, timeout=timeout)
    except (OSError, ValueError):
        return None
    return reply if reply.get('pod') == pod['name'] else None


def wait_for_peers(job, seconds, clock=time.time, sleep=time.sleep, pods=None, root=None):
    """({}, hellos) when every pod (default: the working pods) answers as itself; else ({pod: why}, hellos)
    at the bound. A pod is asked at its published name, or, while that does not resolve yet, at the address
    it registered under root (the state directory; it must answer as itself there too). hellos: {pod: its
    hello reply} of the pods that answered."""
    port = int(job['agent_port'])
    pods = working_pods(job) if pods is None else pods
    root = state_root(job) if root is None else root
    deadline = clock() + seconds

    def ask(pod):
        addresses = net.resolve(pod['address'])
        published = bool(addresses)
        if not addresses:
            addresses = [a for a in [net.registered(root, pod['name'])] if a]
        if not addresses:
            return '%s does not resolve' % pod['address'], None
        net.remember(pod['address'], addresses)
        try:
            reply = net.request(pod['address'], port, {'op': 'hello'}, timeout=2.0)
        except (OSError, ValueError) as exc:
            if not published:
                net.forget(pod['address'])
                return '%s does not resolve' % pod['address'], None
            return '%s (%s) does not answer on port %d: %s' % (
                pod['address'], addresses[0], port, getattr(exc, 'strerror', None) or exc), None
        if reply.get('pod') != pod['name']:
            if not published:       # a registered address now held by another pod: wait for the name
                net.forget(pod['address'])
                return '%s does not resolve' % pod['address'], None
            return '%s answers as %r: the hostfile does not match the pods' % (pod['address'], reply.get('pod')), None
        if reply.get('running'):
            return '%s still runs job %s' % (pod['name'], reply['running'][0]), None
        return '', reply

    while True:
        why, hellos = {}, {}
        for pod, (problem, reply) in zip(pods, net.each(pods, ask)):
            if problem:
                why[pod['name']] = problem
            else:
                hellos[pod['name']] = reply
        if not why or clock() >= deadline:
            return why, hellos
        sleep(1.0)


def as_itself(pod, reply):
    """A pod's reply, or unreachable where another pod answered at its address (a registered address now
    held by another pod): that address is forgotten."""
    if reply.get('pod') not in (None, pod['name']):
        net.forget(pod['address'])
        reply = {'state': 'unreachable', 'error': '%s answered at its address' % reply.get('pod')}
    reply['pod'] = pod['name']
    return reply


def admin_step(job, pod, node):
    """What an administrator does for a pod lost with its node: the StatefulSet makes it again only once it is
    deleted, which is safe only once its node is known to be down."""
    namespace = job.get('namespace') or '<namespace>'
    if node:
        return ('pod %s on node %s is lost: once the node is confirmed down (kubectl get node %s: NotReady; '
                'drained or powered off), kubectl delete pod %s -n %s --force --grace-period=0, and the StatefulSet '
                'makes it again' % (pod, node, node, pod, namespace))
    return ('pod %s is lost (its node may be down): once its node (kubectl get pod %s -n %s -o wide) is confirmed '
            'down, kubectl delete pod %s -n %s --force --grace-period=0' % (pod, pod, namespace, pod, namespace))


def all_status(job, job_id, lines=20, pods=None, slow=None):
    """Every pod's part (default: the working pods), asked at once; a pod in slow (it has not answered
    lately) is waited on LOST_IO_TIMEOUT at most."""
    port = int(job['agent_port'])
    pods = working_pods(job) if pods is None else pods

    def ask(pod):
        try:
            reply = net.request(pod['address'], port, {'op': 'status', 'job_id': job_id, 'lines': lines},
                                timeout=net.LOST_IO_TIMEOUT if pod['name'] in (slow or ()) else net.IO_TIMEOUT)
        except (OSError, ValueError) as exc:
            reply = {'pod': pod['name'], 'state': 'unreachable', 'error': str(exc) or type(exc).__name__}
        return as_itself(pod, reply)
    return net.each(pods, ask)


def summary(job, job_id, states, record=None):
    """The job's state from every pod's part and pod 0's record of the job (its supervision)."""
    unreachable = [s['pod'] for s in states if s.get('state') == 'unreachable']
    reached = [s for s in states if s.get('state') != 'unreachable']
    active = any(s.get('state') in ('running', 'finished', 'failed') for s in reached)
    # a pod that cannot be reached, or has no part, fails a job that runs elsewhere; with no job
    # anywhere it is only reported
    failed = [s for s in states if s.get('state') == 'failed'
              or (active and s.get('state') in ('unreachable', 'absent'))]
    states_seen = reached or states
    reason = ''
    failed_pod = failed[0]['pod'] if failed else None
    if failed:
        reason = failed[0].get('reason') or (
            'unreachable' if failed[0].get('state') == 'unreachable' else
            'has no part of the job' if failed[0].get('state') == 'absent' else 'exit %s' % failed[0].get('exit_code'))
    ended = [s for s in states if s.get('state') in ('failed', 'stopped', 'absent')]
    if record and record.get('state') == 'failed':
        state, failed_pod, reason = 'failed', record.get('failed_pod'), record.get('reason', '')
    elif record and record.get('state') == 'running' and (ended or record.get('phase')):
        # a part ended, or pod 0 named a fault and acts on it; a pod that only did not answer yet is not
        # a fault until train.unreachable_after (the job runs on: unreachable lists it)
        state = 'restarting' if record.get('restarts_used', record.get('attempt', 0)) < record.get('restarts', 0) else 'failing'
    elif record and record.get('state') == 'running' and any(s.get('state') == 'running' for s in states):
        state = 'running'
    elif failed:
        state = 'failed'
    elif all(s.get('state') == 'finished' for s in states):
        state = 'finished'
    elif any(s.get('state') == 'running' for s in states):
        state = 'running'
    elif all(s.get('state') in ('absent', 'stopped') for s in states_seen):
        state = 'absent' if all(s.get('state') == 'absent' for s in states_seen) else 'stopped'
    else:
        state = 'partial'
    out = {'job_id': job_id, 'state': state, 'failed_pod': failed_pod, 'reason': reason,
           'unreachable': unreachable, 'world_size': sum(p['slots'] for p in layout_of(job, record)), 'pods': states}
    if record:
        out.update(attempt=record.get('attempt', 0), restarts=record.get('restarts', 0),
                   restarts_used=record.get('restarts_used', record.get('attempt', 0)),
                   history=record.get('history', []), spares_used=record.get('spares_used', []))
    return out


def stop_all(job, job_id, reason='stopped', pods=None, slow=None, before_attempt=None):
    """Stop the job on every pod (default: all of them, spares too) at once; a pod in slow (it has not
    answered lately) is asked LOST_IO_TIMEOUT at most, the others 30 s (their ranks' grace)."""
    port = int(job['agent_port'])
    pods = job['pods'] if pods is None else pods
    message = {'op': 'stop', 'job_id': job_id, 'reason': reason}
    if before_attempt is not None:
        message['before_attempt'] = before_attempt

    def ask(pod):
        try:
            reply = net.request(pod['address'], port, message,
                                timeout=net.LOST_IO_TIMEOUT if pod['name'] in (slow or ()) else 30.0)
        except (OSError, ValueError) as exc:
            reply = {'state': 'unreachable', 'error': str(exc) or type(exc).__name__}
        return as_itself(pod, reply)
    return net.each(pods, ask)


def start_all(job, job_id, attempt=0, pods=None):
    """Start every pod's part (default: the working pods) with the attempt's hostfile and pod 0's address as
    the master; '' or 'pod <name>: <why>' after stopping the parts already started."""
    port = int(job['agent_port'])
    pods = working_pods(job) if pods is None else pods
    hosts = [[p['address'], p['slots']] for p in pods]
    master = pod_ip() or net.address_of(pods[0]['address'])
    for rank, pod in enumerate(pods):
        try:
            reply = net.request(pod['address'], port, {'op': 'start', 'job_id': job_id, 'node_rank': rank,
                                                       'attempt': attempt, 'hosts': hosts, 'master_addr': master})
        except (OSError, ValueError) as exc:
            reply = {'ok': False, 'error': str(exc)}
        if not reply.get('ok'):
            stop_all(job, job_id, reason='stopped: pod %s did not start its part' % pod['name'], pods=pods)
            return 'pod %s: %s' % (pod['name'], reply.get('error'))
    return ''


def launch(job, job_id, peer_wait, detach, timeout, poll=2.0):
    layout = working_pods(job)
    world = sum(p['slots'] for p in layout)
    started = time.time()
    why, hellos = wait_for_peers(job, peer_wait, pods=layout)
    if why:
        first = next(p['name'] for p in layout if p['name'] in why)
        others = '' if len(why) == 1 else ' (%d pods not ready: %s)' % (len(why), ', '.join(sorted(why)))
        print('k8s_pod: job %s not started: pod %s: %s after %d s%s; nothing was started'
              % (job_id, first, why[first], peer_wait, others), file=sys.stderr, flush=True)
        return 3
    if job.get('network_mode') == 'rdma':
        for pod in layout:
            verdict = rdma_verdict(hellos.get(pod['name'], {}))
            if verdict:
                print('k8s_pod: job %s not started: pod %s %s; nothing was started' % (job_id, pod['name'], verdict),
                      file=sys.stderr, flush=True)
                return 6
    for pod in layout:
        verdict = claim_verdict(job, pod['name'], hellos.get(pod['name'], {}))
        if verdict:
            print('k8s_pod: job %s not started: %s; nothing was started' % (job_id, verdict), file=sys.stderr, flush=True)
            return 7
    problem = start_all(job, job_id, pods=layout)
    if problem:
        print('k8s_pod: job %s not started: %s; stopped on the others' % (job_id, problem), file=sys.stderr, flush=True)
        return 4
    port = int(job['agent_port'])
    try:
        sup = net.request(job['pods'][0]['address'], port, {
            'op': 'supervise', 'job_id': job_id, 'layout': [{'name': p['name'], 'slots': p['slots']} for p in layout],
            'nodes': {name: reply.get('node') for name, reply in hellos.items()}})
    except (OSError, ValueError) as exc:
        sup = {'ok': False, 'error': str(exc)}
    if not sup.get('ok'):
        stop_all(job, job_id, reason='stopped: pod 0 could not supervise it', pods=layout)
        print('k8s_pod: job %s not started: pod %s does not supervise it: %s; stopped'
              % (job_id, job['pods'][0]['name'], sup.get('error')), file=sys.stderr, flush=True)
        return 4
    spares = [p['name'] for p in job['pods'][len(layout):]]
    print('k8s_pod: job %s started on %d pods, world size %d (%s) after %.0f s%s'
          % (job_id, len(layout), world, ', '.join('%s %d' % (p['name'], p['slots']) for p in layout),
             time.time() - started, '; spare%s: %s' % ('s' if len(spares) > 1 else '', ', '.join(spares))
             if spares else ''), flush=True)
    if detach:
        return 0
    deadline = time.time() + timeout if timeout else None
    root = state_root(job)
    while True:
        time.sleep(poll)
        record = read_job_record(root, job_id) or {}
        if record.get('state') == 'failed':
            states = all_status(job, job_id, pods=layout_of(job, record))
            bad = next((st for st in states if st['pod'] == record.get('failed_pod')), {})
            print('k8s_pod: job %s failed: pod %s %s (attempt %d of %d); stopped on every pod'
                  % (job_id, record.get('failed_pod'), record.get('reason'), record.get('attempt', 0),
                     1 + record.get('restarts', 0)), file=sys.stderr, flush=True)
            for line in bad.get('tail') or []:
                print('  %s | %s' % (bad['pod'], line), file=sys.stderr)
            return 1
        if record.get('state') == 'finished':
            final = layout_of(job, record)
            print('k8s_pod: job %s finished on %d pods, world size %d, in %.0f s%s'
                  % (job_id, len(final), sum(p['slots'] for p in final), time.time() - started,
                     ' after %d restart(s)%s' % (record['attempt'], ' (spare %s used)' % ', '.join(record['spares_used'])
                                                 if record.get('spares_used') else '')
                     if record.get('attempt') else ''), flush=True)
            return 0
        if record.get('state') == 'stopped':
            print('k8s_pod: job %s was stopped' % job_id, file=sys.stderr, flush=True)
            return 1
        if deadline and time.time() > deadline:
            stop_job(job, job_id, 'stopped: still running after --timeout %d s' % timeout)
            print('k8s_pod: job %s still running after %d s (--timeout); stopped' % (job_id, timeout),
                  file=sys.stderr)
            return 5


def stop_job(job, job_id, reason='stopped'):
    """Stop a job for good: the record first (no restart), then every pod's part."""
    root = state_root(job)
    record = read_job_record(root, job_id)
    if record and record.get('state') == 'running':
        record.update(state='stopped', reason=reason, updated=time.time())
        write_job_record(root, job_id, record)
    return stop_all(job, job_id, reason=reason)
