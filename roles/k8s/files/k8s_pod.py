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
import stat
import subprocess
import sys
import tempfile
import threading
import time

# the supervision core, mounted beside this program from the ConfigMap: Python puts a program's own directory
# (its links resolved) first on its path
import supervision

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


# A pod's name resolved once per process: a DNS answer that takes seconds (conntrack races, a busy
# CoreDNS) then costs one lookup, not one per request. A request whose cached address no longer
# answers (the pod came back with another address) resolves the name again and tries once more.
ADDRESSES = {}
ADDRESSES_LOCK = threading.Lock()


def _is_address(host):
    try:
        socket.inet_pton(socket.AF_INET6 if ':' in host else socket.AF_INET, host)
        return True
    except (OSError, ValueError):
        return False


def remember(name, addresses):
    """Keep the first of the addresses a pod's name resolved to (none: nothing kept)."""
    if addresses:
        with ADDRESSES_LOCK:
            ADDRESSES[name] = addresses[0]


def address_of(name, fresh=False):
    """The address to connect to for a pod's name: the one cached, else resolved now (and kept); the name
    itself when it does not resolve (the connection then fails, naming it)."""
    if _is_address(name):
        return name
    with ADDRESSES_LOCK:
        if not fresh and name in ADDRESSES:
            return ADDRESSES[name]
    found = resolve(name)
    remember(name, found)
    return found[0] if found else name


def _exchange(address, port, message, timeout):
    with socket.create_connection((address, port), timeout=timeout) as conn:
        conn.sendall((json.dumps(message) + '\n').encode())
        data = b''
        while not data.endswith(b'\n'):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data.decode() or '{}')


def request(address, port, message, timeout=IO_TIMEOUT):
    """One JSON request, one JSON line back; address is a pod's name (resolved once, see ADDRESSES) or
    an address."""
    target = address_of(address)
    try:
        return _exchange(target, port, message, timeout)
    except socket.timeout:
        raise
    except OSError:
        if _is_address(address):
            raise
        again = address_of(address, fresh=True)
        if again == target:
            raise
        return _exchange(again, port, message, timeout)


# ----- what a pod can do -----------------------------------------------------------------------------
CAP_IPC_LOCK = 14
SETTLE_POLLS = 5        # polls pod 0 gathers the parts' states after the first failure before it names one
UNREACHABLE_POLLS = 10  # polls a pod may not answer (its container starting again) before the job fails
FENCE_SECONDS = 3600    # how long pod 0 keeps asking a pod that did not answer a failed job's stop


def capabilities(status_path='/proc/self/status'):
    """The effective capability set of this process (CapEff of /proc/self/status), 0 when unreadable."""
    try:
        with open(status_path) as handle:
            for line in handle:
                if line.startswith('CapEff:'):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def memlock():
    """(soft, hard) RLIMIT_MEMLOCK in bytes, -1 for unlimited."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, OSError, ValueError):
        return (0, 0)
    inf = getattr(resource, 'RLIM_INFINITY', -1)
    return tuple(-1 if v == inf else v for v in (soft, hard))


def claim_check(path):
    """Whether this process can write the job's volume at path (a file made and removed: os.access is
    not what NFS answers): {writable, path, owner, gid, why}."""
    if not path:
        return {'writable': True, 'path': ''}
    try:
        st = os.stat(path)
    except OSError as exc:
        return {'writable': False, 'path': path, 'owner': '?', 'gid': None, 'why': exc.strerror or str(exc)}
    out = {'writable': True, 'path': path, 'gid': st.st_gid,
           'owner': 'owner %d:%d, mode %04o' % (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))}
    try:
        handle, name = tempfile.mkstemp(prefix='.gpucluster-write-check-', dir=path)
        os.close(handle)
        os.unlink(name)
    except OSError as exc:
        out.update(writable=False, why=exc.strerror or str(exc))
    return out


def claim_verdict(job, pod, hello):
    """'' where the pod's agent can write the job's volume, else why and what to set."""
    claim = hello.get('claim') or {}
    if claim.get('writable', True):
        return ''
    gid = claim.get('gid')
    groups = ','.join(str(g) for g in hello.get('groups') or []) or '-'
    return ('pod %s (uid %s, gid %s, groups %s) cannot write the claim %s at %s (%s: %s); fsGroup %s was not '
            'applied to it (NFS, CephFS and most ReadWriteMany drivers ignore fsGroup): set '
            'security.supplemental_groups: [%s] (the group that owns it) in the cluster file, or have an '
            'administrator make its root writable by uid %s once' % (
                pod, hello.get('uid'), hello.get('gid'), groups, job.get('claim', '?'), claim.get('path'),
                claim.get('owner', '?'), claim.get('why', '?'),
                job.get('fs_group') if job.get('fs_group') is not None else '(none set)',
                gid if gid not in (None, 0) else '<its gid>', hello.get('uid')))


def rdma_verdict(hello):
    """'' when a pod can register (pin) RDMA memory: IPC_LOCK effective or an unlimited memlock limit."""
    cap = int(hello.get('cap_eff', '0'), 16)
    soft = hello.get('memlock', [0, 0])[0]
    if cap & (1 << CAP_IPC_LOCK) or soft == -1:
        return ''
    return ('cannot register RDMA memory: memlock limit %s and IPC_LOCK not effective (CapEff %s); the '
            'runtime did not give the added capability to this uid: ask for an unlimited memlock limit on '
            'the node (containerd/CRI-O default_ulimits) or a runtime that grants ambient capabilities'
            % ('%d KiB' % (soft // 1024), hello.get('cap_eff')))


def describe_exit(status):
    """(exit_code, reason) of a waitpid status; a signal is a negative code as subprocess has it."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = 'signal %d' % sig
        reason = 'killed by %s' % name
        if sig == signal.SIGKILL:
            reason += ' (an out-of-memory kill does this)'
        return -sig, reason
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 255
    if code == 0:
        return 0, 'exit 0'
    reason = 'exit %d' % code
    sig = rank_signal(code)
    if sig:
        reason += ' (a rank was killed by %s%s)' % (sig.name, ': an out-of-memory kill does this'
                                                    if sig == signal.SIGKILL else '')
    return code, reason


def rank_signal(code):
    """The signal that killed a rank, read from its launcher's exit code: 128+N from a shell, 256-N
    from DeepSpeed's launcher (sys.exit of the rank's negative return code); None otherwise."""
    for number in ((code - 128) if 128 < code <= 128 + 64 else None, (256 - code) if 192 < code <= 255 else None):
        if number:
            try:
                return signal.Signals(number)
            except ValueError:
                pass
    return None


def blame(states):
    """The pod whose part is the cause among failed parts, in the supervision core's order
    (supervision.CULPRIT_ORDER): a restarted container first, then a pod that cannot be reached, a rank
    killed by a signal, any other failure, a part stopped by someone (not by this job's own stop); the
    earliest ended among equals. Returns (pod, reason) or None."""
    entries = []
    for st in states:
        state, reason = st.get('state'), st.get('reason') or ''
        if state == 'absent':
            reason = 'has no part of the job (its container started again without its state?)'
        elif state == 'unreachable':
            reason = 'unreachable (%s)' % st.get('error', '')
        elif state == 'failed':
            reason = reason or 'exit %s' % st.get('exit_code')
        elif state == 'stopped' and not reason.startswith('stopped: pod '):
            reason = reason or 'stopped'
        else:
            continue
        kind = 'stopped' if state == 'stopped' else supervision.failure_kind(dict(st, reason=reason))
        entries.append({'node': st['pod'], 'kind': kind, 'ended': st.get('ended') or 0, 'why': reason})
    ordered = supervision.order_culprits(entries)
    return (ordered[0]['node'], ordered[0]['why']) if ordered else None


def job_event(root, job_id, kind, **fields):
    """One event in <state dir>/<job id>/events.jsonl, in the supervision core's vocabulary (nodes are
    the pods)."""
    path = os.path.join(root, job_id)
    os.makedirs(path, mode=0o2770, exist_ok=True)
    return supervision.append_event(path, kind, **fields)


def read_job_events(root, job_id):
    return supervision.read_events(os.path.join(root, job_id, supervision.EVENTS)) or []


def subreaper():
    """Adopt orphaned grandchildren (ranks whose launcher died) so they are reaped here, as PID 1 would."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


# ----- the agent ------------------------------------------------------------------------------------
class Agent:
    """This pod's agent: starts, reports and stops its part of a job; pod 0's also supervises the job."""

    def __init__(self, job, name, out=None):
        self.job = job
        self.name = name
        self.ordinal = ordinal_of(job, name)
        self.jobs = {}          # job_id -> record (persisted under the state directory)
        self.lock = threading.RLock()
        self.out = out or sys.stdout
        self.supervisors = {}
        self.boot = '%d-%d' % (os.getpid(), int(time.time() * 1000))  # this container's agent, not a previous one
        self.pod0 = set()       # pod 0's addresses as last resolved (allowed)

    # -- state on the shared (or per-pod) volume: a restarted container knows what it was running
    def state_root(self):
        return os.environ.get('GPUCLUSTER_JOB_DIR') or self.job.get('state_dir') or STATE_ROOT

    def _job_dir(self, job_id):
        path = os.path.join(self.state_root(), job_id)
        os.makedirs(path, mode=0o2770, exist_ok=True)
        return path

    def _save(self, job_id):
        rec = {k: v for k, v in self.jobs[job_id].items() if k != 'proc'}
        path = os.path.join(self._job_dir(job_id), '%s.json' % self.name)
        tmp = '%s.tmp' % path
        with open(tmp, 'w') as handle:
            json.dump(rec, handle, sort_keys=True)
        os.replace(tmp, path)

    def say(self, text):
        """A line on PID 1's stdout: what kubectl logs shows."""
        try:
            print('k8s_pod: %s' % text, file=self.out, flush=True)
        except (OSError, ValueError):
            pass

    def job_ids(self):
        """The job ids of the state directory (sorted; a name that is no job id is skipped)."""
        try:
            names = sorted(os.listdir(self.state_root()))
        except OSError:
            return []
        return [name for name in names if JOB_ID_RE.match(name)]

    def recover(self):
        """At start: a part this pod ran when its container ended is failed, reason restarted."""
        root = self.state_root()
        for job_id in self.job_ids():
            path = os.path.join(root, job_id, '%s.json' % self.name)
            try:
                with open(path) as handle:
                    rec = json.load(handle)
            except (OSError, ValueError):
                continue
            if rec.get('state') == 'running':
                rec.update(state='failed', exit_code=None, ended=time.time(),
                           reason='restarted: the container ended while its part ran (OOMKilled, evicted or '
                                  'killed; kubectl describe pod %s)' % self.name)
                self.say('job %s: %s' % (job_id, rec['reason']))
            self.jobs[job_id] = rec
            self._save(job_id)

    # -- processes
    def command(self, job_id, node_rank, attempt=0):
        job = self.job
        master = job['pods'][0]['address']
        extra = list(job.get('resume_args') or []) if attempt else []
        return [job['deepspeed'], '--no_ssh', '--hostfile', os.path.join(job['config_dir'], 'hostfile'),
                '--node_rank', str(node_rank), '--master_addr', master,
                '--master_port', str(job['master_port'])] + list(job['command']) + extra

    def running(self):
        return [j for j, rec in self.jobs.items() if rec.get('state') == 'running']

    def start(self, job_id, node_rank, attempt=0):
        with self.lock:
            # the ConfigMap as it is now: a changed command or hostfile reaches running pods (kubelet
            # refreshes mounted ConfigMaps) without a restart
            self.job = load_job(self.job['config_dir'])
            current = self.jobs.get(job_id)
            if current and current.get('state') == 'running' and current.get('attempt', 0) == attempt:
                return {'ok': True, 'state': 'running', 'pid': current['pid'], 'already': True}
            if current and current.get('state') == 'running' and current.get('attempt', 0) < attempt:
                # an older attempt's part still runs here (this pod did not answer its stop): fenced first
                self.stop(job_id, reason='stopped: attempt %d of the job starts' % attempt)
            running = self.running()
            if running:
                return {'ok': False, 'error': 'job %s is still running on %s' % (running[0], self.name)}
            log = os.path.join(self._job_dir(job_id), '%s.log' % self.name)
            # GPUCLUSTER_ATTEMPT counts from 1 as on the SSH path (the examples fence attempts by it:
            # a rank of an older attempt never writes a checkpoint); GPUCLUSTER_JOB_ATTEMPT counts restarts
            env = dict(os.environ, **{JOB_ENV: job_id, 'GPUCLUSTER_JOB_ATTEMPT': str(attempt),
                                      'GPUCLUSTER_ATTEMPT': str(attempt + 1)})
            workdir = self.job['workdir'] if os.path.isdir(self.job['workdir']) else '/tmp'
            proc = subprocess.Popen(self.command(job_id, node_rank, attempt), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=workdir, env=env,
                                    start_new_session=True)
            CHILDREN[proc.pid] = (self, job_id, proc)
            self.jobs[job_id] = {'state': 'running', 'pid': proc.pid, 'log': log, 'started': time.time(),
                                 'node_rank': node_rank, 'attempt': attempt, 'exit_code': None, 'reason': '',
                                 'boot': self.boot}
            self._save(job_id)
            threading.Thread(target=self._copy_output, args=(job_id, proc, log), daemon=True).start()
            self.say('job %s: part %d started (attempt %d, pid %d)' % (job_id, node_rank, attempt, proc.pid))
            return {'ok': True, 'state': 'running', 'pid': proc.pid}

    def _copy_output(self, job_id, proc, log):
        """The part's output to its log on the volume and to PID 1's stdout (kubectl logs)."""
        prefix = '[%s %s] ' % (job_id, self.name)
        with open(log, 'ab') as out:
            for line in iter(proc.stdout.readline, b''):
                out.write(line)
                out.flush()
                try:
                    self.out.write(prefix + line.decode('utf-8', 'replace'))
                    self.out.flush()
                except (OSError, ValueError):
                    pass
        proc.stdout.close()

    def reap(self):
        reap_children()

    def ended(self, job_id, pid, status):
        """A part's launcher ended: its state and reason; what is left of its process group is killed."""
        code, reason = describe_exit(status)
        with self.lock:
            rec = self.jobs.get(job_id)
            if rec is None or rec.get('pid') != pid:
                return
            self._kill_group(pid)
            if rec.get('state') == 'running':
                rec.update(state='finished' if code == 0 else 'failed', exit_code=code, reason=reason,
                           ended=time.time())
            else:
                rec.update(exit_code=code, ended=time.time())
            self._save(job_id)
            self.say('job %s: part %d %s (%s)' % (job_id, rec.get('node_rank', -1), rec['state'], reason))

    def _kill_group(self, pgid, sig=signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def reaper(self, period=0.2):
        while True:
            self.reap()
            time.sleep(period)

    def status(self, job_id, lines=20):
        self.reap()
        rec = self.jobs.get(job_id)
        if rec is None:
            return {'ok': True, 'pod': self.name, 'state': 'absent'}
        return {'ok': True, 'pod': self.name, 'state': rec['state'], 'exit_code': rec.get('exit_code'),
                'reason': rec.get('reason', ''), 'pid': rec.get('pid'), 'attempt': rec.get('attempt', 0),
                'ended': rec.get('ended'), 'tail': tail(rec.get('log', ''), lines)}

    def stop(self, job_id, grace=10.0, reason='stopped'):
        """SIGTERM to the job's process group, SIGKILL after grace; returns once nothing of it runs."""
        with self.lock:
            rec = self.jobs.get(job_id)
            if rec is None:
                return {'ok': True, 'pod': self.name, 'state': 'absent'}
            if rec.get('state') == 'running':
                rec.update(state='stopped', reason=reason)
                self._save(job_id)
        pgid = rec.get('pid')
        if rec.get('boot') != self.boot or not pgid:
            # started by a previous container of this pod: its processes died with it; the pid may now
            # be another process's, so nothing is signalled
            return {'ok': True, 'pod': self.name, 'state': rec['state'], 'exit_code': rec.get('exit_code'),
                    'reason': rec.get('reason', '')}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            self._kill_group(pgid, sig)
            deadline = time.time() + (grace if sig == signal.SIGTERM else 5.0)
            while time.time() < deadline and group_alive(pgid):
                self.reap()
                time.sleep(0.1)
            if not group_alive(pgid):
                break
        self.reap()
        return {'ok': True, 'pod': self.name, 'state': rec['state'], 'exit_code': rec.get('exit_code'),
                'reason': rec.get('reason', '')}

    def hello(self):
        soft, hard = memlock()
        return {'ok': True, 'pod': self.name, 'ordinal': self.ordinal,
                'slots': self.job['pods'][self.ordinal]['slots'], 'running': self.running(),
                'uid': os.getuid(), 'gid': os.getgid(), 'groups': sorted(os.getgroups()),
                'memlock': [soft, hard], 'cap_eff': '%016x' % capabilities(),
                'home_writable': os.access(os.environ.get('HOME', '/'), os.W_OK),
                'claim': claim_check(self.job.get('mount_path', ''))}

    # -- pod 0: the job as a whole (JobSet's failure policy and maxRestarts)
    def supervise(self, job_id, attempt=0, poll=1.0):
        if self.ordinal != 0:
            return {'ok': False, 'error': 'only pod 0 supervises a job'}
        with self.lock:
            current = self.supervisors.get(job_id)
            if current and current.is_alive():
                return {'ok': True, 'supervising': job_id, 'already': True}
            record = read_job_record(self.state_root(), job_id) or {}
            record.update(job_id=job_id, state='running', attempt=attempt,
                          restarts=int(self.job.get('restarts', 0)), updated=time.time())
            record.setdefault('history', [])
            record.setdefault('restarts_used', 0)
            write_job_record(self.state_root(), job_id, record)
            job_event(self.state_root(), job_id, 'supervising', attempt=attempt,
                      nodes=[p['name'] for p in self.job['pods']], restarts=record['restarts'])
            thread = threading.Thread(target=self._supervise, args=(job_id, poll), daemon=True)
            self.supervisors[job_id] = thread
            thread.start()
        return {'ok': True, 'supervising': job_id}

    def resume_supervision(self):
        """pod 0 restarted: the jobs it supervised go on being supervised (their parts here failed)."""
        if self.ordinal != 0:
            return
        root = self.state_root()
        for job_id in self.job_ids():
            record = read_job_record(root, job_id)
            if record and record.get('state') == 'running':
                thread = threading.Thread(target=self._supervise, args=(job_id, 1.0), daemon=True)
                self.supervisors[job_id] = thread
                thread.start()

    def _supervise(self, job_id, poll, settle=SETTLE_POLLS, unreachable_polls=UNREACHABLE_POLLS):
        root = self.state_root()
        misses = {}
        while True:
            time.sleep(poll)
            record = read_job_record(root, job_id) or {}
            if record.get('state') != 'running':
                return
            states = all_status(self.job, job_id, lines=5)
            for st in states:
                misses[st['pod']] = misses.get(st['pod'], 0) + 1 if st.get('state') == 'unreachable' else 0
            trouble = [st for st in states if st.get('state') in ('failed', 'absent', 'stopped')
                       or misses.get(st['pod'], 0) >= unreachable_polls]
            if not trouble:
                if states and all(st.get('state') == 'finished' for st in states):
                    record.update(state='finished', updated=time.time())
                    write_job_record(root, job_id, record)
                    job_event(root, job_id, 'done', attempt=record.get('attempt', 0), why='the job finished')
                    self.say('job %s finished (attempt %d)' % (job_id, record.get('attempt', 0)))
                    return
                continue
            # the other pods' ranks fail too once a peer is gone: gather for a few polls, then blame
            # the cause (a restarted container, an unreachable pod, a killed rank) rather than the
            # first collateral exit
            seen = {st['pod']: st for st in states}
            for _ in range(settle):
                if all(st.get('state') in ('failed', 'absent', 'stopped', 'finished') for st in seen.values()):
                    break
                time.sleep(poll)
                for st in all_status(self.job, job_id, lines=5):
                    if st.get('state') != 'unreachable' or seen[st['pod']].get('state') in ('running', 'unreachable'):
                        seen[st['pod']] = st
            bad = blame(list(seen.values())) or blame(trouble)
            if bad is None:
                continue
            pod, reason = bad
            if record.get('state') == 'stopped':
                return
            culprit = seen.get(pod) or next((st for st in trouble if st['pod'] == pod), {'pod': pod})
            kind = supervision.failure_kind(dict(culprit, reason=reason))
            attempt = record.get('attempt', 0)
            job_event(root, job_id, 'fault', attempt=attempt, seen=kind, nodes=[pod], why='pod %s %s' % (pod, reason),
                      exit_code=culprit.get('exit_code'))
            self.say('job %s: pod %s %s; stopping the job on every pod' % (job_id, pod, reason))
            unanswered = [r['pod'] for r in stop_all(self.job, job_id, reason='stopped: pod %s %s' % (pod, reason))
                          if r.get('state') == 'unreachable']
            job_event(root, job_id, 'job_stopped', attempt=attempt, nodes=[p['name'] for p in self.job['pods']],
                      why='stopped on every pod after pod %s %s' % (pod, reason),
                      **({'unanswered': unanswered} if unanswered else {}))
            record = read_job_record(root, job_id) or record
            if record.get('state') != 'running':
                job_event(root, job_id, 'stopped', attempt=attempt, why='stopped by the user meanwhile')
                return  # stopped by the user meanwhile
            record['history'].append({'attempt': attempt, 'failed_pod': pod, 'reason': reason, 'kind': kind,
                                      'at': time.time()})
            used = int(record.get('restarts_used', 0))
            decision = supervision.restart_decision(used, int(record.get('restarts', 0)), 'train.restarts',
                                                    self.job.get('failure_policy'), kind, culprit.get('exit_code'))
            why = decision['why'] if decision['action'] == 'give_up' else ''
            if not why:
                attempt += 1
                used += 1 if decision['counted'] else 0
                record.update(attempt=attempt, restarts_used=used, updated=time.time())
                write_job_record(root, job_id, record)
                self.say('job %s: %s, attempt %d, after pod %s %s' % (job_id, decision['why'], attempt, pod, reason))
                # a pod that did not answer may be on a lost node: the StatefulSet makes it again only once
                # the pod is deleted, so the restart waits for it train.lost_pod_wait, not peer_wait
                bound = int(self.job.get('lost_pod_wait', 120) if kind == 'unreachable' else self.job.get('peer_wait', 300))
                why_peers, _ = wait_for_peers(self.job, bound)
                problem = start_all(self.job, job_id, attempt) if not why_peers else \
                    'pod %s: %s after %d s' % (sorted(why_peers)[0], why_peers[sorted(why_peers)[0]], bound)
                if not problem:
                    job_event(root, job_id, 'restart', attempt=attempt, nodes=[p['name'] for p in self.job['pods']],
                              left_out=[], why='pod %s %s' % (pod, reason), counted=decision['counted'],
                              restarts_used=used)
                    misses = {}
                    continue
                failed_pod = problem.split(': ', 1)[0].replace('pod ', '')
                lost = kind == 'unreachable' and failed_pod == pod
                reason = 'restart failed: %s%s' % (problem, (
                    '; pod %s is lost (its node may be down): the StatefulSet makes it again only once the pod '
                    'is deleted (kubectl delete pod %s --force, once its node is known down)' % (pod, pod))
                    if lost else '')
                pod = failed_pod
                job_event(root, job_id, 'restart_failed', attempt=attempt, nodes=[pod], why=reason)
                stop_all(self.job, job_id, reason='stopped: restart failed')
                why = reason
            record.update(state='failed', failed_pod=pod, reason=reason, updated=time.time())
            write_job_record(root, job_id, record)
            job_event(root, job_id, 'gave_up', attempt=attempt, nodes=[pod], why=why)
            self.say('job %s failed: pod %s %s (attempt %d); nothing of it runs' % (job_id, pod, reason, attempt))
            if unanswered:
                self.fence(job_id, unanswered, attempt)
            return

    def fence(self, job_id, pods, attempt, period=5.0, seconds=FENCE_SECONDS):
        """The pods that did not answer the job's stop (lost with their node, or frozen) are asked again
        every period seconds, for at most seconds: a pod that comes back stops its part at once, so ranks
        of a failed job never run on beside the next one (event fenced, in the SSH supervisor's words)."""
        def loop():
            left, deadline = list(pods), time.time() + seconds
            while left and time.time() < deadline:
                time.sleep(period)
                for pod in list(left):
                    address = next(p['address'] for p in self.job['pods'] if p['name'] == pod)
                    try:
                        reply = request(address, int(self.job['agent_port']),
                                        {'op': 'stop', 'job_id': job_id, 'reason': 'stopped: fenced (the job failed)'},
                                        timeout=30.0)
                    except (OSError, ValueError):
                        continue
                    left.remove(pod)
                    job_event(self.state_root(), job_id, 'fenced', attempt=attempt, nodes=[pod],
                              state=reply.get('state'), exit_code=reply.get('exit_code'))
                    self.say('job %s: pod %s answers again; its part is stopped (%s)' % (job_id, pod, reply.get('state')))
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    def allowed(self, peer):
        """Only pod 0 (or this pod itself) may start or stop a job here. Pod 0's addresses are those last
        resolved (watch_pod0 keeps them fresh in the background): a peer that is not among them has the name
        resolved again before it is refused, so a slow DNS answer delays no request from pod 0."""
        if peer in ('127.0.0.1', '::1') or peer in self.pod0:
            return True
        self.pod0 = set(resolve(self.job['pods'][0]['address']))
        return peer in self.pod0

    def watch_pod0(self, period=30.0):
        """Resolve pod 0's name every period seconds, so that allowed() rarely has to."""
        while True:
            found = resolve(self.job['pods'][0]['address'])
            if found:
                self.pod0 = set(found)
            time.sleep(period)

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
                reply = self.hello()
            elif op in ('start', 'status', 'stop', 'supervise') and not JOB_ID_RE.match(job_id):
                reply = {'ok': False, 'error': 'bad job id %r' % job_id}
            elif op == 'status':
                reply = self.status(job_id, int(msg.get('lines', 20)))
            elif op in ('start', 'stop', 'supervise') and not self.allowed(peer[0]):
                reply = {'ok': False, 'error': '%s refuses %s from %s: only pod 0 starts and stops jobs'
                         % (self.name, op, peer[0])}
            elif op == 'start':
                reply = self.start(job_id, int(msg.get('node_rank', self.ordinal)), int(msg.get('attempt', 0)))
            elif op == 'stop':
                reply = self.stop(job_id, reason=str(msg.get('reason') or 'stopped'))
            elif op == 'supervise':
                reply = self.supervise(job_id, int(msg.get('attempt', 0)))
            else:
                reply = {'ok': False, 'error': 'unknown request %r' % op}
            conn.sendall((json.dumps(reply) + '\n').encode())
        except OSError:
            pass
        finally:
            conn.close()

    def serve(self):
        port = int(self.job['agent_port'])
        subreaper()
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
        hello = self.hello()
        self.say('%s (ordinal %d, %d slot(s)) agent on port %d: uid %d gid %d groups %s, memlock %s, CapEff %s, '
                 'HOME %s%s' % (self.name, self.ordinal, hello['slots'], port, hello['uid'], hello['gid'],
                                ','.join(str(g) for g in hello['groups']) or '-',
                                'unlimited' if hello['memlock'][0] == -1 else '%d KiB' % (hello['memlock'][0] // 1024),
                                hello['cap_eff'], os.environ.get('HOME', '-'),
                                '' if hello['home_writable'] else ' (not writable)'))
        self.recover()
        threading.Thread(target=self.reaper, daemon=True).start()
        threading.Thread(target=self.watch_pod0, daemon=True).start()
        self.resume_supervision()

        def shutdown(signum, frame):
            for job_id in self.running():
                self.stop(job_id, grace=5.0, reason='stopped: the container was asked to stop (SIGTERM)')
            sys.exit(0)
        signal.signal(signal.SIGTERM, shutdown)
        signal.signal(signal.SIGINT, shutdown)
        while True:
            conn, peer = sock.accept()
            peer = (peer[0].replace('::ffff:', ''),) + tuple(peer[1:])
            threading.Thread(target=self.handle, args=(conn, peer), daemon=True).start()


CHILDREN = {}   # pid -> (agent, job_id, Popen): every part's launcher of this process, reaped only here
REAP_LOCK = threading.Lock()


def reap_children():
    """Reap every child (and adopted orphan: PID 1's duty); a part's launcher goes to its agent."""
    while True:
        with REAP_LOCK:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            entry = CHILDREN.pop(pid, None)
        if entry is not None:
            agent, job_id, proc = entry
            proc.returncode = describe_exit(status)[0]
            agent.ended(job_id, pid, status)


def group_alive(pgid):
    """Whether a process group still has a process (a zombie not yet reaped counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_job_record(root, job_id):
    try:
        with open(os.path.join(root, job_id, 'job.json')) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_job_record(root, job_id, record):
    path = os.path.join(root, job_id)
    os.makedirs(path, mode=0o2770, exist_ok=True)
    tmp = os.path.join(path, 'job.json.tmp')
    with open(tmp, 'w') as handle:
        json.dump(record, handle, sort_keys=True)
    os.replace(tmp, os.path.join(path, 'job.json'))


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
    """({}, hellos) when every pod resolves and its agent answers as itself; else ({pod: why}, hellos)
    at the bound. hellos: {pod: its hello reply} of the pods that answered."""
    port = int(job['agent_port'])
    deadline = clock() + seconds
    while True:
        why, hellos = {}, {}
        for pod in job['pods']:
            addresses = resolve(pod['address'])
            if not addresses:
                why[pod['name']] = '%s does not resolve' % pod['address']
                continue
            remember(pod['address'], addresses)
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
            else:
                hellos[pod['name']] = reply
        if not why or clock() >= deadline:
            return why, hellos
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
    if record and record.get('state') == 'failed':
        state, failed_pod, reason = 'failed', record.get('failed_pod'), record.get('reason', '')
    elif record and record.get('state') == 'running' and (failed or any(s.get('state') == 'stopped' for s in states)):
        state = 'restarting' if record.get('restarts_used', record.get('attempt', 0)) < record.get('restarts', 0) else 'failing'
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
           'unreachable': unreachable, 'world_size': sum(p['slots'] for p in job['pods']), 'pods': states}
    if record:
        out.update(attempt=record.get('attempt', 0), restarts=record.get('restarts', 0),
                   restarts_used=record.get('restarts_used', record.get('attempt', 0)),
                   history=record.get('history', []))
    return out


def stop_all(job, job_id, reason='stopped'):
    port = int(job['agent_port'])
    out = []
    for pod in job['pods']:
        try:
            out.append(request(pod['address'], port, {'op': 'stop', 'job_id': job_id, 'reason': reason}, timeout=30.0))
        except (OSError, ValueError) as exc:
            out.append({'pod': pod['name'], 'state': 'unreachable', 'error': str(exc)})
    return out


def start_all(job, job_id, attempt=0):
    """Start every pod's part; '' or 'pod <name>: <why>' after stopping the parts already started."""
    port = int(job['agent_port'])
    for rank, pod in enumerate(job['pods']):
        try:
            reply = request(pod['address'], port, {'op': 'start', 'job_id': job_id, 'node_rank': rank,
                                                   'attempt': attempt})
        except (OSError, ValueError) as exc:
            reply = {'ok': False, 'error': str(exc)}
        if not reply.get('ok'):
            stop_all(job, job_id, reason='stopped: pod %s did not start its part' % pod['name'])
            return 'pod %s: %s' % (pod['name'], reply.get('error'))
    return ''


def launch(job, job_id, peer_wait, detach, timeout, poll=2.0):
    world = sum(p['slots'] for p in job['pods'])
    started = time.time()
    why, hellos = wait_for_peers(job, peer_wait)
    if why:
        first = next(p['name'] for p in job['pods'] if p['name'] in why)
        others = '' if len(why) == 1 else ' (%d pods not ready: %s)' % (len(why), ', '.join(sorted(why)))
        print('k8s_pod: job %s not started: pod %s: %s after %d s%s; nothing was started'
              % (job_id, first, why[first], peer_wait, others), file=sys.stderr, flush=True)
        return 3
    if job.get('network_mode') == 'rdma':
        for pod in job['pods']:
            verdict = rdma_verdict(hellos.get(pod['name'], {}))
            if verdict:
                print('k8s_pod: job %s not started: pod %s %s; nothing was started' % (job_id, pod['name'], verdict),
                      file=sys.stderr, flush=True)
                return 6
    for pod in job['pods']:
        verdict = claim_verdict(job, pod['name'], hellos.get(pod['name'], {}))
        if verdict:
            print('k8s_pod: job %s not started: %s; nothing was started' % (job_id, verdict), file=sys.stderr, flush=True)
            return 7
    problem = start_all(job, job_id)
    if problem:
        print('k8s_pod: job %s not started: %s; stopped on the others' % (job_id, problem), file=sys.stderr, flush=True)
        return 4
    port = int(job['agent_port'])
    try:
        sup = request(job['pods'][0]['address'], port, {'op': 'supervise', 'job_id': job_id})
    except (OSError, ValueError) as exc:
        sup = {'ok': False, 'error': str(exc)}
    if not sup.get('ok'):
        stop_all(job, job_id, reason='stopped: pod 0 could not supervise it')
        print('k8s_pod: job %s not started: pod %s does not supervise it: %s; stopped'
              % (job_id, job['pods'][0]['name'], sup.get('error')), file=sys.stderr, flush=True)
        return 4
    print('k8s_pod: job %s started on %d pods, world size %d (%s) after %.0f s'
          % (job_id, len(job['pods']), world, ', '.join('%s %d' % (p['name'], p['slots']) for p in job['pods']),
             time.time() - started), flush=True)
    if detach:
        return 0
    deadline = time.time() + timeout if timeout else None
    root = state_root(job)
    while True:
        time.sleep(poll)
        record = read_job_record(root, job_id) or {}
        if record.get('state') == 'failed':
            states = all_status(job, job_id)
            bad = next((st for st in states if st['pod'] == record.get('failed_pod')), {})
            print('k8s_pod: job %s failed: pod %s %s (attempt %d of %d); stopped on every pod'
                  % (job_id, record.get('failed_pod'), record.get('reason'), record.get('attempt', 0),
                     1 + record.get('restarts', 0)), file=sys.stderr, flush=True)
            for line in bad.get('tail') or []:
                print('  %s | %s' % (bad['pod'], line), file=sys.stderr)
            return 1
        if record.get('state') == 'finished':
            print('k8s_pod: job %s finished on %d pods, world size %d, in %.0f s%s'
                  % (job_id, len(job['pods']), world, time.time() - started,
                     ' after %d restart(s)' % record['attempt'] if record.get('attempt') else ''), flush=True)
            return 0
        if record.get('state') == 'stopped':
            print('k8s_pod: job %s was stopped' % job_id, file=sys.stderr, flush=True)
            return 1
        if deadline and time.time() > deadline:
            stop_job(job, job_id, 'stopped: still running after --timeout %d s' % timeout)
            print('k8s_pod: job %s still running after %d s (--timeout); stopped' % (job_id, timeout),
                  file=sys.stderr)
            return 5


def state_root(job):
    return os.environ.get('GPUCLUSTER_JOB_DIR') or job.get('state_dir') or STATE_ROOT


def stop_job(job, job_id, reason='stopped'):
    """Stop a job for good: the record first (no restart), then every pod's part."""
    root = state_root(job)
    record = read_job_record(root, job_id)
    if record and record.get('state') == 'running':
        record.update(state='stopped', reason=reason, updated=time.time())
        write_job_record(root, job_id, record)
    return stop_all(job, job_id, reason=reason)


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
        record = read_job_record(state_root(job), args.job_id)
        print(json.dumps(summary(job, args.job_id, all_status(job, args.job_id, args.lines), record), sort_keys=True))
        return 0
    print(json.dumps({'job_id': args.job_id, 'pods': stop_job(job, args.job_id)}, sort_keys=True))
    return 0


if __name__ == '__main__':
    sys.exit(main())
