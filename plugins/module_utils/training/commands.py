# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Command lines, sbatch scripts and checks for starting training through real launchers.

Pure functions: the module that uses them runs them on each node; the unit tests run them
on plain data.
"""

from __future__ import annotations

import json
import re
import shlex
import signal

from ansible_collections.gpucluster.multinode.plugins.module_utils.processes import JOB_ENV

# A job id names the job's directory (<training_jobs_dir>/<id>), its units and its processes' label:
# a plain name, never '.', '..' or a path. The one rule: the module's check_job_id, and train.yml's
# validation through the job_id test (plugins/test/training.py).
JOB_ID_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$')
JOB_ID_RULE = '1-64 letters, digits, ".", "_" or "-", starting with a letter or digit'
# nccl/gloo and launcher variables that mpirun must forward with -x
FORWARD_PREFIXES = ('NCCL_', 'GLOO_', 'TORCH_', 'DS_', 'OMP_', 'CUDA_', 'PYTHON', 'MASTER_', 'GPUCLUSTER_')


class TrainingError(ValueError):
    """A problem with the job's inputs, worded for the user."""


def q(value):
    return shlex.quote(str(value))


def join(argv):
    return ' '.join(q(a) for a in argv)


def is_job_id(job_id):
    """True when job_id is text that is a plain job name (JOB_ID_RE, the whole text: a trailing newline too is refused)."""
    return isinstance(job_id, str) and JOB_ID_RE.fullmatch(job_id) is not None


def check_job_id(job_id):
    if not is_job_id(str(job_id or '')):
        raise TrainingError('job_id %r must be %s' % (job_id, JOB_ID_RULE))
    return str(job_id)


def load_deepspeed_config(config):
    """A DeepSpeed config from a dict, a JSON string or file text; fails when batch settings are missing."""
    if isinstance(config, dict):
        data = config
    else:
        try:
            data = json.loads(config)
        except ValueError as exc:
            raise TrainingError('deepspeed_config is not valid JSON: %s' % exc) from exc
        if not isinstance(data, dict):
            raise TrainingError('deepspeed_config must be a JSON object, got %s' % type(data).__name__)
    batch_keys = ('train_batch_size', 'train_micro_batch_size_per_gpu')
    if not any(k in data for k in batch_keys):
        raise TrainingError('deepspeed_config has no batch settings: set train_batch_size or '
                            'train_micro_batch_size_per_gpu')
    return data


def deepspeed_command(bin_dir, hostfile, master_addr, master_port, script, script_args=(),
                      launcher='pdsh', rank_log_dir=None, num_nodes=None, include=None, exclude=None,
                      launcher_args=None):
    """The deepspeed launcher line run on the head."""
    argv = ['%s/deepspeed' % bin_dir.rstrip('/'), '--hostfile', hostfile, '--launcher', launcher,
            '--master_addr', master_addr, '--master_port', str(master_port)]
    if num_nodes:
        argv += ['--num_nodes', str(num_nodes)]
    if include:
        argv += ['--include', include]
    if exclude:
        argv += ['--exclude', exclude]
    if rank_log_dir:
        argv += ['--enable_each_rank_log', rank_log_dir]
    if launcher_args:
        argv += ['--launcher_args', launcher_args]
    return argv + [script] + list(script_args)


def torchrun_command(bin_dir, nnodes, nproc_per_node, rdzv_host, rdzv_port, job_id, script, script_args=(),
                     log_dir=None, max_restarts=0, node_rank=None, local_addr=None):
    """One torchrun agent's line (c10d rendezvous on the head). local_addr is the address the
    node's agent and rank 0's store advertise: the cluster address, so names need not resolve."""
    argv = ['%s/torchrun' % bin_dir.rstrip('/'), '--nnodes', str(nnodes), '--nproc-per-node', str(nproc_per_node),
            '--rdzv-backend', 'c10d', '--rdzv-endpoint', '%s:%s' % (rdzv_host, rdzv_port),
            '--rdzv-id', job_id, '--max-restarts', str(max_restarts)]
    if local_addr:
        argv += ['--local-addr', local_addr]
    if node_rank is not None:
        argv += ['--node-rank', str(node_rank)]
    if log_dir:
        argv += ['--log-dir', log_dir, '--redirects', '3', '--tee', '3']
    return argv + [script] + list(script_args)


# Open MPI gives each rank OMPI_COMM_WORLD_*; torch.distributed (env://) and DeepSpeed read these.
MPI_RANK_ENV = ('export RANK="$OMPI_COMM_WORLD_RANK" LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" '
                'WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"; ')


def mpirun_command(bin_dir, hostfile, nprocs, env_names, script, script_args=(), mpirun='mpirun',
                   extra_args=(), node_prefix='', ssh_args=''):
    """Open MPI's line on the head: the hostfile's slots filled node after node (each node its own
    count, nprocs their sum), -x for every variable forwarded, ssh_args for Open MPI's ssh to the
    nodes. Each rank starts through bash, which sources node_prefix (the node's own env files, so
    per-node NIC names win) and maps Open MPI's rank variables to RANK, LOCAL_RANK, WORLD_SIZE."""
    argv = [mpirun, '--hostfile', hostfile, '-np', str(nprocs), '--map-by', 'slot', '--bind-to', 'none']
    if ssh_args:
        argv += ['--mca', 'plm_rsh_args', ssh_args]
    for name in sorted(set(env_names)):
        argv += ['-x', name]
    argv += list(extra_args)
    wrapper = node_prefix + MPI_RANK_ENV + 'exec "$0" "$@"'
    return argv + ['/bin/bash', '-c', wrapper, '%s/python' % bin_dir.rstrip('/'), script] + list(script_args)


MPIRUN_SIGNAL_RE = re.compile(r'mpirun noticed that process rank (?P<rank>\d+) with PID \d+ on node (?P<node>\S+) '
                              r'exited on signal (?P<sig>\d+)')
MPIRUN_EXIT_RE = re.compile(r'The first process to do so was:\s*Process name:\s*\[\[\d+,\d+\],(?P<rank>\d+)\]\s*'
                            r'Exit code:\s*(?P<code>\d+)')


def mpirun_failure(text):
    """{rank, node, exit_code} of the first failed rank as mpirun reports it (node is None when
    mpirun names only the rank); None when the output holds no such report."""
    match = MPIRUN_SIGNAL_RE.search(text or '')
    if match:
        return {'rank': int(match.group('rank')), 'node': match.group('node').rstrip('.'),
                'exit_code': 128 + int(match.group('sig'))}
    match = MPIRUN_EXIT_RE.search(text or '')
    if match:
        return {'rank': int(match.group('rank')), 'node': None, 'exit_code': int(match.group('code'))}
    return None


def forwarded_env_names(env):
    return [k for k in env if k == 'PATH' or k == 'LD_LIBRARY_PATH' or k.startswith(FORWARD_PREFIXES)]


SBATCH_TEMPLATE = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
{gpus_line}#SBATCH --cpus-per-task={cpus}
#SBATCH --time={time}
{partition_line}{requeue_line}#SBATCH --output={log_dir}/%x-%j.out
#SBATCH --error={log_dir}/%x-%j.out
set -euo pipefail
export {job_env}={job_id}
{exports}
{attempt_lines}# A node's address as slurm.conf gives it (NodeAddr): names need not resolve between nodes.
node_addr() {{ scontrol show node "$1" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p'; }}
export -f node_addr
# Nodes of this allocation, in order: the hostfile and the master (the first) come from Slurm.
scontrol show hostnames "$SLURM_JOB_NODELIST" > {hostfile}
MASTER_ADDR=$(node_addr "$(head -n 1 {hostfile})")
export MASTER_ADDR MASTER_PORT={master_port}
echo "job {job_id}: slurm job $SLURM_JOB_ID on $(paste -sd, {hostfile}), master $MASTER_ADDR:$MASTER_PORT"
{launch}
"""


SLURM_TIME_RE = re.compile(r'^(?:UNLIMITED|INFINITE|[0-9]+(?:-[0-9]{1,2})?(?::[0-9]{1,2}){0,2})$')
SLURM_PARTITION_RE = re.compile(r'^[A-Za-z0-9_.-]{1,64}$')
ENV_NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')


def check_slurm_settings(time_limit, partition=None):
    """Refuse a Slurm time or partition that would not stay one #SBATCH line (newline, ';', spaces)."""
    if not SLURM_TIME_RE.match(str(time_limit)):
        raise TrainingError('slurm_time %r is not a Slurm time (minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]], '
                            'UNLIMITED)' % (time_limit,))
    if partition and not SLURM_PARTITION_RE.match(str(partition)):
        raise TrainingError('slurm_partition %r may hold only letters, digits, ".", "_" and "-"' % (partition,))


def check_env(env):
    """Refuse environment names that are not shell names (values are always quoted)."""
    for key in env or {}:
        if not ENV_NAME_RE.match(str(key)):
            raise TrainingError('env name %r is not a valid variable name (letters, digits and "_", not '
                                'starting with a digit)' % (key,))
    return {str(k): str(v) for k, v in (env or {}).items()}


# Which values of the job's environment are kept out of every task output (AnsibleModule's
# no_log_values). A value there is masked wherever it appears in the result, so masking a short
# setting such as DS_ACCELERATOR=cpu would turn the version 2.13.0+cpu into 2.13.0+********: the
# settings of the launchers and libraries are shown, secrets are not.
SECRET_WORDS = frozenset(('TOKEN', 'KEY', 'SECRET', 'PASSWORD', 'PASSWD', 'PASS', 'CREDENTIAL', 'CREDENTIALS',
                          'AUTH', 'COOKIE', 'PRIVATE', 'SESSION', 'SIGNATURE'))
SETTING_PREFIXES = ('DS_', 'NCCL_', 'GLOO_', 'TORCH_', 'TORCHELASTIC_', 'PYTORCH_', 'OMP_', 'MKL_', 'CUDA_',
                    'NVIDIA_', 'UCX_', 'FI_', 'TOKENIZERS_', 'HF_HOME', 'TRANSFORMERS_CACHE', 'PYTHON')
SECRET_MIN_LENGTH = 6


def secret_env_values(env):
    """The values of env to mask: every value whose name has a secret word in it (HF_TOKEN,
    WANDB_API_KEY, AWS_SECRET_ACCESS_KEY), and every value of SECRET_MIN_LENGTH characters or more
    of a name that is not a known setting (secure by default); never a value of a known setting
    (DS_ACCELERATOR, NCCL_*, GLOO_*, ...) unless its name has a secret word."""
    out = set()
    for key, value in (env or {}).items():
        key, value = str(key).upper(), str(value)
        if not value:
            continue
        secret = bool(SECRET_WORDS.intersection(key.split('_')))
        setting = key.startswith(SETTING_PREFIXES)
        if secret or (not setting and len(value) >= SECRET_MIN_LENGTH):
            out.add(value)
    return out


def env_file_text(env):
    """The job's environment file: one `export NAME='value'` line per variable, values quoted for
    the shell (a newline or ';' in a value stays inside the quotes)."""
    return ''.join('export %s=%s\n' % (k, q(v)) for k, v in sorted(check_env(env).items()))


# A requeued job (scontrol requeue/requeuehold, SLURM_RESTART_COUNT 1, 2, ...) runs the script Slurm
# stored at submission again: its attempt is SLURM_RESTART_COUNT + 1, its output goes to a file of that
# attempt's own (the first attempt's, Slurm's file, kept by --open-mode=append), and the launch line is read from
# the job directory at run time, so that a restart runs with what the restart wrote (resume, nodes).
REQUEUE_ATTEMPT_LINES = """export GPUCLUSTER_ATTEMPT=$(( ${{SLURM_RESTART_COUNT:-0}} + 1 ))
if [ "$GPUCLUSTER_ATTEMPT" -gt 1 ]; then exec >>{attempt_log} 2>&1; fi
"""


def slurm_attempt_log(log_dir, name, slurm_id, attempt):
    """The batch output of one attempt of a Slurm job: Slurm's own file for the first, then one per requeue."""
    base = '%s/%s-%s' % (str(log_dir).rstrip('/'), name, slurm_id)
    return base + ('.out' if int(attempt) <= 1 else '.attempt%d.out' % int(attempt))


def sbatch_script(job_id, nodes, gpus_per_node, time_limit, log_dir, hostfile, master_port, launch_line,
                  partition=None, cpus_per_task=1, env_file=None, name=None, requeue_launch_file=None):
    """The sbatch script: allocation, hostfile from scontrol, master address, then the launch line.
    The job's environment is sourced from env_file (mode 0600) so no value lands in the script.

    requeue_launch_file: the job may be requeued (#SBATCH --requeue); each run sources its launch line from
    this file (written beside, launch_line is then not in the script) as attempt SLURM_RESTART_COUNT + 1."""
    check_slurm_settings(time_limit, partition)
    exports = ('set -a; . %s; set +a' % q(env_file)) if env_file else ''
    attempt_lines = ''
    if requeue_launch_file:
        log = (q('%s/%s-' % (str(log_dir).rstrip('/'), name or job_id)) + '"$SLURM_JOB_ID"' + '.attempt'
               + '"$GPUCLUSTER_ATTEMPT"' + '.out')
        attempt_lines = REQUEUE_ATTEMPT_LINES.format(attempt_log=log)
        launch_line = '. %s' % q(requeue_launch_file)
    return SBATCH_TEMPLATE.format(
        name=name or job_id, nodes=int(nodes), cpus=int(cpus_per_task), time=time_limit, log_dir=log_dir,
        gpus_line='#SBATCH --gpus-per-node=%d\n' % gpus_per_node if gpus_per_node else '',
        partition_line='#SBATCH --partition=%s\n' % partition if partition else '',
        # --open-mode=append: a requeued run would truncate the first attempt's output otherwise
        requeue_line='#SBATCH --requeue\n#SBATCH --open-mode=append\n' if requeue_launch_file else '',
        attempt_lines=attempt_lines,
        job_env=JOB_ENV, job_id=q(job_id), exports=exports, hostfile=q(hostfile),
        master_port=int(master_port), launch=launch_line)


def slurm_launch_line(launcher, bin_dir, nproc_per_node, job_id, script, script_args=(), log_dir=None,
                      node_prefix=''):
    """What the sbatch script runs: one torchrun agent per node through srun, c10d on the first node.

    nproc_per_node: one count for every node, or {node name: count} (each node its own, read from
    $SLURMD_NODENAME). Each node's agent sources node_prefix (its own env files), advertises its
    own NodeAddr and logs its ranks under log_dir/<node>."""
    if launcher != 'torchrun':
        raise TrainingError('slurm_launcher must be torchrun, got %r' % launcher)
    agent = torchrun_command(bin_dir, '__NNODES__', '__NPROC__', '__MASTER__', '', job_id, script, script_args,
                             log_dir=(log_dir.rstrip('/') + '/__NODE__') if log_dir else None,
                             local_addr='__LOCAL__')
    line = join(agent)
    line = line.replace(q('__NNODES__'), '"$SLURM_NNODES"').replace(q('__MASTER__:'), '"$MASTER_ADDR:$MASTER_PORT"')
    line = line.replace(q('__LOCAL__'), '"$(node_addr "$SLURMD_NODENAME")"')
    if log_dir:
        line = line.replace(q(log_dir.rstrip('/') + '/__NODE__'), q(log_dir.rstrip('/') + '/') + '"$SLURMD_NODENAME"')
    if isinstance(nproc_per_node, dict):
        cases = ' '.join('%s) n=%d;;' % (q(name), int(count)) for name, count in nproc_per_node.items())
        pick = 'case "$SLURMD_NODENAME" in %s *) n=1;; esac; ' % cases
        line = line.replace(q('__NPROC__'), '"$n"')
    else:
        pick = ''
        line = line.replace(q('__NPROC__'), str(int(nproc_per_node)))
    body = node_prefix + pick + 'exec ' + line
    # the counts from the allocation, not from SLURM_NTASKS: a requeued job keeps the environment of its
    # submission, whose task count no longer fits when it was released on fewer nodes
    return ('srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 '
            '--kill-on-bad-exit=1 bash -c ' + q(body))


PDSH_EXIT_RE = re.compile(r'^pdsh@[^:]+: (?P<host>[^:\s]+): ssh exited with exit code (?P<code>\d+)', re.M)


def pdsh_exit_codes(text):
    """{host: code} from the 'ssh exited with exit code N' lines pdsh prints for failed hosts."""
    return {m.group('host'): int(m.group('code')) for m in PDSH_EXIT_RE.finditer(text or '')}


def pdsh_node_tails(text, hosts, lines=20):
    """{host: [last lines]} of what each host printed through pdsh ('host: text' lines)."""
    out = {}
    for line in (text or '').splitlines():
        host, sep, rest = line.partition(': ')
        if sep and host in hosts:
            out.setdefault(host, []).append(rest)
        elif line.startswith('pdsh@'):
            match = PDSH_EXIT_RE.match(line)
            if match:
                out.setdefault(match.group('host'), []).append(line)
    return {h: v[-lines:] for h, v in out.items()}


TORCHRUN_FAILURE_RE = re.compile(
    r'Root Cause \(first observed failure\):\s*\[\d+\]:\s*'
    r'time\s*:\s*(?P<time>\S+)\s*host\s*:\s*(?P<host>\S+)\s*'
    r'rank\s*:\s*(?P<rank>\d+)[^\n]*\s*exitcode\s*:\s*(?P<code>-?\d+)(?P<rest>[^\n]*)')


def torchrun_failure(text):
    """The 'Root Cause (first observed failure)' of torchrun's error report: time, host, rank,
    exit code and signal name (None when the log has no report)."""
    found = None
    for match in TORCHRUN_FAILURE_RE.finditer(text or ''):
        found = match
    if not found:
        return None
    signame = re.search(r'\((SIG[A-Z0-9]+)\)', found.group('rest'))
    return {'time': found.group('time'), 'host': found.group('host'), 'rank': int(found.group('rank')),
            'exit_code': int(found.group('code')), 'signal': signame.group(1) if signame else None}


# DeepSpeed's launch.py (one per node, through pdsh on the head) when one of its ranks exited non-zero:
# "<host>: [2026-11-25 22:52:37,123] [ERROR] [launch.py:259:sigkill_handler] [...] exits with return code = -9"
DS_LAUNCH_EXIT_RE = re.compile(r'^(?P<host>[^\s:]+): \[(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\] \[ERROR\] '
                               r'\[launch\.py:\d+:sigkill_handler\] .* exits with return code = (?P<code>-?\d+)\s*$', re.M)


def deepspeed_rank_failure(text):
    """{time, host, exit_code, signal} of the node whose DeepSpeed launcher first reported a rank's non-zero
    exit, from the pdsh lines in the head's log (the other nodes' ranks fail after it, when their peer is
    gone); a rank ended by a signal (a negative code) wins a tie. None when no node reported one."""
    found = []
    for match in DS_LAUNCH_EXIT_RE.finditer(text or ''):
        code = int(match.group('code'))
        if code:
            found.append((match.group('time'), 0 if code < 0 else 1, match.group('host'), code))
    if not found:
        return None
    when, _, host, code = min(found)
    try:
        name = signal.Signals(-code).name if code < 0 else None
    except ValueError:
        name = None
    return {'time': when, 'host': host, 'exit_code': code, 'signal': name}
