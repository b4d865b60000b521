#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: training_job
short_description: Start, watch and stop a multi-node training job through its real launcher
version_added: 0.1.0
description:
  - Runs on every node of the job (head first in O(nodes)). Each node does its own part of the job
    for the launcher chosen. C(deepspeed) starts the deepspeed launcher on the head, which starts
    the ranks on every node over pdsh; C(torchrun) starts one torchrun agent per node with a c10d
    rendezvous on the head; C(mpirun) starts Open MPI's mpirun on the head; C(slurm) renders an
    sbatch script on the head, submits it and returns the Slurm job id.
  - Every process of the job carries C(GPUCLUSTER_JOB_ID) in its environment. O(state=status)
    and O(state=stopped) find the job's processes on a node by that variable, never by matching
    command names, and stop them by process group.
  - O(state=checked) is the launch preflight of one node; it changes nothing.
author:
  - gpucluster.multinode maintainers
options:
  state:
    description:
      - C(checked) verifies this node can take part (launcher installed, script present, master port
        free on the head, no process of the same job) and reports its torch and deepspeed versions.
      - C(started) starts this node's part; C(status) reports it; C(stopped) stops it.
    type: str
    choices: [checked, started, status, stopped]
    default: started
  job_id:
    description: Id of the job, the same on every node; letters, digits, C(.), C(_) and C(-).
    type: str
    required: true
  launcher:
    description: Launcher that starts the ranks.
    type: str
    choices: [deepspeed, torchrun, mpirun, slurm]
    default: deepspeed
  node:
    description: Name of this node as it appears in O(nodes).
    type: str
    required: true
  nodes:
    description: The job's nodes, head first.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Inventory name (also the name other nodes reach it by).
        type: str
        required: true
      address:
        description: Cluster address.
        type: str
        required: true
      slots:
        description: Ranks (GPUs) on the node.
        type: int
        default: 1
  script:
    description: Training script, at the same path on every node (shared storage is simplest).
    type: path
    required: true
  script_args:
    description: Arguments of the script.
    type: list
    elements: str
    default: []
  env_path:
    description: Prefix of the Python environment (venv or conda env); its C(bin) holds python, deepspeed, torchrun.
    type: path
    required: true
  env:
    description: Extra environment variables of the job (for example C(DS_ACCELERATOR=cpu) on CPU nodes).
    type: dict
    default: {}
  master_addr:
    description: Address of the head on the cluster network (rank 0 and the rendezvous).
    type: str
    required: true
  master_port:
    description: Rendezvous port on the head.
    type: int
    default: 29500
  nproc_per_node:
    description: Ranks per node; default the node's O(nodes[].slots). Must not exceed the slots of any node.
    type: int
  job_dir:
    description: Directory of the job, on storage every node sees (hostfile, config, launcher log, per-rank logs).
    type: path
    required: true
  state_dir:
    description:
      - Private local directory for the pid file and exit status of this node's part (created 0700,
        its parents checked: owned by root or the account, not writable by others).
      - Default C(~/.local/state/gpucluster/jobs) of the account, C(/var/lib/gpucluster/jobs) for root.
    type: path
  hostfile:
    description: Hostfile for C(deepspeed) and C(mpirun); default C(<job_dir>/hostfile), written from O(nodes).
    type: path
  deepspeed_launcher:
    description: How the deepspeed launcher reaches the other nodes.
    type: str
    choices: [pdsh, openmpi]
    default: pdsh
  slurm_partition:
    description: Slurm partition; it must exist.
    type: str
  slurm_time:
    description: Slurm time limit.
    type: str
    default: "01:00:00"
  slurm_gpus_per_node:
    description: GPUs per node asked from Slurm (0 on CPU nodes).
    type: int
    default: 0
  slurm_cpus_per_task:
    description: CPUs per node asked from Slurm.
    type: int
    default: 1
  log_lines:
    description: Lines of log returned with O(state=status).
    type: int
    default: 20
  stop_timeout:
    description: Seconds between SIGTERM and SIGKILL when stopping.
    type: int
    default: 10
attributes:
  check_mode:
    support: full
    details: C(checked) and C(status) only read; C(started) and C(stopped) report what they would do.
  diff_mode:
    support: none
notes:
  - The job runs as the user the module runs as (use C(become_user) for the cluster user).
  - Ranks started by pdsh or mpirun on other nodes are found there by their environment, so
    O(state=stopped) must run on every node of the job.
extends_documentation_fragment: [gpucluster.multinode.launch_env]
'''

EXAMPLES = r'''
- name: Start a DeepSpeed job across the cluster
  gpucluster.multinode.training_job:
    state: started
    job_id: tiny-001
    launcher: deepspeed
    node: "{{ inventory_hostname }}"
    nodes: "{{ groups['cluster'] | map('extract', hostvars) | list | json_query('[].{name: inventory_hostname, address: ansible_host, slots: `1`}') }}"
    script: /shared/jobs/train_tiny.py
    script_args: [--steps, "50"]
    env_path: /opt/gpucluster/env
    env: {DS_ACCELERATOR: cpu}
    master_addr: 192.168.1.100
    job_dir: /shared/jobs/tiny-001
  become: true
  become_user: train

- name: Stop it on every node
  gpucluster.multinode.training_job:
    state: stopped
    job_id: tiny-001
    node: "{{ inventory_hostname }}"
    nodes: "{{ job_nodes }}"
    script: /shared/jobs/train_tiny.py
    env_path: /opt/gpucluster/env
    master_addr: 192.168.1.100
    job_dir: /shared/jobs/tiny-001
'''

RETURN = r'''
job_id:
  description: Id of the job.
  returned: always
  type: str
  sample: tiny-001
role:
  description: What this node does in the job (C(launcher), C(agent), C(ranks)).
  returned: always
  type: str
  sample: launcher
command:
  description: Command line this node started (empty where the launcher on the head starts the ranks).
  returned: state is started or checked
  type: str
  sample: /opt/gpucluster/env/bin/deepspeed --hostfile /shared/jobs/tiny-001/hostfile ...
pid:
  description: Pid (and process group) of what this node started.
  returned: state is started and something was started
  type: int
log:
  description: Log of this node's launcher or agent.
  returned: always
  type: str
  sample: /shared/jobs/tiny-001/logs/lab-head.log
rank_log_dir:
  description: Directory of the per-rank logs (torchrun); the deepspeed launcher prefixes every rank's lines with its node in the head's log.
  returned: always
  type: str
running:
  description: Whether a process of the job runs on this node.
  returned: state is status or stopped
  type: bool
exit_code:
  description: Exit status of what this node started, once it ended.
  returned: state is status
  type: int
node_exit_codes:
  description:
    - Exit status per node as the launcher on the head saw it, the node that failed first first
      (pdsh's "ssh exited" lines, mpirun's failure report, srun's error lines with torchrun's report).
  returned: state is status and launcher is deepspeed, mpirun or slurm
  type: dict
  sample: {lab-worker-1: 1}
node_log_tails:
  description: Last lines each node's ranks printed, from the launcher's log on the head.
  returned: state is status and launcher is deepspeed
  type: dict
rank_failure:
  description: The first observed rank failure in torchrun's report on this node (time, host, rank, exit code, signal).
  returned: state is status and launcher is torchrun
  type: dict
  sample: {time: "2026-11-22_14:36:36", host: lab-worker-1, rank: 1, exit_code: -9, signal: SIGKILL}
log_tail:
  description: Last lines of this node's log.
  returned: state is status
  type: list
  elements: str
stopped_pids:
  description: Pids that were signalled.
  returned: state is stopped
  type: list
  elements: int
slurm_job_id:
  description: Slurm's id of the submitted job.
  returned: launcher is slurm and state is started or status
  type: str
slurm_state:
  description: Slurm's state of the job (squeue while queued or running, then scontrol show job, then sacct).
  returned: launcher is slurm and state is status
  type: str
versions:
  description: torch, CUDA, NCCL and deepspeed versions of the environment on this node.
  returned: state is checked
  type: dict
  sample: {torch: 2.13.0+cpu, cuda: null, nccl: null, deepspeed: 0.19.8}
'''

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as jobs
from ansible_collections.gpucluster.multinode.plugins.module_utils import slurm
from ansible_collections.gpucluster.multinode.plugins.module_utils import training as tr

VERSIONS_PY = (
    "import json, torch\n"
    "v = {'torch': torch.__version__, 'cuda': torch.version.cuda, 'nccl': None, 'deepspeed': None}\n"
    "try:\n"
    "    v['nccl'] = '.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None\n"
    "except Exception:\n"
    "    pass\n"
    "try:\n"
    "    import importlib.metadata as md\n"
    "    v['deepspeed'] = md.version('deepspeed')\n"
    "except Exception:\n"
    "    pass\n"
    "print(json.dumps(v))\n"
)


class Job:
    def __init__(self, module):
        self.m = module
        p = module.params
        self.p = p
        self.job_id = tr.check_job_id(p['job_id'])
        names = [n['name'] for n in p['nodes']]
        if not names:
            module.fail_json(msg='nodes is empty: the job needs at least the head')
        if p['node'] not in names:
            module.fail_json(msg='node %s is not in nodes (%s)' % (p['node'], ', '.join(names)))
        self.nodes = p['nodes']
        self.me = p['node']
        self.is_head = names[0] == self.me
        self.rank = names.index(self.me)
        self.bin = os.path.join(p['env_path'], 'bin')
        self.job_dir = p['job_dir']
        self.log_dir = os.path.join(self.job_dir, 'logs')
        self.rank_log_dir = os.path.join(self.log_dir, 'ranks')
        self.log = os.path.join(self.log_dir, '%s.log' % self.me)
        self.state_dir = os.path.join(p['state_dir'] or jobs.default_state_root(), self.job_id)
        self.hostfile = p['hostfile'] or os.path.join(self.job_dir, 'hostfile')
        slots = {n['name']: n['slots'] for n in self.nodes}
        self.nproc = p['nproc_per_node'] or slots[self.me]
        for node in self.nodes:
            if p['nproc_per_node'] and p['nproc_per_node'] > node['slots']:
                module.fail_json(msg='nproc_per_node %d is above the %d slot(s) of node %s'
                                 % (p['nproc_per_node'], node['slots'], node['name']))

    def own_groups(self):
        """What this node started for the job, while its pid file still names it (same pid, start
        time, owner and job id, and no exit status written yet)."""
        leader = jobs.pidfile_process(self.state_dir, self.job_id)
        return [leader] if leader else []

    @property
    def role(self):
        if self.p['launcher'] == 'torchrun':
            return 'agent'
        return 'launcher' if self.is_head else 'ranks'

    def result(self, **kw):
        base = dict(job_id=self.job_id, node=self.me, role=self.role, log=self.log, rank_log_dir=self.rank_log_dir)
        base.update(kw)
        return base

    # ----- the environment of the job -------------------------------------------------------
    def env(self):
        env = dict(os.environ)
        env.update({k: str(v) for k, v in self.p['env'].items()})
        env['PATH'] = '%s:%s' % (self.bin, env.get('PATH', '/usr/bin:/bin'))
        env[jobs.JOB_ENV] = self.job_id
        env['MASTER_ADDR'] = self.p['master_addr']
        env['MASTER_PORT'] = str(self.p['master_port'])
        return env

    def shell_prefix(self):
        """Source the env files that exist, then keep the job's PATH first."""
        parts = ['set -a']
        for path in self.p['env_files']:
            parts.append('[ -r %s ] && . %s' % (tr.q(path), tr.q(path)))
        parts.append('set +a')
        parts.append('export PATH=%s:"$PATH"' % tr.q(self.bin))
        return '; '.join(parts) + '; '

    def deepspeed_env_file(self, env):
        """The job's DS_ENV_FILE: what pdsh exports on every node (one KEY=VALUE per line)."""
        keep = {}
        home_env = os.path.expanduser('~/.deepspeed_env')
        if os.path.isfile(home_env):
            with open(home_env) as handle:
                for line in handle:
                    if '=' in line and not line.startswith('#'):
                        key, _, value = line.rstrip('\n').partition('=')
                        keep[key.strip()] = value
        for key in self.p['env']:
            keep[key] = str(self.p['env'][key])
        keep['PATH'] = '%s:%s' % (self.bin, keep.get('PATH', '/usr/local/bin:/usr/bin:/bin'))
        keep[jobs.JOB_ENV] = self.job_id
        for key, value in keep.items():
            if any(c.isspace() for c in value):
                self.m.fail_json(msg='env %s has white space in its value, which the deepspeed launcher cannot '
                                     'forward over pdsh: %r' % (key, value))
        return ''.join('%s=%s\n' % kv for kv in keep.items())

    # ----- commands ---------------------------------------------------------------------------
    def command(self):
        p = self.p
        launcher = p['launcher']
        if launcher == 'deepspeed':
            if not self.is_head:
                return None
            return tr.deepspeed_command(self.bin, self.hostfile, p['master_addr'], p['master_port'], p['script'],
                                        p['script_args'], launcher=p['deepspeed_launcher'],
                                        num_nodes=len(self.nodes))
        if launcher == 'torchrun':
            return tr.torchrun_command(self.bin, len(self.nodes), self.nproc, p['master_addr'], p['master_port'],
                                       self.job_id, p['script'], p['script_args'],
                                       log_dir=os.path.join(self.rank_log_dir, self.me),
                                       local_addr=self.nodes[self.rank]['address'])
        if launcher == 'mpirun':
            if not self.is_head:
                return None
            names = list(self.env().keys())
            names = [n for n in tr.forwarded_env_names(names)]
            return tr.mpirun_command(self.bin, self.hostfile, self.nproc * len(self.nodes), self.nproc, names,
                                     p['script'], p['script_args'], node_prefix=self.shell_prefix())
        return None  # slurm: rendered script, see start_slurm

    def slurm_installed(self):
        return bool(self.m.get_bin_path('sbatch')) and bool(self.m.get_bin_path('sinfo'))

    def slurm_log(self, slurm_id):
        return os.path.join(self.log_dir, '%s-%s.out' % (self.job_id, slurm_id))

    def launcher_binary(self):
        launcher = self.p['launcher']
        if launcher == 'deepspeed':
            return os.path.join(self.bin, 'deepspeed')
        if launcher == 'torchrun':
            return os.path.join(self.bin, 'torchrun')
        if launcher == 'mpirun':
            return self.m.get_bin_path('mpirun') or 'mpirun'
        return self.m.get_bin_path('sbatch') or 'sbatch'

    # ----- states -----------------------------------------------------------------------------
    def check(self):
        problems = []
        binary = self.launcher_binary()
        needs_launcher = self.p['launcher'] == 'torchrun' or self.is_head
        if needs_launcher and not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            problems.append('launcher %s is not installed (%s not found)' % (self.p['launcher'], binary))
        python = os.path.join(self.bin, 'python')
        if not os.path.exists(python):
            problems.append('env_path %s holds no Python environment (%s missing)' % (self.p['env_path'], python))
        if not os.path.isfile(self.p['script']):
            problems.append('script %s does not exist' % self.p['script'])
        if jobs.job_processes(self.job_id, leaders=self.own_groups()):
            problems.append('job %s already has processes here' % self.job_id)
        if self.is_head and self.p['launcher'] != 'slurm':
            holders = jobs.port_listeners(self.p['master_port'])
            if holders:
                problems.append(jobs.describe_listeners(self.p['master_port'], holders) +
                                '; stop that job or choose another master_port')
        if self.p['launcher'] == 'slurm' and self.is_head and self.p['slurm_partition'] and self.slurm_installed():
            rc, out, err = self.m.run_command(['sinfo', '--noheader', '--format', '%R'])
            known = slurm.partitions(out) if rc == 0 else []
            if rc != 0:
                problems.append('sinfo cannot reach the Slurm controller: %s' % (err or out).strip()[-300:])
            elif self.p['slurm_partition'] not in known:
                problems.append('slurm_partition %s does not exist (partitions: %s)'
                                % (self.p['slurm_partition'], ', '.join(known) or 'none'))
        versions = {}
        if os.path.exists(python):
            rc, out, err = self.m.run_command([python, '-c', VERSIONS_PY], environ_update={'DS_ACCELERATOR': self.p['env'].get('DS_ACCELERATOR', '')} if self.p['env'].get('DS_ACCELERATOR') else None)
            if rc == 0:
                try:
                    versions = json.loads(out.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    problems.append('could not read versions from %s: %s' % (python, out[-200:]))
            else:
                problems.append('import torch failed in %s: %s' % (python, (err or out).strip()[-300:]))
        cmd = self.command()
        return problems, versions, tr.join(cmd) if cmd else ''

    def write_file(self, path, content, mode=0o644):
        if os.path.exists(path):
            with open(path) as handle:
                if handle.read() == content:
                    return
        tmp = path + '.tmp%d' % os.getpid()
        with open(tmp, 'w') as handle:
            handle.write(content)
        os.chmod(tmp, mode)
        self.m.atomic_move(tmp, path)

    def prepare_dirs(self):
        for path in (self.job_dir, self.log_dir, self.rank_log_dir):
            os.makedirs(path, exist_ok=True)
        try:
            jobs.private_dir(self.state_dir)
        except jobs.ProcessError as exc:
            self.m.fail_json(msg='node %s: %s' % (self.me, exc), **self.result())

    def start(self):
        problems, _, _ = self.check()
        if problems:
            self.m.fail_json(msg='node %s cannot start job %s: %s' % (self.me, self.job_id, '; '.join(problems)),
                             **self.result())
        if self.p['launcher'] == 'slurm':
            return self.start_slurm()
        cmd = self.command()
        if cmd is None:
            return self.result(changed=False, command='', started=False,
                               msg='the %s launcher on the head starts the ranks of %s' % (self.p['launcher'], self.me))
        if self.m.check_mode:
            return self.result(changed=True, command=tr.join(cmd), started=False)
        self.prepare_dirs()
        env = self.env()
        if self.p['launcher'] in ('deepspeed', 'mpirun'):
            self.write_file(self.hostfile, tr.hostfile_text(self.nodes, self.nproc))
        if self.p['launcher'] == 'deepspeed':
            env_file = os.path.join(self.job_dir, 'deepspeed_env')
            self.write_file(env_file, self.deepspeed_env_file(env))
            env['DS_ENV_FILE'] = env_file
        line = self.shell_prefix() + 'exec ' + tr.join(cmd)
        # the shell wrapper records the exit status after the launcher ends
        record = jobs.spawn_detached(line, env, self.job_dir, self.log, self.state_dir, job_id=self.job_id)
        pid = record['pid']
        return self.result(changed=True, command=tr.join(cmd), pid=pid, started=True)

    def start_slurm(self):
        p = self.p
        if not self.is_head:
            return self.result(changed=False, command='', started=False,
                               msg='Slurm starts the ranks of %s' % self.me)
        launch = tr.slurm_launch_line('torchrun', self.bin, self.nproc, self.job_id, p['script'], p['script_args'],
                                      log_dir=self.rank_log_dir, node_prefix=self.shell_prefix())
        env = {k: str(v) for k, v in p['env'].items()}
        script = tr.sbatch_script(self.job_id, len(self.nodes), p['slurm_gpus_per_node'], p['slurm_time'],
                                  self.log_dir, os.path.join(self.job_dir, 'hostfile'), p['master_port'],
                                  launch, partition=p['slurm_partition'],
                                  cpus_per_task=p['slurm_cpus_per_task'], env=env)
        path = os.path.join(self.job_dir, 'job.sbatch')
        if self.m.check_mode:
            return self.result(changed=True, command='sbatch --parsable %s' % path, started=False, sbatch=script)
        self.prepare_dirs()
        self.write_file(path, script, 0o755)
        rc, out, err = self.m.run_command(['sbatch', '--parsable', path], cwd=self.job_dir)
        if rc != 0:
            self.m.fail_json(msg='sbatch refused job %s: %s' % (self.job_id, (err or out).strip()), **self.result())
        slurm_id = out.strip().split(';')[0]
        self.write_file(os.path.join(self.state_dir, 'slurm_job_id'), slurm_id + '\n')
        result = self.result(changed=True, command='sbatch --parsable %s' % path, started=True,
                             slurm_job_id=slurm_id, sbatch=script)
        result['log'] = self.slurm_log(slurm_id)
        return result

    def slurm_status(self, sid):
        """{state, exit_code, ...} of a Slurm job: squeue while it is queued or runs, then scontrol
        (finished jobs stay known for MinJobAge), then sacct where accounting is kept."""
        rc, out, _ = self.m.run_command(['squeue', '--noheader', '--jobs', sid, '--format', '%T'])
        if rc == 0 and out.strip():
            return {'state': out.strip().split()[0], 'exit_code': None}
        rc, out, _ = self.m.run_command(['scontrol', 'show', 'job', '--oneliner', sid])
        if rc == 0 and out.strip():
            return slurm.job_state(slurm.parse_oneline(out))
        rc, out, _ = self.m.run_command(['sacct', '--noheader', '--parsable2', '--allocations', '--jobs', sid,
                                         '--format', 'State,ExitCode'])
        return (slurm.sacct_state(out) if rc == 0 else None) or {'state': None, 'exit_code': None}

    def slurm_id(self):
        try:
            with open(os.path.join(self.state_dir, 'slurm_job_id')) as handle:
                return handle.read().strip()
        except (IOError, OSError):
            return None

    def status(self):
        procs = jobs.job_processes(self.job_id, leaders=self.own_groups())
        exit_code = jobs.read_exit_code(self.state_dir)
        out = self.result(changed=False, running=bool(procs), pids=[p['pid'] for p in procs], exit_code=exit_code,
                          log_tail=jobs.tail(self.log, self.p['log_lines']))
        if self.p['launcher'] == 'torchrun':
            out['rank_failure'] = tr.torchrun_failure('\n'.join(jobs.tail(self.log, 400)))
        if self.p['launcher'] == 'deepspeed' and self.is_head:
            text = '\n'.join(jobs.tail(self.log, 100000))
            out['node_exit_codes'] = tr.pdsh_exit_codes(text)
            out['node_log_tails'] = tr.pdsh_node_tails(text, [n['name'] for n in self.nodes], self.p['log_lines'])
        if self.p['launcher'] == 'mpirun' and self.is_head:
            failure = tr.mpirun_failure('\n'.join(jobs.tail(self.log, 100000)))
            if failure:
                node = failure['node'] or self.nodes[min(failure['rank'] // max(self.nproc, 1), len(self.nodes) - 1)]['name']
                out['node_exit_codes'] = {node: failure['exit_code']}
        if self.p['launcher'] == 'slurm' and self.is_head and self.slurm_id():
            sid = self.slurm_id()
            info = self.slurm_status(sid)
            out['slurm_job_id'] = sid
            out['slurm_state'] = info['state']
            out['running'] = out['running'] or info['state'] in slurm.ACTIVE_STATES
            if not out['running']:
                out['exit_code'] = info['exit_code']
            out['log'] = self.slurm_log(sid)
            text = '\n'.join(jobs.tail(out['log'], 100000))
            out['log_tail'] = jobs.tail(out['log'], self.p['log_lines'])
            # srun names the nodes whose task failed; torchrun's report names the one that failed first
            failures = slurm.srun_failures(text)
            codes = {}
            for node, code, _ in failures:
                codes.setdefault(node, code)
            first = tr.torchrun_failure(text)
            if first and first['host'] in codes:
                codes = dict([(first['host'], codes[first['host']])] + [(n, c) for n, c in codes.items()
                                                                         if n != first['host']])
            out['node_exit_codes'] = codes
            out['rank_failure'] = first
            out['node_log_tails'] = tr.pdsh_node_tails(text, [n['name'] for n in self.nodes], self.p['log_lines'])
        return out

    def stop(self):
        procs = jobs.job_processes(self.job_id, leaders=self.own_groups())
        sid = self.slurm_id() if self.p['launcher'] == 'slurm' and self.is_head else None
        if self.m.check_mode:
            return self.result(changed=bool(procs) or bool(sid), running=bool(procs),
                               stopped_pids=[p['pid'] for p in procs])
        if sid:
            rc, out, err = self.m.run_command(['scancel', sid])
            if rc != 0:
                self.m.fail_json(msg='scancel %s (job %s) failed: %s' % (sid, self.job_id, (err or out).strip()),
                                 **self.result())
            deadline = time.time() + self.p['stop_timeout'] + 30
            while time.time() < deadline and self.slurm_status(sid)['state'] in slurm.ACTIVE_STATES:
                time.sleep(1)
        outcome = jobs.stop_job(self.job_id, grace=self.p['stop_timeout'], leaders=self.own_groups())
        stopped, left = outcome['signalled'], outcome['left']
        if left:
            self.m.fail_json(msg='node %s: %d process(es) of job %s survived SIGKILL: %s'
                             % (self.me, len(left), self.job_id, ', '.join(str(p['pid']) for p in left)),
                             **self.result())
        return self.result(changed=bool(stopped) or bool(sid), running=False, stopped_pids=stopped)


def main():
    node_spec = dict(name=dict(type='str', required=True), address=dict(type='str', required=True),
                     slots=dict(type='int', default=1))
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type='str', default='started', choices=['checked', 'started', 'status', 'stopped']),
            job_id=dict(type='str', required=True),
            launcher=dict(type='str', default='deepspeed', choices=list(tr.LAUNCHERS)),
            node=dict(type='str', required=True),
            nodes=dict(type='list', elements='dict', required=True, options=node_spec),
            script=dict(type='path', required=True),
            script_args=dict(type='list', elements='str', default=[]),
            env_path=dict(type='path', required=True),
            env=dict(type='dict', default={}),
            env_files=dict(type='list', elements='path', default=['/etc/profile.d/gpucluster-nccl.sh']),
            master_addr=dict(type='str', required=True),
            master_port=dict(type='int', default=29500),
            nproc_per_node=dict(type='int'),
            job_dir=dict(type='path', required=True),
            state_dir=dict(type='path'),
            hostfile=dict(type='path'),
            deepspeed_launcher=dict(type='str', default='pdsh', choices=['pdsh', 'openmpi']),
            slurm_partition=dict(type='str'),
            slurm_time=dict(type='str', default='01:00:00'),
            slurm_gpus_per_node=dict(type='int', default=0),
            slurm_cpus_per_task=dict(type='int', default=1),
            log_lines=dict(type='int', default=20),
            stop_timeout=dict(type='int', default=10),
        ),
        supports_check_mode=True,
    )
    try:
        job = Job(module)
    except tr.TrainingError as exc:
        module.fail_json(msg=str(exc))
    state = module.params['state']
    if state == 'checked':
        problems, versions, cmd = job.check()
        if problems:
            module.fail_json(msg='node %s: %s' % (job.me, '; '.join(problems)), versions=versions,
                             **job.result(command=cmd))
        module.exit_json(changed=False, versions=versions, **job.result(command=cmd))
    if state == 'started':
        module.exit_json(**job.start())
    if state == 'status':
        module.exit_json(**job.status())
    module.exit_json(**job.stop())


if __name__ == '__main__':
    main()
