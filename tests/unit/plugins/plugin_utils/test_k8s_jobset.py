"""workload: jobset: the same cluster file rendered as a JobSet (jobset.x-k8s.io/v1alpha2), checked offline
against the JobSet CRD's schema shipped in roles/k8s/files/schemas and its Job template against Kubernetes'
strict batch/v1 schemas; the failure policy said as podFailurePolicy and failurePolicy rules."""
import copy
import os

import pytest
import yaml

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import manifests as km
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import render as kr

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
EXAMPLE_TCP = os.path.join(ROOT, 'inventories', 'example-k8s', 'k8s-cluster-tcp.yml')
SCHEMAS = os.path.join(ROOT, 'roles', 'k8s', 'files', 'schemas')
pytest.importorskip('kubernetes_validate')


def as_jobset(tmp_path, **train):
    with open(EXAMPLE_TCP) as handle:
        data = yaml.safe_load(handle)
    data['workload'] = 'jobset'
    data['train'].update(train)
    data['files'] = {k: os.path.join(ROOT, 'inventories', 'example-k8s', v) for k, v in data['files'].items()}
    path = tmp_path / 'k8s-cluster.yml'
    path.write_text(yaml.safe_dump(data))
    c = kr.load_cluster_file(str(path))
    objs = km.render(c, kr.environment(c), kr.read_text(os.path.join(kr.role_files(), kc.ENTRYPOINT), 'entrypoint'),
                     kr.config_files(c, str(path)))
    return c, objs


def test_the_example_as_a_jobset_passes_the_crd_schema_and_both_kubernetes_versions(tmp_path):
    c, objs = as_jobset(tmp_path, restarts=2, failure_policy=[{'on': ['unreachable', 'restarted'],
                                                              'action': 'restart_uncounted'}])
    report = kr.check_objects(objs, c, kr.DEFAULT_VERSIONS, SCHEMAS)
    assert report['crd_schemas'] == ['jobset-jobset.x-k8s.io-v1alpha2.json']
    assert [o['kind'] for o in objs] == ['ServiceAccount', 'NetworkPolicy', 'ConfigMap', 'PersistentVolumeClaim', 'JobSet']
    js = objs[-1]
    assert js['spec']['failurePolicy'] == {
        'maxRestarts': 2, 'restartStrategy': 'BlockingRecreate',
        'rules': [{'name': 'trainFailurePolicy', 'action': 'RestartJobSetAndIgnoreMaxRestarts',
                   'onJobFailureReasons': ['PodFailurePolicy']}]}
    assert js['spec']['network'] == {'enableDNSHostnames': True, 'subdomain': 'tiny', 'publishNotReadyAddresses': True}
    job = js['spec']['replicatedJobs'][0]['template']['spec']
    assert (job['parallelism'], job['completions'], job['completionMode'], job['backoffLimit']) == (2, 2, 'Indexed', 0)
    assert job['podFailurePolicy'] == {'rules': [{'action': 'FailJob', 'onPodConditions': [
        {'type': 'DisruptionTarget', 'status': 'True'}]}]}
    pod = job['template']['spec']
    assert pod['restartPolicy'] == 'Never' and pod['containers'][0]['command'][-1] == 'run'
    fields = {e['name']: e['valueFrom']['fieldRef']['fieldPath'] for e in pod['containers'][0]['env'] if 'valueFrom' in e}
    assert fields['GPUCLUSTER_NODE_RANK'] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert fields['GPUCLUSTER_JOB_ATTEMPT'] == "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"
    hostfile = next(o for o in objs if o['kind'] == 'ConfigMap')['data']['hostfile']
    assert 'tiny-node-0-0.tiny.ml-team.svc.cluster.local slots=4' in hostfile
    assert 'tiny-node-0-1.tiny.ml-team.svc.cluster.local slots=4' in hostfile


def test_exit_codes_and_signals_become_the_jobs_pod_failure_policy(tmp_path):
    c, objs = as_jobset(tmp_path, restarts=1, failure_policy=[{'on': ['exit'], 'exit_codes': [3], 'action': 'fail'},
                                                              {'on': ['signal'], 'action': 'fail'}])
    kr.check_objects(objs, c, kr.DEFAULT_VERSIONS, SCHEMAS)
    js = objs[-1]
    rules = js['spec']['replicatedJobs'][0]['template']['spec']['podFailurePolicy']['rules']
    assert rules[0] == {'action': 'FailJob', 'onExitCodes': {'containerName': 'trainer', 'operator': 'In', 'values': [3]}}
    assert 137 in rules[1]['onExitCodes']['values'] and 247 in rules[1]['onExitCodes']['values']
    assert js['spec']['failurePolicy']['rules'][0]['action'] == 'FailJobSet'


@pytest.mark.parametrize('train,expected', [
    ({'failure_policy': [{'on': ['exit'], 'exit_codes': [3], 'action': 'fail'},
                         {'on': ['restarted'], 'action': 'restart_uncounted'}]},
     'train.failure_policy has actions fail, restart_uncounted: a JobSet sees every podFailurePolicy failure as reason '
     'PodFailurePolicy and cannot tell them apart'),
    ({'failure_policy': [{'on': ['signal', 'restarted'], 'action': 'fail'}]},
     'train.failure_policy[0].on mixes exit codes and pod conditions'),
    ({'failure_policy': [{'on': ['stalled'], 'action': 'restart_uncounted'}]},
     "train.failure_policy[0].on names stalled: a JobSet's pods run their ranks with no agent"),
])
def test_what_a_jobset_cannot_say_is_refused_naming_the_field(tmp_path, train, expected):
    with pytest.raises(kc.ClusterFileError) as err:
        as_jobset(tmp_path, **train)
    assert expected in str(err.value)


def test_a_spare_or_a_smaller_job_needs_the_statefulset(tmp_path):
    data = {'name': 'tiny', 'namespace': 'ml', 'image': 'x', 'replicas': 3, 'workload': 'jobset',
            'resources': {'cpu': '1', 'memory': '1Gi'}, 'shm_size': '64Mi', 'train': {'command': ['/x.py'], 'spares': 1}}
    with pytest.raises(kc.ClusterFileError) as err:
        kc.check(copy.deepcopy(data), 'k.yml')
    assert str(err.value) == ('k.yml: train.spares needs workload: statefulset (a JobSet recreates every pod at a '
                              'restart: no pod waits as a spare)')
    data['train'] = {'command': ['/x.py'], 'min_pods': 2}
    with pytest.raises(kc.ClusterFileError, match='train.min_pods needs workload: statefulset'):
        kc.check(copy.deepcopy(data), 'k.yml')
    data['train'] = {'command': ['/x.py']}
    data['storage'] = {'mode': 'per-pod'}
    with pytest.raises(kc.ClusterFileError, match='storage.mode must be rwx with workload: jobset'):
        kc.check(copy.deepcopy(data), 'k.yml')


@pytest.mark.parametrize('mutate,expected', [
    (lambda js: js['spec']['failurePolicy'].update(restartStrategy='RecreateAll'),
     "JobSet tiny: spec.failurePolicy.restartStrategy: 'RecreateAll' is not one of"),
    (lambda js: js['spec']['failurePolicy']['rules'][0].update(action='Restart'),
     "JobSet tiny: spec.failurePolicy.rules.0.action: 'Restart' is not one of"),
    (lambda js: js['spec'].update(replicatedJob=[]), "JobSet tiny: spec: Additional properties are not allowed"),
    (lambda js: js['spec']['replicatedJobs'][0]['template']['spec'].update(completionMod='Indexed'),
     'JobSet tiny: spec.replicatedJobs.0.template: Job node: Kubernetes 1.30.0:'),
    (lambda js: js['spec']['replicatedJobs'][0]['template']['spec'].update(backoffLimit=3),
     'JobSet tiny: backoffLimit must be 0'),
])
def test_a_broken_jobset_is_refused_with_the_object_and_field(tmp_path, mutate, expected):
    c, objs = as_jobset(tmp_path, restarts=1, failure_policy=[{'on': ['exit'], 'exit_codes': [3], 'action': 'fail'}])
    mutate(objs[-1])
    with pytest.raises(kr.RenderError) as err:
        kr.check_objects(objs, c, kr.DEFAULT_VERSIONS, SCHEMAS)
    assert expected in str(err.value)
