"""Command lines of a job in a container image (podman, Apptainer/Singularity, enroot through pyxis),
the Slurm script lines, and the readers of podman's output (recorded on a lab node, podman 4.3)."""

import json
import os
import shlex

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import containers as cn
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import launchers as ln
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr

from test_launchers import FakeRunner, Spawn, fixture, job, lab, probe_ok, proc  # noqa: F401 (fixtures)
from test_processes import fake_proc, kills  # noqa: F401 (kills is a fixture)

PODMAN = {'runtime': 'podman', 'image': 'localhost/gpucluster-train:1', 'mounts': ['/shared']}
SIF = {'runtime': 'apptainer', 'image': '/shared/images/train.sif', 'mounts': ['/shared'], 'gpus': True}
SQSH = {'runtime': 'enroot', 'image': '/shared/images/train.sqsh', 'mounts': ['/shared', '/scratch']}
PROFILE = '/etc/profile.d/gpucluster-nccl.sh'


def pairs(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


# ----- podman ------------------------------------------------------------------------------------
def test_podman_line_has_host_network_ipc_gpus_infiniband_memlock_mounts_and_the_job_label():
    spec = cn.check_spec(dict(PODMAN, gpus=True, memlock=True))
    argv = cn.wrap(spec, 'tiny-001', 'gpu-worker-1', ['/opt/gpucluster/env/bin/torchrun', '--nnodes', '3', 'train.py'],
                   'set -a; . /shared/jobs/tiny-001/job.env; set +a; ', env_files=[PROFILE, '/shared/jobs/x.env'],
                   workdir='/shared/jobs/tiny-001', infiniband=True)
    assert argv[:3] == ['podman', 'run', '--rm']
    assert pairs(argv, '--network') == ['host'] and pairs(argv, '--ipc') == ['host']
    assert pairs(argv, '--device') == ['nvidia.com/gpu=all', '/dev/infiniband']
    assert pairs(argv, '--ulimit') == ['memlock=-1:-1'] and pairs(argv, '--userns') == ['keep-id']
    assert pairs(argv, '--label') == ['gpucluster.job=tiny-001', 'gpucluster.node=gpu-worker-1']
    assert pairs(argv, '--name') == ['gpucluster-tiny-001-gpu-worker-1']
    # the shared storage at the same path; an env file outside it read-only at its own path
    assert pairs(argv, '--volume') == ['/shared:/shared', '%s:%s:ro' % (PROFILE, PROFILE)]
    assert pairs(argv, '--env')[:3] == [pr.JOB_ENV, 'MASTER_ADDR', 'MASTER_PORT']
    image_at = argv.index(PODMAN['image'])
    assert argv[image_at + 1:image_at + 3] == ['/bin/bash', '-c']
    assert argv[image_at + 3].startswith(sealed("/shared/jobs/tiny-001/cache/gpu-worker-1"))
    assert 'set -a; . /shared/jobs/tiny-001/job.env' in argv[image_at + 3]
    assert argv[image_at + 3].endswith('exec /opt/gpucluster/env/bin/torchrun --nnodes 3 train.py')


# what every job container's shell does first: the caches under the job's cache directory of the node
SEALED = ('export HOME=%(d)s XDG_CACHE_HOME=%(d)s"/.cache" TRITON_CACHE_DIR=%(d)s"/.cache/triton" '
          'PIP_CACHE_DIR=%(d)s"/.cache/pip" TORCHINDUCTOR_CACHE_DIR=%(d)s"/.cache/torchinductor"; '
          'mkdir -p "$XDG_CACHE_HOME"; if [ -d /opt/gpucluster/torch_extensions ] && [ -w '
          '/opt/gpucluster/torch_extensions ]; then export TORCH_EXTENSIONS_DIR=/opt/gpucluster/torch_extensions; '
          'else export TORCH_EXTENSIONS_DIR="$XDG_CACHE_HOME/torch_extensions"; fi; ')


def sealed(cache_dir):
    return SEALED % {'d': cache_dir}


def no_home(words, home='/home/train'):
    """No word of the line mounts or names the account's home."""
    return not any(home in w for w in words) and 'HOME=/home' not in ' '.join(words)


def test_the_exact_podman_line_is_sealed_from_the_host():
    spec = cn.check_spec(dict(PODMAN, gpus=True))
    spec.update(memlock='false', cache_dir=cn.job_cache_dir('/shared/jobs/j1', 'gpu-1'), expect_gpus=2)
    argv = cn.wrap(spec, 'j1', 'gpu-1', ['torchrun', 'train.py'], 'P; ', env_files=[PROFILE],
                   workdir='/shared/jobs/j1', rootless=True)
    assert argv == [
        'podman', 'run', '--rm', '--name', 'gpucluster-j1-gpu-1', '--label', 'gpucluster.job=j1',
        '--label', 'gpucluster.node=gpu-1', '--network', 'host', '--ipc', 'host', '--security-opt', 'label=disable',
        '--userns', 'keep-id', '--device', 'nvidia.com/gpu=all', '--volume', '/shared:/shared',
        '--volume', '%s:%s:ro' % (PROFILE, PROFILE), '--env', pr.JOB_ENV, '--env', 'MASTER_ADDR',
        '--env', 'MASTER_PORT', '--workdir', '/shared/jobs/j1', 'localhost/gpucluster-train:1', '/bin/bash', '-c',
        (sealed('/shared/jobs/j1/cache/gpu-1')).replace('; mkdir', ' GPUCLUSTER_EXPECT_GPUS=2; mkdir', 1)
        + 'P; exec torchrun train.py']
    assert no_home(argv)


def test_a_job_directory_outside_the_mounts_is_mounted_too():
    spec = cn.check_spec(PODMAN)
    argv = cn.wrap(spec, 'j1', 'n1', ['x'], '', workdir='/scratch/jobs/j1')
    assert pairs(argv, '--volume') == ['/shared:/shared', '/scratch/jobs/j1:/scratch/jobs/j1']


def test_the_sealed_caches_are_made_and_the_image_ops_used_when_writable(tmp_path):
    import subprocess
    cache = cn.job_cache_dir(str(tmp_path / 'job'), 'n1')
    script = cn.sealed_prefix({'expect_gpus': 0}, cache) + \
        'echo "$HOME|$XDG_CACHE_HOME|$TRITON_CACHE_DIR|$PIP_CACHE_DIR|$TORCH_EXTENSIONS_DIR"'
    out = subprocess.run(['bash', '-c', script], capture_output=True, text=True, check=True).stdout.strip()
    home = str(tmp_path / 'job' / 'cache' / 'n1')
    # no /opt/gpucluster/torch_extensions here (an older image): the job's own extension directory
    assert out.split('|') == [home, home + '/.cache', home + '/.cache/triton', home + '/.cache/pip',
                              home + '/.cache/torch_extensions']
    assert os.path.isdir(home + '/.cache')


def test_podman_line_without_gpus_infiniband_or_memlock_asks_for_none_and_root_keeps_its_userns():
    spec = cn.check_spec(dict(PODMAN, memlock=False))
    argv = cn.wrap(spec, 'j', 'n', ['python'], '', rootless=False)
    assert '--device' not in argv and '--ulimit' not in argv and '--userns' not in argv


@pytest.mark.parametrize('wanted,hard,flag,refusal,warning', [
    ('true', None, True, None, None),
    ('auto', None, True, None, None),
    ('false', None, False, None, None),
    ('false', 65536, False, None, None),
    ('true', 8 * 1024 * 1024, False, 'node gpu-2: training_container_memlock is true but the hard memlock limit of the '
                                     'training account is 8192 KiB here', None),
    ('auto', 8 * 1024 * 1024, False, None, 'node gpu-2: the hard memlock limit of the training account is 8192 KiB, '
                                           'not unlimited: the containers keep it'),
])
def test_memlock_unlimited_only_where_asked_and_the_hard_limit_allows_it(wanted, hard, flag, refusal, warning):
    unlimited, refused, warned = cn.memlock_decision(wanted, hard, 'gpu-2')
    assert unlimited is flag
    assert (refused or '').startswith(refusal or '') and bool(refused) == bool(refusal)
    assert (warned or '').startswith(warning or '') and bool(warned) == bool(warning)
    spec = cn.check_spec(dict(PODMAN, memlock=wanted))
    spec['memlock'] = 'true' if unlimited else 'false'
    assert ('--ulimit' in cn.wrap(spec, 'j', 'n', ['x'], '')) is flag


def test_spec_refusals_name_the_setting():
    assert cn.check_spec(None) is None and cn.check_spec({'runtime': 'none'}) is None
    with pytest.raises(cn.ContainerError, match="runtime 'docker' is not one of podman, apptainer"):
        cn.check_spec({'runtime': 'docker', 'image': 'x'})
    with pytest.raises(cn.ContainerError, match='image is empty'):
        cn.check_spec({'runtime': 'podman'})
    with pytest.raises(cn.ContainerError, match="mount 'shared' must be an absolute path"):
        cn.check_spec({'runtime': 'podman', 'image': 'x', 'mounts': ['shared']})
    with pytest.raises(cn.ContainerError, match='enroot runs under Slurm only'):
        cn.wrap(cn.check_spec(SQSH), 'j', 'n', ['python'], '')
    with pytest.raises(cn.ContainerError, match="container memlock 'always' is not one of auto, true, false"):
        cn.check_spec(dict(PODMAN, memlock='always'))


# ----- Apptainer / Singularity / enroot ----------------------------------------------------------
def test_apptainer_exec_brings_gpus_with_nv_and_binds_the_mounts_and_env_files():
    spec = cn.check_spec(SIF)
    spec['cache_dir'] = cn.job_cache_dir('/shared/jobs/tiny-001', 'n1')
    argv = cn.wrap(spec, 'tiny-001', 'n1', ['torchrun', 'train.py'], 'P; ', env_files=[PROFILE], infiniband=True,
                   workdir='/shared/jobs/tiny-001')
    # the exact line: no home (Apptainer mounts it by default), the job's own writable copy of the image,
    # the GPUs with the variables nvidia-container-cli reads
    assert argv == ['env', 'NVIDIA_VISIBLE_DEVICES=all', 'NVIDIA_DRIVER_CAPABILITIES=compute,utility',
                    'apptainer', 'exec', '--no-home', '--writable-tmpfs', '--nv', '--bind',
                    '/shared:/shared,/dev/infiniband:/dev/infiniband,%s:%s:ro' % (PROFILE, PROFILE),
                    SIF['image'], '/bin/bash', '-c',
                    sealed('/shared/jobs/tiny-001/cache/n1') + 'P; exec torchrun train.py']
    assert no_home(argv)
    singularity = cn.wrap(cn.check_spec(dict(SIF, runtime='singularity', gpus=False)), 'j', 'n', ['x'], '')
    assert singularity[:5] == ['singularity', 'exec', '--no-home', '--writable-tmpfs', '--bind']


def test_pyxis_options_import_the_image_every_run_without_the_home():
    argv = cn.pyxis_srun_args(cn.check_spec(SQSH), 'tiny-001', env_files=[PROFILE], workdir='/jobs/tiny-001')
    # no --container-name: pyxis would keep a named container and start it again without importing
    assert argv == ['--container-image=/shared/images/train.sqsh', '--no-container-mount-home',
                    '--container-writable', '--no-container-remap-root',
                    '--container-mounts=/shared:/shared,/scratch:/scratch,/jobs/tiny-001:/jobs/tiny-001,%s:%s:ro'
                    % (PROFILE, PROFILE)]
    assert not any(a.startswith('--container-name') for a in argv)


SRUN = "srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c 'exec torchrun --nnodes \"$SLURM_NNODES\" train.py'"


@pytest.mark.parametrize('spec,middle', [
    (SQSH, "--container-image=/shared/images/train.sqsh --no-container-mount-home --container-writable "
           "--no-container-remap-root --container-mounts=/shared:/shared,/scratch:/scratch bash -c"),
    (SIF, "env NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility apptainer exec --no-home "
          "--writable-tmpfs --nv --bind /shared:/shared /shared/images/train.sif /bin/bash -c"),
])
def test_slurm_step_line_runs_each_task_in_the_image(spec, middle):
    line = cn.slurm_container_line(cn.check_spec(spec), 'tiny-001', SRUN)
    assert line == ("srun --ntasks-per-node=1 --kill-on-bad-exit=1 %s 'exec torchrun --nnodes \"$SLURM_NNODES\" "
                    "train.py'" % middle)
    words = shlex.split(line)
    assert words[-1] == 'exec torchrun --nnodes "$SLURM_NNODES" train.py'


def test_slurm_step_with_gpus_asks_srun_for_them_and_exports_the_nvidia_variables():
    line = cn.slurm_container_line(cn.check_spec(SQSH), 'tiny-001', SRUN, gpus_per_node=4)
    first, step = line.split('\n')
    assert first == 'export NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility'
    assert step.startswith('srun --gpus-per-node=4 --ntasks-per-node=1 --kill-on-bad-exit=1 '
                           '--container-image=/shared/images/train.sqsh --no-container-mount-home ')


def test_slurm_node_address_comes_from_a_file_the_batch_script_wrote(tmp_path):
    addrs = tmp_path / 'node_addrs'
    addrs.write_text('n1 10.0.0.1\nn2 10.0.0.2\n')
    import subprocess
    out = subprocess.run(['bash', '-c', cn.slurm_node_prefix(str(addrs)) + 'node_addr n2'],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == '10.0.0.2'
    assert cn.slurm_node_addr_lines('/j/hostfile', '/j/node_addrs') == \
        'while read -r n; do echo "$n $(node_addr "$n")"; done < /j/hostfile > /j/node_addrs\n'


# ----- podman's output (recorded) ----------------------------------------------------------------
def test_parse_ps_reads_the_jobs_containers_and_an_empty_list():
    found = cn.parse_ps(fixture('containers', 'podman_ps_job.json'))
    assert found == [{'id': 'c01e3f9f39f9', 'name': 'gpucluster-tiny-001-mol-ctr-head',
                      'image': 'localhost/gpucluster-base:bookworm', 'image_id': '9dfd6d3a179a', 'state': 'running',
                      'exit_code': None, 'node': 'mol-ctr-head'}]
    # the same container after its command exited with 3 (podman reports Exited and ExitCode)
    import json
    data = json.loads(fixture('containers', 'podman_ps_job.json'))
    data[0].update(State='exited', Exited=True, ExitCode=3)
    assert [(c['state'], c['exit_code']) for c in cn.parse_ps(json.dumps(data))] == [('exited', 3)]
    assert cn.parse_ps('[]\n') == [] and cn.parse_ps('') == []
    with pytest.raises(cn.ContainerError):
        cn.parse_ps('Error: something')
    assert cn.ps_argv('tiny-001') == ['podman', 'ps', '--all', '--filter', 'label=gpucluster.job=tiny-001',
                                      '--format', 'json']


def test_parse_inspect_and_the_digest_a_node_must_have():
    info = cn.parse_inspect(fixture('containers', 'podman_image_inspect.json'))
    image_id = 'sha256:9dfd6d3a179af5b2df2578547dc36bede86f77b848d7d56450d80a94db1868f3'
    manifest = 'sha256:00ed614ba92f11152340eb52eea7d602d341735552de8afef908748848063ff4'
    assert info['id'] == image_id and info['digest'] == manifest
    assert cn.image_matches(info, image_id) and cn.image_matches(info, image_id[7:])
    assert cn.image_matches(info, 'registry.example/train@' + manifest)
    assert not cn.image_matches(info, 'sha256:' + 'a' * 64) and not cn.image_matches(None, image_id)


def test_digest_mismatches_name_the_node_and_both_digests():
    found = cn.digest_mismatches({'head': 'sha256:aaa', 'w1': 'sha256:aaa', 'w2': 'sha256:bbb', 'w3': None})
    assert [f['node'] for f in found] == ['w2', 'w3']
    assert cn.describe_mismatch(found[0], 'img') == (
        'node w2: image img is sha256:bbb but head has sha256:aaa; load the same image on every node '
        '(site.yml --tags container)')
    assert 'image img is missing (head has sha256:aaa)' in cn.describe_mismatch(found[1], 'img')


# ----- the launchers in containers ---------------------------------------------------------------
INSPECT_OK = (0, None, '')


def podman_runner(inspect=None, ps=(0, '[]\n', '')):
    inspect = inspect or (0, fixture('containers', 'podman_image_inspect.json'), '')
    return FakeRunner({'ssh-probe': probe_ok, 'podman': lambda argv: inspect if argv[1] == 'image' else ps})


def test_torchrun_agent_runs_in_the_image_with_the_env_files_sourced_inside(lab):
    spawn = Spawn()
    out = job(lab, 'torchrun', 'delta', runner=podman_runner(), container=PODMAN, env_files=[PROFILE]).start(spawn=spawn)
    words = shlex.split(spawn.calls[0]['line'])
    assert words[:4] == ['exec', 'podman', 'run', '--rm'] and 'gpucluster.job=tiny-001' in words
    inner = words[-1]
    assert '--nproc-per-node 1' in inner and '. %s' % PROFILE in inner and 'job.env' in inner
    assert out['command'].startswith('podman run')


def test_deepspeed_in_containers_runs_a_launcher_per_node_without_ssh(lab):
    runner = podman_runner()
    spawn = Spawn()
    out = job(lab, 'deepspeed', 'charlie', runner=runner, container=PODMAN).start(spawn=spawn)
    inner = shlex.split(spawn.calls[0]['line'])[-1]
    assert '--no_ssh --node_rank 2' in inner and out['role'] == 'agent'
    assert (lab / 'jobs' / 'tiny-001' / 'hostfile').read_text().startswith('alpha slots=2\n')
    assert 'DS_ENV_FILE' not in spawn.calls[0]['env']
    assert not any(c[:2] == ['bash', '-c'] for c in runner.calls)   # no SSH probe: nothing goes over SSH


def test_mpirun_starts_on_the_host_and_each_rank_in_a_container(lab):
    spawn = Spawn()
    job(lab, 'mpirun', runner=podman_runner(), container=PODMAN).start(spawn=spawn)
    words = shlex.split(spawn.calls[0]['line'].split('; exec ', 1)[1])
    assert words[0].endswith('mpirun') and '-np' in words
    at = words.index('podman')
    assert words[at - 3:at] == ['/bin/bash', '-c', words[at - 1]] and 'OMPI_COMM_WORLD_RANK' in words[at - 1]
    assert {'RANK', 'LOCAL_RANK', 'WORLD_SIZE'} <= set(pairs(words, '--env'))
    # each rank works in the job directory, as a host rank does (the examples' relative progress/ lands there)
    assert pairs(words, '--workdir') == [str(lab / 'jobs' / 'tiny-001')]
    assert words[-4:] == [str(lab / 'env' / 'bin' / 'python'), str(lab / 'train.py'), '--steps', '5']


def test_a_missing_image_or_another_digest_is_refused_naming_the_node(lab):
    missing = podman_runner(inspect=(125, '', fixture('containers', 'podman_image_inspect_missing.txt')))
    with pytest.raises(ln.JobError, match='node bravo-2 cannot start job tiny-001: container image '
                                          'localhost/gpucluster-train:1 is not loaded here'):
        job(lab, 'torchrun', 'bravo-2', runner=missing, container=PODMAN).start(spawn=Spawn())
    other = dict(PODMAN, digest='sha256:' + 'b' * 64)
    problems, versions, _ = job(lab, 'torchrun', 'bravo-2', runner=podman_runner(), container=other).check()
    assert problems == ['container image localhost/gpucluster-train:1 here is sha256:9dfd6d3a179af5b2df2578547dc36bede'
                        '86f77b848d7d56450d80a94db1868f3, not the pinned sha256:%s; load the same image on every node '
                        'with site.yml --tags container' % ('b' * 64)]


def test_enroot_with_an_ssh_launcher_is_refused(lab):
    with pytest.raises(ln.JobError, match='node alpha: container runtime enroot runs under Slurm only'):
        job(lab, 'torchrun', container=SQSH)


def test_slurm_script_with_pyxis_and_apptainer(lab):
    runner = FakeRunner({'sbatch': (0, '42\n', ''), 'sinfo': (0, 'cpu\n', '')})
    (lab / 'train.sqsh').write_text('')
    job(lab, 'slurm', runner=runner, container=dict(SQSH, image=str(lab / 'train.sqsh'))).start()
    script = (lab / 'jobs' / 'tiny-001' / 'job.sbatch').read_text()
    addrs = lab / 'jobs' / 'tiny-001' / 'node_addrs'
    assert 'done < %s > %s\n' % (lab / 'jobs' / 'tiny-001' / 'hostfile', addrs) in script
    step = [line for line in script.splitlines() if line.startswith('srun ')][0]
    assert ' --container-image=%s ' % (lab / 'train.sqsh') in step and '--container-mounts=/shared:/shared' in step
    # inside the image, node_addr reads the file (no scontrol there)
    assert 'node_addr() { awk' in shlex.split(step)[-1]
    (lab / 'train.sif').write_text('')
    job(lab, 'slurm', runner=runner, container=dict(SIF, image=str(lab / 'train.sif'))).start()
    step = [line for line in (lab / 'jobs' / 'tiny-001' / 'job.sbatch').read_text().splitlines()
            if line.startswith('srun ')][0]
    assert ('srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 '
            '--kill-on-bad-exit=1 env NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES='
            'compute,utility apptainer exec --no-home --writable-tmpfs --nv --bind /shared:/shared,%s:%s %s /bin/bash -c'
            % (lab / 'jobs' / 'tiny-001', lab / 'jobs' / 'tiny-001', lab / 'train.sif')) in step
    # each node's caches under the job directory, named by Slurm
    assert ('export HOME=%s/cache/"$SLURMD_NODENAME" ' % (lab / 'jobs' / 'tiny-001')) in shlex.split(step)[-1]


def test_stop_removes_the_jobs_containers_by_label_then_its_processes(lab, proc, kills):
    fake_proc(proc, 800, env={pr.JOB_ENV: 'tiny-001'}, cmdline=('podman', 'run'))
    listed = [fixture('containers', 'podman_ps_job.json'), '[]\n', '[]\n']
    runner = FakeRunner({'podman': lambda argv: (0, listed.pop(0), '') if argv[1] == 'ps' else (0, 'c01e3f9f39f9\n', '')})
    out = job(lab, 'torchrun', runner=runner, container=PODMAN).stop(sleep=lambda s: None)
    assert ['podman', 'rm', '--force', '--time', '1', 'c01e3f9f39f9'] in runner.calls
    assert all('label=gpucluster.job=tiny-001' in c for c in runner.calls if c[1] == 'ps')
    assert out['removed_containers'] == ['gpucluster-tiny-001-mol-ctr-head'] and out['stopped_pids'] == [800]


def test_stop_removes_a_container_made_while_it_stopped_the_processes(lab, proc, kills):
    # podman run was making its container when the stop listed none: it is found after the processes are gone
    fake_proc(proc, 801, env={pr.JOB_ENV: 'tiny-001'}, cmdline=('podman', 'run'))
    listed = ['[]\n', fixture('containers', 'podman_ps_job.json'), '[]\n']
    runner = FakeRunner({'podman': lambda argv: (0, listed.pop(0), '') if argv[1] == 'ps' else (0, 'c01e3f9f39f9\n', '')})
    out = job(lab, 'torchrun', runner=runner, container=PODMAN).stop(sleep=lambda s: None)
    assert ['podman', 'rm', '--force', '--time', '1', 'c01e3f9f39f9'] in runner.calls and listed == []
    assert out['removed_containers'] == ['gpucluster-tiny-001-mol-ctr-head'] and out['stopped_pids'] == [801]


def test_stop_fails_naming_a_container_that_is_left(lab, proc, kills):
    runner = FakeRunner({'podman': lambda argv: (0, fixture('containers', 'podman_ps_job.json'), '')
                         if argv[1] == 'ps' else (125, '', 'Error: cannot remove')})
    with pytest.raises(ln.JobError, match='node alpha: 1 container.s. of job tiny-001 are left: '
                                          'gpucluster-tiny-001-mol-ctr-head .podman rm: Error: cannot remove.'):
        job(lab, 'torchrun', runner=runner, container=PODMAN).stop(sleep=lambda s: None)


def test_status_lists_the_jobs_containers(lab):
    runner = FakeRunner({'podman': (0, fixture('containers', 'podman_ps_job.json'), '')})
    out = job(lab, 'torchrun', runner=runner, container=PODMAN).status()
    assert out['running'] is True and out['containers'][0]['node'] == 'mol-ctr-head'
    assert os.path.basename(out['log']) == 'alpha.log'


def test_archive_image_id_is_the_id_podman_shows_after_loading_it(tmp_path):
    # podman save --format oci-archive of the lab's base image (its layer blob left out of the fixture)
    found = cn.archive_image_id(os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'containers',
                                             'oci_archive_without_layer.tar'))
    inspected = cn.parse_inspect(fixture('containers', 'podman_image_inspect.json'))
    assert found == {'id': inspected['id'], 'name': 'localhost/gpucluster-base:bookworm'}
    (tmp_path / 'x.tar').write_text('not a tar')
    with pytest.raises(cn.ContainerError, match='x.tar is not an OCI archive of one image'):
        cn.archive_image_id(str(tmp_path / 'x.tar'))


def test_an_env_file_the_node_lacks_is_not_mounted(lab, tmp_path):
    present = tmp_path / 'nccl.sh'
    present.write_text('export NCCL_SOCKET_IFNAME=eth0\n')
    spawn = Spawn()
    job(lab, 'torchrun', runner=podman_runner(), container=PODMAN,
        env_files=[str(present), '/etc/profile.d/no-such-file.sh']).start(spawn=spawn)
    words = shlex.split(spawn.calls[0]['line'])
    assert pairs(words, '--volume')[-1] == '%s:%s:ro' % (present, present)
    assert not any('no-such-file' in v for v in pairs(words, '--volume'))


def test_memlock_true_where_the_hard_limit_is_lower_is_refused_before_the_start(lab):
    runner = podman_runner()
    runner.memlock_hard_limit = lambda: 64 * 1024 * 1024
    spawn = Spawn()
    with pytest.raises(ln.JobError, match='node alpha cannot start job tiny-001: node alpha: training_container_memlock '
                                          'is true but the hard memlock limit of the training account is 65536 KiB'):
        job(lab, 'torchrun', runner=runner, container=dict(PODMAN, memlock=True)).start(spawn=spawn)
    assert spawn.calls == []


def test_memlock_auto_keeps_the_default_with_a_warning_and_unlimited_where_allowed(lab):
    runner = podman_runner()
    runner.memlock_hard_limit = lambda: 64 * 1024 * 1024
    spawn = Spawn()
    out = job(lab, 'torchrun', runner=runner, container=PODMAN).start(spawn=spawn)
    assert '--ulimit' not in shlex.split(spawn.calls[0]['line'])
    assert out['warnings'] == ['node alpha: the hard memlock limit of the training account is 65536 KiB, not unlimited: '
                               'the containers keep it (RDMA may fall back to TCP); container_memlock_unlimited '
                               'raises it']
    runner.memlock_hard_limit = lambda: None
    spawn = Spawn()
    out = job(lab, 'torchrun', runner=runner, container=PODMAN).start(spawn=spawn)
    assert pairs(shlex.split(spawn.calls[0]['line']), '--ulimit') == ['memlock=-1:-1'] and 'warnings' not in out


def test_a_started_container_job_never_names_the_home_and_expects_its_gpus(lab):
    runner = podman_runner()
    runner.memlock_hard_limit = lambda: None
    spawn = Spawn()
    job(lab, 'torchrun', 'delta', runner=runner, container=dict(PODMAN, gpus=True)).start(spawn=spawn)
    words = shlex.split(spawn.calls[0]['line'])
    home = os.path.expanduser('~')
    assert not any(v.split(':')[0] == home for v in pairs(words, '--volume'))
    assert not any(e.startswith('HOME=') for e in pairs(words, '--env'))
    inner = words[-1]
    assert inner.startswith('export HOME=%s/cache/delta ' % (lab / 'jobs' / 'tiny-001'))
    assert ' GPUCLUSTER_EXPECT_GPUS=1;' in inner


def test_slurm_pyxis_script_asks_for_the_gpus_and_exports_what_the_examples_check(lab):
    runner = FakeRunner({'sbatch': (0, '42\n', ''), 'sinfo': (0, 'cpu\n', '')})
    (lab / 'train.sqsh').write_text('')
    job(lab, 'slurm', runner=runner, container=dict(SQSH, image=str(lab / 'train.sqsh')), slurm_gpus_per_node=8).start()
    script = (lab / 'jobs' / 'tiny-001' / 'job.sbatch').read_text()
    assert '#SBATCH --gpus-per-node=8\n' in script
    assert 'export NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility\nsrun --gpus-per-node=8 ' \
        in script
    step = [line for line in script.splitlines() if line.startswith('srun ')][0]
    assert '--container-name' not in step and '--no-container-mount-home' in step
    assert ' GPUCLUSTER_EXPECT_GPUS=8;' in shlex.split(step)[-1]


@pytest.mark.parametrize('spec,argv', [
    (PODMAN, ['podman', 'run', '--rm', '--network', 'none', '--entrypoint', 'cat', 'localhost/gpucluster-train:1',
              '/etc/gpucluster/deepspeed-ops.json']),
    (SIF, ['apptainer', 'exec', '--no-home', '/shared/images/train.sif', 'cat', '/etc/gpucluster/deepspeed-ops.json']),
    (SQSH, ['unsquashfs', '-cat', '/shared/images/train.sqsh', 'etc/gpucluster/deepspeed-ops.json']),
])
def test_the_images_record_of_its_ops_is_read_without_a_job(spec, argv):
    assert cn.ops_stamp_argv(cn.check_spec(spec)) == argv


def test_apptainer_inspect_gives_the_recipe_the_sif_was_built_from():
    # written from Apptainer's documented `apptainer inspect --json --labels` shape, not recorded here
    info = cn.parse_apptainer_inspect(fixture('containers', 'apptainer_inspect_labels.json'))
    assert info['recipe'] == '4f1c9b0e6f0d3f0a4c7f5a3d2b1e0c9d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d'
    assert info['labels']['gpucluster.deepspeed_ops'] == '/etc/gpucluster/deepspeed-ops.json'
    with pytest.raises(cn.ContainerError, match='apptainer inspect did not print its JSON'):
        cn.parse_apptainer_inspect('FATAL:   could not open image /shared/images/x.sif: no such file')


LABELS = {'gpucluster.recipe': 'abc123', 'org.label-schema.schema-version': '1.0'}


@pytest.mark.parametrize('shape', [
    # the JSON:API envelope (Singularity 3.0's documented output, Apptainer)
    {'data': {'attributes': {'labels': LABELS}, 'type': 'container'}},
    # Singularity 3.1.x and later releases: no "data" envelope
    {'attributes': {'labels': LABELS}, 'type': 'container'},
    # Singularity 3.1.0: the labels as a JSON string
    {'attributes': {'labels': json.dumps(LABELS, indent='\t')}, 'type': 'container'},
])
def test_apptainer_inspect_is_read_in_each_shape_its_releases_printed(shape):
    assert cn.parse_apptainer_inspect(json.dumps(shape, indent='\t'))['recipe'] == 'abc123'
