#!/usr/bin/env python3
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The pod entrypoint of a gpucluster.multinode training StatefulSet (mounted from its ConfigMap).

Every pod runs ``k8s_pod.py agent``: a small agent on the agent port (the readiness probe's port)
that answers its peers and starts, reports and stops this pod's part of a job. A job is
``deepspeed --no_ssh --node_rank <ordinal>`` with the hostfile of the ConfigMap: each pod starts its
own ranks, no SSH, no root, any uid (OpenShift's restricted-v2 runs it as a random one).

In pod 0, ``k8s_pod.py launch --job-id ID`` waits (bounded by --peer-wait) until every pod of the job
answers as itself: at the name the headless Service publishes, or, before that name exists (a Service
publishes a pod seconds after it starts, and a resolver caches the answer that it did not exist), at
the address the pod registered on the shared volume; a pod that never does is named in one line and
nothing is started anywhere. A pod takes a start or a stop only from pod 0, which it knows by its
published address or, before that, by asking the caller's own agent who it is. Then it starts every
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
LOST_IO_TIMEOUT = 5.0   # a request to a pod that has not answered for a while: it is not waited on longer
REGISTRY = '.pods'      # <state dir>/.pods/<pod>.json: each agent's own address (the downward API's podIP)


def load_job(config_dir=CONFIG_DIR):
    with open(os.path.join(config_dir, 'job.json')) as handle:
        return json.load(handle)


def pod_name():
    return os.environ.get('GPUCLUSTER_POD_NAME') or socket.gethostname().split('.')[0]


def pod_ip():
    """This pod's address (the downward API's status.podIP), '' where it is not set."""
    return os.environ.get('GPUCLUSTER_POD_IP', '')


def node_name():
    """The node this pod runs on (the downward API's spec.nodeName), '' where it is not set."""
    return os.environ.get('GPUCLUSTER_NODE_NAME', '')


def replace_file(path, text):
    """Write text to path whole or not at all (a reader never sees half of it): a temporary file beside it,
    then renamed over it."""
    tmp = '%s.tmp' % path
    with open(tmp, 'w') as handle:
        handle.write(text)
    os.replace(tmp, path)


def register(root, name, address, node, boot):
    """Write where this pod's agent answers (best effort: a volume it cannot write is named by the launch)."""
    if not address:
        return False
    path = os.path.join(root, REGISTRY)
    try:
        os.makedirs(path, mode=0o2770, exist_ok=True)
        replace_file(os.path.join(path, '%s.json' % name),
                     json.dumps({'pod': name, 'address': address, 'node': node, 'boot': boot, 'time': time.time()}))
        return True
    except OSError:
        return False


def registered(root, name):
    """The address a pod registered ('' when none)."""
    try:
        with open(os.path.join(root, REGISTRY, '%s.json' % name)) as handle:
            entry = json.load(handle)
    except (OSError, ValueError):
        return ''
    address = str(entry.get('address') or '') if isinstance(entry, dict) else ''
    return address if _is_address(address) else ''


def each(items, call):
    """call(item) for every item at once, the results in order: a pod that does not answer costs its own
    timeout, not every other pod's too. call handles its own errors."""
    results = [None] * len(items)

    def run(index, item):
        results[index] = call(item)
    threads = [threading.Thread(target=run, args=(i, item), daemon=True) for i, item in enumerate(items)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def working_pods(job):
    """The pods a job starts on: all but the last train.spares (they wait to take a lost pod's place)."""
    pods = list(job['pods'])
    return pods[:len(pods) - int(job.get('spares') or 0)]


def layout_of(job, record):
    """The pods of the job's current attempt ({name, address, slots}, rank order): the record's, else the
    working pods."""
    by_name = {p['name']: p for p in job['pods']}
    out = []
    for entry in (record or {}).get('layout') or []:
        pod = by_name.get(entry.get('name'))
        if pod:
            out.append(dict(pod, slots=int(entry.get('slots', pod['slots']))))
    return out or working_pods(job)


def launcher_line(job, node_rank, attempt=0, hostfile=None, master=None):
    """deepspeed --no_ssh for one pod's part: its node rank in the hostfile (default: the ConfigMap's), the
    ranks' master (default: pod 0's name), train.resume_args added from the second attempt on."""
    extra = list(job.get('resume_args') or []) if attempt else []
    return [job['deepspeed'], '--no_ssh', '--hostfile', hostfile or os.path.join(job['config_dir'], 'hostfile'),
            '--node_rank', str(node_rank), '--master_addr', master or job['pods'][0]['address'],
            '--master_port', str(job['master_port'])] + list(job['command']) + extra


def run_part(job, environ=None, clock=time.time, sleep=time.sleep, execute=os.execvpe):
    """A JobSet pod's whole life (k8s_pod.py run): its rank is its completion index; rank 0 is the master at its
    own address, the others wait (bounded by train.peer_wait) for pod 0's name to resolve, then the launcher
    replaces this process: its exit code is the pod's, which the Job's podFailurePolicy and the JobSet's
    failurePolicy read. Returns an exit code only when it cannot start (3: pod 0 never resolved, 2: no rank)."""
    environ = os.environ if environ is None else environ
    try:
        rank = int(environ.get('GPUCLUSTER_NODE_RANK', ''))
        attempt = int(environ.get('GPUCLUSTER_JOB_ATTEMPT') or 0)
    except ValueError:
        print('k8s_pod: run needs GPUCLUSTER_NODE_RANK (the Job completion index) and GPUCLUSTER_JOB_ATTEMPT, '
              'got %r and %r' % (environ.get('GPUCLUSTER_NODE_RANK'), environ.get('GPUCLUSTER_JOB_ATTEMPT')),
              file=sys.stderr, flush=True)
        return 2
    master = environ.get('GPUCLUSTER_POD_IP', '') if rank == 0 else ''
    name, bound = job['pods'][0]['address'], int(job.get('peer_wait', 300))
    deadline = clock() + bound
    while not master:
        found = resolve(name)
        if found:
            master = found[0]
        elif clock() >= deadline:
            print('k8s_pod: rank %d not started: %s (pod 0) does not resolve after %d s (train.peer_wait)'
                  % (rank, name, bound), file=sys.stderr, flush=True)
            return 3
        else:
            sleep(1.0)
    env = dict(environ, **{JOB_ENV: job['name'], 'GPUCLUSTER_JOB_ATTEMPT': str(attempt),
                           'GPUCLUSTER_ATTEMPT': str(attempt + 1)})
    line = launcher_line(job, rank, attempt, master=master)
    print('k8s_pod: rank %d of %s, attempt %d: %s' % (rank, job['name'], attempt + 1, ' '.join(line)), flush=True)
    if os.path.isdir(job['workdir']):
        os.chdir(job['workdir'])
    return execute(line[0], line, env)


def hostfile_lines(layout):
    return ''.join('%s slots=%d\n' % (p['address'], p['slots']) for p in layout)


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
# Where the pods registered their addresses (the job's state directory; main() sets it): a name the Service has
# not published yet is reached at its pod's registered address. A reply from another pod there is not taken.
REGISTRY_ROOT = None


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
    if not found and REGISTRY_ROOT:
        found = [a for a in [registered(REGISTRY_ROOT, name.split('.')[0])] if a]
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
        replace_file(os.path.join(self._job_dir(job_id), '%s.json' % self.name), json.dumps(rec, sort_keys=True))

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
    def command(self, job_id, node_rank, attempt=0, hostfile=None, master=None):
        """The part's launcher line: the attempt's hostfile (its pods, rank order) and pod 0's address as the
        ranks' master (an address: no rank waits for a name to be published)."""
        return launcher_line(self.job, node_rank, attempt, hostfile, master)

    def running(self):
        return [j for j, rec in self.jobs.items() if rec.get('state') == 'running']

    def start(self, job_id, node_rank, attempt=0, hosts=None, master=None):
        """Start this pod's part: hosts, the attempt's [[address, slots], ...] (rank order; none: the
        ConfigMap's hostfile), master, rank 0's address."""
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
            hostfile = None
            if hosts:
                hostfile = os.path.join(self._job_dir(job_id), '%s.hostfile' % self.name)
                replace_file(hostfile, hostfile_lines([{'address': str(a), 'slots': int(n)} for a, n in hosts]))
            # GPUCLUSTER_ATTEMPT counts from 1 as on the SSH path (the examples fence attempts by it:
            # a rank of an older attempt never writes a checkpoint); GPUCLUSTER_JOB_ATTEMPT counts restarts
            env = dict(os.environ, **{JOB_ENV: job_id, 'GPUCLUSTER_JOB_ATTEMPT': str(attempt),
                                      'GPUCLUSTER_ATTEMPT': str(attempt + 1)})
            workdir = self.job['workdir'] if os.path.isdir(self.job['workdir']) else '/tmp'
            proc = subprocess.Popen(self.command(job_id, node_rank, attempt, hostfile=hostfile, master=master),
                                    stdin=subprocess.DEVNULL,
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

    def stop(self, job_id, grace=10.0, reason='stopped', before_attempt=None):
        """SIGTERM to the job's process group, SIGKILL after grace; returns once nothing of it runs. With
        before_attempt, only a part of an earlier attempt is stopped (a fence never stops the attempt that
        replaced it)."""
        with self.lock:
            rec = self.jobs.get(job_id)
            if rec is None:
                return {'ok': True, 'pod': self.name, 'state': 'absent'}
            if before_attempt is not None and int(rec.get('attempt', 0)) >= before_attempt:
                return {'ok': True, 'pod': self.name, 'state': rec['state'], 'attempt': rec.get('attempt', 0),
                        'reason': rec.get('reason', ''), 'kept': True}
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
        return {'ok': True, 'pod': self.name, 'ordinal': self.ordinal, 'address': pod_ip(), 'node': node_name(),
                'boot': self.boot, 'slots': self.job['pods'][self.ordinal]['slots'], 'running': self.running(),
                'uid': os.getuid(), 'gid': os.getgid(), 'groups': sorted(os.getgroups()),
                'memlock': [soft, hard], 'cap_eff': '%016x' % capabilities(),
                'home_writable': os.access(os.environ.get('HOME', '/'), os.W_OK),
                'claim': claim_check(self.job.get('mount_path', ''))}

    # -- pod 0: the job as a whole (JobSet's failure policy and maxRestarts)
    def supervise(self, job_id, attempt=0, poll=1.0, layout=None, nodes=None):
        """Supervise a job pod 0 started: layout, its pods ({name, address, slots}, rank order; none: the
        working pods); nodes, {pod: node} as the pods said at the start (named when a pod is lost)."""
        if self.ordinal != 0:
            return {'ok': False, 'error': 'only pod 0 supervises a job'}
        with self.lock:
            current = self.supervisors.get(job_id)
            if current and current.is_alive():
                return {'ok': True, 'supervising': job_id, 'already': True}
            record = read_job_record(self.state_root(), job_id) or {}
            layout = layout_of(self.job, {'layout': layout} if layout else record)
            record.update(job_id=job_id, state='running', attempt=attempt,
                          restarts=int(self.job.get('restarts', 0)), updated=time.time(),
                          layout=[{'name': p['name'], 'slots': p['slots']} for p in layout])
            record.setdefault('history', [])
            record.setdefault('restarts_used', 0)
            record.setdefault('spares_used', [])
            record['nodes_of'] = dict(record.get('nodes_of') or {}, **{k: v for k, v in (nodes or {}).items() if v})
            write_job_record(self.state_root(), job_id, record)
            thread = threading.Thread(target=self.follow, args=(job_id, poll), daemon=True)
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
                thread = threading.Thread(target=self.follow, args=(job_id, 1.0, True), daemon=True)
                self.supervisors[job_id] = thread
                thread.start()

    def follow(self, job_id, poll, resumed=False):
        """The supervision loop of the core (supervision.Loop) over the pods (PodDriver) until the job ends; an
        error of its own is an event (supervisor_error) and said, and the job runs on unsupervised."""
        try:
            supervision.Loop(PodDriver(self, job_id, poll, resumed=resumed)).run()
        except Exception as exc:  # pylint: disable=broad-except  # said: the pods' parts run on
            why = '%s: %s; the job runs on unsupervised (its status still reads every pod)' % (type(exc).__name__, exc)
            self.say('job %s: the supervision ended on its own error: %s' % (job_id, why))
            try:
                job_event(self.state_root(), job_id, 'supervisor_error', why=why)
            except OSError:
                pass

    def fence(self, job_id, pods, before_attempt, period=5.0, seconds=FENCE_SECONDS):
        """The pods that did not answer the job's stop (lost with their node, or frozen) are asked again
        every period seconds, for at most seconds: a pod that comes back stops its part of an attempt before
        before_attempt at once, so ranks of a failed attempt never run on beside the next one (event fenced, in
        the SSH supervisor's words); a part of a later attempt (the pod came back and was restarted) is kept."""
        def loop():
            left, deadline = list(pods), time.time() + seconds
            while left and time.time() < deadline:
                time.sleep(period)
                for pod in list(left):
                    address = next(p['address'] for p in self.job['pods'] if p['name'] == pod)
                    try:
                        reply = request(address, int(self.job['agent_port']),
                                        {'op': 'stop', 'job_id': job_id, 'before_attempt': before_attempt,
                                         'reason': 'stopped: fenced (attempt %d replaced it or the job failed)'
                                                   % before_attempt}, timeout=30.0)
                    except (OSError, ValueError):
                        continue
                    left.remove(pod)
                    # the attempt that replaced it, counted from 1 (GPUCLUSTER_ATTEMPT), as the SSH supervisor says it
                    job_event(self.state_root(), job_id, 'fenced', attempt=before_attempt + 1, nodes=[pod],
                              state=reply.get('state'), exit_code=reply.get('exit_code'))
                    self.say('job %s: pod %s answers again; its part is stopped (%s)' % (job_id, pod, reply.get('state')))
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    def allowed(self, peer):
        """Only pod 0 (or this pod itself) may start or stop a job here. Pod 0's addresses are those last
        resolved (watch_pod0 keeps them fresh in the background): a peer that is not among them has the name
        resolved again, and where pod 0's name is not published yet (or still names its old address), the
        caller's own agent is asked who it is: it is pod 0 when it answers as pod 0. The NetworkPolicy is what
        keeps other pods from the agents' port."""
        if peer in ('127.0.0.1', '::1') or peer in self.pod0:
            return True
        found = resolve(self.job['pods'][0]['address'])
        if found:
            self.pod0 = set(found)
            if peer in self.pod0:
                return True
        try:
            reply = _exchange(peer, int(self.job['agent_port']), {'op': 'hello'}, 3.0)
        except (OSError, ValueError):
            return False
        if reply.get('pod') == self.job['pods'][0]['name']:
            self.pod0 = self.pod0 | {peer}
            return True
        return False

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
                reply = self.start(job_id, int(msg.get('node_rank', self.ordinal)), int(msg.get('attempt', 0)),
                                   hosts=msg.get('hosts'), master=msg.get('master_addr'))
            elif op == 'stop':
                before = msg.get('before_attempt')
                reply = self.stop(job_id, reason=str(msg.get('reason') or 'stopped'),
                                  before_attempt=None if before is None else int(before))
            elif op == 'supervise':
                reply = self.supervise(job_id, int(msg.get('attempt', 0)), layout=msg.get('layout'),
                                       nodes=msg.get('nodes'))
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
        if not register(self.state_root(), self.name, pod_ip(), node_name(), self.boot):
            self.say('could not register its address under %s (the launch then waits for its published name)'
                     % os.path.join(self.state_root(), REGISTRY))
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
    replace_file(os.path.join(path, 'job.json'), json.dumps(record, sort_keys=True))


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
class PodDriver:
    """Pod 0's driver of the supervision loop (supervision.Loop, the same loop as the SSH supervisor's): it reads
    the job from every pod's agent, stops and starts their parts, checks the spare pods with a hello and keeps
    the loop's memory in the job record (phase: fault or restarting, what status reads; recovery: the loop's).

    A part that failed (a rank's exit, a signal, a container started again, a part stopped by someone), or a
    pod that has not answered for train.unreachable_after seconds, is a fault. After a failure the other
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
        if not trouble:
            return self._obs('succeeded' if self.finished else 'running')
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
                         reason=reason, failure=kind, exit_code=culprit.get('exit_code'))

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
        ready = [p['name'] for p, hello in zip(candidates, each(candidates, lambda p: hello_of(self.job, p)))
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
            gone = [p['name'] for p, hello in zip(lost, each(lost, lambda p: hello_of(self.job, p))) if not hello]
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


def hello_of(job, pod, timeout=3.0):
    """A pod's hello reply when its agent answers as itself, else None."""
    try:
        reply = request(pod['address'], int(job['agent_port']), {'op': 'hello'}, timeout=timeout)
    except (OSError, ValueError):
        return None
    return reply if reply.get('pod') == pod['name'] else None


def forget(name):
    with ADDRESSES_LOCK:
        ADDRESSES.pop(name, None)


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
        addresses = resolve(pod['address'])
        published = bool(addresses)
        if not addresses:
            addresses = [a for a in [registered(root, pod['name'])] if a]
        if not addresses:
            return '%s does not resolve' % pod['address'], None
        remember(pod['address'], addresses)
        try:
            reply = request(pod['address'], port, {'op': 'hello'}, timeout=2.0)
        except (OSError, ValueError) as exc:
            if not published:
                forget(pod['address'])
                return '%s does not resolve' % pod['address'], None
            return '%s (%s) does not answer on port %d: %s' % (
                pod['address'], addresses[0], port, getattr(exc, 'strerror', None) or exc), None
        if reply.get('pod') != pod['name']:
            if not published:       # a registered address now held by another pod: wait for the name
                forget(pod['address'])
                return '%s does not resolve' % pod['address'], None
            return '%s answers as %r: the hostfile does not match the pods' % (pod['address'], reply.get('pod')), None
        if reply.get('running'):
            return '%s still runs job %s' % (pod['name'], reply['running'][0]), None
        return '', reply

    while True:
        why, hellos = {}, {}
        for pod, (problem, reply) in zip(pods, each(pods, ask)):
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
        forget(pod['address'])
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
            reply = request(pod['address'], port, {'op': 'status', 'job_id': job_id, 'lines': lines},
                            timeout=LOST_IO_TIMEOUT if pod['name'] in (slow or ()) else IO_TIMEOUT)
        except (OSError, ValueError) as exc:
            reply = {'pod': pod['name'], 'state': 'unreachable', 'error': str(exc) or type(exc).__name__}
        return as_itself(pod, reply)
    return each(pods, ask)


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
            reply = request(pod['address'], port, message,
                            timeout=LOST_IO_TIMEOUT if pod['name'] in (slow or ()) else 30.0)
        except (OSError, ValueError) as exc:
            reply = {'state': 'unreachable', 'error': str(exc) or type(exc).__name__}
        return as_itself(pod, reply)
    return each(pods, ask)


def start_all(job, job_id, attempt=0, pods=None):
    """Start every pod's part (default: the working pods) with the attempt's hostfile and pod 0's address as
    the master; '' or 'pod <name>: <why>' after stopping the parts already started."""
    port = int(job['agent_port'])
    pods = working_pods(job) if pods is None else pods
    hosts = [[p['address'], p['slots']] for p in pods]
    master = pod_ip() or address_of(pods[0]['address'])
    for rank, pod in enumerate(pods):
        try:
            reply = request(pod['address'], port, {'op': 'start', 'job_id': job_id, 'node_rank': rank,
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
        sup = request(job['pods'][0]['address'], port, {
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
    sub.add_parser('run', help="a JobSet pod's main process: its own part, then its exit code")
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
    global REGISTRY_ROOT
    REGISTRY_ROOT = state_root(job)
    if args.mode == 'agent':
        Agent(job, pod_name()).serve()
        return 0
    if args.mode == 'run':
        return run_part(job)
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
        states = all_status(job, args.job_id, args.lines, pods=layout_of(job, record))
        print(json.dumps(summary(job, args.job_id, states, record), sort_keys=True))
        return 0
    print(json.dumps({'job_id': args.job_id, 'pods': stop_job(job, args.job_id)}, sort_keys=True))
    return 0


if __name__ == '__main__':
    sys.exit(main())
