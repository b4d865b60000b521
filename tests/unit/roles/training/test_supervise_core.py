"""The supervisor's own reading of ansible's output, its pure decisions on a node that missed a read, on
a read that failed and on a read of an earlier attempt, its figures for Prometheus, its heartbeat and
report, and --probe (roles/training/files/gpucluster_supervise.py).

The ansible output below is shaped as ansible-core 2.19.14 printed it (ANSIBLE_NOCOLOR=1), recorded on
this machine with ad-hoc runs of ansible.builtin.command / ansible.builtin.ping and playbook runs against
hosts that could not be resolved or reached, and tasks that failed."""

import json
import os
import sys
import time

from ansible_collections.gpucluster.multinode.plugins.filter.training import training_status_record

FILES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')
sys.path.insert(0, FILES)

import gpucluster_supervise as sv  # noqa: E402
import ansible_output as aout  # noqa: E402
import supervisor_driver as sdriver  # noqa: E402
import supervisor_reads as sreads  # noqa: E402
import supervisor_record as srecord  # noqa: E402
import supervisor_runs as sruns  # noqa: E402
import supervision as core  # noqa: E402  the supervision core, as the supervisor imports it


def _rec(status):
    """A status read as status.yml writes it (training_status_record): its verdicts and the job's one state."""
    if isinstance(status, dict) and 'job' not in status and '_fail' not in status:
        record = training_status_record(status.get('result'), status.get('progress'))
        record.update((key, value) for key, value in status.items() if key.startswith('_'))  # the fake's own
        return record
    return status


NOW = 1764000000.0


def _obs(state='running', unreachable=(), why='', step=None):
    return {'time': NOW, 'state': state, 'failed_nodes': [], 'unreachable_nodes': list(unreachable),
            'stalled_nodes': [], 'step': step, 'last_step_time': None, 'why': why}


# ----- a node that missed one read ------------------------------------------------------------------
def test_only_a_node_missed_by_two_reads_whose_direct_probe_failed_is_confirmed():
    first = _obs('unreachable', ['w1', 'w2'])
    probes = {'w1': {'answered': False, 'why': 'port 22 on w1: timed out'},
              'w2': {'answered': False, 'why': 'port 22 on w2: timed out'}}
    assert sreads.confirm_unreachable(first, _obs('unreachable', ['w1', 'w2']), probes) == ['w1', 'w2']
    # the second read reached w2
    assert sreads.confirm_unreachable(first, _obs('unreachable', ['w1']), probes) == ['w1']
    # w1 answered its direct probe
    probes['w1']['answered'] = True
    assert sreads.confirm_unreachable(first, _obs('unreachable', ['w1', 'w2']), probes) == ['w2']
    # a second read that reached every node confirms nothing, whatever the probe said
    assert sreads.confirm_unreachable(first, _obs('running'), probes) == []
    # a second read that failed as a whole names no node: no confirmation either
    assert sreads.confirm_unreachable(first, _obs('unknown', why='the status read gave nothing'), probes) == []
    # a node that was not probed is taken as not answering
    assert sreads.confirm_unreachable(_obs('unreachable', ['w3']), _obs('unreachable', ['w3']), {}) == ['w3']


def test_a_read_that_missed_a_node_asks_for_confirming_only_when_no_rank_failed():
    missed = sreads.observe(_rec({'result': {'state': 'unknown', 'unknown_nodes': ['w2']}}), NOW)
    assert core.needs_confirming(missed) and core.decide(missed)['action'] == 'stop'
    # a rank failed too: the stop needs no second read
    failed = {'state': 'failed', 'failed_nodes': ['w1'], 'first_failure': {'node': 'w1', 'exit_code': 1}}
    both = sreads.observe(_rec({'result': failed, 'progress': {'node_errors': {'w2': 'timed out'}}}), NOW)
    assert both['state'] == 'unreachable' and both['failed_nodes'] == ['w1'] and not core.needs_confirming(both)
    # the node that cannot be reached is judged first (supervision.CULPRIT_ORDER, as on Kubernetes): a node
    # lost makes the others' ranks fail, so the first failed rank comes after it
    assert core.decide(both)['nodes'] == ['w2', 'w1']
    assert both['why'] == 'w2 could not be read; a rank failed first on w1 (exit 1)'
    assert not core.needs_confirming(sreads.observe(_rec({'result': {'state': 'running'}}), NOW))


def test_the_read_missed_event_says_for_each_node_why_it_is_no_fault():
    first = _obs('unreachable', ['w1', 'w2'])
    probes = {'w1': {'answered': True, 'why': 'port 22 on w1: sshd answered (SSH-2.0-OpenSSH_9.2p1)'},
              'w2': {'answered': False, 'why': 'port 22 on w2: refused'}}
    why = sreads.missed_why(first, _obs('unreachable', ['w1']), probes)
    assert why == ('not read once, not a fault: w1: the second read could not reach it either; it answered the '
                   'direct probe (port 22 on w1: sshd answered (SSH-2.0-OpenSSH_9.2p1)); w2: the second read reached '
                   'it; the direct probe failed (port 22 on w2: refused)')
    why = sreads.missed_why(_obs('unreachable', ['w2']), _obs('unknown', why='the status read gave nothing'), probes)
    assert why == ('not read once, not a fault: w2: the second read gave no answer (the status read gave nothing); '
                   'the direct probe failed (port 22 on w2: refused)')


def test_a_tcp_probe_names_the_port_and_why_and_only_an_sshd_banner_is_an_answer():
    import socket
    import threading
    server = socket.socket()
    server.bind(('127.0.0.1', 0))
    server.listen(4)
    port = server.getsockname()[1]
    try:
        assert sruns.tcp_probe('127.0.0.1', port, banner=0) == (True, 'port %d on 127.0.0.1: open' % port)
        # the kernel accepts, nothing answers: a frozen node's sshd
        assert sruns.tcp_probe('127.0.0.1', port, banner=0.5) == (
            False, 'port %d on 127.0.0.1: open, but no SSH banner within 0.5 s (a frozen node?)' % port)

    finally:
        server.close()
    sshd = socket.socket()
    sshd.bind(('127.0.0.1', 0))
    sshd.listen(1)

    def answer():
        conn, _ = sshd.accept()
        conn.sendall(b'SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n')
        conn.close()
    thread = threading.Thread(target=answer)
    thread.start()
    try:
        assert sruns.tcp_probe('127.0.0.1', sshd.getsockname()[1], banner=5) == (
            True, 'port %d on 127.0.0.1: sshd answered (SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3)' % sshd.getsockname()[1])
        thread.join(5)
    finally:
        sshd.close()
    answered, why = sruns.tcp_probe('127.0.0.1', port)
    assert not answered and why.startswith('port %d on 127.0.0.1: ' % port) and 'refused' in why.lower()


# ----- reads that failed, reads of an earlier attempt ------------------------------------------------
def test_a_read_of_an_earlier_attempt_is_stale_and_asks_for_nothing():
    failed = {'result': {'state': 'failed', 'failed_nodes': ['w1'], 'first_failure': {'node': 'w1'}, 'attempt': 1},
              'progress': {'ranks': [{'last_step': 23}], 'attempt': 1}}
    obs = sreads.observe(_rec(failed), NOW, attempt=2)
    assert obs['state'] == 'unknown' and obs['stale'] and obs['step'] is None
    assert obs['why'] == 'the read is of attempt 1: attempt 2 has not written yet'
    assert core.decide(obs)['action'] == 'wait'
    # the same read is the fault while attempt 1 runs; a read that names no attempt is taken as it is
    assert sreads.observe(_rec(failed), NOW, attempt=1)['state'] == 'failed'
    assert sreads.observe(_rec({'result': {'state': 'failed', 'failed_nodes': ['w1']}}), NOW, attempt=2)['state'] == 'failed'
    # either part naming an earlier attempt makes the read stale
    partly = dict(failed, result=dict(failed['result'], attempt=2))
    assert sreads.observe(_rec(partly), NOW, attempt=2).get('stale')


def test_a_status_without_the_job_state_is_unknown_never_taken_for_a_fault():
    # the job's state is the controller's (the status file's job): a file without it decides nothing
    obs = sreads.observe({'result': {'state': 'failed', 'failed_nodes': ['w1']}}, NOW)
    assert obs['state'] == 'unknown' and obs['why'] == 'the status read holds no job state'
    assert core.decide(obs)['action'] == 'wait'


def test_a_failed_read_and_the_blind_why_say_the_rc_the_error_and_the_last_good_read():
    nothing = sreads.observe(_rec(None), NOW)
    assert sreads.read_failure(4, None, nothing, 'w1: unreachable: no route') == (
        'train.yml status ended with rc 4 and wrote no status: w1: unreachable: no route')
    assert sreads.read_failure(124, None, nothing, '', 300) == (
        'train.yml status did not end within 300 s (read_timeout) and wrote no status')
    unknown = sreads.observe(_rec({'result': {'state': 'unknown'}}), NOW)
    assert sreads.read_failure(2, {'result': {'state': 'unknown'}}, unknown) == (
        'train.yml status ended with rc 2; its status named no state of the job (unknown)')
    assert sreads.blind_why(3, 'train.yml status ended with rc 4', NOW - 95, NOW - 500, NOW) == (
        '3 reads in a row failed: train.yml status ended with rc 4; last good read 95 s ago')
    assert sreads.blind_why(3, 'x', None, NOW - 40, NOW) == (
        '3 reads in a row failed: x; no good read since the supervisor started 40 s ago')


# ----- ansible's output: a playbook run's error -------------------------------------------------------
# (a line of the recorded output a line here; ansible leaves a space after "=>" before a YAML result)
RUN_2_19 = '\n'.join([
    '',
    'PLAY [all] *********************************************************************',
    '',
    'TASK [ignored one] *************************************************************',
    '[ERROR]: Task failed: Action failed: ignore me',
    'Origin: /tmp/pbt/pb.yml:4:7',
    '',
    '2   gather_facts: false',
    '3   tasks:',
    '4     - name: ignored one',
    '        ^ column 7',
    '',
    'fatal: [a]: FAILED! => {"changed": false, "msg": "ignore me"}',
    '...ignoring',
    'fatal: [b]: FAILED! => {"changed": false, "msg": "ignore me"}',
    '...ignoring',
    '',
    'TASK [Refuse a node] ***********************************************************',
    '[ERROR]: Task failed: Action failed: host lab-worker-1: the launcher could not start: no such file',
    'Origin: /tmp/pbt/pb.yml:7:7',
    '',
    '5       ansible.builtin.fail: {msg: "ignore me"}',
    '6       ignore_errors: true',
    '7     - name: Refuse a node',
    '        ^ column 7',
    '',
    'fatal: [a]: FAILED! => {"assertion": false, "changed": false, "evaluated_to": false, "msg": "host lab-worker-1: '
    'the launcher could not start: no such file"}',
    'fatal: [b]: FAILED! => {"assertion": false, "changed": false, "evaluated_to": false, "msg": "host lab-worker-1: '
    'the launcher could not start: no such file"}',
    'fatal: [c]: UNREACHABLE! => {"changed": false, "msg": "Task failed: Failed to connect to the host via ssh: ssh: '
    'Could not resolve hostname c: Name or service not known", "unreachable": true}',
    '',
    'PLAY RECAP *********************************************************************',
    'a                          : ok=1    changed=0    unreachable=0    failed=1    skipped=0    rescued=0    ignored=1',
    ''])

RUN_YAML = '\n'.join([
    '',
    'TASK [Reach] *******************************************************************',
    '[ERROR]: Task failed: Failed to connect to the host via ssh: ssh: Could not resolve hostname nosuch.invalid: '
    'Name or service not known',
    'Origin: /tmp/pbt/pb3.yml:4:7',
    '',
    'fatal: [nosuch.invalid]: UNREACHABLE! => ',
    '    changed: false',
    "    msg: 'Task failed: Failed to connect to the host via ssh: ssh: Could not resolve hostname",
    "        nosuch.invalid: Name or service not known'",
    '    unreachable: true',
    '',
    'TASK [Refuse a node] ***********************************************************',
    'fatal: [a]: FAILED! => ',
    '    assertion: false',
    '    changed: false',
    '    evaluated_to: false',
    '    msg: |-',
    '        host lab-worker-1: the launcher could not start:',
    '        no such file "x"',
    '',
    'PLAY RECAP *********************************************************************',
    ''])


def test_a_runs_error_is_its_last_failing_tasks_fatal_lines_never_an_ignored_one():
    assert aout.run_error(RUN_2_19) == (
        'task "Refuse a node": a, b: host lab-worker-1: the launcher could not start: no such file; c: unreachable: '
        'Failed to connect to the host via ssh: ssh: Could not resolve hostname c: Name or service not known')
    # only ignored failures: no error
    ignored_only = RUN_2_19.split('TASK [Refuse a node]')[0]
    assert aout.run_error(ignored_only) == ''
    assert aout.run_error('') == '' and aout.run_error('PLAY RECAP ****\na : ok=3 failed=0\n') == ''
    # an assert whose fail_msg is a list of lines (status.yml's, when a node could not be read)
    status = ('TASK [gpucluster.multinode.training : Fail when a node\'s state could not be read (the job\'s state is '
              'unknown, not stopped)] ***\n'
              'fatal: [head]: FAILED! => {"assertion": false, "changed": false, "evaluated_to": false, "msg": ["job '
              'j-1: unknown (its state could not be read on w1)", "w1: read failed: timed out"]}\n')
    assert aout.run_error(status) == (
        'task "gpucluster.multinode.training : Fail when a node\'s state could not be read (the job\'s state is '
        'unknown, not stopped)": head: job j-1: unknown (its state could not be read on w1); w1: read failed: timed '
        'out')


def test_a_runs_error_is_read_from_yaml_results_too():
    assert aout.run_error(RUN_YAML) == ('task "Refuse a node": a: host lab-worker-1: the launcher could not start: '
                                        'no such file "x"')
    assert aout.run_error(RUN_YAML.split('TASK [Refuse a node]')[0]) == (
        'task "Reach": nosuch.invalid: unreachable: Failed to connect to the host via ssh: ssh: Could not resolve '
        'hostname nosuch.invalid: Name or service not known')


def test_a_runs_error_is_its_error_line_when_no_task_failed_and_is_cut_short():
    assert aout.run_error('[ERROR]: the playbook: gpucluster.multinode.nosuch could not be found\n') == (
        'the playbook: gpucluster.multinode.nosuch could not be found')
    # before ansible-core 2.19
    assert aout.run_error('ERROR! couldn\'t resolve module/action \'gpucluster.multinode.training_job\'. This often '
                          'indicates a misspelling\n\nThe error appears to be in \'/x/started.yml\'\n') == (
        'couldn\'t resolve module/action \'gpucluster.multinode.training_job\'. This often indicates a misspelling')
    # an error line after the last failed task is the run's error (it came last)
    assert aout.run_error(RUN_2_19 + '[ERROR]: Unexpected Exception: boom\n') == 'Unexpected Exception: boom'
    long = 'fatal: [a]: FAILED! => {"msg": "%s"}\n' % ('x' * 1000)
    cut = aout.run_error(long)
    assert len(cut) == 400 and cut.startswith('a: xxx') and cut.endswith('...')
    # a module that failed as a whole says its stderr
    module = ('fatal: [a]: FAILED! => {"changed": false, "module_stderr": "sudo: a password is required\\n", '
              '"module_stdout": "", "msg": "MODULE FAILURE: No start of JSON char found\\nSee stdout/stderr for the '
              'exact error", "rc": 1}\n')
    assert aout.run_error(module) == ('a: MODULE FAILURE: No start of JSON char found See stdout/stderr for the exact '
                                      'error: sudo: a password is required')


# ----- ansible's output: an ad-hoc run, one answer a host ---------------------------------------------
ONELINE = '\n'.join([
    "[DEPRECATION WARNING]: The '-o' argument is deprecated. This feature will be removed from ansible-core version "
    "2.23. Use callback configuration to enable the oneline callback instead.",
    'head | CHANGED | rc=0 | (stdout) uid=1001(train) gid=1001(train) groups=1001(train)',
    'w1 | UNREACHABLE!: Task failed: Failed to connect to the host via ssh: ssh: connect to host w1 port 22: '
    'Connection refused',
    'w2 | FAILED | rc=-1 | (stdout) ',
    'w2 | FAILED! => {"changed": false,"msg": "Task failed: Premature end of stream waiting for become success.\\n>>> '
    'Standard Error\\n/bin/sh: 1: sudo: not found"}',
    "w3 | FAILED | rc=1 | (stdout)  (stderr) id: 'train': no such user",
    'w4 | SUCCESS => {"changed": false,"ping": "pong"}',
    '[WARNING]: Could not match supplied host pattern, ignoring: w5',
    ''])

MINIMAL = '\n'.join([
    'head | CHANGED | rc=0 >>',
    'uid=1001(train) gid=1001(train) groups=1001(train)',
    '[ERROR]: Task failed: Failed to connect to the host via ssh: ssh: Could not resolve hostname w1: Name or service '
    'not known',
    "Origin: <adhoc 'ansible.builtin.command' task>",
    '',
    'w1 | UNREACHABLE! => {',
    '    "changed": false,',
    '    "msg": "Task failed: Failed to connect to the host via ssh: ssh: Could not resolve hostname w1: Name or '
    'service not known",',
    '    "unreachable": true',
    '}',
    'w2 | FAILED | rc=1 >>',
    'non-zero return code',
    ''])


def test_an_adhoc_run_names_each_host_that_failed_and_why():
    answers = aout.parse_adhoc(ONELINE, ['head', 'w1', 'w2', 'w3', 'w4', 'w5', 'w6'])
    assert answers['head'] is None and answers['w4'] is None
    assert answers['w1'] == ('unreachable: Failed to connect to the host via ssh: ssh: connect to host w1 port 22: '
                             'Connection refused')
    assert answers['w2'] == ('failed: Premature end of stream waiting for become success. >>> Standard Error '
                             '/bin/sh: 1: sudo: not found')
    assert answers['w3'] == "failed: rc=1 | (stdout) (stderr) id: 'train': no such user"
    assert answers['w5'] == 'not in the inventory (no host of that name)'
    assert answers['w6'] == "no answer in ansible's output"


def test_an_adhoc_run_without_one_line_output_is_read_too():
    answers = aout.parse_adhoc(MINIMAL, ['head', 'w1', 'w2'])
    assert answers == {'head': None,
                       'w1': 'unreachable: Failed to connect to the host via ssh: ssh: Could not resolve hostname w1: '
                             'Name or service not known',
                       'w2': 'failed: rc=1 non-zero return code'}
    # a run that failed before any host: each host is said with the run's error
    assert aout.parse_adhoc('[ERROR]: Unable to parse /etc/inv as an inventory source\n', ['a']) == {
        'a': "no answer in ansible's output (Unable to parse /etc/inv as an inventory source)"}


# ----- figures, heartbeat, report ----------------------------------------------------------------
def test_the_figures_are_prometheus_text_with_help_and_type_and_leave_out_what_is_not_known():
    text = srecord.metrics_text('j-"1"', {'last_read_timestamp_seconds': NOW + 0.5, 'read_seconds': 2.25,
                                          'failed_reads': 0, 'blind': 0, 'restarts': 1, 'attempt': 2,
                                          'heartbeat_timestamp_seconds': NOW + 1})
    lines = text.splitlines()
    assert lines[:3] == ['# HELP gpucluster_supervisor_last_read_timestamp_seconds Time of the supervisor\'s last '
                         'status read that succeeded.',
                         '# TYPE gpucluster_supervisor_last_read_timestamp_seconds gauge',
                         'gpucluster_supervisor_last_read_timestamp_seconds{job="j-\\"1\\""} 1764000000.5']
    samples = dict(line.rsplit(' ', 1) for line in lines if not line.startswith('#'))
    assert samples == {'gpucluster_supervisor_last_read_timestamp_seconds{job="j-\\"1\\""}': '1764000000.5',
                       'gpucluster_supervisor_read_seconds{job="j-\\"1\\""}': '2.25',
                       'gpucluster_supervisor_failed_reads{job="j-\\"1\\""}': '0',
                       'gpucluster_supervisor_blind{job="j-\\"1\\""}': '0',
                       'gpucluster_supervisor_restarts{job="j-\\"1\\""}': '1',
                       'gpucluster_supervisor_attempt{job="j-\\"1\\""}': '2',
                       'gpucluster_supervisor_heartbeat_timestamp_seconds{job="j-\\"1\\""}': '1764000001.0'}
    assert sum(1 for line in lines if line.startswith('# TYPE')) == 7 and text.endswith('\n')
    before_a_read = srecord.metrics_text('j', {'last_read_timestamp_seconds': None, 'read_seconds': None, 'failed_reads': 0,
                                               'blind': 0, 'restarts': 0, 'attempt': 1, 'heartbeat_timestamp_seconds': NOW})
    assert 'last_read' not in before_a_read and 'read_seconds' not in before_a_read


def _settings(tmp_path, **more):
    state = tmp_path / 'state'
    state.mkdir()
    settings = {'job_id': 'j-1', 'job_dir': str(tmp_path / 'job'), 'state_dir': str(state), 'nodes': ['head', 'w1'],
                'unit': 'gpucluster-supervise@j-1.service', 'ansible_playbook': '/nonexistent/bin/ansible-playbook'}
    settings.update(more)
    return settings


def test_the_heartbeat_and_figures_go_to_the_state_dir_and_node_exporters_and_leave_it_at_the_end(tmp_path):
    (tmp_path / 'metrics').mkdir()
    sup = sdriver.Supervisor(_settings(tmp_path, metrics_dir=str(tmp_path / 'metrics'), attempt=3))
    umask = os.umask(0o077)  # node_exporter and users read them whatever the supervisor's umask
    try:
        sup.heartbeat('reading')
    finally:
        os.umask(umask)
    state = tmp_path / 'state'
    mine = (state / 'supervisor.prom').read_text()
    exported = tmp_path / 'metrics' / 'gpucluster_supervisor_j-1.prom'
    assert exported.read_text() == mine and 'gpucluster_supervisor_blind{job="j-1"} 0\n' in mine
    assert 'gpucluster_supervisor_attempt{job="j-1"} 3\n' in mine
    for path in (state / 'supervisor.prom', exported, state / 'supervisor.json'):
        assert os.stat(str(path)).st_mode & 0o777 == 0o644, path
    assert sorted(os.listdir(str(tmp_path / 'metrics'))) == ['gpucluster_supervisor_j-1.prom']  # no temporary left
    sup.blind, sup.blind_since, sup.failed_reads = '3 reads in a row failed: x', NOW, 3
    sup.heartbeat('blind')
    beat = json.loads((state / 'supervisor.json').read_text())
    assert (beat['doing'], beat['blind'], beat['blind_since'], beat['attempt']) == ('blind', sup.blind, NOW, 3)
    assert 'gpucluster_supervisor_blind{job="j-1"} 1\n' in exported.read_text()
    sup.metrics_gone()
    assert not exported.exists() and (state / 'supervisor.prom').exists()


def test_a_metrics_dir_that_cannot_be_written_is_said_once_and_the_figures_stay_in_the_state_dir(tmp_path):
    sup = sdriver.Supervisor(_settings(tmp_path, metrics_dir=str(tmp_path / 'missing')))
    sup.heartbeat('reading')
    sup.heartbeat('waiting')
    events = core.read_events(str(tmp_path / 'state'))
    assert [e['event'] for e in events] == ['metrics_failed']
    assert events[0]['why'].startswith('%s/gpucluster_supervisor_j-1.prom not written: ' % (tmp_path / 'missing'))
    assert (tmp_path / 'state' / 'supervisor.prom').exists()


def test_the_report_of_a_blind_supervisor_says_first_that_it_cannot_read_the_job(tmp_path):
    since = time.mktime((2026, 11, 28, 14, 3, 7, 0, 0, -1))
    (tmp_path / 'supervisor.json').write_text(json.dumps(
        {'unit': 'u', 'pid': 1, 'host': 'sup', 'doing': 'blind', 'time': NOW, 'restarts': 0,
         'blind': '3 reads in a row failed: train.yml status ended with rc 4; last good read 95 s ago',
         'blind_since': since}))
    (tmp_path / 'events.jsonl').write_text(json.dumps({'event': 'blind', 'time': since, 'why': 'w'}) + '\n')
    held = sv.lock(str(tmp_path / 'lock'))
    try:
        lines = sv.report(str(tmp_path), NOW)
    finally:
        held.close()
    assert lines[0] == ('supervisor cannot read the job: 3 reads in a row failed: train.yml status ended with rc 4; '
                        'last good read 95 s ago (since 14:03:07)')
    assert lines[1].startswith('supervision: supervised') and lines[2].endswith('blind why=w')
    # a blind supervisor that died: nobody supervises the job
    assert sv.report(str(tmp_path), NOW)[0].startswith('nobody supervises this job')


def test_the_report_command_reads_the_state_dir(tmp_path, capsys):
    (tmp_path / 'events.jsonl').write_text(json.dumps({'event': 'done', 'time': NOW, 'why': 'the job finished'}) + '\n')
    assert sv.main(['gpucluster_supervise.py', '--report', str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'nobody supervises this job (no supervisor holds %s/lock)' % tmp_path
    assert out[1] == 'supervision: finished (the job finished); 0 restart(s), 0 step(s) lost, 0 s lost'


# ----- --probe ---------------------------------------------------------------------------------
FAKE = '''#!/bin/sh
# stands in for %(name)s: prints what the test recorded and exits with its rc
echo "$@" >> %(dir)s/%(name)s.args
cat %(dir)s/%(name)s.out
exit $(cat %(dir)s/%(name)s.rc)
'''


def _probe_setup(tmp_path, adhoc_out, adhoc_rc=0, syntax_out='\nplaybook: gpucluster.multinode.train\n',
                 syntax_rc=0, user='train'):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    for name, out, rc in (('ansible', adhoc_out, adhoc_rc), ('ansible-playbook', syntax_out, syntax_rc)):
        (bin_dir / name).write_text(FAKE % {'name': name, 'dir': bin_dir})
        (bin_dir / name).chmod(0o755)
        (bin_dir / (name + '.out')).write_text(out)
        (bin_dir / (name + '.rc')).write_text(str(rc))
    (tmp_path / 'inventory.yml').write_text('all: {}\n')
    (tmp_path / 'vars.json').write_text(json.dumps({'training_user': user} if user else {}))
    settings = {'job_id': 'j-1', 'job_dir': '/shared/jobs/j-1', 'state_dir': str(tmp_path), 'nodes': ['n0', 'n1'],
                'hosts': {'n0': 'head', 'n1': 'w1'}, 'ansible_playbook': str(bin_dir / 'ansible-playbook'),
                'inventory': str(tmp_path / 'inventory.yml'), 'vars_file': str(tmp_path / 'vars.json'),
                'train_playbook': 'gpucluster.multinode.train'}
    path = tmp_path / 'settings.json'
    path.write_text(json.dumps(settings))
    return str(path), bin_dir


def _probe(path, capsys):
    rc = sv.main(['gpucluster_supervise.py', '--probe', path])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_the_probe_passes_when_every_host_runs_id_as_the_training_user_and_the_collection_loads(tmp_path, capsys):
    path, bin_dir = _probe_setup(tmp_path, 'head | CHANGED | rc=0 | (stdout) uid=1001(train)\n'
                                           'w1 | CHANGED | rc=0 | (stdout) uid=1001(train)\n')
    assert _probe(path, capsys) == (0, {'problems': []})
    # the ansible beside ansible-playbook, the nodes' inventory hosts, become the training user
    assert (bin_dir / 'ansible.args').read_text().split() == [
        'head,w1', '-i', str(tmp_path / 'inventory.yml'), '-m', 'ansible.builtin.command', '-a', 'id', '-b',
        '--become-user', 'train', '-o']
    assert (bin_dir / 'ansible-playbook.args').read_text().split() == [
        '--syntax-check', '-i', str(tmp_path / 'inventory.yml'), 'gpucluster.multinode.train']


def test_the_probe_names_each_host_it_could_not_read_and_why(tmp_path, capsys):
    path, _ = _probe_setup(tmp_path, 'head | CHANGED | rc=0 | (stdout) uid=1001(train)\n'
                                     'w1 | UNREACHABLE!: Task failed: Failed to connect to the host via ssh: '
                                     'root@w1: Permission denied (publickey).\n', adhoc_rc=4)
    rc, out = _probe(path, capsys)
    assert rc == 1
    assert out == {'problems': ['host w1: unreachable: Failed to connect to the host via ssh: root@w1: Permission '
                                'denied (publickey). (as train, through %s)' % (tmp_path / 'inventory.yml')]}


def test_the_probe_says_a_collection_that_does_not_load_and_missing_files(tmp_path, capsys):
    path, bin_dir = _probe_setup(tmp_path, 'head | CHANGED | rc=0 >>\nuid=1001(train)\nw1 | CHANGED | rc=0 >>\n'
                                           'uid=1001(train)\n',
                                 syntax_out='[ERROR]: the playbook: gpucluster.multinode.train could not be found\n',
                                 syntax_rc=1)
    rc, out = _probe(path, capsys)
    assert rc == 1 and out['problems'] == [
        'ansible-playbook --syntax-check gpucluster.multinode.train ended with rc 1: the playbook: '
        'gpucluster.multinode.train could not be found']
    (bin_dir / 'ansible').unlink()
    os.unlink(str(tmp_path / 'vars.json'))
    rc, out = _probe(path, capsys)
    assert rc == 1 and out['problems'][:3] == [
        'ansible %s not found' % (bin_dir / 'ansible'), 'vars_file %s not found' % (tmp_path / 'vars.json'),
        'no training_user in %s or settings.json: the account the job runs as' % (tmp_path / 'vars.json')]


def test_a_metrics_dir_that_is_no_directory_is_said_with_its_own_remedy_not_the_supervisor_step(tmp_path, capsys):
    path, _ = _probe_setup(tmp_path, 'head | CHANGED | rc=0 | (stdout) uid=1001(train)\n'
                                     'w1 | CHANGED | rc=0 | (stdout) uid=1001(train)\n')
    (tmp_path / 'metrics').write_text('')  # a file where the directory should be
    with open(path) as handle:
        settings = json.load(handle)
    settings['metrics_dir'] = str(tmp_path / 'metrics')
    with open(path, 'w') as handle:
        json.dump(settings, handle)
    rc, out = _probe(path, capsys)
    assert rc == 1 and out['problems'] == [
        'metrics_dir %s is not a directory (training_metrics_dir, where the supervisor writes its figures for '
        'node_exporter; the start makes it where missing): remove what is there, name another directory, or leave '
        'training_metrics_dir empty' % (tmp_path / 'metrics')]
    (tmp_path / 'metrics').unlink()
    (tmp_path / 'metrics').mkdir()  # as the start makes it
    assert _probe(path, capsys) == (0, {'problems': []})


def test_the_probe_is_bounded_in_time(tmp_path):
    path, bin_dir = _probe_setup(tmp_path, '')
    (bin_dir / 'ansible').write_text('#!/bin/sh\nsleep 30\n')
    with open(path) as handle:
        settings = json.load(handle)
    started = time.time()
    problems = sv.probe(settings, timeout=1)
    assert time.time() - started < 15
    assert problems == ['host head: no answer within 1 s (as train, through %s)' % (tmp_path / 'inventory.yml'),
                        'host w1: no answer within 1 s (as train, through %s)' % (tmp_path / 'inventory.yml')]


def test_the_probe_of_settings_that_cannot_be_read_still_prints_its_verdict(tmp_path, capsys):
    rc, out = _probe(str(tmp_path / 'missing.json'), capsys)
    assert rc == 1 and out['problems'][0].startswith('settings %s cannot be read: ' % (tmp_path / 'missing.json'))


def test_a_node_whose_reads_keep_hanging_while_it_answers_a_ping_is_a_fault_after_the_limit():
    first = {'unreachable_nodes': ['w2'], 'state': 'unreachable'}
    second = {'unreachable_nodes': ['w2'], 'state': 'unreachable', 'why': ''}
    pong = {'w2': {'answered': True, 'why': 'pong'}}
    counts = {}
    assert sreads.unread_too_long(counts, first, second, pong, 3) == []
    assert sreads.unread_too_long(counts, first, second, pong, 3) == []
    assert sreads.unread_too_long(counts, first, second, pong, 3) == ['w2']
    # a second read that reaches the node starts the count again
    reached = {'unreachable_nodes': [], 'state': 'running', 'why': ''}
    counts = {'w2': 2}
    assert sreads.unread_too_long(counts, first, reached, pong, 3) == [] and counts == {}
    # a node that does not answer the probe is not counted here (confirm_unreachable decides it)
    counts = {}
    assert sreads.unread_too_long(counts, first, second, {'w2': {'answered': False}}, 1) == []


def test_a_stall_stop_names_the_collective_and_the_rank_the_flight_recorder_dumps_show(tmp_path):
    """The supervisor reads the dumps with the flight recorder's reader installed beside it, for the attempt it
    follows; no dump, no explanation (never an error)."""
    import pickle
    job_dir = tmp_path / 'job'
    sup = sdriver.Supervisor({'job_id': 'j', 'job_dir': str(job_dir), 'state_dir': str(tmp_path / 'state'),
                              'nodes': ['h', 'w'], 'attempt': 2})
    assert sup.hang_verdict() is None
    config = {'0': {'name': '0', 'desc': 'default_pg', 'ranks': '[0, 1]'}}

    def entry(seq, state, name):
        return {'collective_seq_id': seq, 'profiling_name': name, 'state': state, 'retired': state == 'completed',
                'process_group': ('0', 'default_pg'), 'is_p2p': False, 'input_sizes': [[4]]}
    folder = job_dir / 'flight' / 'attempt-2'
    folder.mkdir(parents=True)
    (folder / 'rank_0').write_bytes(pickle.dumps({'entries': [entry(3, 'completed', 'nccl:broadcast'),
                                                              entry(4, 'started', 'nccl:all_reduce')],
                                                  'pg_config': config}))
    (folder / 'rank_1').write_bytes(pickle.dumps({'entries': [entry(3, 'completed', 'nccl:broadcast')],
                                                  'pg_config': config}))
    hang = sup.hang_verdict()
    assert hang['missing_ranks'] == [1] and hang['collective'] == 'nccl:all_reduce'
    assert hang['why'].startswith('rank 1 never entered nccl:all_reduce #4')


# ----- fencing a left-out node ----------------------------------------------------------------------
def test_the_fence_kills_the_jobs_processes_of_older_attempts_only(tmp_path):
    import subprocess
    base = dict(os.environ)
    sleepers = {
        'old': subprocess.Popen(['sleep', '60'], env=dict(base, GPUCLUSTER_JOB_ID='job-f', GPUCLUSTER_ATTEMPT='1')),
        'old-no-attempt': subprocess.Popen(['sleep', '60'], env=dict(base, GPUCLUSTER_JOB_ID='job-f')),
        'current': subprocess.Popen(['sleep', '60'], env=dict(base, GPUCLUSTER_JOB_ID='job-f', GPUCLUSTER_ATTEMPT='2')),
        'other job': subprocess.Popen(['sleep', '60'], env=dict(base, GPUCLUSTER_JOB_ID='job-g', GPUCLUSTER_ATTEMPT='1')),
    }
    try:
        out = subprocess.run([sys.executable, '-c', sruns.FENCE_SCRIPT, 'job-f', '2'], capture_output=True, text=True,
                             timeout=30)
        assert out.stdout.strip() == 'gpucluster-fenced 2'
        for name in ('old', 'old-no-attempt'):
            assert sleepers[name].wait(timeout=10) == -9, name
        for name in ('current', 'other job'):
            assert sleepers[name].poll() is None, name
    finally:
        for proc in sleepers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_fence_run_is_one_ad_hoc_command_as_the_training_account_and_its_answers_are_read():
    cmd = sruns.fence_command('/x/ansible', '/etc/inv.yml', ['w2', 'w3'], 'train', 'job-f', 3)
    assert cmd[:8] == ['/x/ansible', 'w2,w3', '-i', '/etc/inv.yml', '-b', '--become-user', 'train', '-m']
    assert cmd[-2].endswith("' job-f 3") and cmd[-1] == '-o'
    text = ('w2 | CHANGED | rc=0 | (stdout) gpucluster-fenced 3\n'
            'w3 | UNREACHABLE!: Task failed: Failed to connect to the host via ssh: ssh: connect to host w3 port 22: '
            'Connection timed out\n')
    assert aout.fenced_counts(text, ['w2', 'w3']) == {'w2': 3}


def test_a_left_out_node_is_fenced_in_the_background_once_it_answers(tmp_path):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    answer = tmp_path / 'answer'
    answer.write_text('w2 | UNREACHABLE!: Task failed: Failed to connect to the host via ssh: timed out\n')
    (bin_dir / 'ansible').write_text('#!/bin/sh\ncat %s\n' % answer)
    (bin_dir / 'ansible').chmod(0o755)
    state = tmp_path / 'state'
    state.mkdir()
    sup = sdriver.Supervisor({'job_id': 'job-f', 'job_dir': str(tmp_path / 'job'), 'state_dir': str(state),
                              'nodes': ['h', 'w1', 'w2'], 'hosts': {'w2': 'w2'}, 'ansible': str(bin_dir / 'ansible'),
                              'ansible_playbook': str(bin_dir / 'ansible-playbook'), 'inventory': 'inv',
                              'training_user': 'train'})
    sup.to_fence = {'w2': 2}

    def finish(now):
        sup.fence_step(now)                     # starts the run (never waits on it)
        assert sup.fencing is not None
        sup.fencing[0].wait(timeout=10)
        sup.fence_step(now + 1)                 # reads it
        return [json.loads(line) for line in (state / 'events.jsonl').read_text().splitlines()] \
            if (state / 'events.jsonl').exists() else []
    assert finish(1000.0) == [] and sup.to_fence == {'w2': 2}   # not reached: tried again later
    sup.fence_step(1010.0)
    assert sup.fencing is None                  # not before FENCE_EVERY
    answer.write_text('w2 | CHANGED | rc=0 | (stdout) gpucluster-fenced 2\n')
    events = finish(1000.0 + sruns.FENCE_EVERY)
    assert [e['event'] for e in events] == ['fenced'] and events[0]['nodes'] == ['w2'] and events[0]['killed'] == 2
    assert sup.to_fence == {}
