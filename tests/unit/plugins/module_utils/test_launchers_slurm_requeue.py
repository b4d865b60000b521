"""A supervised Slurm job heals the way Slurm does: its stop requeues and holds it, its restart releases the
same Slurm job id on the nodes the supervisor keeps (the others excluded), each attempt with its own output
and SLURM_RESTART_COUNT + 1 as its attempt (fake runner answering as scontrol does)."""

import os
import subprocess

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import slurm
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as tr

from test_launchers import FakeRunner, fixture, job, lab, mode  # noqa: F401 (lab is a fixture)

FAILED = fixture('slurm', 'scontrol_show_job_failed.txt')
HELD = fixture('slurm', 'scontrol_show_job_requeued_held.txt')  # recorded after scontrol requeuehold


def held(restarts=1, excluded='(null)'):
    """The recorded record of a job requeued and held, as job 42 with these restarts and excluded nodes."""
    return (HELD.replace('JobId=3 ', 'JobId=42 ').replace('Restarts=1 ', 'Restarts=%d ' % restarts)
            .replace('ExcNodeList=(null)', 'ExcNodeList=%s' % excluded))


class Scontrol:
    """scontrol show job answers with the current record; requeuehold and release change it."""

    def __init__(self, record, refuse=()):
        self.record = record
        self.refuse = refuse

    def __call__(self, argv):
        if argv[1] in self.refuse:
            return 1, '', 'scontrol: error: Requested operation is presently disabled for job 42'
        if argv[1] == 'requeuehold':
            self.record = held(restarts=1)
        elif argv[1] == 'release':
            self.record = self.record.replace('JobState=PENDING Reason=job_requeued_in_held_state',
                                              'JobState=RUNNING Reason=None')
        return 0, self.record if argv[1] == 'show' else '', ''


def submitted(lab, runner, **kw):  # noqa: F811
    out = job(lab, 'slurm', runner=runner, slurm_partition='cpu', slurm_requeue=True, **kw).start()
    assert out['slurm_job_id'] == '42'
    return out


def test_a_requeueable_job_reads_its_launch_line_at_run_time_and_numbers_its_attempts(lab):  # noqa: F811
    runner = FakeRunner({'sbatch': (0, '42;cluster\n', ''), 'sinfo': (0, 'cpu\n', '')})
    submitted(lab, runner)
    jobdir = lab / 'jobs' / 'tiny-001'
    script, launch = (jobdir / 'job.sbatch').read_text(), (jobdir / 'job.launch').read_text()
    assert '#SBATCH --requeue' in script and '. %s' % (jobdir / 'job.launch') in script
    assert '#SBATCH --open-mode=append' in script   # a requeued run does not truncate the first attempt's output
    # the task count from the allocation: the environment kept from the submission names the first one's
    assert launch.startswith('srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" ')
    assert 'srun' not in script and launch.startswith('srun ') and mode(jobdir / 'job.launch') == 0o700
    assert 'GPUCLUSTER_ATTEMPT=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))' in launch   # the ranks' attempt, after env files
    assert 'alpha) n=2;;' in launch


def test_an_unsupervised_job_keeps_its_launch_line_in_the_script_and_is_not_requeued(lab):  # noqa: F811
    runner = FakeRunner({'sbatch': (0, '42;cluster\n', ''), 'sinfo': (0, 'cpu\n', '')})
    job(lab, 'slurm', runner=runner, slurm_partition='cpu').start()
    script = (lab / 'jobs' / 'tiny-001' / 'job.sbatch').read_text()
    assert '--requeue' not in script and 'srun ' in script and not (lab / 'jobs' / 'tiny-001' / 'job.launch').exists()


def test_the_batch_script_sends_a_requeued_attempts_output_to_its_own_file(tmp_path):
    logs = tmp_path / 'logs'
    logs.mkdir()
    (tmp_path / 'launch').write_text('echo "attempt $GPUCLUSTER_ATTEMPT ran"\n')
    script = tr.sbatch_script('job-7', 2, 0, '00:10:00', str(logs), str(tmp_path / 'hostfile'), 29500, '',
                              requeue_launch_file=str(tmp_path / 'launch'))
    (tmp_path / 'job.sbatch').write_text(script)
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'scontrol').write_text('#!/bin/sh\nif [ "$1" = show ] && [ "$2" = hostnames ]; then echo n1; echo n2; '
                                      'else echo "NodeName=$3 NodeAddr=10.0.0.1 State=IDLE"; fi\n')
    (bin_dir / 'scontrol').chmod(0o755)
    env = dict(os.environ, PATH='%s:%s' % (bin_dir, os.environ['PATH']), SLURM_JOB_ID='42', SLURM_JOB_NODELIST='n[1-2]')
    first = subprocess.run(['bash', str(tmp_path / 'job.sbatch')], env=env, capture_output=True, text=True)
    again = subprocess.run(['bash', str(tmp_path / 'job.sbatch')], env=dict(env, SLURM_RESTART_COUNT='2'),
                           capture_output=True, text=True)
    assert first.returncode == 0 and 'attempt 1 ran' in first.stdout
    assert again.returncode == 0 and 'attempt 3 ran' not in again.stdout
    assert 'attempt 3 ran' in (logs / 'job-7-42.attempt3.out').read_text()


def test_a_supervisors_stop_requeues_and_holds_the_job_instead_of_cancelling_it(lab):  # noqa: F811
    scontrol = Scontrol(FAILED.replace('JobId=4', 'JobId=42'))
    runner = FakeRunner({'sbatch': (0, '42;cluster\n', ''), 'sinfo': (0, 'cpu\n', ''), 'scontrol': scontrol,
                         'squeue': (0, '', '')})
    submitted(lab, runner)
    supervised = job(lab, 'slurm', runner=runner, slurm_partition='cpu', slurm_requeue=True)
    out = supervised.stop(sleep=lambda s: None, slurm_hold=True)
    assert ['scontrol', 'requeuehold', '42'] in runner.calls and not [c for c in runner.calls if c[0] == 'scancel']
    assert out['slurm_held'] is True and out['slurm_job_id'] == '42'


def test_a_job_slurm_cannot_requeue_is_cancelled_and_said_so(lab):  # noqa: F811
    runner = FakeRunner({'sbatch': (0, '42;cluster\n', ''), 'sinfo': (0, 'cpu\n', ''),
                         'scontrol': Scontrol(FAILED, refuse=('requeuehold',)), 'squeue': (0, '', '')})
    submitted(lab, runner)
    out = job(lab, 'slurm', runner=runner, slurm_partition='cpu').stop(sleep=lambda s: None, slurm_hold=True)
    assert ['scancel', '42'] in runner.calls and out['slurm_held'] is False


def test_the_restart_releases_the_same_job_on_the_kept_nodes_with_the_left_out_excluded(lab):  # noqa: F811
    scontrol = Scontrol(held(restarts=1))
    runner = FakeRunner({'sbatch': (0, '42;cluster\n', ''), 'sinfo': (0, 'cpu\n', ''), 'scontrol': scontrol})
    submitted(lab, FakeRunner({'sbatch': (0, '42;cluster\n', ''), 'sinfo': (0, 'cpu\n', '')}))
    kept = [n for n in job(lab).nodes if n['name'] != 'charlie']
    out = job(lab, 'slurm', runner=runner, slurm_partition='cpu', slurm_requeue=True, nodes=kept,
              script_args=['--steps', '5', '--resume', '/ckpt']).start()
    assert not [c for c in runner.calls if c[0] == 'sbatch']
    # StartTime=now: without it Slurm holds a requeued job about two minutes before it may run again
    assert ['scontrol', 'update', 'JobId=42', 'NumNodes=3-3', 'NumTasks=3', 'ReqNodeList=alpha,bravo-2,delta',
            'StartTime=now', 'ExcNodeList=charlie'] in runner.calls
    assert runner.calls[-1] == ['scontrol', 'release', '42']
    assert out['requeued'] is True and out['slurm_attempt'] == 2 and out['excluded'] == ['charlie']
    launch = (lab / 'jobs' / 'tiny-001' / 'job.launch').read_text()
    assert '--resume /ckpt' in launch and 'charlie' not in launch   # what the requeued batch script runs
    # the watch and the status read the new attempt's output, not the first attempt's failure
    assert out['log'].endswith('tiny-001-42.attempt2.out')


def test_a_release_slurm_refuses_fails_naming_the_command_and_its_answer(lab):  # noqa: F811
    runner = FakeRunner({'sinfo': (0, 'cpu\n', ''), 'scontrol': Scontrol(held(), refuse=('release',))})
    submitted(lab, FakeRunner({'sbatch': (0, '42;cluster\n', ''), 'sinfo': (0, 'cpu\n', '')}))
    with pytest.raises(Exception, match='scontrol release 42 refused the requeued Slurm job 42 .job tiny-001.: '
                                        'scontrol: error: Requested operation'):
        job(lab, 'slurm', runner=runner, slurm_partition='cpu', slurm_requeue=True).start()


def test_a_held_job_is_left_alone_by_a_start_that_does_not_requeue(lab):  # noqa: F811
    runner = FakeRunner({'sbatch': (0, '43;cluster\n', ''), 'sinfo': (0, 'cpu\n', ''), 'scontrol': Scontrol(held())})
    out = job(lab, 'slurm', runner=runner, slurm_partition='cpu').start()
    assert out['slurm_job_id'] == '43' and not [c for c in runner.calls if c[:2] == ['scontrol', 'release']]


@pytest.mark.parametrize('text, names', [
    ('(null)', []), ('', []), ('n1', ['n1']), ('gpu-a,gpu-b', ['gpu-a', 'gpu-b']),
    ('node[01-03,7],login', ['node01', 'node02', 'node03', 'node7', 'login']),
    ('r[1-2]-gpu', ['r1-gpu', 'r2-gpu'])])
def test_slurm_host_lists_are_expanded(text, names):
    assert slurm.hostlist(text) == names


def test_held_is_a_pending_job_waiting_for_its_release():
    assert slurm.is_held(slurm.parse_oneline(held()))
    assert not slurm.is_held(slurm.parse_oneline(FAILED))
    assert slurm.restarts(slurm.parse_oneline(held(restarts=3))) == 3


def test_the_head_refuses_a_partition_slurm_does_not_have_or_a_controller_sinfo_cannot_reach(lab):  # noqa: F811
    problems, _, _ = job(lab, 'slurm', runner=FakeRunner({'sinfo': (0, 'cpu\ngpu\n', '')}),
                         slurm_partition='a100').check()
    assert 'slurm_partition a100 does not exist (partitions: cpu, gpu)' in problems
    down = FakeRunner({'sinfo': (1, '', 'slurm_load_partitions: Unable to contact slurm controller (connect failure)')})
    problems, _, _ = job(lab, 'slurm', runner=down, slurm_partition='cpu').check()
    assert any(p.startswith('sinfo cannot reach the Slurm controller: slurm_load_partitions: Unable to contact')
               for p in problems)
    # a worker asks nothing of Slurm: the head submits
    worker = FakeRunner({'sinfo': (0, 'cpu\n', '')})
    problems, _, _ = job(lab, 'slurm', 'bravo-2', runner=worker, slurm_partition='a100').check()
    assert not [p for p in problems if 'slurm' in p] and not [c for c in worker.calls if c[0] == 'sinfo']
