import copy

import pytest

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import manifests as km
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import render as kr

RDMA = {'mode': 'rdma', 'rdma_resource': 'rdma/rdma_shared_device_a', 'ib_hca': ['mlx5_0', 'mlx5_1'],
        'attachment': 'rdma-net', 'attachment_config': {'cniVersion': '0.3.1', 'type': 'host-device', 'device': 'ib0'}}


def cluster(network='tcp', storage='rwx', openshift=False, **extra):
    data = {'name': 'trainer', 'namespace': 'ml-team', 'image': 'img:1', 'replicas': 3, 'gpus_per_pod': 8,
            'pod_slots': {2: 4}, 'network': RDMA if network == 'rdma' else {'mode': 'tcp'},
            'storage': {'mode': storage, 'storage_class': 'cephfs'}, 'openshift': openshift,
            'resources': {'cpu': '16', 'memory': '64Gi'}, 'train': {'command': ['/shared/train.py']}}
    data.update(extra)
    return kc.check(data, 'k.yml')


def render(c):
    return km.render(c, kr.environment(c), '# entrypoint\n')


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
    admin = km.admin_objects(c)
    assert km.problems(objs + admin, c) == []
    # the SCC and the grant of its use are the administrator's (present applies objs only)
    assert 'SecurityContextConstraints' not in kinds(objs)
    assert kinds(admin) == (['SecurityContextConstraints', 'Role', 'RoleBinding'] if openshift and network == 'rdma' else [])
    assert ('RoleBinding' in kinds(objs)) == (openshift and network == 'tcp')
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
    assert ctr['resources']['limits'] == {'nvidia.com/gpu': '8', 'rdma/rdma_shared_device_a': '1', 'cpu': '16',
                                          'memory': '64Gi'}
    assert ctr['resources']['requests'] == ctr['resources']['limits']  # Guaranteed QoS
    assert 'NCCL_IB_GID_INDEX' not in rdma  # NCCL chooses unless network.ib_gid_index is given
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
    objs = render(cluster(shm_size='64Gi', resources={'cpu': '16', 'memory': '80Gi'}))
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


def test_plain_kubernetes_pods_run_as_a_numeric_non_root_uid_guaranteed_and_spread():
    objs = render(cluster(priority_class='training-high'))
    pod = sts_of(objs)['spec']['template']['spec']
    assert pod['securityContext'] == {'runAsNonRoot': True, 'seccompProfile': {'type': 'RuntimeDefault'},
                                      'fsGroupChangePolicy': 'OnRootMismatch', 'runAsUser': 1000,
                                      'runAsGroup': 1000, 'fsGroup': 1000}
    assert pod['priorityClassName'] == 'training-high'
    term = pod['affinity']['podAntiAffinity']['preferredDuringSchedulingIgnoredDuringExecution'][0]
    assert term['podAffinityTerm']['topologyKey'] == 'kubernetes.io/hostname'
    assert term['podAffinityTerm']['labelSelector']['matchLabels']['app.kubernetes.io/instance'] == 'trainer'
    res = pod['containers'][0]['resources']
    assert res['requests'] == res['limits'] and res['limits']['memory'] == '64Gi'
    env = env_of(objs)
    assert env['HOME'] == km.HOME_DIR and {v['name']: v for v in pod['volumes']}['home'] == {'name': 'home', 'emptyDir': {}}
    fields = [e['valueFrom']['fieldRef']['fieldPath'] for e in pod['containers'][0]['env'] if 'valueFrom' in e]
    assert fields == ['metadata.name', 'metadata.namespace', 'status.podIP', 'spec.nodeName']
    required = sts_of(render(cluster(anti_affinity='required')))['spec']['template']['spec']['affinity']
    assert 'requiredDuringSchedulingIgnoredDuringExecution' in required['podAntiAffinity']
    assert 'affinity' not in sts_of(render(cluster(anti_affinity='none')))['spec']['template']['spec']


def test_the_image_user_and_openshift_leave_the_uid_to_the_image_or_the_scc():
    image = sts_of(render(cluster(security={'run_as_user': 'image', 'image_user': '1001'})))
    assert 'runAsUser' not in image['spec']['template']['spec']['securityContext']
    ocp = render(cluster('rdma', openshift=True))
    psc = sts_of(ocp)['spec']['template']['spec']['securityContext']
    assert not {'runAsUser', 'runAsGroup', 'fsGroup'} & set(psc) and psc['fsGroupChangePolicy'] == 'OnRootMismatch'
    scc = km.admin_objects(cluster('rdma', openshift=True))[0]
    assert scc['metadata']['name'] == 'ml-team-trainer-rdma' and 'namespace' not in scc['metadata']
    assert scc['requiredDropCapabilities'] == ['ALL'] and scc['allowedCapabilities'] == ['NET_BIND_SERVICE', 'IPC_LOCK']
    assert scc['runAsUser'] == {'type': 'MustRunAsRange'} and scc['allowPrivilegeEscalation'] is False
    other = km.admin_objects(cluster('rdma', openshift=True, namespace='nlp'))[0]
    assert other['metadata']['name'] != scc['metadata']['name']  # two namespaces, two SCCs


def test_a_pod_the_kubelet_would_refuse_is_named():
    def root(o):
        sts_of(o)['spec']['template']['spec']['securityContext']['runAsUser'] = 0
    assert any('runAsUser 0 with runAsNonRoot' in p for p in broken(root))

    def burstable(o):
        sts_of(o)['spec']['template']['spec']['containers'][0]['resources']['requests']['memory'] = '1Gi'
    assert any('not Guaranteed QoS' in p for p in broken(burstable))


def test_the_claims_group_reaches_the_pods_and_the_agent_knows_what_to_check():
    # NFS and CephFS ignore fsGroup on ReadWriteMany volumes: the group that owns the export is given
    # to the pods as a supplemental group, and the agent checks it can write the claim before a start
    c = cluster(security={'supplemental_groups': [5000]})
    pod = sts_of(render(c))['spec']['template']['spec']
    assert pod['securityContext']['supplementalGroups'] == [5000] and pod['securityContext']['fsGroup'] == 1000
    job = km.job_settings(c)
    # (the agent reads the groups it has from the kernel: the supplemental ones need no copy in job.json)
    assert (job['mount_path'], job['claim'], job['fs_group']) == ('/shared', 'trainer-data', 1000)
    assert 'supplemental_groups' not in job
    assert 'supplementalGroups' not in sts_of(render(cluster()))['spec']['template']['spec']['securityContext']
    assert km.job_settings(cluster(storage='per-pod'))['claim'] == '<per-pod volume>'
