"""Start, status, watch and stop of a training job for each launcher, on a 2+1+1+1 cluster, with a
fake runner (recorded outputs) and a fake process table."""

import json
import os
import signal

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import job as jb
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import launchers as ln
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr

from test_processes import ME, OTHER, fake_kernel, fake_proc, kills, torchrun_tree  # noqa: F401 (kills is a fixture)

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures')
NODES = [{'name': 'alpha', 'address': '10.99.0.11', 'slots': 2},
         {'name': 'bravo-2', 'address': '10.99.0.12', 'slots': 1},
         {'name': 'charlie', 'address': '10.99.0.13', 'slots': 1},
         {'name': 'delta', 'address': '10.99.0.14', 'slots': 1}]
SECRET = 'hf_S3cretTokenValue'


def fixture(*parts):
    with open(os.path.join(FIXTURES, *parts)) as handle:
        return handle.read()


class FakeRunner:
    """Answers commands from a table {argv[0] or 'bash -c': (rc, out, err)} and records them."""

    def __init__(self, answers=None, check_mode=False):
        self.answers = answers or {}
        self.calls = []
        self.check_mode = check_mode

    def run(self, argv, cwd=None, environ=None):
        self.calls.append(list(argv))
        key = 'ssh-probe' if argv[:2] == ['bash', '-c'] else argv[0]
        answer = self.answers.get(key, (0, '', ''))
        return answer(argv) if callable(answer) else answer

    bin_dir = '/usr/bin'

    def which(self, name):
        return os.path.join(self.bin_dir, name)

    def versions(self, python, environ):
        return {'torch': '2.13.0+cpu', 'deepspeed': '0.19.8'}, None


def probe_ok(argv):
    return 0, ''.join('%s\t0\t\n' % n['name'] for n in NODES), ''


@pytest.fixture
def lab(tmp_path):
    env = tmp_path / 'env' / 'bin'
    env.mkdir(parents=True)
    for name in ('python', 'deepspeed', 'torchrun', 'mpirun', 'sbatch', 'sinfo'):
        (env / name).write_text('#!/bin/sh\n')
        (env / name).chmod(0o755)
    (tmp_path / 'train.py').write_text('print(1)\n')
    proc = tmp_path / 'proc'
    (proc / 'net').mkdir(parents=True)
    (proc / 'net' / 'tcp').write_text('  sl  local_address rem_address   st\n')
    return tmp_path


def params(lab, launcher='deepspeed', node='alpha', **kw):
    p = dict(state='started', job_id='tiny-001', launcher=launcher, node=node, nodes=[dict(n) for n in NODES],
             script=str(lab / 'train.py'), script_args=['--steps', '5'], env_path=str(lab / 'env'),
             env={'DS_ACCELERATOR': 'cpu', 'HF_TOKEN': SECRET}, env_files=[], master_addr='10.99.0.11',
             master_port=29500, nproc_per_node=None, job_dir=str(lab / 'jobs' / 'tiny-001'),
             state_dir=str(lab / 'state' / node), hostfile=None, deepspeed_launcher='pdsh', slurm_partition=None,
             slurm_time='01:00:00', slurm_gpus_per_node=0, slurm_cpus_per_task=1, ssh_check=True,
             watch_timeout=30, step_regex='step [0-9]+ loss', log_lines=20, stop_timeout=1)
    p.update(kw)
    return p


def job(lab, launcher='deepspeed', node='alpha', runner=None, **kw):
    runner = runner or FakeRunner({'ssh-probe': probe_ok})
    runner.bin_dir = str(lab / 'env' / 'bin')
    return jb.Job(params(lab, launcher, node, **kw), runner, proc=str(lab / 'proc'))


class Spawn:
    def __init__(self):
        self.calls = []

    def __call__(self, line, env, cwd, log, state_dir, job_id=None, exit_files=()):
        self.calls.append({'line': line, 'env': env, 'log': log, 'exit_files': list(exit_files)})
        return {'pid': 4242, 'start_time': 1, 'uid': ME, 'job_id': job_id}


def mode(path):
    return os.stat(str(path)).st_mode & 0o777


# ----- start ------------------------------------------------------------------------------------
def test_deepspeed_start_writes_each_nodes_own_slots_and_private_env_files(lab):
    spawn = Spawn()
    out = job(lab).start(spawn=spawn)
    jobdir = lab / 'jobs' / 'tiny-001'
    assert (jobdir / 'hostfile').read_text() == 'alpha slots=2\nbravo-2 slots=1\ncharlie slots=1\ndelta slots=1\n'
    assert out['world_size'] == 5 and out['ranks'] == [0, 1] and out['role'] == 'launcher'
    assert mode(jobdir / 'job.env') == 0o600 and mode(jobdir / 'deepspeed_env') == 0o600
    assert 'HF_TOKEN=%s' % SECRET in (jobdir / 'deepspeed_env').read_text()
    assert mode(lab / 'state' / 'alpha' / 'tiny-001') == 0o700
    call = spawn.calls[0]
    assert call['env']['DS_ENV_FILE'] == str(jobdir / 'deepspeed_env')
    assert 'BatchMode=yes' in call['env']['PDSH_SSH_ARGS_APPEND']
    assert 'ConnectTimeout=' in call['env']['PDSH_SSH_ARGS_APPEND']
    assert '--hostfile %s' % (jobdir / 'hostfile') in call['line'] and '--num_nodes 4' in call['line']
    assert call['exit_files'] == [str(jobdir / 'exit' / 'alpha')]
    # the token is in the 0600 files only: never on the command line, never in the result
    assert SECRET not in call['line'] and SECRET not in json.dumps(out)


def test_deepspeed_worker_starts_nothing_itself(lab):
    spawn = Spawn()
    out = job(lab, node='charlie').start(spawn=spawn)
    assert spawn.calls == [] and out['started'] is False and out['role'] == 'ranks' and out['ranks'] == [3, 3]


@pytest.mark.parametrize('node,nproc', [('alpha', 2), ('delta', 1)])
def test_torchrun_gives_each_node_its_own_nproc_per_node(lab, node, nproc):
    spawn = Spawn()
    out = job(lab, 'torchrun', node).start(spawn=spawn)
    line = spawn.calls[0]['line']
    assert '--nnodes 4 --nproc-per-node %d ' % nproc in line
    assert '--rdzv-endpoint 10.99.0.11:29500' in line
    assert out['role'] == 'agent' and out['world_size'] == 5
    assert '. %s' % (lab / 'jobs' / 'tiny-001' / 'job.env') in line   # the job's env comes from its 0600 file
    assert mode(lab / 'jobs' / 'tiny-001' / 'job.env') == 0o600


def test_nproc_per_node_above_a_nodes_slots_is_refused_naming_the_node(lab):
    with pytest.raises(ln.JobError, match='nproc_per_node 2 is above the 1 slot.s. of node bravo-2'):
        job(lab, 'torchrun', nproc_per_node=2)


def test_mpirun_runs_the_sum_of_slots_from_an_openmpi_hostfile(lab):
    spawn = Spawn()
    job(lab, 'mpirun').start(spawn=spawn)
    line = spawn.calls[0]['line']
    assert '-np 5 --map-by slot' in line and 'plm_rsh_args' in line
    # the head starts every node's daemon (no tree spawn: workers need not reach each other over SSH),
    # told to mpirun alone, not forwarded to the ranks
    env = spawn.calls[0]['env']
    assert env['OMPI_MCA_plm_rsh_no_tree_spawn'] == '1' and env['PRTE_MCA_plm_ssh_no_tree_spawn'] == '1'
    assert 'no_tree_spawn' not in line
    assert (lab / 'jobs' / 'tiny-001' / 'hostfile').read_text().splitlines()[0] == 'alpha slots=2'


def test_slurm_start_submits_a_script_without_secrets_and_returns_the_id(lab):
    runner = FakeRunner({'sbatch': (0, '42;cluster\n', ''), 'sinfo': (0, 'cpu\n', '')})
    out = job(lab, 'slurm', runner=runner, slurm_partition='cpu').start()
    script = (lab / 'jobs' / 'tiny-001' / 'job.sbatch').read_text()
    assert out['slurm_job_id'] == '42' and runner.calls[-1][:2] == ['sbatch', '--parsable']
    assert SECRET not in script and 'sbatch' not in out and SECRET not in json.dumps(out)
    assert "alpha) n=2;;" in script and "delta) n=1;;" in script
    assert mode(lab / 'jobs' / 'tiny-001' / 'job.sbatch') == 0o700


def test_slurm_time_with_a_newline_is_refused_before_anything_is_written(lab):
    with pytest.raises(ln.JobError, match='node alpha: slurm_time'):
        job(lab, 'slurm', slurm_time='01:00:00\n#SBATCH --uid=0')
    assert not (lab / 'jobs').exists()


# ----- preflight ---------------------------------------------------------------------------------
def test_check_names_every_node_the_head_cannot_reach_over_ssh(lab):
    probe = ('alpha\t0\t\nbravo-2\t0\t\ncharlie\t255\tssh: connect to host 10.99.0.13 port 22: Connection timed out\n'
             'delta\t255\tHost key verification failed.\n')
    runner = FakeRunner({'ssh-probe': (0, probe, '')})
    problems, _, _ = job(lab, runner=runner).check()
    user = job(lab).user
    assert problems == [
        'head cannot reach charlie over SSH as %s: ssh: connect to host 10.99.0.13 port 22: Connection timed out' % user,
        'head cannot reach delta over SSH as %s: Host key verification failed.' % user]
    script = runner.calls[0][2]
    assert 'BatchMode=yes' in script and 'StrictHostKeyChecking=yes' in script and 'ConnectTimeout=5' in script


def test_the_ssh_connect_bound_is_the_setting_in_the_check_pdsh_and_mpirun(lab):
    # many nodes, or a loaded head: sshd's banner comes later than 5 s, and the user raises the bound
    runner = FakeRunner({'ssh-probe': probe_ok})
    job(lab, runner=runner, ssh_connect_timeout=30).check()
    script = runner.calls[0][2]
    assert 'ConnectTimeout=30' in script and 'timeout 65 ssh' in script and 'ConnectTimeout=5' not in script
    spawn = Spawn()
    job(lab, ssh_connect_timeout=30).start(spawn=spawn)
    assert 'ConnectTimeout=30' in spawn.calls[0]['env']['PDSH_SSH_ARGS_APPEND']
    mpirun = job(lab, 'mpirun', ssh_connect_timeout=30).launcher.command()
    assert 'ConnectTimeout=30' in ' '.join(mpirun)


def test_check_of_torchrun_needs_no_ssh_and_a_worker_never_probes(lab):
    runner = FakeRunner()
    job(lab, 'torchrun', runner=runner).check()
    job(lab, 'deepspeed', 'delta', runner=runner).check()
    assert runner.calls == []


# ----- status ------------------------------------------------------------------------------------
def write_log(lab, node, text):
    logs = lab / 'jobs' / 'tiny-001' / 'logs'
    logs.mkdir(parents=True, exist_ok=True)
    (logs / ('%s.log' % node)).write_text(text)


def test_deepspeed_status_names_the_node_whose_launcher_reported_a_rank_exit_first_by_its_name(lab):
    # the recorded head log of a 2+1+1 lab, its hosts renamed to this cluster's, bravo-2 by its address (a
    # hostfile by address)
    text = fixture('pdsh', 'deepspeed-head-log-rank-killed-on-worker-1.txt')
    text = text.replace('lab-worker-1', '10.99.0.12').replace('lab-worker-2', 'charlie').replace('lab-head', 'alpha')
    write_log(lab, 'alpha', text)
    out = job(lab, 'deepspeed', 'alpha').status()
    assert out['rank_failure']['node'] == 'bravo-2' and out['rank_failure']['signal'] == 'SIGKILL'
    assert out['node_exit_codes'] == {'bravo-2': 247, 'charlie': 1, 'alpha': 1}   # pdsh's address named as its node


def test_deepspeed_status_names_the_worker_pdsh_could_not_reach(lab):
    write_log(lab, 'alpha', fixture('pdsh', 'deepspeed-head-log-worker-blocked.txt'))
    out = job(lab).status()
    assert out['node_exit_codes'] == {'delta': 255}
    assert [(u['node'], u['cause']) for u in out['launcher_unreachable']] == [
        ('bravo-2', 'Timeout, server 10.99.0.12 not responding'),
        ('delta', 'ssh: connect to host 10.99.0.14 port 22: Connection timed out')]
    assert out['running'] is False
    # a result with a true "unreachable" is, to Ansible, the head itself unreachable: its read then failed, and the
    # supervisor took the head of a job whose launcher lost its workers (a reboot of the head) for a dead node
    assert 'unreachable' not in out


def test_mpirun_status_maps_a_rank_to_its_node_with_mixed_slots(lab):
    write_log(lab, 'alpha', fixture('openmpi', 'mpirun-rank-exit3.txt'))
    # rank 1 is alpha's second slot on a 2+1+1+1 cluster, not the second node
    assert job(lab, 'mpirun').status()['node_exit_codes'] == {'alpha': 3}
    write_log(lab, 'alpha', fixture('openmpi', 'mpirun-rank-killed.txt'))
    assert list(job(lab, 'mpirun').status()['node_exit_codes'].values()) == [137]


def test_torchrun_status_reads_the_first_failure_of_its_agent(lab):
    write_log(lab, 'bravo-2', fixture('torchrun', 'agent-rank-killed.log'))
    out = job(lab, 'torchrun', 'bravo-2').status()
    assert out['rank_failure']['signal'] == 'SIGKILL' and out['rank_failure']['exit_code'] == -9


def test_slurm_status_reads_scontrol_then_srun_lines(lab):
    state = lab / 'state' / 'alpha' / 'tiny-001'
    state.mkdir(parents=True)
    (state / 'slurm_job_id').write_text('3\n')
    logs = lab / 'jobs' / 'tiny-001' / 'logs'
    logs.mkdir(parents=True)
    (logs / 'tiny-001-3.out').write_text(fixture('slurm', 'srun-task-exit3.txt'))
    runner = FakeRunner({'squeue': (0, '', ''), 'scontrol': (0, fixture('slurm', 'scontrol_show_job_failed.txt'), '')})
    out = job(lab, 'slurm', runner=runner).status()
    assert out['slurm_job_id'] == '3' and out['slurm_state'] == 'FAILED' and out['running'] is False
    assert list(out['node_exit_codes'])[0] == 'mol-slurm-worker-1'


def test_status_ignores_a_stale_pidfile_and_another_users_job(lab):
    proc = lab / 'proc'
    fake_proc(proc, 700, start_time=99, env={}, cmdline=('vim',))             # pid reused by an unrelated process
    fake_proc(proc, 701, uid=OTHER, env={pr.JOB_ENV: 'tiny-001'})              # another account's job of the same id
    state = lab / 'state' / 'alpha' / 'tiny-001'
    state.mkdir(parents=True)
    pr.write_pidfile(str(state / 'pid'), {'pid': 700, 'start_time': 11, 'uid': ME, 'job_id': 'tiny-001'})
    out = job(lab, 'torchrun').status()
    assert out['running'] is False and out['pids'] == []


# ----- stop --------------------------------------------------------------------------------------
@pytest.fixture
def proc(lab):
    """The fake /proc the kills fixture (from test_processes) ends processes in."""
    return lab / 'proc'


@pytest.mark.parametrize('launcher,node', [('deepspeed', 'alpha'), ('deepspeed', 'delta'), ('torchrun', 'charlie'),
                                           ('mpirun', 'bravo-2')])
def test_stop_ends_the_jobs_processes_only(lab, proc, kills, launcher, node):
    fake_proc(proc, 800, env={pr.JOB_ENV: 'tiny-001'}, cmdline=('python', 'train.py'))
    fake_proc(proc, 801, pgid=800, env={pr.JOB_ENV: 'tiny-001'})
    fake_proc(proc, 802, env={pr.JOB_ENV: 'tiny-002'})                        # another job of ours
    fake_proc(proc, 803, uid=OTHER, env={pr.JOB_ENV: 'tiny-001'})             # another account's
    fake_proc(proc, 700, start_time=99, env={}, cmdline=('vim',))             # named by a stale pid file
    state = lab / 'state' / node / 'tiny-001'
    state.mkdir(parents=True)
    pr.write_pidfile(str(state / 'pid'), {'pid': 700, 'start_time': 11, 'uid': ME, 'job_id': 'tiny-001'})
    out = job(lab, launcher, node).stop(sleep=lambda s: None)
    assert out['stopped_pids'] == [800, 801] and out['changed'] is True
    assert sorted(pr.pids(str(proc))) == [700, 802, 803]
    assert all(call[1] not in (700, 803) for call in kills)


def test_an_agent_that_outlives_its_wrapper_is_killed_itself_and_the_stop_leaves_nothing(lab, proc, monkeypatch):
    # the wrapper the pid file names leads the group and ends on SIGTERM; torchrun's agent outlives it (its
    # rank is a zombie): the SIGKILL round cannot go through the gone leader, the agent gets it itself
    leader = torchrun_tree(proc, 'tiny-001')
    state = lab / 'state' / 'charlie' / 'tiny-001'
    state.mkdir(parents=True)
    pr.write_pidfile(str(state / 'pid'), dict(leader, job_id='tiny-001'))
    calls = fake_kernel(monkeypatch, proc, survive_sigterm=(110,))
    clock = Clock()
    out = job(lab, 'torchrun', 'charlie').stop(sleep=clock.sleep, clock=clock)
    assert out['stopped_pids'] == [100, 110] and out['running'] is False
    assert ('kill', 110, signal.SIGKILL) in calls and not (proc / '110').exists()


def test_the_daemons_of_a_job_are_the_parents_of_its_ranks_that_run_a_named_program(proc):
    from test_processes import orted_tree
    orted_tree(proc)
    found = ln.daemons_of(pr.job_processes('job-1', ME, str(proc)), ('orted', 'prted'), ME, str(proc))
    # job-1's orted; not job-2's, not another account's (whose rank of job-1 is not ours either)
    assert [(d['pid'], d['cmdline']) for d in found] == [(50, '/usr/bin/orted -mca ess env')]
    assert ln.daemons_of(pr.job_processes('job-1', ME, str(proc)), (), ME, str(proc)) == []


@pytest.mark.parametrize('launcher,stopped', [('mpirun', [830, 831]), ('torchrun', [831])])
def test_the_stop_of_an_mpirun_worker_ends_the_orted_that_started_its_rank(lab, proc, kills, launcher, stopped):
    # Open MPI's orted, started over SSH by the head's mpirun, has no job id in its environment: only as
    # its rank's parent is it the job's, and only the mpirun launcher has it
    fake_proc(proc, 830, pgid=829, comm='orted', cmdline=('/usr/bin/orted', '-mca', 'ess', 'env'), env={})
    fake_proc(proc, 831, ppid=830, pgid=829, env={pr.JOB_ENV: 'tiny-001', 'RANK': '2'})
    out = job(lab, launcher, 'charlie').stop(sleep=lambda s: None)
    assert out['stopped_pids'] == stopped and out['running'] is False
    assert (proc / '830').exists() is (launcher != 'mpirun')


def test_stop_with_an_owner_reaches_only_that_accounts_processes(lab, proc, kills):
    import pwd
    other = [a for a in pwd.getpwall() if a.pw_uid != ME][0]
    fake_proc(proc, 810, uid=other.pw_uid, env={pr.JOB_ENV: 'tiny-001'})
    fake_proc(proc, 811, uid=ME, env={pr.JOB_ENV: 'tiny-001'})
    clock = Clock()
    with pytest.raises(ln.JobError, match='1 process.es. of job tiny-001 are left: 810; the kernel refused to signal '
                                          '810 .not permitted.') as err:
        job(lab, 'torchrun', owner=other.pw_name).stop(sleep=clock.sleep, clock=clock)
    # the kernel (here: the fake kill) refuses: an answer in the result, not a crash; ours is untouched
    assert [r['pid'] for r in err.value.result['refused']] == [810] and (proc / '811').exists()
    with pytest.raises(ln.JobError, match='as its owner %s' % other.pw_name):
        job(lab, 'torchrun', owner=other.pw_name).start(spawn=Spawn())


@pytest.mark.parametrize('launcher', ['slurm', 'deepspeed', 'mpirun'])
def test_a_worker_whose_ranks_the_head_starts_is_not_refused_at_the_start_for_them(lab, proc, launcher):
    # the head's sbatch (pdsh, mpirun) may have started this worker's ranks before its own start task ran
    fake_proc(proc, 820, uid=ME, env={pr.JOB_ENV: 'tiny-001'})
    out = job(lab, launcher, 'charlie', state='started').start(spawn=Spawn())
    assert out['started'] is False
    # the preflight, before anything starts, refuses such a leftover
    problems, _, _ = job(lab, launcher, 'charlie', state='checked').check()
    assert 'job tiny-001 already has processes here' in problems


def test_a_node_that_starts_its_own_launcher_is_refused_when_the_job_runs_there_already(lab, proc):
    fake_proc(proc, 821, uid=ME, env={pr.JOB_ENV: 'tiny-001'})
    with pytest.raises(ln.JobError, match='node charlie cannot start job tiny-001: job tiny-001 already has processes here'):
        job(lab, 'torchrun', 'charlie', state='started').start(spawn=Spawn())


def test_stop_of_slurm_cancels_the_allocation(lab, proc, kills):
    state = lab / 'state' / 'alpha' / 'tiny-001'
    state.mkdir(parents=True)
    (state / 'slurm_job_id').write_text('9\n')
    runner = FakeRunner({'squeue': (0, '', ''), 'scontrol': (0, fixture('slurm', 'scontrol_show_job_cancelled.txt'), '')})
    out = job(lab, 'slurm', runner=runner).stop(sleep=lambda s: None)
    assert ['scancel', '9'] in runner.calls and out['changed'] is True


def test_a_finished_job_signals_nothing(lab, proc, kills):
    fake_proc(proc, 900, start_time=5, env={}, cmdline=('bash',))
    state = lab / 'state' / 'alpha' / 'tiny-001'
    state.mkdir(parents=True)
    pr.write_pidfile(str(state / 'pid'), {'pid': 900, 'start_time': 5, 'uid': ME, 'job_id': None})
    (state / 'exit_code').write_text('0\n')
    out = job(lab, 'torchrun').stop(sleep=lambda s: None)
    assert out['stopped_pids'] == [] and kills == [] and out['changed'] is False


# ----- watch -------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_watch_stops_at_once_naming_the_worker_the_head_cannot_reach(lab):
    write_log(lab, 'alpha', fixture('pdsh', 'deepspeed-head-log-worker-blocked.txt'))
    clock = Clock()
    j = job(lab)
    out = j.watch(900, 'step [0-9]+ loss', sleep=clock.sleep, clock=clock)
    assert out['elapsed'] == 0 and out['first_step'] is None and not out['timed_out']
    assert out['failures'][1] == {
        'node': 'delta', 'cause': 'head cannot reach delta over SSH as %s: ssh: connect to host 10.99.0.14 port 22: '
                                  'Connection timed out' % j.user}


def charlie_exits_1_at(lab, clock, at):
    """A sleep that moves the clock and writes charlie's exit code 1 into the job directory at time at."""
    exits = lab / 'jobs' / 'tiny-001' / 'exit'
    exits.mkdir(parents=True)

    def later(seconds):
        clock.sleep(seconds)
        if clock.now >= at:
            (exits / 'charlie').write_text('1\n')
    return later


def test_watch_names_a_torchrun_agent_that_exited_non_zero(lab):
    write_log(lab, 'alpha', 'waiting for the rendezvous\n')
    clock = Clock()
    out = job(lab, 'torchrun').watch(900, 'step [0-9]+ loss', sleep=charlie_exits_1_at(lab, clock, 3), clock=clock)
    assert out['failures'] == [{'node': 'charlie', 'cause': 'its torchrun agent exited with code 1'}]
    assert out['elapsed'] == 3.0
    # the failure comes with the head's last lines, for the message that names the node
    assert out['log_tail'] == ['waiting for the rendezvous'] and out['log'].endswith('.log')


def test_watch_of_a_job_that_logged_steps_then_failed_says_it_failed_at_its_last_step(lab):
    # a user's script with its own step lines (training_progress_regex): 25 iterations, then a node's agent exited 1,
    # all before the watch's first look (a fast failure, or a watch that began late on a loaded head)
    write_log(lab, 'alpha', ''.join('it %d loss %.2f\n' % (i, 2.0 - i / 100) for i in range(1, 26)) + 'Traceback ...\n')
    clock = Clock()
    charlie_exits_1_at(lab, clock, 0)(0)
    out = job(lab, 'torchrun').watch(900, r'it (?P<step>[0-9]+) loss', sleep=clock.sleep, clock=clock)
    assert out['failures'] == [{'node': 'charlie', 'cause': 'its torchrun agent exited with code 1'}]
    assert out['failed_at_step'] == 25 and out['last_step'] == 'it 25 loss 1.75'
    # the step pattern the start did not know (the old default) leaves the same failure a failed start
    write_log(lab, 'alpha', 'waiting for the rendezvous\n')
    out = job(lab, 'torchrun').watch(900, 'step [0-9]+ loss', sleep=clock.sleep, clock=clock)
    assert out['failures'] and out['failed_at_step'] is None and out['last_step'] is None


def test_watch_returns_the_first_step_and_times_out_bounded(lab):
    write_log(lab, 'alpha', 'alpha: step 0 loss 2.30\n')
    clock = Clock()
    # the whole line, not only the part the regex matched (its loss too)
    assert job(lab).watch(900, 'step [0-9]+ loss', sleep=clock.sleep, clock=clock)['first_step'] == \
        'alpha: step 0 loss 2.30'
    write_log(lab, 'alpha', 'nothing yet\n')
    out = job(lab).watch(30, 'step [0-9]+ loss', sleep=clock.sleep, clock=clock)
    assert out['timed_out'] and out['elapsed'] == 30.0 and out['log_tail'] == ['nothing yet']


def test_wait_end_returns_when_a_torchrun_agent_exits_non_zero_with_the_last_step(lab):
    write_log(lab, 'alpha', 'alpha: step 1 loss 2.30\nalpha: step 2 loss 2.10\nother line\n')
    clock = Clock()
    out = job(lab, 'torchrun').wait_end(60, 'step [0-9]+ loss', sleep=charlie_exits_1_at(lab, clock, 6), clock=clock)
    assert out['ended'] and out['job_failed'] and not out['timed_out'] and out['elapsed'] == 6.0
    assert out['last_step'] == 'alpha: step 2 loss 2.10'
    # the wait's polls leave the tracebacks to the status read after it
    assert 'errors' not in job(lab, 'torchrun').status(errors=False) and 'errors' in job(lab, 'torchrun').status()


def test_wait_end_of_torchrun_waits_for_every_agent_and_is_bounded(lab):
    # the head's agent is done (exit 0) but charlie's and the others' are not written: not ended yet
    exits = lab / 'jobs' / 'tiny-001' / 'exit'
    exits.mkdir(parents=True)
    (exits / 'alpha').write_text('0\n')
    clock = Clock()
    out = job(lab, 'torchrun').wait_end(10, 'step [0-9]+ loss', sleep=clock.sleep, clock=clock)
    assert out['timed_out'] and not out['ended'] and out['elapsed'] == 10.0 and out['last_step'] is None
    for node in NODES:
        (exits / node['name']).write_text('0\n')
    out = job(lab, 'torchrun').wait_end(10, 'step [0-9]+ loss', sleep=clock.sleep, clock=clock)
    assert out['ended'] and not out['job_failed'] and out['elapsed'] == 0


def test_every_python_of_the_job_is_unbuffered_unless_training_env_says_otherwise(lab):
    job(lab, 'torchrun').start(spawn=Spawn())
    assert "PYTHONUNBUFFERED=1" in (lab / 'jobs' / 'tiny-001' / 'job.env').read_text()
    job(lab, env={}, job_id='ds-1', job_dir=str(lab / 'jobs' / 'ds-1')).start(spawn=Spawn())
    assert 'PYTHONUNBUFFERED=1\n' in (lab / 'jobs' / 'ds-1' / 'deepspeed_env').read_text()   # pdsh forwards it
    job(lab, 'torchrun', env={'PYTHONUNBUFFERED': ''}, job_id='t-2', job_dir=str(lab / 'jobs' / 't-2')).start(spawn=Spawn())
    assert "PYTHONUNBUFFERED=''" in (lab / 'jobs' / 't-2' / 'job.env').read_text()


def test_check_refuses_an_environment_without_torch(lab):
    class NoTorch(FakeRunner):
        def versions(self, python, environ):
            return {'torch': None, 'deepspeed': None}, None
    problems, _, _ = job(lab, 'torchrun', runner=NoTorch()).check()
    assert problems == ['torch is not installed in %s' % (lab / 'env')]


def test_the_ssh_probe_script_reports_every_node_at_once_with_ssh_crlf_lines(tmp_path):
    """The probe run by bash, with an ssh stand-in that answers as OpenSSH 9.2 did (CR LF lines)."""
    import subprocess
    import time
    from ansible_collections.gpucluster.multinode.plugins.module_utils.training import launch_failures as lf
    (tmp_path / 'ssh').write_text(
        '#!/bin/bash\nfor host; do :; done; host=${@: -2:1}\n'
        'case "$host" in\n'
        '  ok) exit 0 ;;\n'
        '  slow) sleep 2; printf "Connection timed out during banner exchange\\r\\nConnection to 10.1.0.9 port 22 timed '
        'out\\r\\n" >&2; exit 255 ;;\n'
        '  *) printf "ssh: connect to host 10.1.0.8 port 22: Connection timed out\\r\\n" >&2; sleep 2; exit 255 ;;\n'
        'esac\n')
    (tmp_path / 'ssh').chmod(0o755)
    env = dict(os.environ, PATH='%s:%s' % (tmp_path, os.environ['PATH']))
    start = time.time()
    out = subprocess.run(['bash', '-c', lf.ssh_probe_script(['ok', 'slow', 'dropped'], 5)], env=env,
                         capture_output=True, check=True).stdout.decode()
    assert time.time() - start < 3.9   # in parallel: one after the other takes 4 s or more
    assert lf.probe_refusals(lf.parse_ssh_probe(out), ['ok', 'slow', 'dropped'], 'train') == [
        'head cannot reach slow over SSH as train: Connection timed out during banner exchange | '
        'Connection to 10.1.0.9 port 22 timed out',
        'head cannot reach dropped over SSH as train: ssh: connect to host 10.1.0.8 port 22: Connection timed out']


def test_the_ssh_probe_script_keeps_every_node_s_line_whole_when_ssh_says_more_than_a_pipe_write(tmp_path):
    """ssh -v says about 4.4 KB for a login that works (seen on the lab): more than one atomic write to a pipe
    (PIPE_BUF, 4096 bytes). Lines of nodes probed at once must not be mixed: a line cut by another's was read as
    no answer at all ('head cannot reach lab-head over SSH as train: no answer from ssh' on a 4-node lab)."""
    import subprocess
    from ansible_collections.gpucluster.multinode.plugins.module_utils.training import launch_failures as lf
    (tmp_path / 'ssh').write_text(
        '#!/bin/bash\nhost=${@: -2:1}\n'
        'for i in $(seq 1 300); do printf "said: line %d of the login to %s, said at length by ssh -v\\r\\n" '
        '"$i" "$host" >&2; done\nexit 0\n')
    (tmp_path / 'ssh').chmod(0o755)
    env = dict(os.environ, PATH='%s:%s' % (tmp_path, os.environ['PATH']))
    targets = ['node-%d' % i for i in range(64)]
    out = subprocess.run(['bash', '-c', lf.ssh_probe_script(targets, 5)], env=env, capture_output=True,
                         check=True).stdout.decode()
    assert min(len(line) for line in out.splitlines()) > 4096
    results = lf.parse_ssh_probe(out)
    assert sorted(results) == sorted(targets)
    assert all(r["message"].count("login to %s," % t) == 300 for t, r in results.items())
    assert lf.probe_refusals(results, targets, 'train') == []


def test_the_probe_names_the_stage_that_did_not_finish_from_real_ssh_v_output():
    """Recorded on the lab (OpenSSH 9.2, logind sessions): a node that answers, a login refused, an
    address nothing answers at, a user manager slow to start (the login session waits on it) and a
    ~/.bashrc that sleeps (the command waits on it)."""
    from ansible_collections.gpucluster.multinode.plugins.module_utils.training import launch_failures as lf
    results = lf.parse_ssh_probe(fixture('ssh', 'probe_stages_openssh92.txt'))
    assert {t: (r['rc'], r['stage']) for t, r in results.items()} == {
        '10.213.74.11': (0, None), 'nobody@10.213.74.12': (255, 'authentication'),
        '10.213.74.99': (255, 'connect'), '10.213.74.10': (124, 'session'), '10.213.74.12': (124, 'command')}
    assert not any('debug1' in r['message'] for r in results.values())
    targets = ['10.213.74.11', 'nobody@10.213.74.12', '10.213.74.99', '10.213.74.10', '10.213.74.12']
    assert lf.probe_retry_targets(results, targets) == ['10.213.74.10', '10.213.74.12']
    lines = lf.probe_refusals(results, targets, 'train', uid=2000, limit=15)
    assert lines[0] == ('head reached nobody@10.213.74.12 over SSH, but the SSH handshake or the authentication as '
                        'train did not finish (nobody@10.213.74.12: Permission denied (publickey,password)): run '
                        'site.yml --tags ssh_trust (keys, pinned host keys) and see `journalctl -u ssh` on '
                        'nobody@10.213.74.12')
    assert lines[1] == ('head cannot reach 10.213.74.99 over SSH as train: '
                        'ssh: connect to host 10.213.74.99 port 22: No route to host')
    assert lines[2].startswith('head reached 10.213.74.10 over SSH and authenticated as train, but the login session '
                               'did not start within 15 s (tried twice): ')
    assert '`journalctl -u user@2000` and `loginctl user-status train` on 10.213.74.10' in lines[2]
    assert 'cannot reach' not in lines[2] + lines[3]
    assert lines[3].startswith('head logged in to 10.213.74.12 over SSH as train, but the command `true` did not '
                               'finish within 15 s (tried twice): ')
    assert len(lines) == 4


def session_line(name, rc):
    """A probe line as ssh -v prints it for a node that authenticated; rc 124: the session did not start."""
    said = ['debug1: Connecting to %s port 22.' % name, 'debug1: Connection established.',
            'Authenticated to %s ([10.99.0.12]:22) using "publickey".' % name, 'debug1: Entering interactive session.']
    if rc == 0:
        said += ['debug1: Sending command: true', 'debug1: Exit status 0']
    return '%s\t%d\t%s\n' % (name, rc, ' | '.join(said))


def test_a_slow_login_session_is_probed_once_more_and_a_second_success_is_no_refusal(lab):
    answers = iter([''.join(session_line(n['name'], 124 if n['name'] == 'bravo-2' else 0) for n in NODES),
                    session_line('bravo-2', 0)])
    runner = FakeRunner({'ssh-probe': lambda argv: (0, next(answers), '')})
    problems, _, _ = job(lab, runner=runner).check()
    assert problems == []
    assert len(runner.calls) == 2
    assert "'bravo-2'" not in runner.calls[1][2] and ' bravo-2 true' in runner.calls[1][2]
    assert ' alpha true' not in runner.calls[1][2] and ' delta true' not in runner.calls[1][2]


def test_a_login_session_slow_twice_is_refused_naming_the_session_stage_and_the_user_manager(lab):
    runner = FakeRunner({'ssh-probe': lambda argv: (0, ''.join(
        session_line(n['name'], 124 if n['name'] == 'bravo-2' else 0) for n in NODES if ' %s true' % n['name'] in argv[2]), '')})
    j = job(lab, runner=runner)
    problems, _, _ = j.check()
    assert len(runner.calls) == 2
    assert problems == [
        'head reached bravo-2 over SSH and authenticated as %s, but the login session did not start within 15 s '
        '(tried twice): sshd waits there on systemd-logind and the account\'s user manager, or on a slow PAM or NSS '
        'lookup; see `journalctl -u user@%d` and `loginctl user-status %s` on bravo-2 (ssh_trust_linger keeps the '
        'user manager running between jobs)' % (j.user, j.uid, j.user)]


def test_a_job_id_started_again_keeps_the_last_log_aside_and_watches_only_the_new_run(lab):
    write_log(lab, 'alpha', 'alpha: step 1 loss 2.30\nalpha: final loss 0.5\n')
    j = job(lab, 'torchrun')
    j.start(spawn=Spawn())
    logs = lab / 'jobs' / 'tiny-001' / 'logs'
    assert (logs / 'alpha.log.previous').read_text().startswith('alpha: step 1 loss')
    assert not (logs / 'alpha.log').exists() or (logs / 'alpha.log').read_text() == ''
    clock = Clock()
    out = job(lab, 'torchrun').watch(5, 'step [0-9]+ loss', sleep=clock.sleep, clock=clock)
    assert out['first_step'] is None and out['timed_out']   # the old run's step is not this run's


def test_status_reports_the_ranks_the_job_was_started_with(lab):
    # started with nproc_per_node 1 (world 4, not the inventory's 5): status without it reads layout.json
    job(lab, 'torchrun', nproc_per_node=1).start(spawn=Spawn())
    out = job(lab, 'torchrun', state='status').status()
    assert out['world_size'] == 4 and out['ranks'] == [0, 0] and out['slots'] == 1
    (lab / 'jobs' / 'tiny-001' / 'layout.json').write_text('not json')
    assert job(lab, 'torchrun', state='status').status()['world_size'] == 5   # unreadable: the inventory's


# ----- NCCL flight recorder ------------------------------------------------------------------------
def test_a_job_on_gpus_turns_on_the_flight_recorder_into_its_job_dir(lab, monkeypatch):
    device = lab / 'nvidiactl'
    device.write_text('')
    monkeypatch.setattr(jb.Job, 'GPU_DEVICE', str(device))
    job(lab, launcher='torchrun', env={'TORCH_FR_BUFFER_SIZE': '500'}).start(spawn=Spawn())
    jobdir = lab / 'jobs' / 'tiny-001'
    text = (jobdir / 'job.env').read_text()
    assert 'TORCH_FR_BUFFER_SIZE=500' in text and 'TORCH_FR_BUFFER_SIZE=2000' not in text  # training_env wins
    assert 'TORCH_NCCL_DUMP_ON_TIMEOUT=' in text and str(jobdir / 'flight' / 'rank_') in text
    assert (jobdir / 'flight').is_dir()
    # the deepspeed launcher forwards it to every node's ranks too
    job(lab, env={}, job_id='ds-1', job_dir=str(lab / 'jobs' / 'ds-1')).start(spawn=Spawn())
    assert 'TORCH_FR_DUMP_TEMP_FILE=%s' % (lab / 'jobs' / 'ds-1' / 'flight' / 'rank_') in \
        (lab / 'jobs' / 'ds-1' / 'deepspeed_env').read_text()


def test_a_job_on_cpus_has_no_flight_recorder(lab, monkeypatch):
    monkeypatch.setattr(jb.Job, 'GPU_DEVICE', str(lab / 'no-nvidiactl'))
    job(lab, launcher='torchrun', env={}).start(spawn=Spawn())
    jobdir = lab / 'jobs' / 'tiny-001'
    assert 'TORCH_FR' not in (jobdir / 'job.env').read_text() and not (jobdir / 'flight').exists()
    device = lab / 'nvidiactl'
    device.write_text('')
    monkeypatch.setattr(jb.Job, 'GPU_DEVICE', str(device))
    assert job(lab, launcher='torchrun').flight_dir is None  # DS_ACCELERATOR=cpu: gloo, no NCCL
