#!/usr/bin/env python3
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The pod entrypoint of a gpucluster.multinode training StatefulSet (mounted from its ConfigMap).

Every pod runs ``k8s_pod.py agent``: a small agent on the agent port (the readiness probe's port)
that answers its peers and starts, reports and stops this pod's part of a job. A job is
``deepspeed --no_ssh --node_rank <ordinal>`` with the hostfile of the ConfigMap: each pod starts its
own ranks, no SSH, no root, any uid (OpenShift's restricted-v2 runs it as a random one).

In pod 0, ``k8s_pod.py launch --job-id ID`` waits (bounded by --peer-wait) until every pod of the
hostfile resolves through the headless Service and its agent answers with the expected pod name;
a pod that never does is named in one line and nothing is started anywhere. Then it starts every
pod's part (pod 0's own last is not special: all are started through the agents) and, unless
--detach, follows the job: the first pod whose launcher exits non-zero is named and the job is
stopped on the others. ``status`` and ``stop`` do the same through the agents.

Only the standard library; Python 3.8 or later.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

CONFIG_DIR = os.environ.get('GPUCLUSTER_CONFIG_DIR', '/etc/gpucluster')
JOB_ID_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$')
STATE_ROOT = os.environ.get('GPUCLUSTER_JOB_DIR', '/tmp/gpucluster-jobs')
JOB_ENV = 'GPUCLUSTER_JOB_ID'
IO_TIMEOUT = 5.0


def load_job(config_dir=CONFIG_DIR):
    with open(os.path.join(config_dir, 'job.json')) as handle:
        return json.load(handle)


def pod_name():
    return os.environ.get('GPUCLUSTER_POD_NAME') or socket.gethostname().split('.')[0]


def ordinal_of(job, name):
    for index, pod in enumerate(job['pods']):
        if pod['name'] == name:
            return index
    raise SystemExit('k8s_pod: this pod %r is not in the hostfile of %s (pods: %s)'
                     % (name, job['name'], ', '.join(p['name'] for p in job['pods'])))


def resolve(name):
    """The IPv4/IPv6 addresses a name resolves to now ([] when it does not)."""
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)})
    except (socket.gaierror, UnicodeError):
        return []


def request(address, port, message, timeout=IO_TIMEOUT):
    """One JSON request, one JSON line back."""
    with socket.create_connection((address, port), timeout=timeout) as conn:
        conn.sendall((json.dumps(message) + '\n').encode())
        data = b''
        while not data.endswith(b'\n'):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data.decode() or '{}')


# ----- the agent ------------------------------------------------------------------------------------
class Agent:
    def __init__(self, job, name):
        self.job = job
        self.name = name
        self.ordinal = ordinal_of(job, name)
        self.jobs = {}          # job_id -> {'proc', 'log', 'exit_code'}
        self.lock = threading.Lock()

    def _job_dir(self, job_id):
        path = os.path.join(STATE_ROOT, job_id)
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def command(self, job_id, node_rank):
        job = self.job
        master = job['pods'][0]['address']
        return [job['deepspeed'], '--no_ssh', '--hostfile', os.path.join(job['config_dir'], 'hostfile'),
                '--node_rank', str(node_rank), '--master_addr', master,
                '--master_port', str(job['master_port'])] + list(job['command'])

    def start(self, job_id, node_rank):
        with self.lock:
            # the ConfigMap as it is now: a changed command or hostfile reaches running pods (kubelet
            # refreshes mounted ConfigMaps) without a restart
            self.job = load_job(self.job['config_dir'])
            current = self.jobs.get(job_id)
            if current and current['proc'].poll() is None:
                return {'ok': True, 'state': 'running', 'pid': current['proc'].pid, 'already': True}
            running = [j for j, rec in self.jobs.items() if rec['proc'].poll() is None]
            if running:
                return {'ok': False, 'error': 'job %s is still running on %s' % (running[0], self.name)}
            log = os.path.join(self._job_dir(job_id), '%s.log' % self.name)
            env = dict(os.environ, **{JOB_ENV: job_id})
            workdir = self.job['workdir'] if os.path.isdir(self.job['workdir']) else '/tmp'
            with open(log, 'ab') as out:
                proc = subprocess.Popen(self.command(job_id, node_rank), stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, cwd=workdir, env=env, start_new_session=True)
            self.jobs[job_id] = {'proc': proc, 'log': log, 'started': time.time()}
            return {'ok': True, 'state': 'running', 'pid': proc.pid}

    def status(self, job_id, lines=20):
        rec = self.jobs.get(job_id)
        if rec is None:
            return {'ok': True, 'pod': self.name, 'state': 'absent'}
        code = rec['proc'].poll()
        state = 'running' if code is None else ('finished' if code == 0 else 'failed')
        return {'ok': True, 'pod': self.name, 'state': state, 'exit_code': code, 'pid': rec['proc'].pid,
                'tail': tail(rec['log'], lines)}

    def stop(self, job_id, grace=10.0):
        rec = self.jobs.get(job_id)
        if rec is None or rec['proc'].poll() is not None:
            return {'ok': True, 'pod': self.name, 'state': 'absent' if rec is None else 'stopped'}
        # the job's own process group only: the launcher was started in a new session
        pgid = rec['proc'].pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + grace
            while time.time() < deadline and rec['proc'].poll() is None:
                time.sleep(0.2)
            if rec['proc'].poll() is not None:
                break
        return {'ok': True, 'pod': self.name, 'state': 'stopped', 'exit_code': rec['proc'].poll()}

    def allowed(self, peer):
        """Only pod 0 (or this pod itself) may start or stop a job here."""
        return peer in ('127.0.0.1', '::1') or peer in resolve(self.job['pods'][0]['address'])

    def handle(self, conn, peer):
        try:
            conn.settimeout(IO_TIMEOUT)
            data = b''
            while not data.endswith(b'\n') and len(data) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            try:
                msg = json.loads(data.decode() or '{}')
            except ValueError:
                msg = {}
            op = msg.get('op')
            job_id = str(msg.get('job_id', ''))
            if op == 'hello':
                reply = {'ok': True, 'pod': self.name, 'ordinal': self.ordinal,
                         'slots': self.job['pods'][self.ordinal]['slots'],
                         'running': [j for j, r in self.jobs.items() if r['proc'].poll() is None]}
            elif op in ('start', 'status', 'stop') and not JOB_ID_RE.match(job_id):
                reply = {'ok': False, 'error': 'bad job id %r' % job_id}
            elif op == 'status':
                reply = self.status(job_id, int(msg.get('lines', 20)))
            elif op in ('start', 'stop') and not self.allowed(peer[0]):
                reply = {'ok': False, 'error': '%s refuses %s from %s: only pod 0 starts and stops jobs'
                         % (self.name, op, peer[0])}
            elif op == 'start':
                reply = self.start(job_id, int(msg.get('node_rank', self.ordinal)))
            elif op == 'stop':
                reply = self.stop(job_id)
            else:
                reply = {'ok': False, 'error': 'unknown request %r' % op}
            conn.sendall((json.dumps(reply) + '\n').encode())
        except OSError:
            pass
        finally:
            conn.close()

    def serve(self):
        port = int(self.job['agent_port'])
        sock = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sock.family == socket.AF_INET6:
            try:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind(('::', port))
            except OSError:
                sock.close()
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(('0.0.0.0', port))
        else:
            sock.bind(('0.0.0.0', port))
        sock.listen(64)
        print('k8s_pod: %s (ordinal %d, %d slot(s)) agent on port %d' % (
            self.name, self.ordinal, self.job['pods'][self.ordinal]['slots'], port), flush=True)

        def shutdown(signum, frame):
            for job_id in list(self.jobs):
                self.stop(job_id, grace=5.0)
            sys.exit(0)
        signal.signal(signal.SIGTERM, shutdown)
        signal.signal(signal.SIGINT, shutdown)
        while True:
            conn, peer = sock.accept()
            peer = (peer[0].replace('::ffff:', ''),) + tuple(peer[1:])
            threading.Thread(target=self.handle, args=(conn, peer), daemon=True).start()


def tail(path, lines):
    try:
        with open(path, 'rb') as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            text = handle.read().decode('utf-8', 'replace')
    except OSError:
        return []
    return text.splitlines()[-lines:]


# ----- pod 0: wait, start, follow --------------------------------------------------------------------
def wait_for_peers(job, seconds, clock=time.time, sleep=time.sleep):
    """{pod: None} when every pod resolves and its agent answers as itself; else {pod: why} at the bound."""
    port = int(job['agent_port'])
    deadline = clock() + seconds
    why = {}
    while True:
        why = {}
        for pod in job['pods']:
            addresses = resolve(pod['address'])
            if not addresses:
                why[pod['name']] = '%s does not resolve' % pod['address']
                continue
            try:
                reply = request(pod['address'], port, {'op': 'hello'}, timeout=2.0)
            except (OSError, ValueError) as exc:
                why[pod['name']] = '%s (%s) does not answer on port %d: %s' % (
                    pod['address'], addresses[0], port, getattr(exc, 'strerror', None) or exc)
                continue
            if reply.get('pod') != pod['name']:
                why[pod['name']] = '%s answers as %r: the hostfile does not match the pods' % (
                    pod['address'], reply.get('pod'))
            elif reply.get('running'):
                why[pod['name']] = '%s still runs job %s' % (pod['name'], reply['running'][0])
        if not why or clock() >= deadline:
            return why
        sleep(1.0)


def all_status(job, job_id, lines=20):
    port = int(job['agent_port'])
    out = []
    for pod in job['pods']:
        try:
            reply = request(pod['address'], port, {'op': 'status', 'job_id': job_id, 'lines': lines})
        except (OSError, ValueError) as exc:
            reply = {'pod': pod['name'], 'state': 'unreachable', 'error': str(exc)}
        reply['pod'] = pod['name']
        out.append(reply)
    return out


def summary(job, job_id, states):
    unreachable = [s['pod'] for s in states if s.get('state') == 'unreachable']
    reached = [s for s in states if s.get('state') != 'unreachable']
    active = any(s.get('state') in ('running', 'finished', 'failed') for s in reached)
    # a pod that cannot be reached fails a job that runs; with no job anywhere it is only reported
    failed = [s for s in states if s.get('state') == 'failed' or (active and s.get('state') == 'unreachable')]
    states_seen = reached or states
    if failed:
        state = 'failed'
    elif all(s.get('state') == 'finished' for s in states):
        state = 'finished'
    elif any(s.get('state') == 'running' for s in states):
        state = 'running'
    elif all(s.get('state') in ('absent', 'stopped') for s in states_seen):
        state = 'absent' if all(s.get('state') == 'absent' for s in states_seen) else 'stopped'
    else:
        state = 'partial'
    return {'job_id': job_id, 'state': state, 'failed_pod': failed[0]['pod'] if failed else None,
            'unreachable': unreachable, 'world_size': sum(p['slots'] for p in job['pods']), 'pods': states}


def stop_all(job, job_id):
    port = int(job['agent_port'])
    out = []
    for pod in job['pods']:
        try:
            out.append(request(pod['address'], port, {'op': 'stop', 'job_id': job_id}, timeout=30.0))
        except (OSError, ValueError) as exc:
            out.append({'pod': pod['name'], 'state': 'unreachable', 'error': str(exc)})
    return out


def launch(job, job_id, peer_wait, detach, timeout, poll=2.0):
    world = sum(p['slots'] for p in job['pods'])
    started = time.time()
    why = wait_for_peers(job, peer_wait)
    if why:
        first = next(p['name'] for p in job['pods'] if p['name'] in why)
        others = '' if len(why) == 1 else ' (%d pods not ready: %s)' % (len(why), ', '.join(sorted(why)))
        print('k8s_pod: job %s not started: pod %s: %s after %d s%s; nothing was started'
              % (job_id, first, why[first], peer_wait, others), file=sys.stderr, flush=True)
        return 3
    port = int(job['agent_port'])
    for rank, pod in enumerate(job['pods']):
        try:
            reply = request(pod['address'], port, {'op': 'start', 'job_id': job_id, 'node_rank': rank})
        except (OSError, ValueError) as exc:
            reply = {'ok': False, 'error': str(exc)}
        if not reply.get('ok'):
            stop_all(job, job_id)
            print('k8s_pod: job %s not started: pod %s: %s; stopped on the others'
                  % (job_id, pod['name'], reply.get('error')), file=sys.stderr, flush=True)
            return 4
    print('k8s_pod: job %s started on %d pods, world size %d (%s) after %.0f s'
          % (job_id, len(job['pods']), world, ', '.join('%s %d' % (p['name'], p['slots']) for p in job['pods']),
             time.time() - started), flush=True)
    if detach:
        return 0
    deadline = time.time() + timeout if timeout else None
    while True:
        result = summary(job, job_id, all_status(job, job_id))
        if result['state'] == 'failed':
            bad = next(s for s in result['pods'] if s['pod'] == result['failed_pod'])
            stop_all(job, job_id)
            print('k8s_pod: job %s failed: pod %s %s (exit %s); stopped on the others'
                  % (job_id, bad['pod'], bad.get('state'), bad.get('exit_code')), file=sys.stderr)
            for line in bad.get('tail') or []:
                print('  %s | %s' % (bad['pod'], line), file=sys.stderr)
            return 1
        if result['state'] == 'finished':
            print('k8s_pod: job %s finished on %d pods, world size %d, in %.0f s'
                  % (job_id, len(job['pods']), world, time.time() - started), flush=True)
            return 0
        if deadline and time.time() > deadline:
            stop_all(job, job_id)
            print('k8s_pod: job %s still running after %d s (--timeout); stopped' % (job_id, timeout),
                  file=sys.stderr)
            return 5
        time.sleep(poll)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='mode', required=True)
    sub.add_parser('agent', help="the pod's main process")
    for mode in ('launch', 'status', 'stop'):
        p = sub.add_parser(mode)
        p.add_argument('--job-id', required=True)
        if mode == 'launch':
            p.add_argument('--peer-wait', type=int, default=None, help='seconds to wait for the pods (job.json)')
            p.add_argument('--detach', action='store_true', help='return once every pod started its part')
            p.add_argument('--timeout', type=int, default=0, help='stop the job after this many seconds (0: none)')
        if mode == 'status':
            p.add_argument('--lines', type=int, default=20)
    args = parser.parse_args(argv)
    job = load_job()
    if args.mode == 'agent':
        Agent(job, pod_name()).serve()
        return 0
    if not JOB_ID_RE.match(args.job_id):
        print('k8s_pod: job id %r must be 1-64 letters, digits, ".", "_" or "-"' % args.job_id, file=sys.stderr)
        return 2
    if args.mode == 'launch':
        if ordinal_of(job, pod_name()) != 0:
            print('k8s_pod: launch runs in pod %s (pod 0), not in %s' % (job['pods'][0]['name'], pod_name()),
                  file=sys.stderr)
            return 2
        peer_wait = job['peer_wait'] if args.peer_wait is None else args.peer_wait
        return launch(job, args.job_id, peer_wait, args.detach, args.timeout)
    if args.mode == 'status':
        print(json.dumps(summary(job, args.job_id, all_status(job, args.job_id, args.lines)), sort_keys=True))
        return 0
    print(json.dumps({'job_id': args.job_id, 'pods': stop_all(job, args.job_id)}, sort_keys=True))
    return 0


if __name__ == '__main__':
    sys.exit(main())
