"""rank_errors: the tracebacks of a node's log, each rank's own error told from the follow-on errors of
the ranks whose peer died, on recorded logs of every launcher's shape (tests/unit/fixtures/rank_errors)."""

import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import rank_errors as re_

from test_launchers import job, lab, write_log  # noqa: F401 (lab is a fixture)

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures')


def fixture(*parts):
    with open(os.path.join(FIXTURES, *parts)) as handle:
        return handle.read()


def roots(errors):
    return [e for e in errors if not e['follow_on']]


@pytest.mark.parametrize('name, hosts', [
    ('deepspeed-head-log-rank0-permission-error.txt', ()),           # pdsh: hosts read from the log itself
    ('torchrun-agent-rank0-permission-error.log', ()),               # [default0]:[rank0]: with --tee 3
    ('torchrun-agent-rank0-permission-error-record.log', ()),        # @record: the report carries it too
    ('torchrun-rank0-stderr.log', ()),                               # torchrun's per-rank log
    ('env-ranks-rank0-permission-error.log', ()),                    # ranks' stderr unprefixed but [rankN]:
    ('mpirun-rank0-permission-error.txt', ()),                       # what mpirun forwards, then its report
    ('slurm-ckpt-run-7.out', ()),                                    # the batch log: agents and srun
])
def test_each_launchers_log_gives_rank_0s_permission_error_as_the_only_root_error(name, hosts):
    errors = re_.parse(fixture('rank_errors', name), hosts)
    found = roots(errors)
    assert [e['type'] for e in found] == ['PermissionError'], errors
    assert found[0]['rank'] == 0
    assert found[0]['error'].startswith("PermissionError: [Errno 13] Permission denied: '/")
    assert found[0]['lines'][-1] == found[0]['error'] and found[0]['lines'][0] == re_.TRACEBACK
    assert any('os.makedirs(path, exist_ok=True)' in line for line in found[0]['lines'])


def test_the_pdsh_head_log_names_each_errors_host_and_rank_and_the_gloo_errors_are_follow_ons():
    errors = re_.parse(fixture('rank_errors', 'deepspeed-head-log-rank0-permission-error.txt'))
    assert [(e['host'], e['rank'], e['follow_on']) for e in errors] == [
        ('lab-head', 0, False), ('lab-worker-1', 2, True), ('lab-head', 1, True)]
    gloo = errors[1]
    assert gloo['type'] == 'RuntimeError' and 'Connection closed by peer [10.89.0.10]:41234' in gloo['error']
    assert gloo['why'] == 'a peer closed its connection'
    # the interleaved lines of the two waiting ranks are read apart: each traceback is whole
    assert all(not line.startswith('lab-') for e in errors for line in e['lines'])
    assert errors[1]['lines'] == [line.replace('52011', '41234') for line in errors[2]['lines']]


def test_the_torchrun_report_marks_its_root_cause_and_the_agents_own_error_is_a_follow_on():
    errors = re_.parse(fixture('rank_errors', 'torchrun-agent-rank0-permission-error-record.log'))
    assert [e['type'] for e in errors] == ['PermissionError', 'RuntimeError',
                                           'torch.distributed.elastic.multiprocessing.errors.ChildFailedError']
    assert errors[0]['root_cause'] is True and errors[0]['local_rank'] == 0
    assert errors[2]['follow_on'] and errors[2]['why'] == 'the torchrun agent reports a child that failed'


def test_the_report_alone_gives_the_root_cause_when_the_ranks_lines_are_gone():
    text = fixture('rank_errors', 'torchrun-agent-rank0-permission-error-record.log')
    report = text[text.index('Traceback (most recent call last):\n  File "/tmp/tv/bin/torchrun"'):]
    found = roots(re_.parse(report))
    assert len(found) == 1 and found[0]['rank'] == 0 and found[0]['root_cause'] is True
    assert found[0]['error'] == "PermissionError: [Errno 13] Permission denied: '/tmp/rk/ckpt/step-3'"
    assert found[0]['host'] == 'localhost' and found[0]['exit_code'] == 1


@pytest.mark.parametrize('parts', [('pdsh', 'deepspeed-head-log-rank-killed-on-worker-1.txt'),
                                   ('torchrun', 'agent-peer-failed.log'),
                                   ('torchrun', 'agent-rank-killed.log'),
                                   ('rank_errors', 'torchrun-rank1-stderr.log')])
def test_the_ranks_left_waiting_by_a_peer_that_died_show_only_follow_on_errors(parts):
    errors = re_.parse(fixture(*parts))
    assert errors and not roots(errors), errors


@pytest.mark.parametrize('line, why', [
    ('RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.89.0.11]:41234',
     'a peer closed its connection'),
    ('RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.213.0.11]:42695: '
     'Connection reset by peer.', 'a peer reset its connection'),
    ('torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2047, remote process exited or there '
     'was a network error, NCCL version 2.27.3', 'NCCL lost a peer'),
    ('torch.distributed.DistBackendError: [2] is setting up NCCL communicator', 'torch.distributed backend error'),
    ('RuntimeError: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran '
     'for 600000 milliseconds before timing out.', 'a collective timed out'),
    ('PermissionError: [Errno 13] Permission denied: \'/shared/ckpt\'', ''),
    ('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', ''),
])
def test_follow_on_errors_are_told_from_root_errors(line, why):
    assert re_.follow_on_reason(line) == why


def test_a_chained_group_is_one_error_named_by_its_root_exception():
    text = '\n'.join([
        '[rank3]: Traceback (most recent call last):',
        '[rank3]:   File "/shared/train.py", line 10, in save',
        '[rank3]:     os.makedirs(path)',
        "[rank3]: PermissionError: [Errno 13] Permission denied: '/shared/ckpt/step-9'",
        '[rank3]: ',
        '[rank3]: The above exception was the direct cause of the following exception:',
        '[rank3]: ',
        '[rank3]: Traceback (most recent call last):',
        '[rank3]:   File "/shared/train.py", line 30, in main',
        '[rank3]:     save(step)',
        '[rank3]: RuntimeError: checkpoint 9 could not be saved',
        'step 10 loss 0.1'])
    errors = re_.parse(text)
    assert len(errors) == 1 and errors[0]['rank'] == 3 and not errors[0]['follow_on']
    assert errors[0]['error'] == "PermissionError: [Errno 13] Permission denied: '/shared/ckpt/step-9'"
    assert errors[0]['lines'][-1] == 'RuntimeError: checkpoint 9 could not be saved'


def test_the_errors_of_a_node_stay_bounded_and_keep_the_earliest_root_error(tmp_path):
    one = fixture('rank_errors', 'torchrun-rank1-stderr.log')
    deep = ['Traceback (most recent call last):'] + ['  File "/x.py", line %d, in f\n    f()' % i for i in range(500)]
    text = '\n'.join(deep + ['ValueError: %s' % ('x' * 5000)]) + '\n' + one * 50
    log = tmp_path / 'node.log'
    log.write_text(text)
    errors = re_.log_errors([str(log)])
    assert len(errors) <= re_.MAX_ERRORS
    assert errors[0]['type'] == 'ValueError' and len(errors[0]['error']) <= re_.LINE_CHARS
    assert all(len(e['lines']) <= re_.TAIL_LINES for e in errors)
    assert all(e['follow_on'] for e in errors[1:])


def test_only_the_tail_of_a_big_log_is_read(tmp_path):
    log = tmp_path / 'node.log'
    log.write_text(fixture('rank_errors', 'torchrun-rank0-stderr.log') + 'step 1 loss 0.5\n' * 3000)
    assert re_.log_errors([str(log)]) == []
    assert len(re_.read_tail(str(log), max_bytes=1000).splitlines()) <= 1000 // len('step 1 loss 0.5\n')


def test_deepspeed_status_on_the_head_returns_the_errors_each_named_by_its_node(lab):  # noqa: F811
    text = fixture('rank_errors', 'deepspeed-head-log-rank0-permission-error.txt')
    write_log(lab, 'alpha', text.replace('lab-head', 'alpha').replace('lab-worker-1', '10.99.0.12'))
    out = job(lab, 'deepspeed', 'alpha').status()
    assert [(e['node'], e['rank'], e['follow_on']) for e in out['errors']] == [
        ('alpha', 0, False), ('bravo-2', 2, True), ('alpha', 1, True)]
    assert out['errors'][0]['log'].endswith('/logs/alpha.log')


def test_torchrun_status_returns_its_agents_errors(lab):  # noqa: F811
    write_log(lab, 'bravo-2', fixture('rank_errors', 'torchrun-agent-rank0-permission-error.log'))
    out = job(lab, 'torchrun', 'bravo-2').status()
    assert roots(out['errors'])[0]['type'] == 'PermissionError' and out['rank_failure']['rank'] == 0
