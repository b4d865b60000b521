import os

from ansible_collections.gpucluster.multinode.plugins.module_utils import slurm

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'slurm')


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


def test_a_completed_job_reads_completed_with_exit_zero():
    record = slurm.parse_oneline(fixture('scontrol_show_job_completed.txt'))
    assert record['JobId'] == '1' and record['NodeList'] == 'probe'
    assert slurm.job_state(record) == {'state': 'COMPLETED', 'exit_code': 0, 'signal': None, 'nodes': 'probe',
                                       'reason': 'None'}


def test_a_failed_job_keeps_its_exit_code():
    state = slurm.job_state(slurm.parse_oneline(fixture('scontrol_show_job_failed.txt')))
    assert state['state'] == 'FAILED' and state['exit_code'] == 3 and state['signal'] is None


def test_a_cancelled_job_reads_as_killed_by_sigterm():
    state = slurm.job_state(slurm.parse_oneline(fixture('scontrol_show_job_cancelled.txt')))
    assert state['state'] == 'CANCELLED' and state['signal'] == 15 and state['exit_code'] == 143
    assert state['state'] not in slurm.ACTIVE_STATES


def test_values_with_spaces_stay_whole():
    record = slurm.parse_oneline('JobId=7 JobName=a b Reason=Nodes required for job are DOWN Dependency=(null)')
    assert record['JobName'] == 'a b'
    assert record['Reason'] == 'Nodes required for job are DOWN'
    assert slurm.parse_oneline('') == {}


def test_partitions_drop_the_default_mark():
    assert slurm.partitions('batch*\ngpu\n') == ['batch', 'gpu']
    assert slurm.partitions('') == []


def test_sacct_line():
    assert slurm.sacct_state('FAILED|1:0\n') == {'state': 'FAILED', 'exit_code': 1}
    assert slurm.sacct_state('CANCELLED by 2000|0:15\n') == {'state': 'CANCELLED', 'exit_code': 143}
    assert slurm.sacct_state('') is None


def test_srun_names_the_node_whose_task_failed_first():
    failures = slurm.srun_failures(fixture('srun-task-exit3.txt'))
    assert failures == [('mol-slurm-worker-1', 3, 'Exited with exit code 3'), ('mol-slurm-head', 143, 'Terminated')]
