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


# ---------------------------------------------------------------- draining (health playbook)

def node_line(name, state, reason=None):
    """A `scontrol show node -o` line in the form of the recorded one (scontrol_show_node_drained.txt)."""
    line = [l for l in fixture('scontrol_show_node_drained.txt').splitlines() if 'Reason=' in l][0]
    rec = slurm.parse_oneline(line)
    line = line.replace('NodeName=%s ' % rec['NodeName'], 'NodeName=%s ' % name, 1)
    line = line.replace('State=%s ' % rec['State'], 'State=%s ' % state, 1)
    head, _, _ = line.partition(' Reason=')
    return head + (' Reason=%s [root@2026-11-23T08:00:00]' % reason if reason else '')


def test_recorded_node_states_and_reasons():
    nodes = slurm.node_records(fixture('scontrol_show_node_drained.txt'))
    drained = [n for n, rec in nodes.items() if slurm.is_drained(rec)]
    assert len(nodes) >= 2 and len(drained) == 1
    rec = nodes[drained[0]]
    assert rec['reason'] == 'gpucluster-health: version.torch' and 'DRAIN' in rec['states']
    assert all(r['reason'] == '' for n, r in nodes.items() if n != drained[0])


def test_the_plan_drains_failing_nodes_and_resumes_only_its_own():
    text = '\n'.join([node_line('n1', 'IDLE'), node_line('n2', 'IDLE+DRAIN', 'gpucluster-health: gpu'),
                      node_line('n3', 'IDLE+DRAIN', 'bad DIMM, ticket 42'), node_line('n4', 'MIXED'),
                      node_line('n5', 'ALLOCATED+DRAIN', 'gpucluster-health: clock')])
    records = slurm.node_records(text)
    assert records['n3']['reason'] == 'bad DIMM, ticket 42'
    plan = slurm.drain_plan(records, {'n4': 'version.torch', 'n5': 'clock', 'x9': 'reachable'},
                            ['n1', 'n2', 'n3', 'n4', 'n5', 'x9'], 'gpucluster-health:')
    assert plan['drain'] == [('n4', 'gpucluster-health: version.torch')]
    assert plan['resume'] == ['n2']          # healthy again, drained by us
    assert plan['foreign'] == ['n3']         # drained by an administrator: never resumed
    assert plan['kept'] == ['n5'] and plan['not_in_slurm'] == ['x9'] and plan['held'] == ''


def test_nodes_not_checked_are_left_alone():
    records = slurm.node_records(node_line('n2', 'IDLE+DRAIN', 'gpucluster-health: gpu'))
    assert slurm.drain_plan(records, {}, ['n1'], 'gpucluster-health:')['resume'] == []


def test_too_many_failures_drain_nothing():
    records = slurm.node_records('\n'.join(node_line('n%d' % i, 'IDLE') for i in range(4)))
    plan = slurm.drain_plan(records, {'n0': 'reachable', 'n1': 'reachable', 'n2': 'reachable'},
                            ['n0', 'n1', 'n2', 'n3'], 'gpucluster-health:', 50)
    assert plan['drain'] == [] and plan['held'].startswith('3 of 4 node(s) failed, more than 50%')
    plan = slurm.drain_plan(records, {'n0': 'reachable', 'n1': 'reachable'}, ['n0', 'n1', 'n2', 'n3'],
                            'gpucluster-health:', 50)
    assert [n for n, _ in plan['drain']] == ['n0', 'n1'] and plan['held'] == ''
