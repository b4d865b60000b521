# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The supervisor's runs of ansible on the supervisor host: the collection's playbooks (train.yml
status/stopped/started/report, health.yml), each in its own process group, bounded, its output appended to
ansible.log (mode 0600); the direct probe of a node a read missed (a TCP connect to its SSH port that waits
for sshd's banner, and an ansible ping); the fence of a left-out node (its older attempts' ranks killed once
it answers again); and --probe, the start's check that the supervisor, as it will run, can read the job.

Runs is the part of the supervisor (supervisor_driver.Supervisor) that runs them; it uses the supervisor's s
(settings), dir, job, child, run_offset, glance_every, to_fence, fencing, fence_next, fence_said, and its
remember(), refresh() and event()."""

import base64
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ansible_output import last_line, parse_adhoc, fenced_counts, run_error
from supervisor_record import LOG, proc_start, state_dir_of


# The supervisor's playbook runs reach a frozen node: SSH gives up on it (a connection multiplexed over
# an open master gets no ConnectTimeout, so the server is asked to answer every 5 s), and a read ends.
SSH_ENV = {'ANSIBLE_SSH_ARGS': '-C -o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=5 '
                               '-o ServerAliveCountMax=3',
           'ANSIBLE_TIMEOUT': '10'}


TCP_TIMEOUT = 5        # the direct probe's connect to a node's SSH port


BANNER_TIMEOUT = 20    # and the wait for its sshd's banner (a loaded node's sshd forks before it answers)


PING_TIMEOUT = 60      # the direct probe's ansible ping (every node not read, in one run)


PROBE_TIMEOUT = 120    # each run of --probe


BEAT_EVERY = 15        # the heartbeat is written again this often while a run goes on


LOG_TAIL = 256 * 1024  # the most of a run's output read back for its error


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


# ----- fencing: a left-out node's ranks killed once it answers again ------------------------------
# Run on a left-out node as the training account: SIGKILL to the processes of the job (GPUCLUSTER_JOB_ID in
# their environment, which only the job's own processes carry) of an attempt before the given one; it prints
# how many. Nothing else is signalled (the account reads only its own processes' environment).


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


class Runs:
    """Runs of ansible: playbooks, the direct probe, the fence."""

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

    def train(self, state, limit=None, timeout=None, watch=None, **extra):
        # training_supervisor_acting: stopped.yml leaves this supervisor's own unit alone
        return self.playbook(self.s['train_playbook'], dict(extra, training_state=state, training_job_id=self.job,
                                                            training_supervisor_acting=True), limit=limit,
                             timeout=timeout, watch=watch)

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

    def note(self, text):
        self.log_text('# %s %s\n' % (time.strftime('%Y-%m-%dT%H:%M:%S'), text))

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
