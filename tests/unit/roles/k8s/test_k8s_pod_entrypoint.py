"""The pod entrypoint (roles/k8s/files/k8s_pod.py): its agent and pod 0's wait, over real sockets on
127.0.0.1 with the pods' names resolved by a stand-in resolver."""
import io
import json
import os
import socket
import sys
import threading
import time

import pytest

# the entrypoint and its parts, imported by their names as in a pod (the ConfigMap mounts them side by side;
# the supervision core is loaded under its name by tests/conftest.py)
FILES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'k8s', 'files')
sys.path.insert(0, FILES)
import pod_agent as pagent  # noqa: E402
import pod_checks as pchecks  # noqa: E402
import pod_cluster as pcluster  # noqa: E402
import pod_job as pjob  # noqa: E402
import pod_net as net  # noqa: E402
import pod_progress as pprogress  # noqa: E402

_request = net.request


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture
def job(tmp_path, monkeypatch):
    port = free_port()
    data = {'name': 'trainer', 'agent_port': port, 'master_port': 29500, 'peer_wait': 2, 'deepspeed': 'deepspeed',
            'config_dir': str(tmp_path), 'workdir': str(tmp_path), 'command': ['train.py'],
            'pods': [{'name': 'trainer-%d' % i, 'address': 'trainer-%d.trainer.ns.svc.cluster.local' % i,
                      'slots': 2 if i == 0 else 1} for i in range(3)]}
    (tmp_path / 'job.json').write_text(json.dumps(data))
    monkeypatch.setattr(pjob, 'STATE_ROOT', str(tmp_path / 'jobs'))
    monkeypatch.setattr(net, 'ADDRESSES', {})
    return data


_REAPERS = []


def start_reaper(agent):
    """The agent's reaper (waitpid(-1) as PID 1 does) for the length of one test: left running, it
    would reap the children of later tests in this process."""
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            agent.reap()
            time.sleep(0.2)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    _REAPERS.append((stop, thread))


@pytest.fixture(autouse=True)
def reapers_end_with_their_test():
    yield
    while _REAPERS:
        stop, thread = _REAPERS.pop()
        stop.set()
        thread.join(5)


def serve(agent, host='127.0.0.1', port=None):
    """The agent's handler on host:port (default: 127.0.0.1 and its job's agent port), one request at a time."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, agent.job['agent_port'] if port is None else port))
    sock.listen(8)

    def loop():
        while True:
            try:
                conn, peer = sock.accept()
            except OSError:
                return
            agent.handle(conn, peer)
    threading.Thread(target=loop, daemon=True).start()
    return sock


def test_a_pod_that_does_not_resolve_is_named_at_the_bound(job, monkeypatch):
    # trainer-0 and trainer-1 resolve to the one agent on 127.0.0.1, which answers as trainer-0
    monkeypatch.setattr(net, 'resolve', lambda name: [] if name.startswith('trainer-2') else ['127.0.0.1'])
    monkeypatch.setattr(net, 'request', lambda addr, port, msg, timeout=5: _request('127.0.0.1', port, msg, timeout))
    sock = serve(pagent.Agent(job, 'trainer-0'))
    try:
        start = time.time()
        why, hellos = pcluster.wait_for_peers(job, 2)
        assert time.time() - start < 6
    finally:
        sock.close()
    assert why['trainer-2'] == 'trainer-2.trainer.ns.svc.cluster.local does not resolve'
    assert why['trainer-1'] == ("trainer-1.trainer.ns.svc.cluster.local answers as 'trainer-0': the hostfile does "
                                "not match the pods")
    assert 'trainer-0' not in why and list(hellos) == ['trainer-0']


def test_launch_names_the_first_missing_pod_in_one_line_and_starts_nothing(job, monkeypatch, capsys):
    monkeypatch.setattr(pcluster, 'wait_for_peers', lambda j, s, **k: ({'trainer-2': 'x does not resolve',
                                                                       'trainer-1': 'y does not answer'}, {}))
    started = []
    monkeypatch.setattr(net, 'request', lambda *a, **k: started.append(a))
    assert pcluster.launch(job, 'j1', 20, detach=True, timeout=0) == 3
    err = capsys.readouterr().err
    assert err == ('k8s_pod: job j1 not started: pod trainer-1: y does not answer after 20 s (2 pods not ready: '
                   'trainer-1, trainer-2); nothing was started\n')
    assert started == []


def test_the_agent_starts_reports_and_stops_only_for_pod_0(job, monkeypatch, tmp_path):
    monkeypatch.setattr(net, 'resolve', lambda name: ['10.0.0.5'] if name.startswith('trainer-0') else [])
    out = io.StringIO()
    agent = pagent.Agent(job, 'trainer-1', out=out)
    monkeypatch.setattr(agent, 'command', lambda job_id, rank, attempt=0, **kw: ['sh', '-c', 'echo rank %d; sleep 30' % rank])
    start_reaper(agent)
    sock = serve(agent)
    port = job['agent_port']
    try:
        hello = _request('127.0.0.1', port, {'op': 'hello'})
        assert {k: hello[k] for k in ('ok', 'pod', 'ordinal', 'slots', 'running')} == {
            'ok': True, 'pod': 'trainer-1', 'ordinal': 1, 'slots': 1, 'running': []}
        assert hello['uid'] == os.getuid() and len(hello['memlock']) == 2 and int(hello['cap_eff'], 16) >= 0
        assert agent.allowed('10.0.0.5') and not agent.allowed('10.0.0.9')
        assert _request('127.0.0.1', port, {'op': 'start', 'job_id': 'bad id'})['error'] == "bad job id 'bad id'"
        assert _request('127.0.0.1', port, {'op': 'start', 'job_id': 'j1', 'node_rank': 1})['state'] == 'running'
        refused = _request('127.0.0.1', port, {'op': 'start', 'job_id': 'j2', 'node_rank': 1})
        assert refused == {'ok': False, 'error': 'job j1 is still running on trainer-1'}
        time.sleep(0.5)
        status = _request('127.0.0.1', port, {'op': 'status', 'job_id': 'j1'})
        assert status['state'] == 'running' and status['tail'] == ['rank 1']
        # the part's output is on PID 1's stdout too (kubectl logs), and its state on the volume
        assert '[j1 trainer-1] rank 1\n' in out.getvalue()
        on_disk = json.loads((tmp_path / 'jobs' / 'j1' / 'trainer-1.json').read_text())
        assert on_disk['state'] == 'running' and on_disk['pid'] == status['pid']
        stopped = _request('127.0.0.1', port, {'op': 'stop', 'job_id': 'j1', 'reason': 'stopped: test'}, timeout=30)
        assert stopped['state'] == 'stopped' and stopped['exit_code'] == -15 and stopped['reason'] == 'stopped: test'
        assert not pagent.group_alive(status['pid'])
        assert _request('127.0.0.1', port, {'op': 'status', 'job_id': 'j1'})['state'] == 'stopped'
    finally:
        sock.close()
        for pid in list(pagent.CHILDREN):
            agent._kill_group(pid)


@pytest.mark.parametrize('script,code,reason', [
    ('exit 3', 3, 'exit 3'),
    ('kill -9 $$', -9, 'killed by SIGKILL (an out-of-memory kill does this)'),
])
def test_a_part_that_ends_badly_is_failed_with_its_reason_and_leaves_no_process(job, script, code, reason):
    agent = pagent.Agent(job, 'trainer-2', out=io.StringIO())
    agent.command = lambda job_id, rank, attempt=0, **kw: ['sh', '-c', '(sleep 60 &) ; sleep 0.3; ' + script]
    agent.start('j1', 2)
    deadline = time.time() + 10
    while time.time() < deadline and agent.jobs['j1']['state'] == 'running':
        agent.reap()
        time.sleep(0.1)
    rec = agent.jobs['j1']
    assert (rec['state'], rec['exit_code'], rec['reason']) == ('failed', code, reason)
    while time.time() < deadline and pagent.group_alive(rec['pid']):
        time.sleep(0.1)
    assert not pagent.group_alive(rec['pid'])  # the background sleep of its group was killed too


def test_a_restarted_container_reports_its_part_failed_and_signals_nothing(job, monkeypatch):
    first = pagent.Agent(job, 'trainer-1', out=io.StringIO())
    first.command = lambda job_id, rank, attempt=0, **kw: ['sleep', '30']
    first.start('j1', 1)
    pid = first.jobs['j1']['pid']
    try:
        out = io.StringIO()
        second = pagent.Agent(job, 'trainer-1', out=out)  # the container started again: a new agent
        second.recover()
        status = second.status('j1')
        assert status['state'] == 'failed' and status['reason'].startswith('restarted: the container ended')
        assert 'kubectl describe pod trainer-1' in out.getvalue()
        second.stop('j1')
        assert pagent.group_alive(pid)  # not this container's process: left alone
    finally:
        first._kill_group(pid)
        first.reap()


def cluster_of_agents(job, monkeypatch, commands):
    """An agent for every pod on a local port of its own, each pod's address mapped to its port."""
    ports = [job['agent_port']] + [free_port() for _ in job['pods'][1:]]
    monkeypatch.setattr(net, 'resolve', lambda name: ['127.0.0.1'])
    by_name = {p['address']: ports[i] for i, p in enumerate(job['pods'])}
    monkeypatch.setattr(net, 'request', lambda addr, port, msg, timeout=5: _request('127.0.0.1', by_name[addr], msg, timeout))
    agents, socks = [], []
    for i in range(len(job['pods'])):
        agent = pagent.Agent(dict(job, agent_port=ports[i]), 'trainer-%d' % i, out=io.StringIO())
        agent.command = (lambda rank: lambda job_id, r, attempt=0, **kw: commands(rank, attempt))(i)
        start_reaper(agent)
        agents.append(agent)
        socks.append(serve(agent))
    return agents, socks


def wait_record(job, job_id, states, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        rec = pjob.read_job_record(pjob.STATE_ROOT, job_id) or {}
        if rec.get('state') in states:
            return rec
        time.sleep(0.2)
    return pjob.read_job_record(pjob.STATE_ROOT, job_id)


def test_a_failed_rank_ends_the_job_on_every_pod_within_seconds_naming_the_pod(job, monkeypatch):
    agents, socks = cluster_of_agents(job, monkeypatch, lambda rank, attempt: ['sh', '-c', 'sleep 1; exit 7'] if rank == 1
                                      else ['sleep', '60'])
    try:
        assert pcluster.start_all(job, 'j1') == ''
        start = time.time()
        assert net.request(job['pods'][0]['address'], 0, {'op': 'supervise', 'job_id': 'j1'})['ok']
        rec = wait_record(job, 'j1', ('failed',))
        assert time.time() - start < 15  # 1 s polls, then 5 polls gathering the others' states
        # the fault, then why it was not restarted (the same words as the gave_up event)
        assert (rec['state'], rec['failed_pod'], rec['reason']) == ('failed', 'trainer-1', 'exit 7; train.restarts is 0')
        states = pcluster.all_status(job, 'j1')
        assert [s['state'] for s in states] == ['stopped', 'failed', 'stopped']
        assert states[0]['reason'] == 'stopped: pod trainer-1 exit 7'
        assert not any(pagent.group_alive(a.jobs['j1']['pid']) for a in agents)
        summary = pcluster.summary(job, 'j1', states, rec)
        assert (summary['state'], summary['failed_pod'], summary['reason']) == ('failed', 'trainer-1',
                                                                                'exit 7; train.restarts is 0')
    finally:
        for sock in socks:
            sock.close()


def test_restarts_start_the_whole_job_again_with_the_resume_arguments(job, monkeypatch, tmp_path):
    data = json.loads((tmp_path / 'job.json').read_text())
    data.update(restarts=1, resume_args=['--resume-from', '/ckpt'])
    (tmp_path / 'job.json').write_text(json.dumps(data))
    job.update(restarts=1, resume_args=['--resume-from', '/ckpt'], peer_wait=5)
    seen = []

    def commands(rank, attempt):
        seen.append((rank, attempt))
        if attempt == 0:
            return ['sh', '-c', 'sleep 1; exit 9'] if rank == 2 else ['sleep', '60']
        return ['sh', '-c', 'sleep 0.5']
    agents, socks = cluster_of_agents(job, monkeypatch, commands)
    try:
        assert pcluster.start_all(job, 'j1') == ''
        assert net.request(job['pods'][0]['address'], 0, {'op': 'supervise', 'job_id': 'j1'})['ok']
        rec = wait_record(job, 'j1', ('finished', 'failed'), seconds=30)
        assert rec['state'] == 'finished' and rec['attempt'] == 1
        assert rec['history'][0]['failed_pod'] == 'trainer-2' and rec['history'][0]['reason'] == 'exit 9'
        assert sorted(seen) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
        real = pagent.Agent(job, 'trainer-1')
        assert real.command('j1', 1, attempt=1)[-2:] == ['--resume-from', '/ckpt']
        assert '--resume-from' not in real.command('j1', 1, attempt=0)
    finally:
        for sock in socks:
            sock.close()


def with_settings(job, tmp_path, **settings):
    data = json.loads((tmp_path / 'job.json').read_text())
    data.update(settings)
    (tmp_path / 'job.json').write_text(json.dumps(data))
    job.update(settings)


def kinds_of(job_id):
    return [(e['event'], e.get('attempt')) for e in pjob.read_job_events(pjob.STATE_ROOT, job_id)]


def test_the_failure_policy_fails_the_job_at_once_on_a_failure_it_names(job, monkeypatch, tmp_path):
    # exit 3 is the script's own "bad configuration": restarting would fail again; restarts are for the rest
    with_settings(job, tmp_path, restarts=2, peer_wait=5,
                  failure_policy=[{'on': ['exit'], 'exit_codes': [3], 'action': 'fail'}])
    agents, socks = cluster_of_agents(job, monkeypatch, lambda rank, attempt: ['sh', '-c', 'sleep 1; exit 3']
                                      if rank == 1 else ['sleep', '60'])
    try:
        assert pcluster.start_all(job, 'j1') == ''
        assert net.request(job['pods'][0]['address'], 0, {'op': 'supervise', 'job_id': 'j1'})['ok']
        rec = wait_record(job, 'j1', ('failed',))
        assert (rec['state'], rec['failed_pod'], rec['attempt'], rec['restarts_used']) == ('failed', 'trainer-1', 0, 0)
        assert kinds_of('j1') == [('supervising', 1), ('fault', 1), ('job_stopped', 1), ('gave_up', 1)]
        gave_up = pjob.read_job_events(pjob.STATE_ROOT, 'j1')[-1]
        assert gave_up['why'] == 'train.failure_policy[0] fails the job on a exit failure'
        fault = pjob.read_job_events(pjob.STATE_ROOT, 'j1')[1]
        assert (fault['seen'], fault['failure'], fault['exit_code']) == ('failed', 'exit', 3)  # the SSH words
    finally:
        for sock in socks:
            sock.close()


def test_an_uncounted_restart_does_not_use_train_restarts_and_the_attempt_reaches_the_ranks(job, monkeypatch, tmp_path):
    # a rank killed by a signal (a preempted node's OOM killer, a SIGKILL) restarts without using the one
    # counted restart; the parts of the next attempt see GPUCLUSTER_ATTEMPT 2, as on the SSH path
    with_settings(job, tmp_path, restarts=0, peer_wait=5,
                  failure_policy=[{'on': ['signal'], 'exit_codes': [], 'action': 'restart_uncounted'}])
    seen = []

    def commands(rank, attempt):
        seen.append((rank, attempt))
        if attempt == 0:
            return ['sh', '-c', 'sleep 1; kill -9 $$'] if rank == 2 else ['sleep', '60']
        return ['sh', '-c', 'echo attempt=$GPUCLUSTER_ATTEMPT; sleep 0.5']
    agents, socks = cluster_of_agents(job, monkeypatch, commands)
    try:
        assert pcluster.start_all(job, 'j1') == ''
        assert net.request(job['pods'][0]['address'], 0, {'op': 'supervise', 'job_id': 'j1'})['ok']
        rec = wait_record(job, 'j1', ('finished', 'failed'), seconds=30)
        assert (rec['state'], rec['attempt'], rec['restarts_used']) == ('finished', 1, 0)
        assert rec['history'][0]['kind'] == 'signal'
        # the same story as over SSH: the pods are checked (the spares' hellos) before the restart
        # events count attempts from 1, as the ranks (GPUCLUSTER_ATTEMPT) and the SSH supervisor do
        assert kinds_of('j1') == [('supervising', 1), ('fault', 1), ('job_stopped', 1), ('checked', 1), ('restart', 2),
                                  ('done', 2)]
        restart = pjob.read_job_events(pjob.STATE_ROOT, 'j1')[4]
        assert restart['counted'] is False and restart['nodes'] == ['trainer-0', 'trainer-1', 'trainer-2']
        time.sleep(0.5)
        assert pcluster.all_status(job, 'j1')[1]['tail'][-1] == 'attempt=2'
    finally:
        for sock in socks:
            sock.close()


def losing(monkeypatch, job, ordinals):
    """From now on the agents of these pods answer no more (their node is gone, their ranks frozen with it);
    returns the switch that brings them back."""
    real = net.request
    lost = {job['pods'][i]['address'] for i in ordinals}
    state = {'lost': True}

    def request(addr, port, msg, timeout=5):
        if addr in lost and state['lost']:
            raise ConnectionRefusedError(111, 'Connection refused')
        return real(addr, port, msg, timeout)
    monkeypatch.setattr(net, 'request', request)
    return state


def wait_event(job_id, kind, seconds=15):
    deadline = time.time() + seconds
    while time.time() < deadline and kind not in [e for e, _ in kinds_of(job_id)]:
        time.sleep(0.2)
    return [e for e in pjob.read_job_events(pjob.STATE_ROOT, job_id) if e['event'] == kind]


def four_pods(job, tmp_path, **settings):
    """The job on trainer-0..2 (2 + 1 + 1 slots) with trainer-3 as its spare."""
    pods = job['pods'] + [{'name': 'trainer-3', 'address': 'trainer-3.trainer.ns.svc.cluster.local', 'slots': 1}]
    with_settings(job, tmp_path, pods=pods, spares=1, min_pods=3, **settings)


def test_a_pod_lost_without_a_spare_ends_the_job_within_its_bounds_naming_pod_node_and_the_admin_step(job, monkeypatch, tmp_path):
    # trainer-2 stops answering: after train.unreachable_after it is the fault (no gathering first), the stop
    # asks it once briefly, no spare and train.min_pods 3 leave nothing but to wait train.lost_pod_wait for it;
    # the job then fails naming the pod, its node and the administrator's step. When it answers again, its
    # part of the failed job is stopped.
    with_settings(job, tmp_path, restarts=1, peer_wait=300, lost_pod_wait=3, unreachable_after=1, min_pods=3,
                  namespace='ns')
    agents, socks = cluster_of_agents(job, monkeypatch, lambda rank, attempt: ['sleep', '60'])
    try:
        assert pcluster.start_all(job, 'j1') == ''
        node = losing(monkeypatch, job, [2])
        start = time.time()
        agents[0].supervise('j1', poll=0.2, nodes={'trainer-2': 'gpu-node-7'})
        rec = wait_record(job, 'j1', ('failed',), seconds=30)
        assert time.time() - start < 12
        assert rec['failed_pod'] == 'trainer-2'
        assert rec['reason'].startswith('unreachable (no answer for 1 s')
        assert ('2 node(s) would remain (trainer-0, trainer-1) and train.min_pods is 3; left out: trainer-2; trainer-2 '
                'did not answer again within train.lost_pod_wait (3 s): pod trainer-2 on node gpu-node-7 is lost: once '
                'the node is confirmed down (kubectl get node gpu-node-7: NotReady; drained or powered off), kubectl '
                'delete pod trainer-2 -n ns --force --grace-period=0') in rec['reason']
        assert [e for e, _ in kinds_of('j1')] == ['supervising', 'fault', 'job_stopped', 'checked', 'gave_up']
        events = pjob.read_job_events(pjob.STATE_ROOT, 'j1')
        assert events[1]['seen'] == 'unreachable' and events[2]['unanswered'] == ['trainer-2']
        assert events[4]['time'] - events[1]['time'] < 6     # the stop and the lost pod's wait, no 30 s request
        assert pagent.group_alive(agents[2].jobs['j1']['pid'])     # still running where nobody could stop it
        node['lost'] = False                                        # the node is back
        fenced = wait_event('j1', 'fenced')
        assert [(e['nodes'], e['state']) for e in fenced] == [(['trainer-2'], 'stopped')]
        assert not pagent.group_alive(agents[2].jobs['j1']['pid'])
    finally:
        for sock in socks:
            sock.close()


def test_a_spare_pod_takes_a_lost_pods_place_and_slots_at_once_and_the_lost_part_is_fenced(job, monkeypatch, tmp_path):
    four_pods(job, tmp_path, restarts=1, peer_wait=30, lost_pod_wait=300, unreachable_after=1)
    started = []

    def commands(rank, attempt):
        started.append((rank, attempt))
        return ['sleep', '60'] if attempt == 0 else ['sh', '-c', 'sleep 1']
    agents, socks = cluster_of_agents(job, monkeypatch, commands)
    try:
        assert pcluster.start_all(job, 'j1', pods=pjob.working_pods(job)) == ''
        assert 'j1' not in agents[3].jobs                            # the spare waits
        node = losing(monkeypatch, job, [2])
        start = time.time()
        agents[0].supervise('j1', poll=0.2)
        rec = wait_record(job, 'j1', ('finished', 'failed'), seconds=30)
        assert (rec['state'], rec['attempt'], rec['spares_used']) == ('finished', 1, ['trainer-3'])
        assert time.time() - start < 15                             # not lost_pod_wait (300 s)
        restart = wait_event('j1', 'restart')[0]
        assert (restart['nodes'], restart['left_out'], restart['spares'], restart['world_size']) == (
            ['trainer-0', 'trainer-1', 'trainer-3'], ['trainer-2'], ['trainer-3'], 4)
        assert 'spare trainer-3 in its place' in restart['why']
        assert sorted(started) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (3, 1)]    # (pod, attempt): the spare ran attempt 1
        hostfile = agents[3].jobs['j1']
        with open(os.path.join(pjob.STATE_ROOT, 'j1', 'trainer-3.hostfile')) as handle:
            assert handle.read() == ('trainer-0.trainer.ns.svc.cluster.local slots=2\n'
                                     'trainer-1.trainer.ns.svc.cluster.local slots=1\n'
                                     'trainer-3.trainer.ns.svc.cluster.local slots=1\n')
        assert hostfile['node_rank'] == 2
        node['lost'] = False
        fenced = wait_event('j1', 'fenced')
        assert [(e['nodes'], e['state']) for e in fenced] == [(['trainer-2'], 'stopped')]
        assert not pagent.group_alive(agents[2].jobs['j1']['pid'])
    finally:
        for sock in socks:
            sock.close()


def test_without_a_spare_the_job_shrinks_down_to_train_min_pods(job, monkeypatch, tmp_path):
    with_settings(job, tmp_path, restarts=1, peer_wait=30, lost_pod_wait=300, unreachable_after=1, min_pods=2)
    agents, socks = cluster_of_agents(job, monkeypatch, lambda rank, attempt: ['sleep', '60'] if attempt == 0
                                      else ['sh', '-c', 'sleep 1'])
    try:
        assert pcluster.start_all(job, 'j1') == ''
        losing(monkeypatch, job, [1])
        agents[0].supervise('j1', poll=0.2)
        rec = wait_record(job, 'j1', ('finished', 'failed'), seconds=30)
        assert (rec['state'], rec['attempt'], [p['name'] for p in rec['layout']]) == ('finished', 1, ['trainer-0', 'trainer-2'])
        restart = wait_event('j1', 'restart')[0]
        assert (restart['left_out'], restart['world_size'], restart['why']) == (
            ['trainer-1'], 3, 'pod trainer-1 unreachable (no answer for 1 s: [Errno 111] Connection refused): without trainer-1')
        assert agents[2].jobs['j1']['node_rank'] == 1
    finally:
        for sock in socks:
            sock.close()


def test_a_lost_pod_that_answers_again_within_lost_pod_wait_gets_the_job_back_on_the_same_pods(job, monkeypatch, tmp_path):
    with_settings(job, tmp_path, restarts=1, peer_wait=30, lost_pod_wait=20, unreachable_after=1)
    agents, socks = cluster_of_agents(job, monkeypatch, lambda rank, attempt: ['sleep', '60'] if attempt == 0
                                      else ['sh', '-c', 'sleep 1'])
    try:
        assert pcluster.start_all(job, 'j1') == ''
        node = losing(monkeypatch, job, [2])
        agents[0].supervise('j1', poll=0.2)
        assert wait_event('j1', 'checked')
        node['lost'] = False                                       # back before lost_pod_wait ends
        rec = wait_record(job, 'j1', ('finished', 'failed'), seconds=30)
        assert (rec['state'], rec['attempt'], len(rec['layout'])) == ('finished', 1, 3)
        assert wait_event('j1', 'restart')[0]['why'].endswith('on the same pods (trainer-2 answered again)')
        # the fence stops attempt 0's part where it still ran, never attempt 1's
        assert agents[2].jobs['j1']['attempt'] == 1 and agents[2].jobs['j1']['state'] == 'finished'
    finally:
        for sock in socks:
            sock.close()


def test_status_says_running_while_a_pod_only_did_not_answer_yet_and_restarting_once_pod_0_acts(job):
    rows = [{'pod': 'trainer-0', 'state': 'running'}, {'pod': 'trainer-1', 'state': 'running'},
            {'pod': 'trainer-2', 'state': 'unreachable'}]
    record = {'state': 'running', 'attempt': 0, 'restarts': 1, 'restarts_used': 0}
    out = pcluster.summary(job, 'j', rows, record)
    assert (out['state'], out['unreachable']) == ('running', ['trainer-2'])
    assert pcluster.summary(job, 'j', rows, dict(record, phase='fault'))['state'] == 'restarting'
    assert pcluster.summary(job, 'j', rows, dict(record, phase='fault', restarts=0))['state'] == 'failing'


def test_a_fence_never_stops_the_attempt_that_replaced_the_fenced_one(job):
    agent = pagent.Agent(job, 'trainer-1', out=io.StringIO())
    start_reaper(agent)
    agent.command = lambda job_id, r, attempt=0, **kw: ['sleep', '30']
    assert agent.start('j1', 1, attempt=1)['ok']
    try:
        assert agent.stop('j1', before_attempt=1)['kept'] and agent.jobs['j1']['state'] == 'running'
        assert agent.stop('j1', before_attempt=2)['state'] == 'stopped'
    finally:
        agent.stop('j1', grace=1)


KILLED = 'exit 247 (a rank was killed by SIGKILL: an out-of-memory kill does this)'


@pytest.mark.parametrize('states,pod,reason', [
    # a rank killed in trainer-2 (DeepSpeed's launcher exits 247), trainer-0's rank then fails on the
    # broken collective, and ended first: trainer-2 is the cause
    ([('failed', 1, 'exit 1', 10.0), ('running', None, '', None), ('failed', 247, KILLED, 10.5)], 'trainer-2', KILLED),
    # a container restarted beats the others' exits, whenever they ended
    ([('failed', 1, 'exit 1', 10.0), ('failed', None, 'restarted: the container ended while its part ran', None),
      ('failed', 1, 'exit 1', 10.2)], 'trainer-1', 'restarted: the container ended while its part ran'),
    ([('failed', 1, 'exit 1', 10.0), ('unreachable', None, '', None), ('stopped', -15, 'stopped: pod trainer-0 exit 1', 11.0)],
     'trainer-1', 'unreachable ()'),
    ([('failed', 2, 'exit 2', 12.0), ('failed', 1, 'exit 1', 11.0), ('finished', 0, 'exit 0', 9.0)], 'trainer-1', 'exit 1'),
    ([('running', None, '', None), ('finished', 0, 'exit 0', 9.0), ('running', None, '', None)], None, None),
])
def test_the_cause_is_named_not_the_collateral_failure(states, pod, reason):
    rows = [{'pod': 'trainer-%d' % i, 'state': st, 'exit_code': code, 'reason': why, 'ended': ended}
            for i, (st, code, why, ended) in enumerate(states)]
    assert pchecks.blame(rows) == ((pod, reason) if pod else None)


def test_a_launcher_exit_code_names_the_signal_that_killed_its_rank():
    assert pchecks.rank_signal(247).name == 'SIGKILL' and pchecks.rank_signal(137).name == 'SIGKILL'
    assert pchecks.rank_signal(143).name == 'SIGTERM' and pchecks.rank_signal(1) is None
    assert pchecks.describe_exit(247 << 8) == (247, 'exit 247 (a rank was killed by SIGKILL: an out-of-memory kill does this)')


def test_rdma_needs_ipc_lock_or_an_unlimited_memlock():
    assert pchecks.rdma_verdict({'cap_eff': '%016x' % (1 << 14), 'memlock': [8 << 20, 8 << 20]}) == ''
    assert pchecks.rdma_verdict({'cap_eff': '0', 'memlock': [-1, -1]}) == ''
    assert pchecks.rdma_verdict({'cap_eff': '0', 'memlock': [8 << 20, 8 << 20]}).startswith(
        'cannot register RDMA memory: memlock limit 8192 KiB and IPC_LOCK not effective (CapEff 0)')


def test_launch_refuses_an_rdma_job_where_a_pod_cannot_register_memory(job, monkeypatch, capsys):
    job['network_mode'] = 'rdma'
    ok = {'cap_eff': '%016x' % (1 << 14), 'memlock': [65536, 65536]}
    monkeypatch.setattr(pcluster, 'wait_for_peers', lambda j, s, **k: ({}, {'trainer-0': ok, 'trainer-1': ok,
                                                                            'trainer-2': {'cap_eff': '0', 'memlock': [65536, 65536]}}))
    started = []
    monkeypatch.setattr(net, 'request', lambda *a, **k: started.append(a))
    assert pcluster.launch(job, 'j1', 20, detach=True, timeout=0) == 6
    err = capsys.readouterr().err
    assert err.startswith('k8s_pod: job j1 not started: pod trainer-2 cannot register RDMA memory: memlock limit 64 KiB')
    assert err.endswith('; nothing was started\n') and started == []


def test_a_pod_reports_whether_it_can_write_the_claim(job, tmp_path):
    claim = tmp_path / 'claim'
    claim.mkdir()
    job['mount_path'] = str(claim)
    hello = pagent.Agent(job, 'trainer-1', out=io.StringIO()).hello()
    assert hello['claim']['writable'] is True and list(claim.iterdir()) == []   # the check leaves nothing
    # a directory this process cannot make a file in (as root too: sysfs refuses new files)
    target = str(claim) if os.getuid() != 0 else '/sys'
    if os.getuid() != 0:
        claim.chmod(0o555)
    refused = pagent.Agent(dict(job, mount_path=target), 'trainer-1', out=io.StringIO()).hello()['claim']
    assert refused['writable'] is False and refused['why'] == 'Permission denied' and refused['path'] == target
    assert pchecks.claim_check(str(tmp_path / 'missing'))['why'] == 'No such file or directory'


def test_launch_refuses_a_job_whose_pods_cannot_write_the_claim_naming_uid_and_what_to_set(job, monkeypatch, capsys):
    job.update(claim='trainer-data', fs_group=1000)
    ok = {'uid': 1000, 'gid': 1000, 'groups': [1000], 'claim': {'writable': True}}
    nfs = {'uid': 1000, 'gid': 1000, 'groups': [1000],
           'claim': {'writable': False, 'path': '/shared', 'gid': 5000, 'owner': 'owner 0:5000, mode 0775',
                     'why': 'Permission denied'}}
    monkeypatch.setattr(pcluster, 'wait_for_peers', lambda j, s, **k: ({}, {'trainer-0': ok, 'trainer-1': nfs,
                                                                            'trainer-2': ok}))
    started = []
    monkeypatch.setattr(net, 'request', lambda *a, **k: started.append(a))
    assert pcluster.launch(job, 'j1', 20, detach=True, timeout=0) == 7
    err = capsys.readouterr().err
    assert err == ('k8s_pod: job j1 not started: pod trainer-1 (uid 1000, gid 1000, groups 1000) cannot write the '
                   'claim trainer-data at /shared (owner 0:5000, mode 0775: Permission denied); fsGroup 1000 was not '
                   'applied to it (NFS, CephFS and most ReadWriteMany drivers ignore fsGroup): set '
                   'security.supplemental_groups: [5000] (the group that owns it) in the cluster file, or have an '
                   'administrator make its root writable by uid 1000 once; nothing was started\n')
    assert started == []


@pytest.mark.parametrize('states,state,failed', [
    (['finished', 'finished', 'finished'], 'finished', None),
    (['running', 'failed', 'running'], 'failed', 'trainer-1'),
    (['running', 'running', 'unreachable'], 'failed', 'trainer-2'),
    (['absent', 'absent', 'unreachable'], 'absent', None),
    (['stopped', 'stopped', 'absent'], 'stopped', None),
])
def test_summary(job, states, state, failed):
    rows = [{'pod': 'trainer-%d' % i, 'state': s} for i, s in enumerate(states)]
    out = pcluster.summary(job, 'j', rows)
    assert (out['state'], out['failed_pod'], out['world_size']) == (state, failed, 4)


def test_the_launcher_line_is_deepspeed_without_ssh_with_the_node_rank(job):
    agent = pagent.Agent(job, 'trainer-2')
    assert agent.command('j', 2) == ['deepspeed', '--no_ssh', '--hostfile', os.path.join(job['config_dir'], 'hostfile'),
                                     '--node_rank', '2', '--master_addr', 'trainer-0.trainer.ns.svc.cluster.local',
                                     '--master_port', '29500', 'train.py']


def slow_after_first(answer, seconds=6.0):
    """A resolver whose first answer is at once and every later one takes longer than IO_TIMEOUT (the 5 s
    DNS stall of a conntrack race); it counts its lookups."""
    calls = []

    def resolve(name):
        calls.append(name)
        if len(calls) > 1:
            time.sleep(seconds)
        return list(answer(name))
    return resolve, calls


def test_a_slow_dns_answer_delays_no_request_to_a_pod(job, monkeypatch):
    # pod 0 resolves each pod's name once (wait_for_peers, or the first request) and keeps the address:
    # the later requests of a launch (start, supervise, status, stop) do not wait on DNS
    resolve, calls = slow_after_first(lambda name: ['127.0.0.1'])
    monkeypatch.setattr(net, 'resolve', resolve)
    agent = pagent.Agent(job, 'trainer-1', out=io.StringIO())
    sock = serve(agent)
    try:
        name = job['pods'][1]['address']
        began = time.time()
        for _ in range(3):
            assert net.request(name, job['agent_port'], {'op': 'hello'}, timeout=net.IO_TIMEOUT)['pod'] == 'trainer-1'
        assert time.time() - began < 2 and calls == [name]
    finally:
        sock.close()


def test_a_pod_that_came_back_elsewhere_is_resolved_again_once(job, monkeypatch):
    monkeypatch.setattr(net, 'resolve', lambda name: ['127.0.0.1'])
    agent = pagent.Agent(job, 'trainer-1', out=io.StringIO())
    sock = serve(agent)
    name = job['pods'][1]['address']
    net.ADDRESSES[name] = '127.0.0.2'   # where the pod was: nothing listens there now
    try:
        assert net.request(name, job['agent_port'], {'op': 'hello'})['pod'] == 'trainer-1'
        assert net.ADDRESSES[name] == '127.0.0.1'
        # a pod that answers nowhere still fails the request (127.0.0.2 and .3: nothing listens there)
        net.ADDRESSES[name] = '127.0.0.2'
        monkeypatch.setattr(net, 'resolve', lambda name: ['127.0.0.3'])
        with pytest.raises(OSError):
            net.request(name, job['agent_port'], {'op': 'hello'}, timeout=1)
    finally:
        sock.close()


def test_the_agent_knows_pod_0_without_a_lookup_per_request_and_still_refuses_others(job, monkeypatch):
    resolve, calls = slow_after_first(lambda name: ['10.0.0.5'])
    monkeypatch.setattr(net, 'resolve', resolve)
    agent = pagent.Agent(job, 'trainer-1', out=io.StringIO())
    assert agent.allowed('10.0.0.5')
    began = time.time()
    assert all(agent.allowed('10.0.0.5') for _ in range(5)) and time.time() - began < 1 and len(calls) == 1
    # a peer that is not pod 0 is refused after one more lookup (pod 0 may have come back elsewhere)
    monkeypatch.setattr(net, 'resolve', lambda name: ['10.0.0.6'])
    assert not agent.allowed('10.0.0.9') and agent.allowed('10.0.0.6') and not agent.allowed('10.0.0.5')


def test_before_pod_0s_name_is_published_a_pod_asks_the_callers_agent_who_it_is(job, monkeypatch):
    # trainer-1 cannot resolve trainer-0 yet (the Service publishes it late, the resolver cached its absence):
    # a start from 127.0.0.2 is taken when the agent there answers as trainer-0, refused otherwise
    monkeypatch.setattr(net, 'resolve', lambda name: [])
    agent = pagent.Agent(job, 'trainer-1', out=io.StringIO())
    caller = serve(pagent.Agent(job, 'trainer-0', out=io.StringIO()), '127.0.0.2', job['agent_port'])
    try:
        assert agent.allowed('127.0.0.2') and '127.0.0.2' in agent.pod0
    finally:
        caller.close()
    other = serve(pagent.Agent(job, 'trainer-2', out=io.StringIO()), '127.0.0.3', job['agent_port'])
    try:
        assert not agent.allowed('127.0.0.3')
    finally:
        other.close()
    assert not agent.allowed('127.0.0.4')                  # nothing answers there
    conn = socket.socket()
    # through the agent's own handler: the refusal names the caller
    sock = serve(agent, '127.0.0.5', job['agent_port'])
    try:
        conn.bind(('127.0.0.6', 0))
        conn.connect(('127.0.0.5', job['agent_port']))
        conn.sendall(b'{"op": "stop", "job_id": "j1"}\n')
        reply = json.loads(conn.makefile().readline())
        assert reply['error'] == 'trainer-1 refuses stop from 127.0.0.6: only pod 0 starts and stops jobs'
    finally:
        conn.close()
        sock.close()


def test_pod_0_reaches_a_pod_whose_name_is_not_published_yet_at_its_registered_address(job, monkeypatch, tmp_path):
    root = str(tmp_path / 'state')
    monkeypatch.setattr(net, 'resolve', lambda name: ['127.0.0.1'] if name.startswith('trainer-0') else [])
    servers = []
    try:
        for i, host in ((1, '127.0.0.7'), (2, '127.0.0.8')):
            agent = pagent.Agent(job, 'trainer-%d' % i, out=io.StringIO())
            servers.append(serve(agent, host, job['agent_port']))
        servers.append(serve(pagent.Agent(job, 'trainer-0', out=io.StringIO()), '127.0.0.1', job['agent_port']))
        assert net.register(root, 'trainer-1', '127.0.0.7', 'node-a', 'b1')
        # trainer-2 registered an address another pod holds now: not taken for it
        assert net.register(root, 'trainer-2', '127.0.0.7', 'node-b', 'b2')
        why, hellos = pcluster.wait_for_peers(job, 0, root=root)
        assert sorted(hellos) == ['trainer-0', 'trainer-1'] and hellos['trainer-1']['pod'] == 'trainer-1'
        assert why == {'trainer-2': 'trainer-2.trainer.ns.svc.cluster.local does not resolve'}
        assert net.ADDRESSES[job['pods'][1]['address']] == '127.0.0.7'
        assert job['pods'][2]['address'] not in net.ADDRESSES
        assert net.register(root, 'trainer-2', '127.0.0.8', 'node-b', 'b3')
        assert pcluster.wait_for_peers(job, 0, root=root)[0] == {}
    finally:
        for sock in servers:
            sock.close()


def test_a_part_starts_with_the_attempts_hostfile_and_pod_0s_address_as_its_master(job, tmp_path):
    agent = pagent.Agent(job, 'trainer-1', out=io.StringIO())
    hostfile = str(tmp_path / 'h')
    assert agent.command('j', 1, hostfile=hostfile, master='10.0.0.5')[:8] == [
        'deepspeed', '--no_ssh', '--hostfile', hostfile, '--node_rank', '1', '--master_addr', '10.0.0.5']
    assert pjob.hostfile_lines([{'address': 'a', 'slots': 2}, {'address': 'b', 'slots': 1}]) == 'a slots=2\nb slots=1\n'


def test_every_request_reaches_a_pod_at_its_registered_address_until_its_name_resolves(job, monkeypatch, tmp_path):
    # pod 0's agent (another process than the launch: its own cache) follows the job before the Service
    # published the peers' names; a reply from another pod at a registered address is not taken as the pod's
    root = str(tmp_path / 'state')
    monkeypatch.setattr(net, 'resolve', lambda name: [])
    monkeypatch.setattr(net, 'REGISTRY_ROOT', root)
    server = serve(pagent.Agent(job, 'trainer-1', out=io.StringIO()), '127.0.0.9', job['agent_port'])
    try:
        net.register(root, 'trainer-1', '127.0.0.9', 'node-a', 'b1')
        net.register(root, 'trainer-2', '127.0.0.9', 'node-b', 'b2')     # stale: trainer-1 holds it now
        states = pcluster.all_status(job, 'j1', pods=job['pods'][1:])
        assert [(s['pod'], s['state']) for s in states] == [('trainer-1', 'absent'), ('trainer-2', 'unreachable')]
        assert states[1]['error'] == 'trainer-1 answered at its address'
        assert job['pods'][2]['address'] not in net.ADDRESSES
    finally:
        server.close()


def test_a_jobset_pod_runs_its_rank_with_pod_0s_address_once_it_resolves_and_resumes_after_a_restart(job, monkeypatch):
    job = dict(job, resume_args=['--resume-from', '/ckpt'], peer_wait=5)
    ran, now, names = [], [0.0], []

    def resolve(name):
        names.append(name)
        return ['10.0.0.7'] if now[0] >= 3 else []      # published 3 s after the pod started

    def sleep(seconds):
        now[0] += seconds
    monkeypatch.setattr(net, 'resolve', resolve)
    env = {'GPUCLUSTER_NODE_RANK': '2', 'GPUCLUSTER_JOB_ATTEMPT': '1', 'PATH': '/bin'}
    pjob.run_part(job, env, clock=lambda: now[0], sleep=sleep, execute=lambda *a: ran.append(a) or 0)
    (program, line, child_env), = ran
    assert line[:8] == ['deepspeed', '--no_ssh', '--hostfile', os.path.join(job['config_dir'], 'hostfile'),
                        '--node_rank', '2', '--master_addr', '10.0.0.7']
    assert line[-2:] == ['--resume-from', '/ckpt'] and child_env['GPUCLUSTER_ATTEMPT'] == '2'
    assert now[0] == 3 and names[0] == job['pods'][0]['address']
    # rank 0 is the master at its own address; a name that never comes ends the pod naming it
    ran.clear()
    pjob.run_part(job, {'GPUCLUSTER_NODE_RANK': '0', 'GPUCLUSTER_POD_IP': '10.0.0.5'},
                  execute=lambda *a: ran.append(a) or 0)
    assert ran[0][1][7] == '10.0.0.5' and '--resume-from' not in ran[0][1]
    now[0] = -100.0
    assert pjob.run_part(job, env, clock=lambda: now[0], sleep=sleep, execute=lambda *a: 0) == 3


# ----- a stall: the parts' own output, judged by the core's rule (the training role's) ---------------------
def test_a_parts_progress_is_its_step_lines_and_heartbeats_on_the_agents_clock():
    now = [1000.0]
    prog = pprogress.Progress(None, clock=lambda: now[0])
    assert prog.report()['tracked'] is False  # nothing says yet that this part logs steps
    prog.saw('[rank0]: step 7 loss 0.52\n')
    now[0] = 1004.0
    prog.saw('something else\n')
    assert prog.report() == {'tracked': True, 'last_step': 7, 'seconds_since_step': 4.0, 'seconds_since_heartbeat': None,
                             'seconds_since_start': 4.0, 'phase': None, 'phase_s': None}
    prog.saw('gpucluster-heartbeat phase=checkpoint step=7 since=1003.0 time=1004.0\n')
    now[0] = 1010.0
    report = prog.report()
    assert (report['phase'], report['phase_s'], report['seconds_since_heartbeat']) == ('checkpoint', 7.0, 6.0)
    prog.saw('step 8 loss 0.5\n')  # a step ends the phase
    assert prog.report()['phase'] is None and prog.report()['last_step'] == 8
    named = pprogress.Progress(r'it=(?P<step>\d+) of \d+', clock=lambda: now[0])
    named.saw('it=12 of 100\n')
    assert named.report()['last_step'] == 12


def test_a_rank_the_kernel_holds_is_named_by_its_part(tmp_path):
    for pid, state, pgrp in (('10', 'S', '10'), ('11', 'T', '10'), ('12', 'T', '99')):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / 'stat').write_text('%s (python3 x) %s 1 %s %s 0' % (pid, state, pgrp, pgrp))
    assert pprogress.held_in_group(10, proc=str(tmp_path)) == 'stopped (pid 11)'
    assert pprogress.held_in_group(20, proc=str(tmp_path)) == ''


def test_a_job_whose_parts_log_no_step_for_train_stall_seconds_is_stalled_stopped_and_restarted(job, monkeypatch,
                                                                                                tmp_path):
    # (a job id of its own: an earlier test's fence of j1 may still ask)
    # every part logs steps, then pod 1's rank is held by the kernel (SIGSTOP) and every part goes quiet, as the
    # others wait for it in their next collective: the core's stall rule (the training role's) names pod 1
    with_settings(job, tmp_path, restarts=1, peer_wait=5, stall_seconds=2)
    script = ('for i in 1 2 3; do echo "step $i loss 0.5"; sleep 0.2; done; %s sleep 60')

    def commands(rank, attempt):
        if attempt == 0:
            return ['sh', '-c', script % ('kill -STOP $$;' if rank == 1 else '')]
        return ['sh', '-c', 'for i in 3 4 5; do echo "step $i loss 0.4"; sleep 0.2; done']
    agents, socks = cluster_of_agents(job, monkeypatch, commands)
    try:
        assert pcluster.start_all(job, 'j-stall') == ''
        assert net.request(job['pods'][0]['address'], 0, {'op': 'supervise', 'job_id': 'j-stall'})['ok']
        rec = wait_record(job, 'j-stall', ('finished', 'failed'), seconds=40)
        assert (rec['state'], rec['attempt']) == ('finished', 1)
        events = pjob.read_job_events(pjob.STATE_ROOT, 'j-stall')
        assert [e['event'] for e in events] == ['supervising', 'fault', 'job_stopped', 'checked', 'restart', 'training',
                                                'done']
        fault = events[1]
        assert (fault['seen'], fault['failure'], fault['nodes'], fault['step']) == ('stalled', 'stalled', ['trainer-1'], 3)
        assert fault['why'].startswith('no rank logged a step or heartbeat for 2 s or more (rank 1 on trainer-1 is '
                                       'stopped (pid ')
        assert rec['history'][0]['kind'] == 'stalled' and rec['history'][0]['failed_pod'] == 'trainer-1'
        assert events[5]['step'] in (3, 4, 5)  # training again: a step of the new attempt, read
        assert not any(pagent.group_alive(a.jobs['j-stall']['pid']) for a in agents)
    finally:
        for sock in socks:
            sock.close()


def test_a_job_that_logs_no_step_is_never_stalled(job, monkeypatch, tmp_path):
    # nothing says the script logs steps (no line matches, no heartbeat): stall detection is off, as over SSH
    with_settings(job, tmp_path, restarts=1, peer_wait=5, stall_seconds=1)
    agents, socks = cluster_of_agents(job, monkeypatch, lambda rank, attempt: ['sh', '-c', 'echo hello; sleep 4'])
    try:
        assert pcluster.start_all(job, 'j-stall') == ''
        assert net.request(job['pods'][0]['address'], 0, {'op': 'supervise', 'job_id': 'j-stall'})['ok']
        rec = wait_record(job, 'j-stall', ('finished', 'failed'), seconds=20)
        assert (rec['state'], rec['attempt']) == ('finished', 0)
        assert kinds_of('j-stall') == [('supervising', 1), ('done', 1)]
    finally:
        for sock in socks:
            sock.close()
