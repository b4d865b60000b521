# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A training job on one node, through its launcher (launchers.py): preflight, start, watch, status and stop.

The ``Job`` runs the launcher's description with a ``runner`` (the module, or a fake in the unit tests) and
``processes`` for the process life cycle; every problem raises launchers.JobError with one message that
names the node and the option.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import time

from ansible_collections.gpucluster.multinode.plugins.module_utils import containers as cn
from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions
from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as tr
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import flight_recorder as fr
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import launch_failures as lf
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as mon
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import rank_errors as re_
from ansible_collections.gpucluster.multinode.plugins.module_utils.training.launchers import (
    BIG, LAUNCHERS, SSH_CONNECT_TIMEOUT, UNBUFFERED_ENV, JobError, daemons_of, read_layout, write_file)


class Runner:
    """What a Job needs from Ansible (the module implements it; the tests fake it)."""

    def __init__(self, module):
        self.module = module
        self.check_mode = module.check_mode

    def run(self, argv, cwd=None, environ=None):
        return self.module.run_command(argv, cwd=cwd, environ_update=environ)

    def which(self, name):
        return self.module.get_bin_path(name)

    def versions(self, python, environ):
        # from the packages' metadata, no import: the preflight stays quick, and an environment whose
        # torch does not import fails the start at once (the watch names the node)
        return env_versions.read(self.module, python, imports=False, environ=environ, timeout=120)


# ----- the job on this node --------------------------------------------------------------------
def matched_line(text, match):
    """The whole line of text in which match (a re match object on text) begins, without its end."""
    start = text.rfind('\n', 0, match.start()) + 1
    end = text.find('\n', match.start())
    return text[start:end if end >= 0 else len(text)].strip()


def last_step_of(text, step_re):
    """{line, step} of the last line of text that step_re matches (step: its step number, the progress
    parser's rule: group step, else the first number of the match; None when it holds none), else None."""
    last = None
    for last in step_re.finditer(text):
        pass
    if last is None:
        return None
    return {'line': matched_line(text, last), 'step': mon.step_of(last)}


class Job:
    def __init__(self, params, runner, proc='/proc'):
        self.p = p = params
        self.runner = runner
        self.proc = proc
        try:
            self.job_id = tr.check_job_id(p['job_id'])
            self.env = tr.check_env(p['env'])
            kind = LAUNCHERS[p['launcher']]
            kind.check_settings(p)
            self.container = cn.check_spec(p.get('container'))
            if self.container and self.container['runtime'] == 'enroot' and not kind.schedules:
                raise cn.ContainerError('container runtime enroot runs under Slurm only (through pyxis), not with '
                                        'launcher %s; use podman or apptainer' % p['launcher'])
        except (tr.TrainingError, cn.ContainerError) as exc:
            raise JobError('node %s: %s' % (p['node'], exc))
        names = [n['name'] for n in p['nodes']]
        if not names:
            raise JobError('nodes is empty: the job needs at least the head')
        if p['node'] not in names:
            raise JobError('node %s is not in nodes (%s)' % (p['node'], ', '.join(names)))
        for node in p['nodes']:
            if p['nproc_per_node'] and p['nproc_per_node'] > node['slots']:
                raise JobError('nproc_per_node %d is above the %d slot(s) of node %s'
                               % (p['nproc_per_node'], node['slots'], node['name']))
        self.nodes = [dict(name=n['name'], address=n['address'], slots=p['nproc_per_node'] or n['slots'])
                      for n in p['nodes']]
        self.layout_file = os.path.join(p['job_dir'], 'layout.json')
        if p.get('state') not in ('started', 'checked') and not p['nproc_per_node']:
            # a running job's ranks per node are those it was started with (training_nproc_per_node then)
            started = read_layout(self.layout_file)
            self.nodes = [dict(n, slots=started.get(n['name'], n['slots'])) for n in self.nodes]
        self.me = p['node']
        self.node = self.nodes[names.index(self.me)]
        self.slots = self.node['slots']
        self.is_head = names[0] == self.me
        self.uid = os.geteuid()
        if p.get('owner'):
            try:
                self.uid = pwd.getpwnam(p['owner']).pw_uid
            except KeyError:
                raise JobError('node %s: owner %s is not an account here' % (self.me, p['owner']))
        try:
            account = pwd.getpwuid(self.uid)
            self.user, self.home = account.pw_name, account.pw_dir
        except KeyError:
            self.user, self.home = str(self.uid), os.path.expanduser('~')
        self.bin = os.path.join(p['env_path'], 'bin')
        self.job_dir = p['job_dir']
        self.log_dir = os.path.join(self.job_dir, 'logs')
        self.rank_log_dir = os.path.join(self.log_dir, 'ranks')
        self.exit_dir = os.path.join(self.job_dir, 'exit')
        self.log = os.path.join(self.log_dir, '%s.log' % self.me)
        self.state_dir = os.path.join(p['state_dir'] or pr.default_state_root(self.uid), self.job_id)
        self.hostfile = p['hostfile'] or os.path.join(self.job_dir, 'hostfile')
        self.env_file = os.path.join(self.job_dir, 'job.env')
        self.ds_env_file = os.path.join(self.job_dir, 'deepspeed_env')
        self.sbatch = os.path.join(self.job_dir, 'job.sbatch')
        if self.container:
            if self.container['gpus'] is None:
                # auto: the GPUs where the node offers them (a CDI spec for podman, the driver for apptainer)
                self.container['gpus'] = any(os.path.exists(path) for path in (
                    cn.CDI_SPECS if self.container['runtime'] == 'podman' else ('/dev/nvidiactl',)))
                if kind.schedules and self.container['runtime'] != 'podman':
                    # pyxis and Apptainer in a Slurm step: the GPUs are the allocation's
                    self.container['gpus'] = bool(p['slurm_gpus_per_node'])
            # sealed: the caches of this node's container in the job's directory, never the home
            self.container['cache_dir'] = cn.job_cache_dir(self.job_dir, self.me)
            if kind.schedules:
                self.container['expect_gpus'] = p['slurm_gpus_per_node'] or 0
            elif self.container['gpus']:
                self.container['expect_gpus'] = self.slots
        # PyTorch's NCCL flight recorder for a job on GPUs: on a collective's timeout, or asked through its
        # debug-info pipe, every rank dumps its last collectives to <job_dir>/flight/rank_<RANK> (attempt N:
        # flight/attempt-N/). job.env, sourced after the env files (the nccl_env profile's
        # TORCH_NCCL_ASYNC_ERROR_HANDLING=1), carries these; training_env overrides them
        self.attempt = fr.attempt_number(self.env.get('GPUCLUSTER_ATTEMPT'))
        self.flight_dir = fr.attempt_dir(self.job_dir, self.attempt) if self.uses_nccl() else None
        if self.flight_dir:
            self.env = dict(fr.job_env(self.job_dir, self.attempt), **self.env)
        # every Python of the job (launcher, agents, ranks) writes each line at once: a rank's output reaches
        # its node's log as it is printed, not in blocks minutes later (the first-step wait, status and the
        # stall clock read those logs); training_env can still set it to ''
        self.env = dict(UNBUFFERED_ENV, **self.env)
        self.warnings = []
        self.launcher = LAUNCHERS[p['launcher']](self)

    def result(self, **kw):
        base = dict(job_id=self.job_id, node=self.me, launcher=self.launcher.name, role=self.launcher.role(),
                    log=self.log, rank_log_dir=self.rank_log_dir, slots=self.slots, world_size=hf.world_size(self.nodes),
                    ranks=hf.rank_layout(self.nodes).get(self.me))
        if self.warnings:
            base['warnings'] = list(self.warnings)
        base.update(kw)
        return base

    def fail(self, msg, **kw):
        raise JobError(msg, **self.result(**kw))

    # ----- environment -------------------------------------------------------------------------
    GPU_DEVICE = '/dev/nvidiactl'

    def uses_nccl(self):
        """Whether the job's ranks run on GPUs (so torch.distributed uses NCCL): the node has the
        NVIDIA driver's device (the container's GPUs, in a container; GPUs asked from Slurm), and
        training_env does not set DS_ACCELERATOR=cpu."""
        if self.env.get('DS_ACCELERATOR') == 'cpu':
            return False
        if self.container:
            return bool(self.container.get('gpus'))
        return bool(self.p.get('slurm_gpus_per_node')) or os.path.exists(self.GPU_DEVICE)

    def base_env(self):
        """The environment of what this node starts (the job's own variables come from job.env)."""
        env = dict(os.environ)
        env['PATH'] = '%s:%s' % (self.bin, env.get('PATH', '/usr/bin:/bin'))
        env[pr.JOB_ENV] = self.job_id
        env['MASTER_ADDR'] = self.p['master_addr']
        env['MASTER_PORT'] = str(self.p['master_port'])
        return env

    def shell_prefix(self):
        """Source the env files that exist and the job's environment file, then keep the job's PATH first."""
        parts = ['set -a']
        for path in list(self.p['env_files']) + [self.env_file]:
            parts.append('[ -r %s ] && . %s' % (tr.q(path), tr.q(path)))
        parts.append('set +a')
        parts.append('export PATH=%s:"$PATH"' % tr.q(self.bin))
        return '; '.join(parts) + '; '

    def unreachable_cause(self, item):
        return 'head cannot reach %s over SSH as %s: %s' % (item['node'], self.user, item['cause'])

    # ----- preflight ---------------------------------------------------------------------------
    def leaders(self):
        """What this node started for the job, while its pid file still names it."""
        leader = pr.pidfile_process(self.state_dir, self.job_id, self.proc)
        return [leader] if leader else []

    def processes(self):
        return pr.job_processes(self.job_id, self.uid, self.proc, self.leaders())

    @property
    def ssh_connect_timeout(self):
        """Seconds the head's ssh to a node may take to connect (the ssh_connect_timeout option)."""
        return int(self.p.get('ssh_connect_timeout') or SSH_CONNECT_TIMEOUT)

    def ssh_refusals(self):
        """A line for every node the head cannot log in to over SSH and run `true` on, naming the stage
        that did not finish (launch_failures.probe_refusals); a node that connected and authenticated
        but whose login session or command was slow is probed once more (within a second bound)."""
        targets = [n['name'] for n in self.nodes]
        rc, out, err = self.runner.run(['bash', '-c', lf.ssh_probe_script(targets, self.ssh_connect_timeout)])
        results = lf.parse_ssh_probe(out)
        again = lf.probe_retry_targets(results, targets)
        if again:
            rc, out, err = self.runner.run(['bash', '-c', lf.ssh_probe_script(again, self.ssh_connect_timeout)])
            results.update(lf.parse_ssh_probe(out))
        return lf.probe_refusals(results, targets, self.user, uid=self.uid,
                                 limit=lf.probe_attempt_limit(self.ssh_connect_timeout))

    def memlock_problems(self):
        """podman's --ulimit memlock=-1:-1 only where asked (true or auto) and the account's hard limit
        here allows it: true where it does not is refused naming the node and the limit, auto warns."""
        spec = self.container
        if not spec or spec['runtime'] != 'podman' or spec['memlock'] not in ('true', 'auto') \
                or getattr(self, 'memlock_decided', False):
            return []
        read = getattr(self.runner, 'memlock_hard_limit', None) or cn.read_memlock_hard_limit
        unlimited, refusal, warning = cn.memlock_decision(spec['memlock'], read(), self.me)
        spec['memlock'] = 'true' if unlimited else 'false'
        self.memlock_decided = True
        if warning:
            self.warnings.append(warning)
        return [refusal] if refusal else []

    def check(self):
        """(problems, versions, command line) of this node's part; changes nothing."""
        problems = []
        if self.container and (self.launcher.starts_here() or self.launcher.container_per_rank):
            problems.extend(self.memlock_problems())
        launcher = self.launcher
        binary = launcher.binary()
        python = os.path.join(self.bin, 'python')
        if self.container:
            # the launcher and its Python are in the image: the image is checked instead
            problems.extend(self.image_problems())
            if (launcher.container_per_rank or launcher.schedules) and launcher.starts_here() \
                    and not self.runner.which(binary):
                problems.append('launcher %s is not installed on the host (%s not found)' % (launcher.name, binary))
        else:
            if launcher.starts_here() and not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
                problems.append('launcher %s is not installed (%s not found)' % (launcher.name, binary))
            if not os.path.exists(python):
                problems.append('env_path %s holds no Python environment (%s missing)' % (self.p['env_path'], python))
        if not os.path.isfile(self.p['script']):
            problems.append('script %s does not exist' % self.p['script'])
        # At the start a node whose ranks another node's launcher starts (pdsh, mpirun, srun) may already
        # run them: the preflight (state checked, before anything started) refused leftovers there.
        if (self.p.get('state') != 'started' or launcher.starts_here()) and self.processes():
            problems.append('job %s already has processes here' % self.job_id)
        if self.is_head and not launcher.schedules:
            holders = pr.port_listeners(self.p['master_port'], proc=self.proc)
            if holders:
                problems.append(pr.describe_listeners(self.p['master_port'], holders) +
                                '; stop that job or choose another master_port')
        if self.is_head and launcher.uses_ssh and self.p['ssh_check'] and len(self.nodes) > 0:
            problems.extend(self.ssh_refusals())
        problems.extend(launcher.problems())
        versions = {}
        if self.container and not launcher.schedules:
            versions = {'image': self.image_info.get('id') if self.image_info else None}
        elif self.container:
            versions = {}
        elif os.path.exists(python):
            ds = self.env.get('DS_ACCELERATOR')
            versions, error = self.runner.versions(python, {'DS_ACCELERATOR': ds} if ds else None)
            if error:
                problems.append('cannot read the versions of %s: %s' % (python, error))
            elif not versions.get('torch'):
                problems.append('torch is not installed in %s' % self.p['env_path'])
            versions = dict((k, versions.get(k)) for k in launcher.compared)
        cmd = launcher.command()
        if cmd and self.container and not launcher.container_per_rank:
            cmd = self.in_container(cmd)
        return problems, versions, tr.join(cmd) if cmd else ''

    # ----- containers --------------------------------------------------------------------------
    image_info = None

    def image_problems(self):
        """The runtime is installed and this node has the job's image (the pinned one, when pinned)."""
        spec = self.container
        if self.launcher.schedules and not self.is_head:
            return []
        runtime = 'apptainer' if spec['runtime'] == 'apptainer' and not self.runner.which('apptainer') \
            and self.runner.which('singularity') else spec['runtime']
        if spec['runtime'] == 'enroot':
            # pyxis asks enroot on the compute nodes; a squashfs image must be on the shared storage
            if spec['image'].startswith('/') and not os.path.isfile(spec['image']):
                return ['container image %s does not exist' % spec['image']]
            return []
        if not self.runner.which(runtime):
            return ['container runtime %s is not installed (run site.yml --tags container)' % spec['runtime']]
        if spec['runtime'] != 'podman':
            if not os.path.isfile(spec['image']):
                return ['container image %s does not exist (a SIF file every node sees)' % spec['image']]
            return []
        rc, out, err = self.runner.run(cn.inspect_argv(spec['image']))
        if rc != 0:
            why = ((err or out).strip().splitlines() or ['no such image'])[-1]
            return ['container image %s is not loaded here (podman: %s); load it on every node with site.yml '
                    '--tags container' % (spec['image'], why)]
        try:
            self.image_info = cn.parse_inspect(out)
        except cn.ContainerError as exc:
            return [str(exc)]
        if spec['digest'] and not cn.image_matches(self.image_info, spec['digest']):
            return ['container image %s here is %s, not the pinned %s; load the same image on every node with '
                    'site.yml --tags container' % (spec['image'], self.image_info['id'], spec['digest'])]
        return []

    def env_files_here(self):
        """The env files this node has (the others are skipped by the shell prefix; a mount of one would fail)."""
        return [path for path in self.p['env_files'] if os.path.exists(path)]

    def in_container(self, cmd):
        """This node's launch command inside the job's image."""
        return cn.wrap(self.container, self.job_id, self.me, cmd, self.shell_prefix(), env_files=self.env_files_here(),
                       workdir=self.job_dir, rootless=self.uid != 0, infiniband=os.path.isdir(cn.INFINIBAND))

    def containers(self):
        """[{id, name, state, node}] of the job's containers on this node (podman), by the job's label."""
        if not self.container or self.container['runtime'] != 'podman' or not self.runner.which('podman'):
            return []
        rc, out, err = self.runner.run(cn.ps_argv(self.job_id))
        if rc != 0:
            self.fail('node %s: podman cannot list the containers of job %s: %s'
                      % (self.me, self.job_id, (err or out).strip()[-300:]))
        try:
            return cn.parse_ps(out)
        except cn.ContainerError as exc:
            self.fail('node %s: %s' % (self.me, exc))

    # ----- start -------------------------------------------------------------------------------
    def prepare(self):
        for path in (self.job_dir, self.log_dir, self.rank_log_dir, self.exit_dir, self.flight_dir):
            if path:
                os.makedirs(path, exist_ok=True)
        try:
            pr.private_dir(self.state_dir)
        except pr.ProcessError as exc:
            self.fail('node %s: %s' % (self.me, exc))
        if self.is_head or self.launcher.per_node:
            write_file(self.env_file, tr.env_file_text(self.env), 0o600)
        if self.is_head:
            write_file(self.layout_file, json.dumps(dict((n['name'], n['slots']) for n in self.nodes)) + '\n', 0o644)
        if self.flight_dir:
            # an earlier run of this job id and attempt left its dumps: not this run's
            fr.set_aside(self.job_dir, self.attempt)
        # a job id run again: the last run's log is kept beside (.previous), the new run's starts empty,
        # so the wait for the first step and the failure watch read only this run
        if os.path.isfile(self.log) and os.path.getsize(self.log) > 0:
            os.replace(self.log, self.log + '.previous')
        for path, (content, mode) in self.launcher.files().items():
            write_file(path, content, mode)

    def start(self, spawn=pr.spawn_detached):
        if self.uid != os.geteuid():
            self.fail('node %s: start job %s as its owner %s (become_user), not as uid %d'
                      % (self.me, self.job_id, self.user, os.geteuid()))
        problems, _, _ = self.check()
        if problems:
            self.fail('node %s cannot start job %s: %s' % (self.me, self.job_id, '; '.join(problems)))
        submitted = self.launcher.submit()
        if submitted is not None:
            return submitted
        cmd = self.launcher.command()
        if cmd is None:
            return self.result(changed=False, command='', started=False,
                               msg='the %s launcher on the head starts the ranks of %s' % (self.launcher.name, self.me))
        if self.container and not self.launcher.container_per_rank:
            cmd = self.in_container(cmd)
        if self.runner.check_mode:
            return self.result(changed=True, command=tr.join(cmd), started=False)
        self.prepare()
        try:
            os.unlink(os.path.join(self.exit_dir, self.me))
        except OSError:
            pass
        env = self.launcher.start_env(self.base_env())
        # in a container the env files are sourced inside (the host's copies are mounted there)
        line = ('exec ' if self.container and not self.launcher.container_per_rank else self.shell_prefix() + 'exec ') \
            + tr.join(cmd)
        record = spawn(line, env, self.job_dir, self.log, self.state_dir, job_id=self.job_id,
                       exit_files=[os.path.join(self.exit_dir, self.me)])
        return self.result(changed=True, command=tr.join(cmd), pid=record['pid'], started=True)

    # ----- watch, status, stop -----------------------------------------------------------------
    def exit_codes(self):
        """{node: exit code} of the nodes whose part already ended (from the job directory)."""
        out = {}
        for node in self.nodes:
            text = pr.tail(os.path.join(self.exit_dir, node['name']), 1)
            if text and text[0].strip().lstrip('-').isdigit():
                out[node['name']] = int(text[0].strip())
        return out

    def watch_once(self, step_re):
        """(first_step_line, failures, last_step) from one look at the job: the head's log and every node's exit.
        last_step, with failures only: {line, step} of the last step line of the log when the job logged steps
        before it failed (it started, then failed at that step), else None."""
        text = '\n'.join(pr.tail(self.launcher.watch_log(), BIG))
        failures = self.launcher.failures(text)
        for node, code in self.exit_codes().items():
            if code and node not in [f['node'] for f in failures]:
                what = 'agent' if self.launcher.per_node else 'launcher'
                failures.append({'node': node, 'cause': 'its %s %s exited with code %d' % (self.launcher.name, what, code)})
        if failures:
            return None, failures, last_step_of(text, step_re)
        step = step_re.search(text)
        return (matched_line(text, step) if step else None), [], None

    def watch_log_tail(self):
        """{log, log_tail}: the log the watch reads (the head's) and its last lines."""
        log = self.launcher.watch_log()
        return {'log': log, 'log_tail': pr.tail(log, self.p['log_lines'])}

    def watch(self, timeout, step_regex, poll=1.0, sleep=time.sleep, clock=time.time):
        """Wait (on the head) for the first step line, but return as soon as a node fails or cannot be
        reached: {first_step, elapsed, failures: [{node, cause}], timed_out}."""
        step_re = re.compile(step_regex)
        start = clock()
        while True:
            step, failures, last = self.watch_once(step_re)
            elapsed = round(clock() - start, 1)
            if failures:
                # a job that logged steps and then failed started: it failed at its last step, never "did not start"
                return self.result(changed=False, first_step=None, elapsed=elapsed, failures=failures, timed_out=False,
                                   failed_at_step=last['step'] if last else None,
                                   last_step=last['line'] if last else None, **self.watch_log_tail())
            if step:
                return self.result(changed=False, first_step=step, elapsed=elapsed, failures=[], timed_out=False)
            if self.exit_codes().get(self.me) == 0:
                return self.result(changed=False, first_step=None, elapsed=elapsed, failures=[], timed_out=False)
            if elapsed >= timeout:
                return self.result(changed=False, first_step=None, elapsed=elapsed, failures=[], timed_out=True,
                                   **self.watch_log_tail())
            sleep(poll)

    def wait_end(self, timeout, step_regex, poll=2.0, sleep=time.sleep, clock=time.time):
        """Wait (on the head) for the job's end, at most timeout seconds: {ended, job_failed, elapsed, timed_out,
        last_step}. It ended when a node's part exited non-zero (its exit file in the job directory, or the
        launcher on the head names it), or when the head's part no longer runs and, where every node starts its
        own part (torchrun agents), every node's exit status was written. last_step: the last line of the
        head's log the step regex matches, read once at the return (not at every poll)."""
        start = clock()
        while True:
            out = self.status(errors=False)  # polled: the tracebacks are read by the status read after the wait
            codes = self.exit_codes()
            failed = any(codes.values()) or bool(out.get('node_exit_codes')) or bool(out.get('exit_code'))
            every_node = not self.launcher.per_node or all(n['name'] in codes for n in self.nodes)
            ended = failed or (not out['running'] and every_node)
            elapsed = round(clock() - start, 1)
            if ended or elapsed >= timeout:
                return self.result(changed=False, ended=ended, job_failed=failed, elapsed=elapsed, timed_out=not ended,
                                   running=out['running'], last_step=self.last_step_line(step_regex))
            sleep(poll)

    def last_step_line(self, step_regex, read_bytes=1024 * 1024):
        """The last line of the log the head watches that step_regex matches (its last read_bytes), or None."""
        read = pr.tail_text(self.launcher.watch_log(), read_bytes)
        if read is None:
            return None
        step_re = re.compile(step_regex)
        for line in reversed(read[0].splitlines()):
            if step_re.search(line):
                return line.strip()
        return None

    def status(self, errors=True):
        """This node's part of the job: running, pids, exit code, log tail, the launcher's reads and, with
        errors, the tracebacks of the log (rank_errors: a bounded tail read and parsed)."""
        procs = self.processes()
        out = self.result(changed=False, running=bool(procs), pids=[p['pid'] for p in procs],
                          exit_code=pr.read_exit_code(self.state_dir), log_tail=pr.tail(self.log, self.p['log_lines']))
        if self.container:
            out['containers'] = self.containers()
            out['running'] = out['running'] or any(c['state'] == 'running' for c in out['containers'])
        self.launcher.read_status(out)
        if errors:
            out['errors'] = self.rank_errors(out.get('log') or self.log)
            # the log's last loss line, from more than its tail: the end of a log can be a launcher's
            # shutdown lines (under Slurm, every node's agent in one file)
            out['loss_line'] = mon.log_loss_line(out.get('log') or self.log)
        return out

    def rank_errors(self, log):
        """The tracebacks of the bounded tail of this node's log (rank_errors), a pdsh host named as its node."""
        names = dict((n['address'], n['name']) for n in self.nodes)
        names.update((n['name'], n['name']) for n in self.nodes)
        found = re_.log_errors([log], hosts=list(names))
        for item in found:
            if item.get('host'):
                item['node'] = names.get(item['host'], item['host'])
        return found

    def remove_containers(self, boxes):
        """podman stops the job's containers (SIGTERM, SIGKILL after the grace) and removes them; fails
        naming any that is left."""
        rc, out, err = self.runner.run(cn.rm_argv([c['id'] for c in boxes], self.p['stop_timeout']))
        left = self.containers()
        if left:
            self.fail('node %s: %d container(s) of job %s are left: %s (podman rm: %s)'
                      % (self.me, len(left), self.job_id, ', '.join(c['name'] for c in left),
                         (err or out).strip()[-300:]), removed_containers=[])

    def rank_attempts(self):
        """{rank: attempt} of the job's rank processes on this node (RANK, GPUCLUSTER_ATTEMPT of their
        environment), the newest attempt where one rank has several."""
        out = {}
        for item in self.processes():
            env = pr.read_environ(item['pid'], self.proc)
            if env.get('RANK', '').isdigit():
                rank, attempt = int(env['RANK']), fr.attempt_number(env.get('GPUCLUSTER_ATTEMPT'))
                out[rank] = max(attempt, out.get(rank, 0))
        return out

    def flight_dump(self, timeout, sleep=time.sleep, clock=time.monotonic):
        """Ask the job's ranks on this node for their flight recorder's dump (flight_recorder.request_dumps)
        and wait for it, at most timeout seconds; their attempt is the newest their processes carry."""
        ranks = self.rank_attempts()
        attempt = max(ranks.values()) if ranks else fr.newest_attempt(self.job_dir)
        out = fr.request_dumps(self.job_dir, attempt, [r for r, a in ranks.items() if a == attempt], timeout,
                               sleep=sleep, clock=clock)
        out['flight_attempt'] = attempt
        return out

    def stop(self, sleep=time.sleep, clock=time.time, flight_dump=False, flight_dump_timeout=20, slurm_hold=False):
        # the hang explained before the stop: the ranks' dumps of the collectives they are in, asked first
        dumped = {}
        if flight_dump and not self.runner.check_mode:
            dumped = self.flight_dump(flight_dump_timeout, sleep=sleep, clock=clock)
        procs = self.processes()
        sid = self.launcher.scheduled()
        boxes = self.containers()
        if self.runner.check_mode:
            return self.result(changed=bool(procs) or bool(sid) or bool(boxes), running=bool(procs),
                               stopped_pids=[p['pid'] for p in procs], removed_containers=[c['name'] for c in boxes])
        if boxes:
            self.remove_containers(boxes)
        held = self.launcher.unschedule(sid, sleep, hold=slurm_hold) if sid else None
        # the launcher's daemons that started the job's ranks here, found before the first signal
        daemons = daemons_of(procs, self.launcher.daemons, self.uid, self.proc)
        outcome = pr.stop_job(self.job_id, self.uid, grace=self.p['stop_timeout'], proc=self.proc,
                              leaders=self.leaders(), sleep=sleep, clock=clock, daemons=daemons)
        # a podman run stopped while it was making its container leaves that container behind (created,
        # never started): the job's label finds it once its processes are gone
        late = self.containers()
        if late:
            self.remove_containers(late)
            boxes = list(boxes) + late
        if outcome['left']:
            refused = ', '.join('%s (%s)' % (r['pid'], r['reason']) for r in outcome['refused'])
            self.fail('node %s: %d process(es) of job %s are left: %s%s'
                      % (self.me, len(outcome['left']), self.job_id, ', '.join(str(p['pid']) for p in outcome['left']),
                         '; the kernel refused to signal %s' % refused if refused else ' (they survived SIGKILL for %d s)' % pr.KILL_WAIT_SECONDS),
                      stopped_pids=outcome['signalled'], refused=outcome['refused'], **dumped)
        if held is not None:
            dumped = dict(dumped, slurm_job_id=sid, slurm_held=held)
        return self.result(changed=bool(outcome['signalled']) or bool(sid) or bool(boxes), running=False,
                           stopped_pids=outcome['signalled'], refused=outcome['refused'],
                           removed_containers=[c['name'] for c in boxes], **dumped)
