"""The pod entrypoint (roles/k8s/files/k8s_pod.py): its agent and pod 0's wait, over real sockets on
127.0.0.1 with the pods' names resolved by a stand-in resolver."""
import importlib.util
import json
import os
import socket
import threading
import time

import pytest

PATH = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'k8s', 'files', 'k8s_pod.py')
spec = importlib.util.spec_from_file_location('k8s_pod', PATH)
k8s_pod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(k8s_pod)
_request = k8s_pod.request


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
    monkeypatch.setattr(k8s_pod, 'STATE_ROOT', str(tmp_path / 'jobs'))
    return data


def serve(agent):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(('127.0.0.1', agent.job['agent_port']))
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
    monkeypatch.setattr(k8s_pod, 'resolve', lambda name: [] if name.startswith('trainer-2') else ['127.0.0.1'])
    monkeypatch.setattr(k8s_pod, 'request', lambda addr, port, msg, timeout=5: _request('127.0.0.1', port, msg, timeout))
    sock = serve(k8s_pod.Agent(job, 'trainer-0'))
    try:
        start = time.time()
        why = k8s_pod.wait_for_peers(job, 2)
        assert time.time() - start < 6
    finally:
        sock.close()
    assert why['trainer-2'] == 'trainer-2.trainer.ns.svc.cluster.local does not resolve'
    assert why['trainer-1'] == ("trainer-1.trainer.ns.svc.cluster.local answers as 'trainer-0': the hostfile does "
                                "not match the pods")
    assert 'trainer-0' not in why


def test_launch_names_the_first_missing_pod_in_one_line_and_starts_nothing(job, monkeypatch, capsys):
    monkeypatch.setattr(k8s_pod, 'wait_for_peers', lambda j, s: {'trainer-2': 'x does not resolve',
                                                                 'trainer-1': 'y does not answer'})
    started = []
    monkeypatch.setattr(k8s_pod, 'request', lambda *a, **k: started.append(a))
    assert k8s_pod.launch(job, 'j1', 20, detach=True, timeout=0) == 3
    err = capsys.readouterr().err
    assert err == ('k8s_pod: job j1 not started: pod trainer-1: y does not answer after 20 s (2 pods not ready: '
                   'trainer-1, trainer-2); nothing was started\n')
    assert started == []


def test_the_agent_starts_reports_and_stops_only_for_pod_0(job, monkeypatch, tmp_path):
    monkeypatch.setattr(k8s_pod, 'resolve', lambda name: ['10.0.0.5'] if name.startswith('trainer-0') else [])
    agent = k8s_pod.Agent(job, 'trainer-1')
    monkeypatch.setattr(agent, 'command', lambda job_id, rank: ['sh', '-c', 'echo rank %d; sleep 30' % rank])
    sock = serve(agent)
    port = job['agent_port']
    try:
        hello = _request('127.0.0.1', port, {'op': 'hello'})
        assert hello == {'ok': True, 'pod': 'trainer-1', 'ordinal': 1, 'slots': 1, 'running': []}
        assert agent.allowed('10.0.0.5') and not agent.allowed('10.0.0.9')
        assert _request('127.0.0.1', port, {'op': 'start', 'job_id': 'bad id'})['error'] == "bad job id 'bad id'"
        assert _request('127.0.0.1', port, {'op': 'start', 'job_id': 'j1', 'node_rank': 1})['state'] == 'running'
        refused = _request('127.0.0.1', port, {'op': 'start', 'job_id': 'j2', 'node_rank': 1})
        assert refused == {'ok': False, 'error': 'job j1 is still running on trainer-1'}
        time.sleep(0.3)
        status = _request('127.0.0.1', port, {'op': 'status', 'job_id': 'j1'})
        assert status['state'] == 'running' and status['tail'] == ['rank 1']
        stopped = _request('127.0.0.1', port, {'op': 'stop', 'job_id': 'j1'}, timeout=30)
        assert stopped['state'] == 'stopped' and stopped['exit_code'] == -15
        assert _request('127.0.0.1', port, {'op': 'status', 'job_id': 'j1'})['state'] == 'failed'
    finally:
        sock.close()
        for rec in agent.jobs.values():
            if rec['proc'].poll() is None:
                rec['proc'].kill()


@pytest.mark.parametrize('states,state,failed', [
    (['finished', 'finished', 'finished'], 'finished', None),
    (['running', 'failed', 'running'], 'failed', 'trainer-1'),
    (['running', 'running', 'unreachable'], 'failed', 'trainer-2'),
    (['absent', 'absent', 'unreachable'], 'absent', None),
    (['stopped', 'stopped', 'absent'], 'stopped', None),
])
def test_summary(job, states, state, failed):
    rows = [{'pod': 'trainer-%d' % i, 'state': s} for i, s in enumerate(states)]
    out = k8s_pod.summary(job, 'j', rows)
    assert (out['state'], out['failed_pod'], out['world_size']) == (state, failed, 4)


def test_the_launcher_line_is_deepspeed_without_ssh_with_the_node_rank(job):
    agent = k8s_pod.Agent(job, 'trainer-2')
    assert agent.command('j', 2) == ['deepspeed', '--no_ssh', '--hostfile', os.path.join(job['config_dir'], 'hostfile'),
                                     '--node_rank', '2', '--master_addr', 'trainer-0.trainer.ns.svc.cluster.local',
                                     '--master_port', '29500', 'train.py']
