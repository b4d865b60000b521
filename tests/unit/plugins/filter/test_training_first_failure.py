"""status, logs and watch of a failed job put the failing rank's own error first: training_verdict's lines
and first_failure, training_first_failure and training_watch_outcome, on the status results a deepspeed
and a torchrun job's nodes return for the recorded logs of tests/unit/fixtures/rank_errors."""

import os

from ansible_collections.gpucluster.multinode.plugins.filter.training import training_verdict
from ansible_collections.gpucluster.multinode.plugins.filter.training_monitor import (
    training_first_failure, training_watch_outcome)
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import rank_errors as re_
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as tr

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'rank_errors')
NODES = ['lab-head', 'lab-worker-1']


def text(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


def deepspeed_results():
    """What training_job state=status returns on each node of the pdsh job whose rank 0 failed."""
    log = text('deepspeed-head-log-rank0-permission-error.txt')
    errors = re_.bound(re_.parse(log, NODES))
    for e in errors:
        e['node'] = e['host']
    head = {'node': 'lab-head', 'job_id': 'ckpt-run', 'role': 'launcher', 'running': False, 'exit_code': 1,
            'log': '/shared/jobs/ckpt-run/logs/lab-head.log', 'log_tail': log.splitlines()[-20:],
            'node_exit_codes': tr.pdsh_exit_codes(log), 'rank_failure': dict(tr.deepspeed_rank_failure(log)),
            'node_log_tails': tr.pdsh_node_tails(log, NODES, 20), 'errors': errors, 'ranks': [0, 1]}
    head['rank_failure']['node'] = head['rank_failure']['host']
    worker = {'node': 'lab-worker-1', 'job_id': 'ckpt-run', 'role': 'ranks', 'running': False, 'exit_code': None,
              'log': '/shared/jobs/ckpt-run/logs/lab-worker-1.log', 'log_tail': [], 'errors': [], 'ranks': [2, 2]}
    return [head, worker]


def test_the_20_line_tail_of_the_head_holds_only_the_follow_ons_that_is_why():
    head = deepspeed_results()[0]
    assert not any('PermissionError' in line for line in head['log_tail'])


def test_status_prints_the_root_error_right_after_the_state_line():
    verdict = training_verdict(deepspeed_results(), NODES)
    assert verdict['state'] == 'failed' and verdict['failed_nodes'][0] == 'lab-head'
    lines = verdict['lines']
    assert lines[0] == 'job ckpt-run: failed'
    assert lines[1] == ("first failure: lab-head rank 0 (exit 1): PermissionError: [Errno 13] Permission denied: "
                        "'/shared/checkpoints/ckpt-run/step-3'")
    assert lines[2].startswith('  ! ') and lines[-1].startswith('  | ')   # the traceback, then the rest as before
    assert not any('Connection closed by peer' in line for line in lines if line.startswith('  ! '))
    first = verdict['first_failure']
    assert first['node'] == 'lab-head' and first['exit_code'] == 1 and first['log'] and 'log_tail' in first
    assert first['error']['type'] == 'PermissionError' and first['error']['rank'] == 0


def test_a_torchrun_job_names_the_rank_its_report_names_first():
    head_log = text('torchrun-agent-rank0-permission-error.log')
    head = {'node': 'lab-head', 'job_id': 'ckpt-run', 'role': 'agent', 'running': False, 'exit_code': 1,
            'log_tail': head_log.splitlines()[-20:], 'rank_failure': tr.torchrun_failure(head_log),
            'errors': re_.bound(re_.parse(head_log))}
    worker_log = text('torchrun-rank1-stderr.log')
    worker = {'node': 'lab-worker-1', 'job_id': 'ckpt-run', 'role': 'agent', 'running': False, 'exit_code': 1,
              'log_tail': worker_log.splitlines(), 'errors': re_.bound(re_.parse(worker_log))}
    verdict = training_verdict([head, worker], NODES)
    assert verdict['lines'][1].startswith('first failure: lab-head rank 0 (exit 1): PermissionError: ')


def test_logs_shows_the_block_first_from_the_status_and_the_logs_reads():
    verdict = training_verdict(deepspeed_results(), NODES)
    progress = [{'errors': re_.bound(re_.parse(text('torchrun-rank1-stderr.log')))}, {'errors': []}]
    first = training_first_failure(verdict, progress, ['lab-head', 'lab-worker-1'])
    assert first['lines'][0].startswith('first failure: lab-head rank 0 (exit 1): PermissionError: ')
    assert first['lines'][-1] == "  ! PermissionError: [Errno 13] Permission denied: '/shared/checkpoints/ckpt-run/step-3'"
    assert all(len(line) < 500 for line in first['lines']) and len(first['lines']) <= 9
    assert training_first_failure({'state': 'running', 'first_failure': None}) == {'error': None, 'lines': []}


def test_a_watch_of_a_failed_job_fails_and_of_a_finished_one_does_not():
    assert training_watch_outcome('failed', 'failed')['fail'] is True
    assert training_watch_outcome('finished')['fail'] is False
    assert training_watch_outcome('running')['fail'] is False
