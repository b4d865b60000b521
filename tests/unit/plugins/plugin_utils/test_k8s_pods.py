import json
import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import pods as k8s_pods

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'k8s')
NAMES = ['trainer-0', 'trainer-1', 'trainer-2']


def load(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return json.load(handle)


def test_crashloop_and_pending_pods_are_named_with_their_reason():
    rep = k8s_pods.report(load('pods_crashloop_pending.json'), load('statefulset_progressing.json')[0], NAMES)
    assert rep['state'] == 'failing'
    assert rep['not_ready'] == ['trainer-1', 'trainer-2'] and rep['failing'] == ['trainer-1', 'trainer-2']
    assert rep['ready_replicas'] == 1 and rep['replicas'] == 3
    assert rep['lines'][0] == 'trainer-0 Running ready node=gpu-node-07 restarts=0'
    assert rep['lines'][1].startswith('trainer-1 Running not-ready node=gpu-node-11 restarts=4 CrashLoopBackOff: '
                                      'back-off 1m20s restarting failed container=trainer')
    assert rep['lines'][2].startswith('trainer-2 Pending not-ready node=- restarts=0 Unschedulable: 0/12 nodes are '
                                      'available')
    assert rep['msg'].startswith('2 of 3 pods not ready; first: trainer-1 Running not-ready')


def test_all_ready():
    rep = k8s_pods.report(load('pods_ready.json'), None, NAMES)
    assert rep['state'] == 'ready' and rep['msg'] == 'all 3 pods ready' and rep['not_ready'] == []
    assert [r['node'] for r in rep['rows']] == ['gpu-node-07', 'gpu-node-11', 'gpu-node-12']


def test_a_pod_the_api_does_not_list_is_missing_and_an_extra_one_listed_last():
    pods = load('pods_ready.json')
    extra = json.loads(json.dumps(pods[2]))
    extra['metadata']['name'] = 'trainer-3'
    rep = k8s_pods.report(pods[:2] + [extra], None, NAMES)
    assert rep['state'] == 'progressing' and rep['not_ready'] == ['trainer-2']
    assert rep['rows'][2]['phase'] == 'Missing' and rep['rows'][3]['name'] == 'trainer-3'


def test_nothing_there_is_absent():
    assert k8s_pods.report([], None, NAMES)['state'] == 'absent'


@pytest.mark.parametrize('line,state,msg', [
    ('{"failed_pod": null, "job_id": "j1", "pods": [{"pod": "trainer-0", "state": "finished", "exit_code": 0}], '
     '"state": "finished", "unreachable": [], "world_size": 4}', 'finished', 'job j1 finished on 1 pods'),
    ('{"failed_pod": "trainer-1", "job_id": "j2", "pods": [{"pod": "trainer-0", "state": "running"}, '
     '{"pod": "trainer-1", "state": "failed", "exit_code": 1}], "state": "failed", "unreachable": [], "world_size": 4}',
     'failed', 'job j2 failed: pod trainer-1 failed (exit 1)'),
    ('{"failed_pod": "trainer-2", "job_id": "j4", "reason": "restarted: the container ended while its part ran", '
     '"pods": [{"pod": "trainer-2", "state": "failed"}], "state": "failed", "attempt": 1, "restarts": 1}',
     'failed', 'job j4 failed: pod trainer-2 restarted: the container ended while its part ran (attempt 2 of 2)'),
    ('{"failed_pod": null, "job_id": "j3", "pods": [{"pod": "trainer-0", "state": "absent"}, '
     '{"pod": "trainer-2", "state": "unreachable"}], "state": "absent", "unreachable": ["trainer-2"], "world_size": 4}',
     'absent', 'job j3 absent on 2 pods; unreachable: trainer-2'),
])
def test_job_report_reads_the_status_line(line, state, msg):
    rep = k8s_pods.job_report('Defaulted container "trainer"\n' + line + '\n')
    assert rep['state'] == state and rep['msg'] == msg


def test_job_report_without_a_status_line():
    with pytest.raises(ValueError, match='no status line'):
        k8s_pods.job_report('error: unable to upgrade connection: container not found ("trainer")')
