import copy

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import k8s_cluster as kc

BASE = {'name': 'trainer', 'namespace': 'ml-team', 'image': 'registry.example.com/ml/ds:1',
        'replicas': 3, 'gpus_per_pod': 8, 'train': {'command': ['/shared/train.py']}}


def with_(**changes):
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def test_defaults_are_filled_in():
    c = kc.check(copy.deepcopy(BASE), 'k.yml')
    assert c['slots_per_pod'] == 8 and c['network']['mode'] == 'tcp' and c['network']['socket_ifname'] == 'eth0'
    assert c['storage'] == {'mode': 'rwx', 'storage_class': '', 'size': '100Gi', 'mount_path': '/shared', 'claim_name': ''}
    assert c['train']['master_port'] == 29500 and c['train']['peer_wait'] == 300 and c['shm_size'] == '16Gi'


def test_pods_have_service_dns_names_and_mixed_slots():
    c = kc.check(with_(gpus_per_pod=0, slots_per_pod=1, pod_slots={0: 2}), 'k.yml')
    assert kc.pods(c) == [
        {'name': 'trainer-0', 'ordinal': 0, 'address': 'trainer-0.trainer.ml-team.svc.cluster.local', 'slots': 2},
        {'name': 'trainer-1', 'ordinal': 1, 'address': 'trainer-1.trainer.ml-team.svc.cluster.local', 'slots': 1},
        {'name': 'trainer-2', 'ordinal': 2, 'address': 'trainer-2.trainer.ml-team.svc.cluster.local', 'slots': 1},
    ]


@pytest.mark.parametrize('changes,message', [
    ({'replicas': '3'}, "k.yml: replicas must be a whole number from 1 to 1024, got '3' (str)"),
    ({'replicas': 0}, 'k.yml: replicas must be from 1 to 1024, got 0'),
    ({'name': 'Trainer'}, "k.yml: name must be a DNS label (lower case letters, digits, \"-\"), got 'Trainer'"),
    ({'replica': 3}, 'k.yml: replica is not a field of a cluster file'),
    ({'slots_per_pod': 9}, 'k.yml: slots_per_pod is 9 but a pod gets 8 GPU(s) (gpus_per_pod)'),
    ({'pod_slots': {3: 1}}, 'k.yml: pod_slots.3 must be a pod ordinal from 0 to 2'),
    ({'network': {'mode': 'ib'}}, "k.yml: network.mode must be tcp or rdma, got 'ib'"),
    ({'network': {'mode': 'rdma', 'ib_hca': 'mlx5_0', 'attachment': 'rdma-net'}},
     'k.yml: network.rdma_resource is required when network.mode is rdma'),
    ({'network': {'mode': 'tcp', 'ib_hca': 'mlx5_0'}}, 'k.yml: network.ib_hca is set but network.mode is tcp'),
    ({'network': {'mode': 'tcp', 'sockt_ifname': 'eth1'}}, 'k.yml: network.sockt_ifname is not a field'),
    ({'storage': {'mode': 'per-pod', 'claim_name': 'shared'}}, 'k.yml: storage.claim_name names an existing'),
    ({'shm_size': '16GB'}, 'k.yml: shm_size must be a Kubernetes quantity such as "16Gi", got \'16GB\''),
    ({'openshift': 'yes'}, "k.yml: openshift must be true or false, got 'yes' (str)"),
    ({'tolerations': [{'key': 'gpu', 'effect': 'NoSchedul'}]}, "k.yml: tolerations[0].effect must be NoSchedule"),
    ({'train': {}}, 'k.yml: train.command is required'),
    ({'train': {'command': '/shared/train.py'}}, 'k.yml: train.command must be a non-empty list of strings'),
    ({'train': {'command': ['x'], 'agent_port': 29500}}, 'k.yml: train.agent_port must differ from train.master_port'),
    ({'train': {'command': ['x'], 'deepspeed_config': {'zero_optimization': {}}}},
     'k.yml: train.deepspeed_config has no batch settings'),
    ({'files': {'hostfile': 'my-hostfile'}}, 'k.yml: files.hostfile is a key the collection writes itself'),
    ({'labels': {'app.kubernetes.io/instance': 'x'}}, 'k.yml: labels.app.kubernetes.io/instance is set by the collection'),
])
def test_a_bad_field_is_refused_in_one_line_naming_file_and_field(changes, message):
    with pytest.raises(kc.ClusterFileError) as err:
        kc.check(with_(**changes), 'k.yml')
    assert str(err.value).startswith(message)
    assert '\n' not in str(err.value)


def test_missing_required_fields_and_non_mapping():
    with pytest.raises(kc.ClusterFileError, match='^k.yml: image is required$'):
        kc.check({'name': 'a', 'namespace': 'b'}, 'k.yml')
    with pytest.raises(kc.ClusterFileError, match=r"^k.yml: the file must be a mapping, got \['a'\] \(list\)"):
        kc.check(['a'], 'k.yml')
