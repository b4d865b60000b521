# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Training inside one container image: the command lines that put a node's launch command into
the image, and the readers of what the runtime reports.

A wrapping layer: the launchers build their command as for a host environment, and the functions
here turn it into ``podman run`` (SSH clusters), ``apptainer exec`` (Apptainer or Singularity) or
the ``srun --container-image`` line of pyxis/enroot (Slurm). Every container of a job carries the
label ``gpucluster.job=<job id>``; a stop finds them by that label, never by a name pattern.

Pure functions: the module runs them on each node, the unit tests on plain data.
"""

from __future__ import annotations

import json
import re
import resource
import tarfile

from ansible_collections.gpucluster.multinode.plugins.module_utils.processes import JOB_ENV
from ansible_collections.gpucluster.multinode.plugins.module_utils.training.commands import join, q

RUNTIMES = ('podman', 'apptainer', 'singularity', 'enroot')
# what an SSH launcher (torchrun, deepspeed, mpirun) can start on a node; enroot runs through pyxis
SSH_RUNTIMES = ('podman', 'apptainer', 'singularity')
JOB_LABEL = 'gpucluster.job'
NODE_LABEL = 'gpucluster.node'
CDI_ALL_GPUS = 'nvidia.com/gpu=all'
# where nvidia-ctk writes the CDI spec podman reads
CDI_SPECS = ('/etc/cdi/nvidia.yaml', '/var/run/cdi/nvidia.yaml')
INFINIBAND = '/dev/infiniband'
# the variables every container of a job gets from the host (the rest comes from the env files)
BASE_ENV = (JOB_ENV, 'MASTER_ADDR', 'MASTER_PORT')
MPI_RANK_ENV = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE')
IMAGE_ID_RE = re.compile(r'^(sha256:)?[0-9a-f]{64}$')
# What the image carries (the recipe writes both): DeepSpeed's ops built at image build time, in a
# directory every container may write to (its own copy: podman's container layer, Apptainer's
# --writable-tmpfs, pyxis' --container-writable), and the record of what was built there.
IMAGE_OPS_DIR = '/opt/gpucluster/torch_extensions'
IMAGE_OPS_STAMP = '/etc/gpucluster/deepspeed-ops.json'
# The caches a job writes, all under its own cache directory (<job dir>/cache/<node>): never the
# account's home, which no container of a job sees.
CACHE_ENV = (('HOME', ''), ('XDG_CACHE_HOME', '/.cache'), ('TRITON_CACHE_DIR', '/.cache/triton'),
             ('PIP_CACHE_DIR', '/.cache/pip'), ('TORCHINDUCTOR_CACHE_DIR', '/.cache/torchinductor'))
# enroot's NVIDIA hook (and nvidia-container-cli under Apptainer's --nvccli) gives no GPU without
# NVIDIA_VISIBLE_DEVICES, and only nvidia-smi (utility) without compute in the capabilities
NVIDIA_ENV = (('NVIDIA_VISIBLE_DEVICES', 'all'), ('NVIDIA_DRIVER_CAPABILITIES', 'compute,utility'))
EXPECT_GPUS_ENV = 'GPUCLUSTER_EXPECT_GPUS'
MEMLOCK_CHOICES = ('auto', 'true', 'false')


class ContainerError(ValueError):
    """A problem with the container settings, worded for the user."""


def check_spec(spec):
    """The container settings of a job, checked; None when the job runs on the host."""
    if not spec or (spec.get('runtime') or 'none') == 'none':
        return None
    runtime = spec.get('runtime')
    if runtime not in RUNTIMES:
        raise ContainerError('container runtime %r is not one of %s' % (runtime, ', '.join(RUNTIMES + ('none',))))
    image = str(spec.get('image') or '')
    if not image:
        raise ContainerError('container image is empty: name the image (podman), the SIF file (apptainer) '
                             'or the squashfs file or image (enroot)')
    mounts = [str(m) for m in spec.get('mounts') or []]
    for path in mounts:
        if not path.startswith('/') or ':' in path or ',' in path:
            raise ContainerError('container mount %r must be an absolute path without ":" or ","; it is mounted '
                                 'at the same path inside' % path)
    conflicts = extra_args_conflicts(runtime, spec.get('extra_args'), 'container extra_args',
                                     memlock=spec.get('memlock', True) is not False)
    if conflicts:
        raise ContainerError('; '.join(conflicts))
    gpus = spec.get('gpus')
    memlock = spec.get('memlock', 'auto')
    memlock = {True: 'true', False: 'false', None: 'auto'}.get(memlock, str(memlock).lower())
    memlock = {'yes': 'true', 'no': 'false', 'on': 'true', 'off': 'false', '1': 'true', '0': 'false'}.get(memlock, memlock)
    if memlock not in MEMLOCK_CHOICES:
        raise ContainerError('container memlock %r is not one of %s' % (spec.get('memlock'), ', '.join(MEMLOCK_CHOICES)))
    return dict(runtime=runtime, image=image, mounts=mounts, gpus=None if gpus is None else bool(gpus),
                devices=[str(d) for d in spec.get('devices') or []], memlock=memlock,
                extra_args=[str(a) for a in spec.get('extra_args') or []], digest=str(spec.get('digest') or ''),
                expect_gpus=0, cache_dir='')


def memlock_decision(wanted, hard_limit, node):
    """(unlimited, refusal, warning) for ``--ulimit memlock=-1:-1``: asked for (``true``) or ``auto``,
    and the account's hard limit on the node (bytes, or None for unlimited) allows it. ``true`` where
    the hard limit is lower is refused (every rootless podman run fails there with ``setrlimit
    RLIMIT_MEMLOCK: Operation not permitted``); ``auto`` keeps the default limit and warns."""
    if wanted == 'false':
        return False, None, None
    if hard_limit is None:
        return True, None, None
    limit = '%d KiB' % (hard_limit // 1024)
    if wanted == 'true':
        return False, ('node %s: training_container_memlock is true but the hard memlock limit of the training '
                       'account is %s here, so podman run --ulimit memlock=-1:-1 would fail; raise it '
                       '(container_memlock_unlimited, then a new login of the account) or set '
                       'training_container_memlock to auto or false' % (node, limit)), None
    return False, None, ('node %s: the hard memlock limit of the training account is %s, not unlimited: the '
                         'containers keep it (RDMA may fall back to TCP); container_memlock_unlimited raises it'
                         % (node, limit))


def read_memlock_hard_limit():
    """This process' hard RLIMIT_MEMLOCK in bytes, None when unlimited (what a job started from here gets)."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def cache_env_lines(cache_dir):
    """[(name, value)] of the caches of a job's container, under cache_dir (a shell word)."""
    return [(name, cache_dir + ('"%s"' % tail if tail else '')) for name, tail in CACHE_ENV]


def sealed_prefix(spec, cache_dir):
    """The inner shell's first words: the caches under the job's own cache directory (cache_dir, a
    shell word: a quoted path, or one ending in a variable), created; DeepSpeed's extensions from
    the image's prebuilt directory (a job-private one where an older image has none); the GPUs the
    job expects (the examples refuse to fall back to the CPU then)."""
    words = ['%s=%s' % kv for kv in cache_env_lines(cache_dir)]
    if spec.get('expect_gpus'):
        words.append('%s=%d' % (EXPECT_GPUS_ENV, spec['expect_gpus']))
    return ('export %s; mkdir -p "$XDG_CACHE_HOME"; if [ -d %s ] && [ -w %s ]; then export TORCH_EXTENSIONS_DIR=%s; '
            'else export TORCH_EXTENSIONS_DIR="$XDG_CACHE_HOME/torch_extensions"; fi; '
            % (' '.join(words), IMAGE_OPS_DIR, IMAGE_OPS_DIR, IMAGE_OPS_DIR))


def job_cache_dir(job_dir, who, tag=''):
    """<job dir>/cache/<tag><who> as a shell word (who: a node name, or a word such as "$SLURMD_NODENAME")."""
    base = job_dir.rstrip('/') + '/cache/' + tag
    if who.startswith('"$'):
        return q(base) + who
    return q(base + re.sub(r'[^A-Za-z0-9_.-]', '-', who))


def container_name(job_id, node):
    """The container of a node's part of a job (a name for people; stop goes by the label)."""
    return 'gpucluster-%s-%s' % (job_id, re.sub(r'[^A-Za-z0-9_.-]', '-', node))


def labels(job_id, node=None):
    out = ['--label', '%s=%s' % (JOB_LABEL, job_id)]
    if node:
        out += ['--label', '%s=%s' % (NODE_LABEL, node)]
    return out


def podman_run_argv(spec, job_id, inner, node=None, env_names=(), env_files=(), workdir=None, rootless=True,
                    infiniband=False):
    """``podman run`` of ``inner`` (an argv) in the image: host network and IPC (NCCL sees the host's
    interfaces and /dev/shm), the GPUs through CDI, /dev/infiniband where the node has it, unlimited
    memlock where it was decided so (memlock_decision), each mount at the same path, the job
    directory, the env files read-only at their own path, the job's variables, and the job's label
    (and the node's, with a name) so a stop finds it by the job id. Nothing else of the host: not the
    account's home (the caches go to the job's cache directory, sealed_prefix)."""
    argv = ['podman', 'run', '--rm']
    if node:
        argv += ['--name', container_name(job_id, node)]
    argv += labels(job_id, node)
    argv += ['--network', 'host', '--ipc', 'host', '--security-opt', 'label=disable']
    if rootless:
        argv += ['--userns', 'keep-id']
    if spec['memlock'] == 'true':
        argv += ['--ulimit', 'memlock=-1:-1']
    if spec['gpus']:
        argv += ['--device', CDI_ALL_GPUS]
    if infiniband:
        argv += ['--device', INFINIBAND]
    for device in spec['devices']:
        argv += ['--device', device]
    for path in spec['mounts'] + outside_mounts(spec, [workdir] if workdir else []):
        argv += ['--volume', '%s:%s' % (path, path)]
    for path in outside_mounts(spec, env_files):
        argv += ['--volume', '%s:%s:ro' % (path, path)]
    for name in list(BASE_ENV) + [n for n in env_names if n not in BASE_ENV]:
        argv += ['--env', name]
    if workdir:
        argv += ['--workdir', workdir]
    return argv + spec['extra_args'] + [spec['image']] + list(inner)


def outside_mounts(spec, paths):
    """The paths not already under one of the mounts (env files from /etc/profile.d, say)."""
    return [p for p in paths if not any(p == m or p.startswith(m.rstrip('/') + '/') for m in spec['mounts'])]


def apptainer_exec_argv(spec, inner, infiniband=False, env_files=(), workdir=None):
    """``apptainer exec`` (or ``singularity exec``) of ``inner``: the host's network, IPC and
    processes are the container's already; --no-home keeps the account's home out (Apptainer mounts
    it by default), --writable-tmpfs gives the job its own writable copy of the image (the prebuilt
    DeepSpeed ops); --nv brings the GPUs, with NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES
    in its environment (--nvccli reads them); --bind the mounts and the job directory at the same
    path (/dev is the host's, InfiniBand included); the environment passes through."""
    argv = []
    if spec['gpus']:
        argv += ['env'] + ['%s=%s' % kv for kv in NVIDIA_ENV]
    argv += [spec['runtime'] if spec['runtime'] == 'singularity' else 'apptainer', 'exec', '--no-home',
             '--writable-tmpfs']
    if spec['gpus']:
        argv.append('--nv')
    binds = ['%s:%s' % (p, p) for p in spec['mounts'] + outside_mounts(spec, [workdir] if workdir else [])]
    if infiniband:
        binds.append('%s:%s' % (INFINIBAND, INFINIBAND))
    binds += ['%s:%s:ro' % (p, p) for p in outside_mounts(spec, env_files)]
    if binds:
        argv += ['--bind', ','.join(binds)]
    return argv + spec['extra_args'] + [spec['image']] + list(inner)


def pyxis_srun_args(spec, job_id, env_files=(), workdir=None):
    """The options pyxis adds to srun so each task runs in the enroot image: the image (a squashfs
    file on shared storage, or a registry reference), imported for every run: no --container-name,
    since pyxis keeps a named container (across Slurm jobs with container_scope=global) and starts it
    again without importing, i.e. another image than the pinned one; an unnamed container is removed
    when its task ends. Not the account's home (pyxis mounts it unless --no-container-mount-home), a
    writable root file system (the job's own copy: the prebuilt DeepSpeed ops), the account's own
    uid, the mounts and the job directory at the same path."""
    argv = ['--container-image=%s' % spec['image'], '--no-container-mount-home', '--container-writable',
            '--no-container-remap-root']
    mounts = ['%s:%s' % (p, p) for p in spec['mounts'] + outside_mounts(spec, [workdir] if workdir else [])]
    mounts += ['%s:%s:ro' % (p, p) for p in outside_mounts(spec, env_files)]
    if mounts:
        argv.append('--container-mounts=%s' % ','.join(mounts))
    return argv + spec['extra_args']


# What the runtime's line above sets that the job's extra arguments must leave alone, one row per
# option: the runtimes whose line sets it, its spellings, whether it takes a value, the values that
# conflict (a regex; None: any use of it does), what the line sets and why the job needs it.
# Everything else (more --device, --env, --volume, --security-opt, apptainer's --writable-tmpfs...)
# is passed through as given.
EXTRA_ARG_CONFLICTS = (
    (('podman',), ('--network', '--net'), True, None, '--network host',
     'every launcher needs (ranks reach each other on the cluster addresses; podman takes no second --network)'),
    (('podman',), ('--ipc',), True, r'^(?!host$)', '--ipc host', 'NCCL needs (the ranks of a node share /dev/shm)'),
    (('podman',), ('--userns',), True, r'^(?!keep-id$)', '--userns keep-id',
     'a rootless job needs (its files on the shared storage keep the account\'s uid)'),
    (('podman',), ('--name',), True, None, '--name gpucluster-<job>-<node>',
     'names each node\'s container of the job (one name would clash between the containers of a node)'),
    (('podman',), ('--label', '-l'), True, r'^%s=|^%s=' % (re.escape(JOB_LABEL), re.escape(NODE_LABEL)),
     '--label %s=<job id>' % JOB_LABEL, 'status and stop find the job\'s containers by'),
    (('podman',), ('--workdir', '-w'), True, None, '--workdir <job directory>',
     'every rank starts in (relative paths land in the job directory)'),
    (('podman',), ('--detach', '-d'), False, r'^(?!false$)', 'a container in the foreground',
     'the launcher waits on (a detached container reads as a finished job)'),
    (('podman',), ('--ulimit',), True, r'^memlock=', '--ulimit memlock=-1:-1 (training_container_memlock)',
     'RDMA registers memory with; set training_container_memlock instead'),
    (('apptainer', 'singularity'), ('--net', '-n', '--network', '--network-args'), None, None,
     'the host network', 'every launcher needs (ranks reach each other on the cluster addresses)'),
    (('apptainer', 'singularity'), ('--ipc', '-i'), False, None, 'the host IPC namespace',
     'NCCL needs (the ranks of a node share /dev/shm)'),
    (('apptainer', 'singularity'), ('--containall', '-C'), False, None, 'the host IPC namespace and environment',
     'NCCL and the launchers need (the ranks of a node share /dev/shm; MASTER_ADDR and the job id come from the host)'),
    (('apptainer', 'singularity'), ('--cleanenv', '-e'), False, None, 'the host environment passed through',
     'the launchers need (MASTER_ADDR, MASTER_PORT and the job id come from the host)'),
    (('enroot',), ('--container-image',), True, None, '--container-image=<training_container_image>',
     'names the image (set training_container_image)'),
    (('enroot',), ('--container-name',), True, None, '--container-name=gpucluster-<job>-slurm',
     'carries the job id (pyxis removes the container when the Slurm job ends)'),
    (('enroot',), ('--container-mounts',), True, None, '--container-mounts=<training_container_mounts>',
     'brings the shared storage in (set training_container_mounts; a second one replaces it)'),
    (('enroot',), ('--container-remap-root',), False, None, '--no-container-remap-root',
     'runs the job as the account (its files on the shared storage keep its uid)'),
)


def extra_args_conflicts(runtime, args, variable='training_container_extra_args', memlock=True):
    """One line per extra argument that undoes what the runtime's line sets (EXTRA_ARG_CONFLICTS),
    naming the variable, the argument as given and why the job needs the line's own. An argument
    is one item (``--network=bridge``, ``--net bridge``) or an option and the next item. Without
    memlock the line sets no memlock limit, so one among the extra arguments is no conflict."""
    rows = [row for row in EXTRA_ARG_CONFLICTS if runtime in row[0] and (memlock or row[1] != ('--ulimit',))]
    args = [str(a) for a in args or []]
    lines = []
    i = 0
    while i < len(args):
        arg = args[i].strip()
        i += 1
        name, sep, value = arg.partition('=')
        if not sep and ' ' in arg:
            name, value = arg.split(None, 1)
            sep = ' '
        row = next((r for r in rows if name in r[1]), None)
        if row is None:
            continue
        takes_value = row[2] if row[2] is not None else name in ('--network', '--network-args')
        shown = arg
        if takes_value and not sep and i < len(args):
            value = args[i]
            shown = '%s %s' % (arg, value)
            i += 1
        if row[3] is not None and not re.search(row[3], value.strip()):
            continue
        lines.append('%s: %s conflicts with %s that %s' % (variable, shown, row[4], row[5]))
    return lines


def wrap(spec, job_id, node, argv, shell_prefix, env_names=(), env_files=(), workdir=None, rootless=True,
         infiniband=False):
    """This node's launch command in the image: the runtime's line around ``bash -c`` of the sealed
    prefix (the caches in the job's cache directory of this node), the job's shell prefix (its env
    files, sourced inside, so the NCCL interface is the host's) and the argv."""
    cache = spec.get('cache_dir') or job_cache_dir(workdir or '/tmp', node or 'node')
    inner = ['/bin/bash', '-c', sealed_prefix(spec, cache) + shell_prefix + 'exec ' + join(argv)]
    if spec['runtime'] == 'podman':
        return podman_run_argv(spec, job_id, inner, node=node, env_names=env_names, env_files=env_files,
                               workdir=workdir, rootless=rootless, infiniband=infiniband)
    if spec['runtime'] in ('apptainer', 'singularity'):
        return apptainer_exec_argv(spec, inner, infiniband=infiniband, env_files=env_files, workdir=workdir)
    raise ContainerError('container runtime enroot runs under Slurm only (launcher slurm, through pyxis); '
                         'use podman or apptainer with %s' % ', '.join(('torchrun', 'deepspeed', 'mpirun')))


def mpirun_rank_prefix(spec, job_id, shell_prefix, env_names=(), env_files=(), rootless=True, infiniband=False,
                       workdir=None):
    """What mpirun's per-rank bash runs before ``python script``: the rank's container (Open MPI
    starts the ranks on the hosts; each rank is a container of the job, with the rank variables),
    in workdir (the job directory, as the ranks of a host job: relative paths land there); each
    rank's caches in <job dir>/cache/rank-<RANK>."""
    cache = job_cache_dir(workdir or '/tmp', '"$RANK"', 'rank-')
    inner = ['/bin/bash', '-c', sealed_prefix(spec, cache) + shell_prefix + 'exec "$0" "$@"']
    names = list(MPI_RANK_ENV) + [n for n in env_names if n not in MPI_RANK_ENV]
    if spec['runtime'] == 'podman':
        return podman_run_argv(spec, job_id, inner, env_names=names, env_files=env_files, rootless=rootless,
                               infiniband=infiniband, workdir=workdir)
    if spec['runtime'] in ('apptainer', 'singularity'):
        return apptainer_exec_argv(spec, inner, infiniband=infiniband, env_files=env_files, workdir=workdir)
    raise ContainerError('container runtime enroot runs under Slurm only (launcher slurm, through pyxis)')


def slurm_node_addr_lines(hostfile, addr_file):
    """sbatch lines that write each node's NodeAddr to a file on the shared storage (the batch
    host has scontrol; the image need not), and the node_addr function the containers use."""
    return ('while read -r n; do echo "$n $(node_addr "$n")"; done < %s > %s\n' % (q(hostfile), q(addr_file)))


def slurm_node_prefix(addr_file):
    """Inside the container: node_addr reads the file the batch script wrote."""
    return 'node_addr() { awk -v n="$1" %s %s; }; ' % (q('$1 == n {print $2}'), q(addr_file))


def slurm_sealed_prefix(spec, job_dir):
    """The sealed prefix of a Slurm step: each node's caches in <job dir>/cache/<its Slurm name>."""
    return sealed_prefix(spec, job_cache_dir(job_dir, '"$SLURMD_NODENAME"'))


def slurm_container_line(spec, job_id, launch_line, env_files=(), infiniband=False, gpus_per_node=0, workdir=None):
    """The srun line of slurm_launch_line with each task in the image: pyxis options for enroot,
    ``apptainer exec`` in the job step for Apptainer and Singularity, ``podman run`` for podman.
    With GPUs asked for, srun asks for them per node (a step gets no GPU otherwise on sites that
    give steps only what they ask for), and the line exports NVIDIA_VISIBLE_DEVICES and
    NVIDIA_DRIVER_CAPABILITIES, without which enroot's NVIDIA hook gives the container no GPU (or
    nvidia-smi only)."""
    head, sep, body = launch_line.partition(' bash -c ')
    if not sep or not head.startswith('srun '):
        raise ContainerError('not an srun line: %r' % launch_line[:80])
    lead = ''
    if gpus_per_node:
        head = 'srun --gpus-per-node=%d %s' % (int(gpus_per_node), head[len('srun '):])
        lead = 'export %s\n' % ' '.join('%s=%s' % (k, q(v)) for k, v in NVIDIA_ENV)
    if spec['runtime'] == 'enroot':
        return '%s%s %s bash -c %s' % (lead, head, join(pyxis_srun_args(spec, job_id, env_files, workdir=workdir)), body)
    if spec['runtime'] in ('apptainer', 'singularity'):
        argv = apptainer_exec_argv(spec, [], infiniband=infiniband, env_files=env_files, workdir=workdir)
        return '%s%s %s /bin/bash -c %s' % (lead, head, join(argv), body)
    argv = podman_run_argv(spec, job_id, [], env_names=('SLURMD_NODENAME', 'SLURM_NNODES', 'SLURM_JOB_ID'),
                           env_files=env_files, infiniband=infiniband, workdir=workdir)
    return '%s%s %s /bin/bash -c %s' % (lead, head, join(argv), body)


# ----- what the runtime reports ----------------------------------------------------------------
def ps_argv(job_id):
    """podman's list of every container of the job, running or not, by its label."""
    return ['podman', 'ps', '--all', '--filter', 'label=%s=%s' % (JOB_LABEL, job_id), '--format', 'json']


def parse_ps(text):
    """[{id, name, image, image_id, state, exit_code, node}] from ``podman ps --format json`` (exit_code
    None while the container has not exited)."""
    text = (text or '').strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ContainerError('podman ps did not print JSON: %s' % exc) from exc
    out = []
    for item in data or []:
        names = item.get('Names') or []
        exited = item.get('Exited') or item.get('State') in ('exited', 'stopped')
        out.append({'id': item.get('Id', '')[:12], 'name': names[0] if names else '', 'image': item.get('Image', ''),
                    'image_id': (item.get('ImageID') or '')[:12], 'state': item.get('State', ''),
                    'exit_code': item.get('ExitCode') if exited else None,
                    'node': (item.get('Labels') or {}).get(NODE_LABEL)})
    return out


def rm_argv(ids, timeout=10):
    """Stop (SIGTERM, SIGKILL after ``timeout`` s) and remove the given containers."""
    return ['podman', 'rm', '--force', '--time', str(int(timeout))] + list(ids)


def ops_stamp_argv(spec):
    """What reads the image's record of its DeepSpeed ops without starting a job: a throwaway container
    without network (podman), ``apptainer exec`` of cat (SIF), unsquashfs -cat (an enroot squashfs)."""
    if spec['runtime'] == 'podman':
        return ['podman', 'run', '--rm', '--network', 'none', '--entrypoint', 'cat', spec['image'], IMAGE_OPS_STAMP]
    if spec['runtime'] in ('apptainer', 'singularity'):
        return [spec['runtime'], 'exec', '--no-home', spec['image'], 'cat', IMAGE_OPS_STAMP]
    return ['unsquashfs', '-cat', spec['image'], IMAGE_OPS_STAMP.lstrip('/')]


def inspect_argv(image):
    return ['podman', 'image', 'inspect', '--format', 'json', image]


def parse_inspect(text):
    """{id, digest, repo_digests, names} of the first image in ``podman image inspect`` JSON."""
    try:
        data = json.loads(text or '[]')
    except ValueError as exc:
        raise ContainerError('podman image inspect did not print JSON: %s' % exc) from exc
    if not data:
        return None
    item = data[0]
    image_id = item.get('Id', '')
    return {'id': image_id if image_id.startswith('sha256:') else 'sha256:' + image_id,
            'digest': item.get('Digest', ''), 'repo_digests': item.get('RepoDigests') or [],
            'names': item.get('RepoTags') or []}


def parse_apptainer_inspect(text):
    """{labels, recipe} of a SIF from ``apptainer inspect --json --labels SIF``: the recipe label the image
    was built with (gpucluster.recipe, carried over from the OCI image) is what two SIF files built from
    the same recipe share.

    The JSON has had three shapes across Singularity/Apptainer releases, all read: the JSON:API envelope
    {"data": {"attributes": {"labels": {...}}, "type": "container"}}, the same without "data", and
    (Singularity 3.1) the labels as a JSON string inside it."""
    try:
        data = json.loads(text or '')
        body = data.get('data', data) if isinstance(data, dict) else None
        labels = body['attributes'].get('labels') or {}
        if isinstance(labels, str):
            labels = json.loads(labels)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ContainerError('apptainer inspect did not print its JSON (%s: %s)' % (type(exc).__name__, exc)) from exc
    if not isinstance(labels, dict):
        raise ContainerError('apptainer inspect: labels are not a mapping')
    return {'labels': labels, 'recipe': labels.get('gpucluster.recipe', '')}


def image_matches(info, wanted):
    """Whether an inspected image is the wanted one: its id (sha256:<64 hex>), or a digest the
    image was pulled by (name@sha256:... or sha256:...)."""
    if not wanted:
        return True
    if info is None:
        return False
    wanted = wanted.split('@', 1)[-1]
    if IMAGE_ID_RE.match(wanted):
        wanted = wanted if wanted.startswith('sha256:') else 'sha256:' + wanted
    return wanted in ([info['id'], info['digest']] + [d.split('@', 1)[-1] for d in info['repo_digests']])


def digest_mismatches(digests, reference_node=None):
    """Nodes whose image differs from the reference node's (the first one by default).

    digests: {node: digest or None} in node order. Returns [{node, digest, reference, reference_digest}]
    (digest None: the image is missing on that node)."""
    nodes = list(digests)
    if not nodes:
        return []
    ref = reference_node or nodes[0]
    want = digests.get(ref)
    return [{'node': n, 'digest': digests[n], 'reference': ref, 'reference_digest': want}
            for n in nodes if n != ref and digests[n] != want]


def mismatch_lines(digests, image, reference_node=None):
    """One line per node whose image differs from the reference node's (or is missing: a false value),
    naming both digests and the remedy."""
    found = digest_mismatches(dict((str(n), d or None) for n, d in digests.items()), reference_node)
    return [describe_mismatch(item, image) for item in found]


def describe_mismatch(item, image):
    if item['digest'] is None:
        return ('node %s: image %s is missing (%s has %s); load it there (site.yml --tags container)'
                % (item['node'], image, item['reference'], item['reference_digest']))
    return ('node %s: image %s is %s but %s has %s; load the same image on every node '
            '(site.yml --tags container)'
            % (item['node'], image, item['digest'], item['reference'], item['reference_digest']))


def archive_image_id(path):
    """The image id (config digest) an OCI archive holds (what ``podman load`` will show), read from
    its index and manifest without loading it; {id, name}."""
    try:
        with tarfile.open(path) as tar:
            index = json.load(tar.extractfile('index.json'))
            entry = index['manifests'][0]
            manifest = json.load(tar.extractfile('blobs/' + entry['digest'].replace(':', '/')))
    except (IOError, OSError, KeyError, IndexError, ValueError, tarfile.TarError, AttributeError, TypeError) as exc:
        raise ContainerError('%s is not an OCI archive of one image (%s: %s)' % (path, type(exc).__name__, exc)) from exc
    return {'id': manifest['config']['digest'],
            'name': (entry.get('annotations') or {}).get('org.opencontainers.image.ref.name')}
