import copy

import pytest

from ansible_collections.gpucluster.multinode.plugins.filter.nccl_env import nccl_environment
from ansible_collections.gpucluster.multinode.plugins.module_utils import k8s_cluster as kc
from ansible_collections.gpucluster.multinode.plugins.module_utils import k8s_manifests as km

RDMA = {'mode': 'rdma', 'rdma_resource': 'rdma/rdma_shared_device_a', 'ib_hca': ['mlx5_0', 'mlx5_1'],
        'attachment': 'rdma-net', 'attachment_config': {'cniVersion': '0.3.1', 'type': 'host-device', 'device': 'ib0'}}


def cluster(network='tcp', storage='rwx', openshift=False, **extra):
    data = {'name': 'trainer', 'namespace': 'ml-team', 'image': 'img:1', 'replicas': 3, 'gpus_per_pod': 8,
            'pod_slots': {2: 4}, 'network': RDMA if network == 'rdma' else {'mode': 'tcp'},
            'storage': {'mode': storage, 'storage_class': 'cephfs'}, 'openshift': openshift,
            'train': {'command': ['/shared/train.py']}}
    data.update(extra)
    return kc.check(data, 'k.yml')


def render(c):
    env = nccl_environment(c['network']['mode'], c['network']['socket_ifname'], ib_hca=c['network'].get('ib_hca', ''),
                           master_addr=kc.pod_dns(c, 0), master_port=c['train']['master_port'])
    return km.render(c, env, '# entrypoint\n')


def kinds(objs):
    return [o['kind'] for o in objs]


def sts_of(objs):
    return next(o for o in objs if o['kind'] == 'StatefulSet')


def env_of(objs):
    return {e['name']: e.get('value') for e in sts_of(objs)['spec']['template']['spec']['containers'][0]['env']}


@pytest.mark.parametrize('network', ['tcp', 'rdma'])
@pytest.mark.parametrize('storage', ['rwx', 'per-pod'])
@pytest.mark.parametrize('openshift', [False, True])
def test_every_variant_renders_consistent_objects(network, storage, openshift):
    c = cluster(network, storage, openshift)
    objs = render(c)
    assert km.problems(objs, c) == []
    assert ('SecurityContextConstraints' in kinds(objs)) == (openshift and network == 'rdma')
    assert ('RoleBinding' in kinds(objs)) == openshift
    assert ('NetworkAttachmentDefinition' in kinds(objs)) == (network == 'rdma')
    assert ('PersistentVolumeClaim' in kinds(objs)) == (storage == 'rwx')
    assert ('volumeClaimTemplates' in sts_of(objs)['spec']) == (storage == 'per-pod')
    assert kinds(objs)[-2:] == ['Service', 'StatefulSet'] and kinds(objs)[0] == 'ServiceAccount'


def test_the_configmap_hostfile_lists_the_pods_with_their_slots():
    objs = render(cluster())
    cm = next(o for o in objs if o['kind'] == 'ConfigMap')
    assert cm['data']['hostfile'] == ('trainer-0.trainer.ml-team.svc.cluster.local slots=8\n'
                                      'trainer-1.trainer.ml-team.svc.cluster.local slots=8\n'
                                      'trainer-2.trainer.ml-team.svc.cluster.local slots=4\n')
    assert cm['data'][kc.ENTRYPOINT] == '# entrypoint\n'


def test_tcp_and_rdma_environment_follow_the_nccl_env_rules():
    tcp = env_of(render(cluster('tcp')))
    assert tcp['NCCL_SOCKET_IFNAME'] == 'eth0' and tcp['NCCL_IB_DISABLE'] == '1' and 'NCCL_IB_HCA' not in tcp
    assert tcp['MASTER_ADDR'] == 'trainer-0.trainer.ml-team.svc.cluster.local'
    rdma_objs = render(cluster('rdma'))
    rdma = env_of(rdma_objs)
    assert rdma['NCCL_SOCKET_IFNAME'] == 'net1' and rdma['NCCL_IB_HCA'] == 'mlx5_0,mlx5_1' and rdma['NCCL_IB_DISABLE'] == '0'
    ctr = sts_of(rdma_objs)['spec']['template']['spec']['containers'][0]
    assert ctr['securityContext']['capabilities'] == {'drop': ['ALL'], 'add': ['IPC_LOCK']}
    assert ctr['resources']['limits'] == {'nvidia.com/gpu': '8', 'rdma/rdma_shared_device_a': '1'}
    assert sts_of(rdma_objs)['spec']['template']['metadata']['annotations'] == {'k8s.v1.cni.cncf.io/networks': 'rdma-net'}


def test_openshift_tcp_stays_within_restricted_v2():
    objs = render(cluster('tcp', openshift=True))
    pod = sts_of(objs)['spec']['template']['spec']
    sc = pod['containers'][0]['securityContext']
    assert sc == {'allowPrivilegeEscalation': False, 'capabilities': {'drop': ['ALL']}, 'runAsNonRoot': True,
                  'seccompProfile': {'type': 'RuntimeDefault'}}
    assert 'runAsUser' not in pod['securityContext']
    role = next(o for o in objs if o['kind'] == 'Role')
    assert role['rules'][0]['resourceNames'] == ['restricted-v2']


def test_headless_service_and_shm():
    objs = render(cluster(shm_size='64Gi'))
    svc = next(o for o in objs if o['kind'] == 'Service')
    assert svc['spec']['clusterIP'] == 'None' and svc['spec']['publishNotReadyAddresses'] is True
    vols = {v['name']: v for v in sts_of(objs)['spec']['template']['spec']['volumes']}
    assert vols['dshm'] == {'name': 'dshm', 'emptyDir': {'medium': 'Memory', 'sizeLimit': '64Gi'}}


def broken(mutate, network='tcp', openshift=False):
    c = cluster(network, openshift=openshift)
    objs = copy.deepcopy(render(c))
    mutate(objs)
    return km.problems(objs, c)


@pytest.mark.parametrize('mutate,expected', [
    (lambda o: sts_of(o)['spec']['selector']['matchLabels'].update({'app.kubernetes.io/instance': 'x'}),
     'spec.selector.matchLabels'),
    (lambda o: sts_of(o)['spec'].update(serviceName='other'), "serviceName 'other' is not the headless Service"),
    (lambda o: sts_of(o)['spec'].update(podManagementPolicy='OrderedReady'), 'podManagementPolicy must be Parallel'),
    (lambda o: next(x for x in o if x['kind'] == 'Service')['spec'].pop('publishNotReadyAddresses'),
     'publishNotReadyAddresses must be true'),
    (lambda o: next(x for x in o if x['kind'] == 'ConfigMap')['data'].update(
        hostfile='trainer-0.trainer.ml-team.svc.cluster.local slots=8\n'), 'the hostfile has 1 line(s) for 3 replicas'),
    (lambda o: next(x for x in o if x['kind'] == 'ConfigMap')['data'].update(
        hostfile='trainer-0.trainer.ml-team.svc.cluster.local slots=8\ntrainer-1.trainer.ml-team.svc.cluster.local slots=8\n'
                 'trainer-2.trainer.ml-team.svc.cluster.local slots=8\n'), 'expected trainer-2.trainer.ml-team.svc.cluster.local slots=4'),
    (lambda o: sts_of(o)['spec']['template']['spec']['volumes'][1].update(emptyDir={}), '/dev/shm must be a memory emptyDir'),
])
def test_a_broken_object_is_named(mutate, expected):
    problems = broken(mutate)
    assert any(expected in p for p in problems), problems


def test_rdma_without_ipc_lock_and_openshift_root_are_named():
    def drop_ipc(o):
        sts_of(o)['spec']['template']['spec']['containers'][0]['securityContext']['capabilities'].pop('add')
    assert any('without the IPC_LOCK capability' in p for p in broken(drop_ipc, 'rdma'))

    def run_as_root(o):
        sts_of(o)['spec']['template']['spec']['securityContext']['runAsUser'] = 0
    assert any('runAsUser is set' in p for p in broken(run_as_root, openshift=True))
