# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""This pod's agent (k8s_pod.py agent): on the agent port it answers its peers and starts, reports and stops
this pod's part of a job; pod 0's also supervises the job (supervision.Loop with pod_driver.PodDriver) and
fences the pods that did not answer a stop. It reaps every child (PID 1's duty). Standard library only;
mounted beside the pod entrypoint."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pod_net as net
import supervision
from pod_checks import capabilities, claim_check, describe_exit, memlock
from pod_driver import PodDriver
from pod_progress import Progress, held_in_group
from pod_job import (JOB_ENV, JOB_ID_RE, hostfile_lines, job_event, launcher_line, layout_of, load_job, node_name,
                     ordinal_of, pod_ip, read_job_record, state_root, tail, write_job_record)


FENCE_SECONDS = 3600    # how long pod 0 keeps asking a pod that did not answer a failed job's stop


def subreaper():
    """Adopt orphaned grandchildren (ranks whose launcher died) so they are reaped here, as PID 1 would."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


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
        self.progress = {}      # job_id -> what its part's output says of its steps (Progress), this container's
        self.boot = '%d-%d' % (os.getpid(), int(time.time() * 1000))  # this container's agent, not a previous one
        self.pod0 = set()       # pod 0's addresses as last resolved (allowed)

    # -- state on the shared (or per-pod) volume: a restarted container knows what it was running
    def state_root(self):
        return state_root(self.job)

    def _job_dir(self, job_id):
        path = os.path.join(self.state_root(), job_id)
        os.makedirs(path, mode=0o2770, exist_ok=True)
        return path

    def _save(self, job_id):
        rec = {k: v for k, v in self.jobs[job_id].items() if k != 'proc'}
        net.replace_file(os.path.join(self._job_dir(job_id), '%s.json' % self.name), json.dumps(rec, sort_keys=True))

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
                net.replace_file(hostfile, hostfile_lines([{'address': str(a), 'slots': int(n)} for a, n in hosts]))
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
            self.progress[job_id] = Progress(self.job.get('progress_regex'))
            threading.Thread(target=self._copy_output, args=(job_id, proc, log), daemon=True).start()
            self.say('job %s: part %d started (attempt %d, pid %d)' % (job_id, node_rank, attempt, proc.pid))
            return {'ok': True, 'state': 'running', 'pid': proc.pid}

    def _copy_output(self, job_id, proc, log):
        """The part's output to its log on the volume and to PID 1's stdout (kubectl logs)."""
        prefix = '[%s %s] ' % (job_id, self.name)
        progress = self.progress.get(job_id)
        with open(log, 'ab') as out:
            for line in iter(proc.stdout.readline, b''):
                out.write(line)
                out.flush()
                if progress is not None:
                    progress.saw(line.decode('utf-8', 'replace'))
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
        reply = {'ok': True, 'pod': self.name, 'state': rec['state'], 'exit_code': rec.get('exit_code'),
                 'reason': rec.get('reason', ''), 'pid': rec.get('pid'), 'attempt': rec.get('attempt', 0),
                 'ended': rec.get('ended'), 'tail': tail(rec.get('log', ''), lines),
                 'node_rank': rec.get('node_rank', self.ordinal)}
        progress = self.progress.get(job_id)
        if rec['state'] == 'running' and progress is not None and rec.get('boot') == self.boot:
            # what its output said of its steps, and a rank the kernel holds (the stall rule names it first)
            reply.update(progress=progress.report(), held=held_in_group(rec.get('pid')))
        return reply

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
        root = self.state_root()  # the job's directory now: the loop outlives the call

        def loop():
            left, deadline = list(pods), time.time() + seconds
            while left and time.time() < deadline:
                time.sleep(period)
                for pod in list(left):
                    address = next(p['address'] for p in self.job['pods'] if p['name'] == pod)
                    try:
                        reply = net.request(address, int(self.job['agent_port']),
                                            {'op': 'stop', 'job_id': job_id, 'before_attempt': before_attempt,
                                             'reason': 'stopped: fenced (attempt %d replaced it or the job failed)'
                                                   % before_attempt}, timeout=30.0)
                    except (OSError, ValueError):
                        continue
                    left.remove(pod)
                    # the attempt that replaced it, counted from 1 (GPUCLUSTER_ATTEMPT), as the SSH supervisor says it
                    job_event(root, job_id, 'fenced', attempt=before_attempt + 1, nodes=[pod],
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
        found = net.resolve(self.job['pods'][0]['address'])
        if found:
            self.pod0 = set(found)
            if peer in self.pod0:
                return True
        try:
            reply = net._exchange(peer, int(self.job['agent_port']), {'op': 'hello'}, 3.0)
        except (OSError, ValueError):
            return False
        if reply.get('pod') == self.job['pods'][0]['name']:
            self.pod0 = self.pod0 | {peer}
            return True
        return False

    def watch_pod0(self, period=30.0):
        """Resolve pod 0's name every period seconds, so that allowed() rarely has to."""
        while True:
            found = net.resolve(self.job['pods'][0]['address'])
            if found:
                self.pod0 = set(found)
            time.sleep(period)

    def handle(self, conn, peer):
        try:
            conn.settimeout(net.IO_TIMEOUT)
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
        if not net.register(self.state_root(), self.name, pod_ip(), node_name(), self.boot):
            self.say('could not register its address under %s (the launch then waits for its published name)'
                     % os.path.join(self.state_root(), net.REGISTRY))
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
