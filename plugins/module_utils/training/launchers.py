# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The launchers a training job runs through, each described once (a class per launcher): the command it
runs, what every node does (``launcher`` on the head and ``ranks`` elsewhere, or an ``agent`` per node), the
files it needs (hostfile, environment), how its status and the node that failed are read from its output,
and what one node's status result says of the job (exit codes, the failure's node, the state once it
ended: plugin_utils/training/job_state.py decides the job's state with these). job.py runs them.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.gpucluster.multinode.plugins.module_utils import containers as cn
from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr
from ansible_collections.gpucluster.multinode.plugins.module_utils import slurm
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as tr
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import launch_failures as lf

SSH_CONNECT_TIMEOUT = 5
BIG = 100000
UNBUFFERED_ENV = {'PYTHONUNBUFFERED': '1'}


class JobError(Exception):
    """A refusal or failure worded for the user; result holds what the module returns with it."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.msg = msg
        self.result = result


# ----- the launchers ---------------------------------------------------------------------------
def write_file(path, content, mode=0o644):
    """Write through a temp file and a rename, mode set before the content lands; True when changed."""
    try:
        with open(path) as handle:
            if handle.read() == content and (os.stat(path).st_mode & 0o777) == mode:
                return False
    except (IOError, OSError):
        pass
    tmp = '%s.tmp%d' % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, 'w') as handle:
        handle.write(content)
    os.chmod(tmp, mode)
    os.rename(tmp, path)
    return True


def read_layout(path):
    """{node: ranks} a job was started with (layout.json in its directory); {} when absent or unreadable."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (IOError, OSError, ValueError):
        data = None
    items = data.items() if isinstance(data, dict) else ()
    return dict((str(k), v) for k, v in items if isinstance(v, int) and not isinstance(v, bool) and v > 0)


def daemons_of(procs, names, uid, proc='/proc'):
    """[{pid, pgid, uid, start_time, cmdline}] of the parents of procs whose program is one of names and that
    uid owns: a launcher's daemon on this node (Open MPI's orted, started over SSH without the job's
    environment) that is the job's because it started the job's ranks."""
    found, seen = [], set()
    for p in procs if names else ():
        child = pr.read_stat(p['pid'], proc)
        parent = pr.read_stat(child['ppid'], proc) if child else None
        if parent is None or parent['pid'] in seen or parent['state'] in ('Z', 'X') or parent['pid'] <= 1:
            continue
        if parent['comm'] in names and pr.read_uid(parent['pid'], proc) == uid:
            seen.add(parent['pid'])
            found.append({'pid': parent['pid'], 'pgid': parent['pgid'], 'uid': uid,
                          'start_time': parent['start_time'], 'cmdline': pr.read_cmdline(parent['pid'], proc)})
    return found


class Launcher:
    name = None
    # The versions that must be the same on every node for this launcher (env_versions keys): Ray,
    # for one, does not matter to any of them.
    compared = ('python', 'torch', 'torch_cuda', 'torch_nccl', 'nccl_wheel')
    uses_ssh = False        # the head reaches every node over SSH (checked before the start)
    per_node = False        # every node starts its own part (an agent)
    # What node_tools installs for it (its package groups), and the training_job options only it reads.
    tools = ()
    options = ()
    # Programs of the launcher that run the ranks on a node without the job's environment (so only
    # as the ranks' parent are they known to be the job's): a stop ends them with the ranks.
    daemons = ()
    # In a container: mpirun runs on the host and starts a container a rank (its command carries it); the
    # others run in the node's container. A scheduler (Slurm) places the ranks: no rendezvous port on the
    # head, the image checked where the job is submitted, enroot (pyxis) allowed.
    container_per_rank = False
    schedules = False
    # One log on the head holds every node's lines (Slurm's output file): a failure shows that log's lines, as
    # no node has a log of its own.
    one_log = False

    def __init__(self, job):
        self.job = job

    @classmethod
    def check_settings(cls, params):
        """Raise TrainingError on an option of this launcher that cannot be used."""

    def problems(self):
        """What this launcher finds wrong on this node before a start, besides the job's own checks."""
        return []

    @classmethod
    def tools_for(cls, deepspeed_launcher):
        """The node_tools package groups this launcher needs, given how deepspeed reaches the nodes."""
        return list(cls.tools)

    def submit(self):
        """The start of a launcher that hands the job to a scheduler (its result); None: the job runs command()
        on this node itself."""
        return None

    def scheduled(self):
        """The scheduler's id of the job, on the node that submitted it; None where no scheduler runs it."""
        return None

    def unschedule(self, sid, sleep, hold=False):
        """End the scheduler's job sid before the job's processes are stopped; held (True, False) with hold, else
        None."""
        return None

    def role(self):
        if self.per_node:
            return 'agent'
        return 'launcher' if self.job.is_head else 'ranks'

    def starts_here(self):
        return self.per_node or self.job.is_head

    def binary(self):
        return os.path.join(self.job.bin, self.name)

    def command(self):
        return None

    def files(self):
        """{path: (content, mode)} this node writes before starting."""
        return {}

    def start_env(self, env):
        return env

    def read_status(self, out):
        """Add the launcher's view of the nodes (node_exit_codes, ...) to a status result."""

    def failures(self, text):
        """[{node, cause}] the launcher's log shows while the job starts."""
        return []

    def watch_log(self):
        """The log the head watches for the first step."""
        return self.job.log

    # ----- what one node's status result says of the job (plugin_utils/training/job_state.py decides with these) -----
    @classmethod
    def exit_codes(cls, result):
        """{node: exit code} one node's status result gives: its own part's exit code, and the nodes the
        launcher on the head names (pdsh's and mpirun's lines: node_exit_codes)."""
        codes = {}
        if result.get('exit_code') is not None:
            codes[result.get('node')] = result['exit_code']
        codes.update(result.get('node_exit_codes') or {})
        return codes

    @classmethod
    def failure_node(cls, result):
        """The node a result's rank_failure report names: the one deepspeed's head log names (pdsh's line),
        else the node that read it (each torchrun agent reads its own)."""
        return result['rank_failure'].get('node') or result.get('node')

    @classmethod
    def ended(cls, head):
        """The job's state once nothing runs and no node failed, from the head's result (succeeded when
        the head's part exited 0); None when the nodes' exit codes decide."""
        return 'succeeded' if head.get('exit_code') == 0 else None


class DeepSpeed(Launcher):
    name = 'deepspeed'
    compared = Launcher.compared + ('deepspeed',)
    uses_ssh = True
    tools = ('pdsh',)
    options = ('deepspeed_launcher',)

    @classmethod
    def tools_for(cls, deepspeed_launcher):
        return ['openmpi'] if deepspeed_launcher == 'openmpi' else list(cls.tools)

    def __init__(self, job):
        super().__init__(job)
        if job.container:
            # pdsh would start the ranks on the other hosts, outside the image: in containers every
            # node runs its own launcher (--no_ssh, its --node_rank in the hostfile)
            self.per_node, self.uses_ssh = True, False

    def command(self):
        j = self.job
        if not j.is_head and not j.container:
            return None
        argv = tr.deepspeed_command(j.bin, j.hostfile, j.p['master_addr'], j.p['master_port'], j.p['script'],
                                    j.p['script_args'], launcher=j.p['deepspeed_launcher'], num_nodes=len(j.nodes))
        if j.container:
            at = len(argv) - 1 - len(j.p['script_args'])
            argv[at:at] = ['--no_ssh', '--node_rank', str([n['name'] for n in j.nodes].index(j.me))]
        return argv

    def ds_env_text(self):
        """The job's DS_ENV_FILE: what pdsh exports on every node (one KEY=VALUE per line)."""
        j = self.job
        keep = {}
        home_env = os.path.join(j.home, '.deepspeed_env')
        if os.path.isfile(home_env):
            with open(home_env) as handle:
                for line in handle:
                    if '=' in line and not line.startswith('#'):
                        key, _, value = line.rstrip('\n').partition('=')
                        keep[key.strip()] = value
        keep.update(j.env)
        keep['PATH'] = '%s:%s' % (j.bin, keep.get('PATH', '/usr/local/bin:/usr/bin:/bin'))
        keep[pr.JOB_ENV] = j.job_id
        for key, value in keep.items():
            if any(c.isspace() for c in value):
                raise JobError('node %s: env %s has white space in its value, which the deepspeed launcher '
                               'cannot forward over pdsh' % (j.me, key))
        return ''.join('%s=%s\n' % kv for kv in keep.items())

    def files(self):
        j = self.job
        if j.container:
            return {j.hostfile: (hf.render(j.nodes, 'deepspeed'), 0o644)}
        if not j.is_head:
            return {}
        return {j.hostfile: (hf.render(j.nodes, 'deepspeed'), 0o644),
                j.ds_env_file: (self.ds_env_text(), 0o600)}

    def start_env(self, env):
        if self.job.container:
            return env
        env['DS_ENV_FILE'] = self.job.ds_env_file
        # pdsh's ssh: no prompt, pinned keys, a bounded connect
        env['PDSH_SSH_ARGS_APPEND'] = ' '.join(lf.SSH_OPTIONS + ('-o', 'ConnectTimeout=%d' % self.job.ssh_connect_timeout))
        return env

    def read_status(self, out):
        j = self.job
        if not j.is_head:
            return
        text = '\n'.join(pr.tail(j.log, BIG))
        # pdsh names a host as the hostfile does (name or address): each is named as its node
        out['node_exit_codes'] = dict((self.node_name(host), code) for host, code in tr.pdsh_exit_codes(text).items())
        failure = tr.deepspeed_rank_failure(text)
        if failure:
            failure['node'] = self.node_name(failure['host'])
        out['rank_failure'] = failure
        tails = {}
        hosts = [n['name'] for n in j.nodes] + [n['address'] for n in j.nodes]
        for host, lines in tr.pdsh_node_tails(text, hosts, j.p['log_lines']).items():
            tails.setdefault(self.node_name(host), []).extend(lines)
        out['node_log_tails'] = dict((node, lines[-j.p['log_lines']:]) for node, lines in tails.items())
        out['launcher_unreachable'] = lf.unreachable_nodes(text, j.nodes)

    def node_name(self, host):
        """The name of the node pdsh names host (its name or its address), host itself when no node is."""
        return next((n['name'] for n in self.job.nodes if host in (n['name'], n['address'])), host)

    def failures(self, text):
        found = [dict(node=u['node'], cause=self.job.unreachable_cause(u)) for u in lf.unreachable_nodes(text, self.job.nodes)]
        seen = {f['node'] for f in found}
        for host, code in tr.pdsh_exit_codes(text).items():
            if code and self.node_name(host) not in seen:
                found.append({'node': self.node_name(host), 'cause': 'its ranks exited with code %d' % code})
        return found


class Torchrun(Launcher):
    name = 'torchrun'
    per_node = True

    def command(self):
        j = self.job
        # each attempt of a supervised job rendezvous under its own id: agents left from an earlier one never join
        attempt = str(j.env.get('GPUCLUSTER_ATTEMPT') or '1')
        rdzv_id = j.job_id if attempt in ('', '1') else '%s-attempt%s' % (j.job_id, attempt)
        return tr.torchrun_command(j.bin, len(j.nodes), j.slots, j.p['master_addr'], j.p['master_port'], rdzv_id,
                                   j.p['script'], j.p['script_args'], log_dir=os.path.join(j.rank_log_dir, j.me),
                                   local_addr=j.node['address'])

    def read_status(self, out):
        out['rank_failure'] = tr.torchrun_failure('\n'.join(pr.tail(self.job.log, 400)))


class Mpirun(Launcher):
    name = 'mpirun'
    uses_ssh = True
    tools = ('openmpi',)
    # Open MPI 4's orted (5's prted), started over SSH by mpirun: it outlives the ranks it started for a
    # moment after they are killed, until the head's mpirun is gone
    daemons = ('orted', 'prted')
    container_per_rank = True

    def binary(self):
        return self.job.runner.which('mpirun') or 'mpirun'

    def start_env(self, env):
        # the head starts every node's daemon itself: Open MPI's tree spawn (past 64 daemons, its radix) has
        # daemons start others over SSH, node to node, which only the head is sure to reach (its preflight
        # checks it; worker to worker SSH is cluster_ssh_all_to_all's). Open MPI 4 reads OMPI_MCA_, 5's PRRTE
        # PRTE_MCA_; each ignores the other's.
        env['OMPI_MCA_plm_rsh_no_tree_spawn'] = '1'
        env['PRTE_MCA_plm_ssh_no_tree_spawn'] = '1'
        return env

    def command(self):
        j = self.job
        if not j.is_head:
            return None
        names = tr.forwarded_env_names(list(j.base_env()) + list(j.env))
        ssh_args = ' '.join(lf.SSH_OPTIONS + ('-o', 'ConnectTimeout=%d' % j.ssh_connect_timeout))
        argv = tr.mpirun_command(j.bin, j.hostfile, hf.world_size(j.nodes), names, j.p['script'], j.p['script_args'],
                                 mpirun=self.binary(), node_prefix=j.shell_prefix(), ssh_args=ssh_args)
        if j.container:
            # Open MPI starts each rank on its host; the rank's bash then runs it in the image
            at = len(argv) - 2 - len(j.p['script_args'])
            argv[at:at] = cn.mpirun_rank_prefix(j.container, j.job_id, j.shell_prefix(), env_files=j.env_files_here(),
                                                rootless=j.uid != 0, infiniband=os.path.isdir(cn.INFINIBAND),
                                                workdir=j.job_dir)
        return argv

    def files(self):
        j = self.job
        return {j.hostfile: (hf.render(j.nodes, 'openmpi'), 0o644)} if j.is_head else {}

    def read_status(self, out):
        j = self.job
        if not j.is_head:
            return
        text = '\n'.join(pr.tail(j.log, BIG))
        failure = tr.mpirun_failure(text)
        if failure:
            node = failure['node'] or hf.node_of_rank(j.nodes, failure['rank']) or j.nodes[-1]['name']
            out['node_exit_codes'] = {node: failure['exit_code']}
        out['launcher_unreachable'] = lf.unreachable_nodes(text, j.nodes)

    def failures(self, text):
        j = self.job
        found = [dict(node=u['node'], cause=j.unreachable_cause(u)) for u in lf.unreachable_nodes(text, j.nodes)]
        failure = tr.mpirun_failure(text)
        if failure and not found:
            node = failure['node'] or hf.node_of_rank(j.nodes, failure['rank'])
            found.append({'node': node, 'cause': 'rank %d exited with code %d' % (failure['rank'], failure['exit_code'])})
        return found


class Slurm(Launcher):
    name = 'slurm'
    options = ('slurm_partition', 'slurm_time', 'slurm_gpus_per_node', 'slurm_cpus_per_task')
    schedules = True
    one_log = True

    @classmethod
    def check_settings(cls, params):
        tr.check_slurm_settings(params['slurm_time'], params['slurm_partition'])

    def problems(self):
        """The partition asked for exists (on the head, where sbatch and sinfo are)."""
        j = self.job
        if not (j.is_head and j.p['slurm_partition'] and j.runner.which('sbatch') and j.runner.which('sinfo')):
            return []
        rc, out, err = j.runner.run(['sinfo', '--noheader', '--format', '%R'])
        if rc != 0:
            return ['sinfo cannot reach the Slurm controller: %s' % (err or out).strip()[-300:]]
        known = slurm.partitions(out)
        if j.p['slurm_partition'] not in known:
            return ['slurm_partition %s does not exist (partitions: %s)'
                    % (j.p['slurm_partition'], ', '.join(known) or 'none')]
        return []

    @staticmethod
    def cancelled(result):
        return str(result.get('slurm_state') or '').startswith('CANCELLED')

    @classmethod
    def exit_codes(cls, result):
        """The batch script's status is the job's (the head's result); srun names the nodes whose task
        failed, and those are the failed nodes. A cancelled job (scancel) failed nowhere: srun's lines
        name the tasks it killed."""
        if cls.cancelled(result):
            return {}
        codes = {}
        if result.get('exit_code') and not result.get('node_exit_codes'):
            codes[result.get('node')] = result['exit_code']
        codes.update(result.get('node_exit_codes') or {})
        return codes

    @classmethod
    def failure_node(cls, result):
        """One log holds every node's torchrun report: the report's own host is the node."""
        failure = result['rank_failure']
        return failure.get('node') or failure.get('host') or result.get('node')

    @classmethod
    def ended(cls, head):
        """Slurm's own state decides: CANCELLED (scancel, or a stop) stopped, COMPLETED succeeded."""
        if cls.cancelled(head):
            return 'stopped'
        if str(head.get('slurm_state') or '') == 'COMPLETED':
            return 'succeeded'
        return super().ended(head)

    def binary(self):
        return self.job.runner.which('sbatch') or 'sbatch'

    def submit(self):
        """sbatch on the head (the ranks of the other nodes are Slurm's to start); a job this job's stop
        requeued and held is released instead (release())."""
        j = self.job
        if not j.is_head:
            return j.result(changed=False, command='', started=False, msg='Slurm starts the ranks of %s' % j.me)
        sid = self.slurm_id() if j.p.get('slurm_requeue') else None
        record = self.slurm_record(sid) if sid else {}
        if record and slurm.is_held(record):
            return self.release(sid, record)
        command = 'sbatch --parsable %s' % j.sbatch
        if j.runner.check_mode:
            return j.result(changed=True, command=command, started=False)
        j.prepare()
        try:
            os.unlink(os.path.join(j.state_dir, 'slurm_attempt'))
        except OSError:
            pass
        rc, out, err = j.runner.run(['sbatch', '--parsable', j.sbatch], cwd=j.job_dir)
        if rc != 0:
            j.fail('sbatch refused job %s: %s' % (j.job_id, (err or out).strip()))
        sid = out.strip().split(';')[0]
        write_file(os.path.join(j.state_dir, 'slurm_job_id'), sid + '\n', 0o600)
        return j.result(changed=True, command=command, started=True, slurm_job_id=sid, log=self.slurm_log(sid))

    def release(self, sid, record):
        """Start again the Slurm job this job's stop requeued and held (slurm_hold): the same job id and
        place in the queue, on this run's nodes (ReqNodeList, NumNodes), the nodes it ran on before and runs
        on no more excluded (ExcNodeList); its batch script reads the launch line and environment written now."""
        j = self.job
        names = [n['name'] for n in j.nodes]
        before = list(read_layout(j.layout_file))
        excluded = [n for n in (slurm.hostlist(record.get('ExcNodeList')) + before) if n not in names]
        excluded = sorted(set(excluded), key=excluded.index)
        update = slurm.requeue_update(sid, names, excluded)
        attempt = slurm.restarts(record) + 1
        command = '%s; scontrol release %s' % (tr.join(update), sid)
        if j.runner.check_mode:
            return j.result(changed=True, command=command, started=False, slurm_job_id=sid)
        j.prepare()
        write_file(os.path.join(j.state_dir, 'slurm_attempt'), '%d\n' % attempt, 0o600)
        for argv in (update, ['scontrol', 'release', sid]):
            rc, out, err = j.runner.run(argv, cwd=j.job_dir)
            if rc != 0:
                j.fail('%s refused the requeued Slurm job %s (job %s): %s'
                       % (tr.join(argv), sid, j.job_id, (err or out).strip()), slurm_job_id=sid)
        return j.result(changed=True, command=command, started=True, slurm_job_id=sid, requeued=True,
                        slurm_attempt=attempt, excluded=excluded, log=self.slurm_log(sid))

    def scheduled(self):
        return self.slurm_id() if self.job.is_head else None

    def unschedule(self, sid, sleep, hold=False):
        """scancel, and wait (the stop's grace and 30 s) until Slurm has ended the job; with hold, the job is
        requeued and held instead (hold())."""
        j = self.job
        if hold:
            # requeued and held (the job keeps its id and place in the queue): a restart releases it
            return self.hold(sid, sleep)
        rc, out, err = j.runner.run(['scancel', sid])
        if rc != 0:
            j.fail('scancel %s (job %s) failed: %s' % (sid, j.job_id, (err or out).strip()))
        deadline = time.time() + j.p['stop_timeout'] + 30
        while time.time() < deadline and self.slurm_status(sid)['state'] in slurm.ACTIVE_STATES:
            sleep(1)
        return None

    def hold(self, sid, sleep):
        """scontrol requeuehold: the Slurm job's tasks end and it waits, held, under the same id (a running or
        an ended job Slurm still knows); True once it is pending and held. A job Slurm cannot requeue (submitted
        without --requeue, or forgotten) is cancelled instead: False."""
        j = self.job
        record = self.slurm_record(sid)
        if record and slurm.is_held(record):
            return True
        rc, out, err = j.runner.run(['scontrol', 'requeuehold', sid])
        if rc != 0:
            rc2, out2, err2 = j.runner.run(['scancel', sid])
            if rc2 != 0 and self.slurm_status(sid)['state'] in slurm.ACTIVE_STATES:
                j.fail('scontrol requeuehold %s (job %s) failed: %s; scancel failed too: %s'
                       % (sid, j.job_id, (err or out).strip(), (err2 or out2).strip()))
            return False
        deadline = time.time() + j.p['stop_timeout'] + 30
        while time.time() < deadline:
            record = self.slurm_record(sid)
            if record and slurm.is_held(record):
                return True
            sleep(1)
        j.fail('Slurm job %s (job %s) was requeued but is not pending and held after %d s (state %s)'
               % (sid, j.job_id, j.p['stop_timeout'] + 30, (record or {}).get('JobState', 'unknown')),
               slurm_job_id=sid)

    def script(self):
        j = self.job
        prefix = j.shell_prefix()
        if j.container:
            # scontrol is on the hosts, not in the image: the batch script writes every NodeAddr first
            addr_file = os.path.join(j.job_dir, 'node_addrs')
            prefix = cn.slurm_sealed_prefix(j.container, j.job_dir) + cn.slurm_node_prefix(addr_file) + prefix
        if j.p.get('slurm_requeue'):
            # a requeued job's ranks are of attempt SLURM_RESTART_COUNT + 1 (after the env files, which name the
            # attempt the job was started as: Slurm may requeue it on its own too)
            prefix = prefix + 'export GPUCLUSTER_ATTEMPT=$(( ${SLURM_RESTART_COUNT:-0} + 1 )); '
        launch = tr.slurm_launch_line('torchrun', j.bin, {n['name']: n['slots'] for n in j.nodes}, j.job_id,
                                      j.p['script'], j.p['script_args'], log_dir=j.rank_log_dir,
                                      node_prefix=prefix)
        if j.container:
            launch = (cn.slurm_node_addr_lines(os.path.join(j.job_dir, 'hostfile'), addr_file)
                      + cn.slurm_container_line(j.container, j.job_id, launch, env_files=j.p['env_files'],
                                                gpus_per_node=j.p['slurm_gpus_per_node'], workdir=j.job_dir))
        # a requeueable job reads its launch line from launch_file() at each run: it is not in the script
        requeue = bool(j.p.get('slurm_requeue'))
        script = tr.sbatch_script(j.job_id, len(j.nodes), j.p['slurm_gpus_per_node'], j.p['slurm_time'], j.log_dir,
                                  os.path.join(j.job_dir, 'hostfile'), j.p['master_port'], '' if requeue else launch,
                                  partition=j.p['slurm_partition'], cpus_per_task=j.p['slurm_cpus_per_task'],
                                  env_file=j.env_file, requeue_launch_file=self.launch_file() if requeue else None)
        return (launch if requeue else None), script

    def launch_file(self):
        """Where a requeueable job's batch script reads its launch line at each run."""
        return os.path.join(self.job.job_dir, 'job.launch')

    def files(self):
        j = self.job
        if not j.is_head:
            return {}
        launch, script = self.script()
        out = {j.sbatch: (script, 0o700)}
        if launch is not None:
            out[self.launch_file()] = (launch + '\n', 0o700)
        return out

    def slurm_id(self):
        text = pr.tail(os.path.join(self.job.state_dir, 'slurm_job_id'), 1)
        return text[0].strip() if text else None

    def slurm_attempt(self):
        """The attempt the Slurm job runs now: written when a requeued job is released (its restart count + 1),
        or the newest attempt whose output exists (Slurm requeues a job on its own too); 1 when neither."""
        text = pr.tail(os.path.join(self.job.state_dir, 'slurm_attempt'), 1)
        attempt = int(text[0].strip()) if text and text[0].strip().isdigit() else 1
        sid = self.slurm_id()
        prefix = '%s-%s.attempt' % (self.job.job_id, sid)
        try:
            names = os.listdir(self.job.log_dir)
        except OSError:
            names = []
        for name in names:
            middle = name[len(prefix):-len('.out')] if name.startswith(prefix) and name.endswith('.out') else ''
            if middle.isdigit():
                attempt = max(attempt, int(middle))
        return attempt

    def slurm_record(self, sid):
        """The job's `scontrol show job` record ({} when Slurm no longer knows it)."""
        rc, out, _ = self.job.runner.run(['scontrol', 'show', 'job', '--oneliner', sid])
        return slurm.parse_oneline(out) if rc == 0 and out.strip() else {}

    def watch_log(self):
        sid = self.slurm_id()
        return self.slurm_log(sid) if sid else self.job.log

    def failures(self, text):
        found = {}
        for node, _, what in slurm.srun_failures(text):
            found.setdefault(node, {'node': node, 'cause': 'srun: its task %s' % what})
        return list(found.values())

    def slurm_log(self, sid):
        """The batch output of the attempt the job runs now (a requeued job's attempts each have their own)."""
        attempt = self.slurm_attempt() if sid == self.slurm_id() else 1
        return tr.slurm_attempt_log(self.job.log_dir, self.job.job_id, sid, attempt)

    def slurm_status(self, sid):
        """{state, exit_code}: squeue while queued or running, then scontrol (finished jobs stay known
        for MinJobAge), then sacct where accounting is kept."""
        run = self.job.runner.run
        rc, out, _ = run(['squeue', '--noheader', '--jobs', sid, '--format', '%T'])
        if rc == 0 and out.strip():
            return {'state': out.strip().split()[0], 'exit_code': None}
        rc, out, _ = run(['scontrol', 'show', 'job', '--oneliner', sid])
        if rc == 0 and out.strip():
            return slurm.job_state(slurm.parse_oneline(out))
        rc, out, _ = run(['sacct', '--noheader', '--parsable2', '--allocations', '--jobs', sid,
                          '--format', 'State,ExitCode'])
        return (slurm.sacct_state(out) if rc == 0 else None) or {'state': None, 'exit_code': None}

    def read_status(self, out):
        j = self.job
        sid = self.slurm_id() if j.is_head else None
        if not sid:
            return
        info = self.slurm_status(sid)
        out.update(slurm_job_id=sid, slurm_state=info['state'], log=self.slurm_log(sid))
        out['running'] = out['running'] or info['state'] in slurm.ACTIVE_STATES
        if not out['running']:
            out['exit_code'] = info['exit_code']
        text = '\n'.join(pr.tail(out['log'], BIG))
        out['log_tail'] = pr.tail(out['log'], j.p['log_lines'])
        # srun names the nodes whose task failed; torchrun's report names the one that failed first
        codes = {}
        for node, code, _ in slurm.srun_failures(text):
            codes.setdefault(node, code)
        first = tr.torchrun_failure(text)
        if first and first['host'] in codes:
            codes = dict([(first['host'], codes[first['host']])] + [(n, c) for n, c in codes.items()
                                                                    if n != first['host']])
        out['node_exit_codes'] = codes
        out['rank_failure'] = first
        out['node_log_tails'] = tr.pdsh_node_tails(text, [n['name'] for n in j.nodes], j.p['log_lines'])


# The launchers, declared once: the module's choices, the role's argument spec (a test compares
# them), the role's validation and node_tools (through the gpucluster.multinode.launchers lookup).
LAUNCHERS = {cls.name: cls for cls in (DeepSpeed, Torchrun, Mpirun, Slurm)}
DEEPSPEED_LAUNCHERS = ('pdsh', 'openmpi')


def declaration(name, deepspeed_launcher='pdsh'):
    """What the collection knows of one launcher: its name, the node_tools package groups it needs,
    whether the head reaches the nodes over SSH, whether every node starts its own part, and the
    training_job options only it reads. An unknown name raises ValueError naming the known ones."""
    if name not in LAUNCHERS:
        raise ValueError('training_launcher must be %s (got %r)' % (', '.join(LAUNCHERS), name))
    cls = LAUNCHERS[name]
    return {'name': name, 'tools': cls.tools_for(deepspeed_launcher), 'uses_ssh': cls.uses_ssh,
            'per_node': cls.per_node, 'options': list(cls.options)}
