import copy

import pytest

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc

BASE = {'name': 'trainer', 'namespace': 'ml-team', 'image': 'registry.example.com/ml/ds:1',
        'replicas': 3, 'gpus_per_pod': 8, 'resources': {'cpu': '16', 'memory': '64Gi'},
        'train': {'command': ['/shared/train.py']}}


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
    ({'name': 'Trainer'}, 'k.yml: name must be a DNS-1035 label (lower case letters, digits and "-", a letter first: '
                          "it names a Service), got 'Trainer'"),
    ({'name': '2026-nlp'}, 'k.yml: name must be a DNS-1035 label'),
    ({'namespace': 'n' * 64}, 'k.yml: namespace must be at most 63 characters (a DNS-1123 label), got 64'),
    ({'security': {'supplemental_groups': 5000}}, 'k.yml: security.supplemental_groups must be a list of group ids, '
                                                  'got 5000 (int)'),
    ({'security': {'supplemental_groups': [5000, 0]}}, 'k.yml: security.supplemental_groups[1] must be from 1 to'),
    ({'train': {'command': ['/x.py'], 'failure_policy': {'on': 'exit'}}},
     'k.yml: train.failure_policy must be a list of rules, got'),
    ({'train': {'command': ['/x.py'], 'failure_policy': [{'on': ['oom'], 'action': 'fail'}]}},
     "k.yml: train.failure_policy[0].on must be exit or signal or unreachable or restarted or stalled, got 'oom'"),
    ({'train': {'command': ['/x.py'], 'failure_policy': [{'on': ['signal'], 'exit_codes': [9], 'action': 'fail'}]}},
     'k.yml: train.failure_policy[0].exit_codes apply to exit failures only: set on: [exit]'),
    ({'train': {'command': ['/x.py'], 'failure_policy': [{'on': ['exit'], 'action': 'retry'}]}},
     "k.yml: train.failure_policy[0].action must be restart or restart_uncounted or fail, got 'retry'"),
    ({'train': {'command': ['/x.py'], 'failure_policy': [{'on': ['exit']}]}},
     'k.yml: train.failure_policy[0] needs on (exit, signal, unreachable, restarted, stalled) and action'),
    ({'train': {'command': ['/x.py'], 'lost_pod_wait': 1}}, 'k.yml: train.lost_pod_wait must be from 5 to 86400, got 1'),
    # three replicas: two may wait as spares, then the job runs on one pod; with one spare it runs on two
    ({'train': {'command': ['/x.py'], 'spares': 3}}, 'k.yml: train.spares must be from 0 to 2, got 3'),
    ({'train': {'command': ['/x.py'], 'spares': 1, 'min_pods': 3}}, 'k.yml: train.min_pods must be from 1 to 2, got 3'),
    ({'train': {'command': ['/x.py'], 'unreachable_after': 2}}, 'k.yml: train.unreachable_after must be from 5 to 3600'),
    # one refusal gives the real bound of a name: 52, whether 64 or 60 characters were given
    ({'name': 'a' * 64}, 'k.yml: name must be at most 52 characters (a DNS-1035 label; the StatefulSet labels its '
                         'pods controller-revision-hash=<name>-<10-character hash>, and a label value is at most 63), '
                         'got 64'),
    ({'name': 'a' * 60}, 'k.yml: name must be at most 52 characters (a DNS-1035 label; the StatefulSet'),
    ({'namespace': 'ML-team'}, "k.yml: namespace must be a DNS-1123 label (lower case letters, digits and \"-\", a "
                               "letter or digit at both ends), got 'ML-team'"),
    ({'labels': {'team': 'NLP team!'}}, "k.yml: labels.team must be a label value: empty or at most 63 letters, digits, "
                                        "\"-\", \"_\" or \".\" (a letter or digit at both ends), got 'NLP team!'"),
    ({'labels': {'team': 'x' * 64}}, 'k.yml: labels.team must be a label value'),
    ({'labels': {'Example.com/team': 'nlp'}}, "k.yml: labels.Example.com/team has the prefix 'Example.com', which must "
                                              'be a DNS-1123 subdomain'),
    ({'labels': {'example.com/' + 'k' * 64: 'nlp'}}, 'k.yml: labels.example.com/kkkk'),
    ({'node_selector': {'nvidia.com/gpu.product': 'H100 80GB'}},
     "k.yml: node_selector.nvidia.com/gpu.product must be a label value: empty or at most 63"),
    ({'node_selector': {'-gpu': 'yes'}}, 'k.yml: node_selector.-gpu must be a label key'),
    ({'tolerations': [{'key': 'gpu type', 'operator': 'Exists'}]}, "k.yml: tolerations[0].key must be a label key"),
    ({'storage': {'storage_class': 'CephFS'}}, "k.yml: storage.storage_class must be a DNS-1123 subdomain"),
    ({'priority_class': 'High'}, 'k.yml: priority_class must be a DNS-1123 subdomain'),
    ({'image_pull_secrets': ['Reg']}, 'k.yml: image_pull_secrets[0] must be a DNS-1123 subdomain'),
    ({'network': {'mode': 'rdma', 'rdma_resource': 'rdma/x', 'ib_hca': 'mlx5_0,^mlx5_1', 'attachment': 'a'}},
     'k.yml: network.ib_hca must be NCCL_IB_HCA: HCA names with optional :port'),
    ({'network': {'mode': 'rdma', 'rdma_resource': 'rdma/x', 'ib_hca': ['=mlx5_0', '=mlx5_1'], 'attachment': 'a'}},
     "k.yml: network.ib_hca[1] must be an HCA name with an optional :port such as \"mlx5_1:1\" (\"^\" and \"=\" go "
     "before the first one only), got '=mlx5_1'"),
    ({'network': {'mode': 'rdma', 'rdma_resource': 'rdma/x', 'ib_hca': 'mlx5_0:x', 'attachment': 'a'}},
     'k.yml: network.ib_hca must be NCCL_IB_HCA'),
    ({'network': {'mode': 'rdma', 'rdma_resource': 'rdma/x', 'ib_hca': 'mlx5_0', 'attachment': 'Net/a'}},
     'k.yml: network.attachment must be a DNS-1123 label'),
    ({'resources': {'cpu': '8'}}, 'k.yml: resources.memory is required: the pods get requests = limits (Guaranteed QoS'),
    ({'resources': {'cpu': '8', 'memory': '16Gi'}},
     'k.yml: resources.memory is 16Gi but /dev/shm alone may hold shm_size 16Gi: a memory emptyDir is counted'),
    ({'resources': {'qos': 'BestEffort', 'cpu': '8'}}, 'k.yml: resources.cpu is set but resources.qos is BestEffort'),
    ({'security': {'run_as_user': 0}}, 'k.yml: security.run_as_user is 0 (root): the pods run with runAsNonRoot'),
    ({'security': {'run_as_user': 'image'}}, 'k.yml: security.image_user is required with run_as_user: image'),
    ({'security': {'run_as_user': 'image', 'image_user': ''}},
     "k.yml: security.image_user '': the kubelet refuses the pod (container has runAsNonRoot and image will run as root)"),
    ({'security': {'run_as_user': 'image', 'image_user': 'root'}},
     "k.yml: security.image_user 'root': the kubelet refuses the pod (container has runAsNonRoot and image has "
     'non-numeric user (root), cannot verify user is non-root)'),
    ({'security': {'run_as_user': 'image', 'image_user': 'trainer:trainer'}},
     "k.yml: security.image_user 'trainer:trainer': the kubelet refuses the pod (container has runAsNonRoot and "
     'image has non-numeric user (trainer)'),
    ({'security': {'run_as_user': 'image', 'image_user': '0:0'}}, "k.yml: security.image_user '0:0': the kubelet refuses"),
    ({'openshift': True, 'security': {'run_as_user': 1000}},
     'k.yml: security.run_as_user is set but openshift is true: restricted-v2 assigns the uid'),
    ({'affinity': {'nodeAffinity': {}}, 'anti_affinity': 'required'}, 'k.yml: anti_affinity is set together with affinity'),
    ({'train': {'command': ['x'], 'resume_args': ['--resume-from', '/c']}},
     'k.yml: train.resume_args are added when the job is restarted; they need train.restarts 1 or more'),
    ({'train': {'command': ['x'], 'restarts': -1}}, 'k.yml: train.restarts must be from 0 to 100, got -1'),
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
    ({'train': {'command': ['x'], 'stall_seconds': '10m'}}, 'k.yml: train.stall_seconds must be a whole number'),
    ({'train': {'command': ['x'], 'progress_regex': 'step (\\d+'}},
     'k.yml: train.progress_regex is not a regular expression (missing ), unterminated subpattern'),
    ({'files': {'hostfile': 'my-hostfile'}}, 'k.yml: files.hostfile is a key the collection writes itself'),
    ({'files': {'pod_driver.py': 'mine.py'}}, 'k.yml: files.pod_driver.py is a key the collection writes itself'),
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


def test_what_the_api_server_accepts_is_accepted():
    c = kc.check(with_(namespace='2026-nlp', labels={'team': 'nlp', 'example.com/cost-centre': 'A_1.b', 'empty': ''},
                       node_selector={'nvidia.com/gpu.product': 'NVIDIA-H100-80GB-HBM3'},
                       priority_class='training-high', network={
                           'mode': 'rdma', 'rdma_resource': 'rdma/x', 'ib_hca': '^=mlx5_1:1,mlx5_2', 'attachment': 'net/rdma'}),
                 'k.yml')
    assert c['namespace'] == '2026-nlp' and c['network']['ib_hca'] == '^=mlx5_1:1,mlx5_2'
    assert c['network']['ib_gid_index'] is None
    assert kc.check(with_(namespace='n' * 63), 'k.yml')['namespace'] == 'n' * 63
    hca = with_(network={'mode': 'rdma', 'rdma_resource': 'rdma/x', 'ib_hca': ['=mlx5_0:1', 'mlx5_1:1'],
                         'attachment': 'a', 'ib_gid_index': 3})
    assert kc.check(hca, 'k.yml')['network']['ib_hca'] == '=mlx5_0:1,mlx5_1:1'
    assert kc.check(hca, 'k.yml')['network']['ib_gid_index'] == 3


def test_the_failure_policy_is_read_in_order_with_its_defaults():
    train = kc.check(with_(train={'command': ['/x.py'], 'restarts': 2, 'failure_policy': [
        {'on': ['exit'], 'exit_codes': [3], 'action': 'fail'}, {'on': 'signal', 'action': 'restart_uncounted'}]}),
        'k.yml')['train']
    assert train['failure_policy'] == [{'on': ['exit'], 'exit_codes': [3], 'action': 'fail'},
                                       {'on': ['signal'], 'exit_codes': [], 'action': 'restart_uncounted'}]
    assert (train['lost_pod_wait'], train['unreachable_after'], train['spares'], train['min_pods']) == (60, 30, 0, 3)
    plain = kc.check(with_(), 'k.yml')['train']
    assert plain['failure_policy'] == [] and plain['restarts'] == 0
    # resume arguments need a restart: counted, or one the policy allows uncounted
    kc.check(with_(train={'command': ['/x.py'], 'resume_args': ['--resume'],
                          'failure_policy': [{'on': ['signal'], 'action': 'restart_uncounted'}]}), 'k.yml')


def test_security_defaults_plain_kubernetes_and_openshift():
    plain = kc.check(with_(), 'k.yml')['security']
    assert plain == {'run_as_user': 1000, 'run_as_group': 1000, 'fs_group': 1000, 'image_user': None,
                     'supplemental_groups': []}
    image = kc.check(with_(security={'run_as_user': 'image', 'image_user': '1001:1001'}), 'k.yml')['security']
    assert image == {'run_as_user': None, 'run_as_group': 1001, 'fs_group': 1001, 'image_user': '1001:1001',
                     'supplemental_groups': []}
    ocp = kc.check(with_(openshift=True, security={'supplemental_groups': [5000]}), 'k.yml')['security']
    assert ocp == {'run_as_user': None, 'run_as_group': None, 'fs_group': None, 'image_user': None,
                   'supplemental_groups': [5000]}
    assert kc.check(with_(resources={'qos': 'BestEffort'}), 'k.yml')['resources'] == {'qos': 'BestEffort'}


def test_a_failure_rule_written_with_a_bare_on_key_is_read_as_yaml_1_1_reads_it():
    # `- {on: [exit], exit_codes: [3], action: fail}` as the README writes it: PyYAML reads the key as True
    import yaml
    policy = yaml.safe_load('- {on: [exit], exit_codes: [3], action: fail}')
    assert True in policy[0]
    train = kc.check(with_(train={'command': ['/x.py'], 'restarts': 1, 'failure_policy': policy}), 'k.yml')['train']
    assert train['failure_policy'] == [{'on': ['exit'], 'exit_codes': [3], 'action': 'fail'}]
