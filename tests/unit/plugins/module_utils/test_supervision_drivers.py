"""One story, two platforms: the SSH supervisor (roles/training/files/gpucluster_supervise.py, its reads and acts
through fake playbooks) and the pod agent (roles/k8s/files/k8s_pod.py, real agents on local sockets) run the
core's loop (plugins/module_utils/training/supervision.py) and tell the same fault with the same events.

The story: a rank of the second node is killed (SIGKILL) while the job trains; every node answers; the job is
stopped, checked, restarted on the same nodes as attempt 2 and finishes. What differs is said: the pod agent
reads no training step (the ranks' progress is the SSH read's), so it has no `training` event, and a pod's
names are its own."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, '..', '..', 'roles', 'training'))
sys.path.insert(0, os.path.join(HERE, '..', '..', 'roles', 'k8s'))

import test_k8s_pod_entrypoint as k8s_tests  # noqa: E402
import test_supervise as ssh_tests  # noqa: E402
from test_k8s_pod_entrypoint import job, reapers_end_with_their_test  # noqa: E402,F401  (pytest's fixtures)

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import supervision as core  # noqa: E402

SAME = ('event', 'attempt', 'seen', 'failure', 'counted', 'restarts_used')


def _ssh_story(tmp_path):
    running = {'result': {'state': 'running'}, 'progress': ssh_tests._progress(12)}
    statuses = [running, ssh_tests._failed('w1', 23),
                {'result': {'state': 'running'}, 'progress': ssh_tests._progress(25)},
                {'result': {'state': 'succeeded'}, 'progress': dict(ssh_tests._progress(40), state='finished')}]
    rc, _calls, events = ssh_tests._supervise(tmp_path, statuses, [ssh_tests._healthy()], restarts=1)
    assert rc == 0
    return events, ssh_tests.NODES


def _k8s_story(job, monkeypatch, tmp_path):
    k8s_tests.with_settings(job, tmp_path, restarts=1, peer_wait=5)

    def commands(rank, attempt):
        # the ranks log their steps as the training role's examples do (the pod agent reads them from the output)
        if attempt == 0:
            return ['sh', '-c', 'echo "step 12 loss 0.5"; sleep 1; kill -9 $$' if rank == 1
                    else 'echo "step 12 loss 0.5"; sleep 60']
        return ['sh', '-c', 'echo "step 25 loss 0.4"; sleep 2']
    _agents, socks = k8s_tests.cluster_of_agents(job, monkeypatch, commands)
    try:
        assert k8s_tests.pcluster.start_all(job, 'j1') == ''
        assert k8s_tests.net.request(job['pods'][0]['address'], 0, {'op': 'supervise', 'job_id': 'j1'})['ok']
        assert k8s_tests.wait_record(job, 'j1', ('finished', 'failed'), seconds=30)['state'] == 'finished'
        return k8s_tests.pjob.read_job_events(k8s_tests.pjob.STATE_ROOT, 'j1'), [p['name'] for p in job['pods']]
    finally:
        for sock in socks:
            sock.close()


def _told(events, nodes):
    """The events as the story tells them, names as the nodes' places (0: the head, pod 0)."""
    out = []
    for event in events:
        told = {key: event.get(key) for key in SAME if key in event}
        for key in ('nodes', 'left_out'):
            if key in event and event['event'] in ('fault', 'restart', 'checked'):
                told[key] = [nodes.index(n) for n in event[key]]
        out.append(told)
    return out


def test_a_killed_rank_is_the_same_story_over_ssh_and_on_kubernetes(tmp_path, job, monkeypatch):
    (tmp_path / 'ssh').mkdir()
    ssh, ssh_nodes = _ssh_story(tmp_path / 'ssh')
    pods, pod_names = _k8s_story(job, monkeypatch, tmp_path)
    assert [e['event'] for e in ssh] == ['supervising', 'fault', 'job_stopped', 'checked', 'restart', 'training',
                                         'done']
    ssh_told = _told(ssh, ssh_nodes)
    assert _told(pods, pod_names) == ssh_told
    fault = [e for e in ssh_told if e['event'] == 'fault'][0]
    assert fault == {'event': 'fault', 'attempt': 1, 'seen': 'failed', 'failure': 'signal', 'nodes': [1]}
    restart = [e for e in ssh_told if e['event'] == 'restart'][0]
    assert restart == {'event': 'restart', 'attempt': 2, 'counted': True, 'restarts_used': 1, 'nodes': [0, 1, 2],
                       'left_out': []}
    assert core.summarize(ssh)['restarts'] == core.summarize(pods)['restarts'] == 1
    assert core.summarize(ssh)['outcome'] == core.summarize(pods)['outcome'] == 'finished'
