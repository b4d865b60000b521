"""job_state (the launchers' read): the job's state from every node's status, each node's status read by the
real launcher classes (module_utils/training/launchers.py) from the recorded logs of tests/unit/fixtures, on the
2+1+1+1 cluster of test_launchers.py (alpha is the head)."""

import os
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_state as js

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(__file__), '..', 'module_utils')))
from test_launchers import NODES, FakeRunner, fixture, job, lab, write_log  # noqa: E402,F401 (lab: a fixture)

NAMES = [n['name'] for n in NODES]


def exited(lab, node, code):
    """The exit status the wrapper of node's part wrote when it ended."""
    state = lab / 'state' / node / 'tiny-001'
    state.mkdir(parents=True, exist_ok=True)
    (state / 'exit_code').write_text('%d\n' % code)


def statuses(lab, launcher, runner=None):
    """Every node's status result, head first, as training_job state=status returns it."""
    return [job(lab, launcher, node, runner=runner).status() for node in NAMES]


def test_every_status_result_names_its_launcher(lab):
    assert [r['launcher'] for r in statuses(lab, 'torchrun')] == ['torchrun'] * 4


# ----- deepspeed (pdsh on the head) ------------------------------------------------------------------
def killed_on_worker_1(lab, worker_1):
    """The verdict of the recorded head log of a 2+1+1 lab where a rank on lab-worker-1 was killed (SIGKILL) and
    pdsh then named every host, lab-worker-1 named worker_1 there (bravo-2, or its address)."""
    text = fixture('pdsh', 'deepspeed-head-log-rank-killed-on-worker-1.txt')
    write_log(lab, 'alpha', text.replace('lab-worker-1', worker_1).replace('lab-worker-2', 'charlie')
              .replace('lab-head', 'alpha'))
    exited(lab, 'alpha', 1)
    return js.launch_verdict(statuses(lab, 'deepspeed'), NAMES)


def test_deepspeed_a_rank_killed_on_a_worker_puts_that_worker_first(lab):
    verdict = killed_on_worker_1(lab, 'bravo-2')
    assert verdict['state'] == 'failed'
    assert verdict['failed_nodes'][0] == 'bravo-2' and set(verdict['failed_nodes']) == {'bravo-2', 'charlie', 'alpha'}
    assert verdict['first_failure']['node'] == 'bravo-2'
    assert verdict['first_failure']['log'].endswith('(lines from bravo-2)')


def test_deepspeed_a_hostfile_of_addresses_still_names_the_node(lab):
    # pdsh names a host as the hostfile does: by its address, the culprit is still the node
    verdict = killed_on_worker_1(lab, '10.99.0.12')
    assert verdict['failed_nodes'][0] == 'bravo-2' and '10.99.0.12' not in verdict['failed_nodes']
    assert verdict['exit_codes']['bravo-2'] == 247
    assert verdict['first_failure']['log_tail'], 'the lines pdsh showed of bravo-2, though named by its address'


def test_deepspeed_a_worker_pdsh_cannot_reach_fails_the_job_naming_it(lab):
    write_log(lab, 'alpha', fixture('pdsh', 'deepspeed-head-log-worker-blocked.txt'))
    exited(lab, 'alpha', 255)
    verdict = js.launch_verdict(statuses(lab, 'deepspeed'), NAMES)
    assert verdict['state'] == 'failed' and verdict['failed_nodes'][0] == 'delta'


# ----- torchrun (an agent on every node) -------------------------------------------------------------
def test_torchrun_the_node_whose_rank_was_killed_is_the_culprit_though_every_agent_failed(lab):
    # every agent exits 1 once a rank dies; bravo-2's agent saw its rank killed first (recorded agent logs)
    for node in NAMES:
        log = 'agent-rank-killed.log' if node == 'bravo-2' else 'agent-peer-failed.log'
        write_log(lab, node, fixture('torchrun', log))
        exited(lab, node, 1)
    verdict = js.launch_verdict(statuses(lab, 'torchrun'), NAMES)
    assert verdict['state'] == 'failed'
    assert verdict['failed_nodes'][0] == 'bravo-2' and len(verdict['failed_nodes']) == 4
    assert verdict['first_failure']['node'] == 'bravo-2' and verdict['first_failure']['exit_code'] == 1


def test_torchrun_one_agent_failed_while_the_others_run_is_failed_not_running(lab):
    write_log(lab, 'charlie', fixture('torchrun', 'agent-rank-killed.log'))
    exited(lab, 'charlie', 1)
    results = statuses(lab, 'torchrun')
    for r in results:
        if r['node'] != 'charlie':
            r['running'] = True       # their ranks wait in a collective until the job is stopped
    verdict = js.launch_verdict(results, NAMES)
    assert verdict['state'] == 'failed' and verdict['failed_nodes'] == ['charlie']
    assert verdict['running_nodes'] == ['alpha', 'bravo-2', 'delta']


def test_torchrun_every_agent_done_is_succeeded_and_none_started_is_stopped(lab):
    for node in NAMES:
        exited(lab, node, 0)
    assert js.launch_verdict(statuses(lab, 'torchrun'), NAMES)['state'] == 'succeeded'
    for node in NAMES:
        os.remove(str(lab / 'state' / node / 'tiny-001' / 'exit_code'))
    assert js.launch_verdict(statuses(lab, 'torchrun'), NAMES)['state'] == 'stopped'


# ----- mpirun (Open MPI on the head) -----------------------------------------------------------------
@pytest.mark.parametrize('log,culprit,code', [('mpirun-rank-killed.txt', 'charlie', 137),
                                              ('mpirun-rank-exit3.txt', 'alpha', 3)])
def test_mpirun_the_node_of_the_failed_rank_comes_first(lab, log, culprit, code):
    # mpirun-rank-killed names the node of rank 1 (renamed to charlie); mpirun-rank-exit3 names only the rank:
    # rank 1 is alpha's second slot
    write_log(lab, 'alpha', fixture('openmpi', log).replace('mol-slurm-worker-1', 'charlie'))
    exited(lab, 'alpha', code)
    verdict = js.launch_verdict(statuses(lab, 'mpirun'), NAMES)
    assert verdict['state'] == 'failed' and verdict['failed_nodes'][0] == culprit
    assert verdict['exit_codes'][culprit] == code


# ----- slurm (sbatch, srun) -----------------------------------------------------------------------------
def slurm_job(lab, scontrol, out_log=None):
    state = lab / 'state' / 'alpha' / 'tiny-001'
    state.mkdir(parents=True, exist_ok=True)
    (state / 'slurm_job_id').write_text('3\n')
    if out_log:
        logs = lab / 'jobs' / 'tiny-001' / 'logs'
        logs.mkdir(parents=True, exist_ok=True)
        (logs / 'tiny-001-3.out').write_text(out_log)
    return FakeRunner({'squeue': (0, '', ''), 'scontrol': (0, fixture('slurm', scontrol), '')})


def test_slurm_a_failed_task_names_its_node_first(lab):
    text = fixture('slurm', 'srun-task-exit3.txt').replace('mol-slurm-worker-1', 'charlie').replace('mol-slurm-head', 'alpha')
    runner = slurm_job(lab, 'scontrol_show_job_failed.txt', text)
    verdict = js.launch_verdict(statuses(lab, 'slurm', runner), NAMES)
    assert verdict['state'] == 'failed' and verdict['failed_nodes'][0] == 'charlie'
    assert verdict['exit_codes']['charlie'] == 3
    # one log holds every node's lines under Slurm (its output file, on the head): the failure shows it
    first = verdict['first_failure']
    assert first['log'] == str(lab / 'jobs' / 'tiny-001' / 'logs' / 'tiny-001-3.out')
    assert first['log_tail'] and first['log_tail'][-1] == text.rstrip('\n').splitlines()[-1]


def test_slurm_a_cancelled_job_is_stopped_though_srun_names_the_tasks_it_killed(lab):
    text = fixture('slurm', 'srun-task-exit3.txt').replace('mol-slurm-worker-1', 'charlie').replace('mol-slurm-head', 'alpha')
    runner = slurm_job(lab, 'scontrol_show_job_cancelled.txt', text)
    verdict = js.launch_verdict(statuses(lab, 'slurm', runner), NAMES)
    assert verdict['state'] == 'stopped' and verdict['failed_nodes'] == []


def test_slurm_a_completed_job_succeeded(lab):
    runner = slurm_job(lab, 'scontrol_show_job_completed.txt', 'step 5 loss 0.1\n')
    assert js.launch_verdict(statuses(lab, 'slurm', runner), NAMES)['state'] == 'succeeded'


def test_slurm_a_finished_job_s_loss_line_is_found_above_the_agents_shutdown_lines(lab):
    # one file holds every node's lines: the agents' lines at the end push the final loss out of the tail
    chatter = ''.join('[W1201 02:%02d:00.000 socket.cpp:752] [c10d] The client socket has failed to connect '
                      'to [mol-slurm-head]:29500 (errno: 111 - Connection refused).\n' % i for i in range(30))
    runner = slurm_job(lab, 'scontrol_show_job_completed.txt', 'step 19 loss 0.2500\nfinal loss 0.1234\n' + chatter)
    verdict = js.launch_verdict(statuses(lab, 'slurm', runner), NAMES)
    assert verdict['state'] == 'succeeded' and verdict['last_loss_line'] == 'final loss 0.1234'
    assert 'last loss line: final loss 0.1234' in verdict['lines']


# ----- a node that could not be read --------------------------------------------------------------------
def test_a_node_that_could_not_be_read_makes_the_job_unknown_whatever_the_others_say(lab):
    for node in NAMES:
        exited(lab, node, 0)
    results = statuses(lab, 'torchrun')
    results[2] = {'failed': True, 'msg': 'node charlie: the job directory does not exist here'}
    verdict = js.job_verdict(results, NAMES, NAMES, 'tiny-001')
    assert verdict['state'] == 'unknown' and verdict['unknown_nodes'] == ['charlie']
    assert verdict['lines'][1] == 'charlie: read failed: node charlie: the job directory does not exist here'
    del results[2]
    assert js.job_verdict(results + [{}], NAMES, NAMES, 'tiny-001')['unknown_nodes'] == ['delta']


def test_a_read_of_part_of_the_job_says_a_failure_and_nothing_else_of_the_whole(lab):
    # training_status_nodes: the head and charlie read, bravo-2 and delta left out
    write_log(lab, 'charlie', fixture('torchrun', 'agent-rank-killed.log'))
    exited(lab, 'charlie', 1)
    results = statuses(lab, 'torchrun')
    read = [results[0], results[2]]
    verdict = js.job_verdict(read, ['alpha', 'charlie'], ['alpha', 'charlie'], 'tiny-001', ['bravo-2', 'delta'])
    assert verdict['state'] == 'failed' and verdict['left_out'] == ['bravo-2', 'delta']
    assert verdict['lines'][1] == ('a read of part of the job: alpha, charlie read, bravo-2, delta left out '
                                   '(training_status_nodes)')
    state = js.job_state(verdict, None)
    assert state['state'] == 'failed' and state['failed_nodes'] == ['charlie'] and state['left_out'] == ['bravo-2', 'delta']
    # nothing failed on the nodes read: it cannot tell the job runs, nor that it ended
    os.remove(str(lab / 'state' / 'charlie' / 'tiny-001' / 'exit_code'))
    read = [job(lab, 'torchrun', node).status() for node in ('alpha', 'charlie')]
    for r in read:
        r['running'] = True
    state = js.job_state(js.job_verdict(read, ['alpha', 'charlie'], ['alpha', 'charlie'], 'tiny-001', ['bravo-2']),
                         None)
    assert state['state'] == 'unknown' and state['why'] == 'a read of part of the job saw no failure (left out: bravo-2)'
