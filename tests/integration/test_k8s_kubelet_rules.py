"""The rendered pod spec run by the kubelet's rules (molecule/k8s/kubelet.py) on two CPU pods from the
lab's node image (python3, no torch): the kubelet refuses root and non-numeric images under
runAsNonRoot, runs the pod as its numeric uid with fsGroup, projects the ConfigMap read-only, gives
the downward API, /dev/shm and the memory limit, and starts a container whose PID 1 died again; the
agent of that pod then reports its part failed (restarted) and pod 0 ends the job on every pod,
naming it. The job's launcher here is a shell script from the ConfigMap that sleeps (the node image
has no deepspeed); the k8s scenario runs the real one. Network: k8s-rules-net, 10.213.127.0/24
(containers k8s-rules-rules-0 and -1; GPUCLUSTER_K8S_RULES_NAME and _SUBNET change them)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import time

import pytest

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.nccl_env import nccl_environment
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import manifests as km

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location('kubelet', os.path.join(ROOT, 'molecule', 'k8s', 'kubelet.py'))
kubelet = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kubelet)

# GPUCLUSTER_K8S_RULES_NAME and GPUCLUSTER_K8S_RULES_SUBNET let two runs on one machine apart
NAME = os.environ.get('GPUCLUSTER_K8S_RULES_NAME', 'k8s-rules')
SUBNET = os.environ.get('GPUCLUSTER_K8S_RULES_SUBNET', '10.213.127.0/24')
NET, PREFIX = NAME + '-net', NAME + '-'
IPS = [SUBNET.rsplit('.', 1)[0] + '.10', SUBNET.rsplit('.', 1)[0] + '.11']
LAUNCHER = '#!/bin/sh\n# stands for deepspeed --no_ssh ... in an image without it: prints, then sleeps\necho "part $5 of $GPUCLUSTER_JOB_ID"\nexec sleep 300\n'


def node_image():
    path = os.path.join(ROOT, '.lab', 'node-image')
    image = os.environ.get('GPUCLUSTER_NODE_IMAGE') or (open(path).read().strip() if os.path.exists(path) else '')
    if not shutil.which('podman') or not image or kubelet.podman('image', 'exists', image, check=False).returncode:
        pytest.skip('needs podman and the lab node image (ansible-playbook lab/lab.yml -e lab_state=image)')
    return image


def objects(image, **extra):
    data = {'name': 'rules', 'namespace': 'ns', 'image': image, 'replicas': 2, 'gpus_per_pod': 0,
            'shm_size': '64Mi', 'resources': {'cpu': '1', 'memory': '256Mi'}, 'network_policy': False,
            'storage': {'size': '1Gi'},
            'train': {'command': ['/etc/gpucluster/job.json'], 'deepspeed': '/etc/gpucluster/launcher.sh',
                      'peer_wait': 20}}
    data.update(extra)
    cluster = kc.check(data, 'rules.yml')
    env = nccl_environment('tcp', 'eth0', master_addr=kc.pod_dns(cluster, 0), master_port=29500)
    with open(os.path.join(ROOT, 'roles', 'k8s', 'files', 'k8s_pod.py')) as handle:
        entry = handle.read()
    return km.render(cluster, env, entry, {'launcher.sh': LAUNCHER})


def sh(pod, *cmd, check=True):
    proc = kubelet.podman('exec', PREFIX + pod, *cmd, check=False)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def net():
    if kubelet.podman('network', 'exists', NET, check=False).returncode:
        kubelet.podman('network', 'create', '--subnet', SUBNET, NET)
    yield NET
    for i in range(2):
        kubelet.podman('rm', '-f', '-t', '0', PREFIX + 'rules-%d' % i, check=False)
    kubelet.podman('volume', 'rm', '-f', PREFIX + 'rules-data', check=False)
    kubelet.podman('network', 'rm', '-f', NET, check=False)


def start(objs, tmp_path, ordinal, extra=()):
    path = tmp_path / 'objects.json'
    path.write_text(json.dumps(objs))
    hosts = ['rules-%d.rules.ns.svc.cluster.local:%s' % (i, ip) for i, ip in enumerate(IPS)]
    return subprocess.run(['python3', os.path.join(ROOT, 'molecule', 'k8s', 'kubelet.py'), 'run', str(path),
                           str(ordinal), '--prefix', PREFIX, '--network', NET, '--ip', IPS[ordinal],
                           '--work', str(tmp_path / 'pods')] + [a for h in hosts for a in ('--add-host', h)]
                          + list(extra), capture_output=True, text=True, check=False)


@pytest.mark.integration
def test_the_kubelet_refuses_root_and_non_numeric_images_under_run_as_non_root(tmp_path, net):
    image = node_image()  # USER unset: root
    objs = objects(image, security={'run_as_user': 'image', 'image_user': '1000'})  # the file claims 1000
    refused = start(objs, tmp_path, 0)
    assert refused.returncode == 2
    assert refused.stderr.strip() == ('rules-0: CreateContainerConfigError: Error: container has runAsNonRoot and '
                                      'image will run as root')
    named = tmp_path / 'named'
    named.mkdir()
    (named / 'Containerfile').write_text('FROM %s\nUSER nobody\n' % image)
    kubelet.podman('build', '-q', '-t', 'localhost/%s-named:1' % NAME, str(named))
    try:
        refused = start(objects('localhost/%s-named:1' % NAME, security={'run_as_user': 'image', 'image_user': '1000'}),
                        tmp_path, 0)
        assert refused.stderr.strip().endswith('container has runAsNonRoot and image has non-numeric user (nobody), '
                                               'cannot verify user is non-root')
    finally:
        kubelet.podman('rmi', '-f', 'localhost/%s-named:1' % NAME, check=False)
    assert kubelet.podman('container', 'exists', PREFIX + 'rules-0', check=False).returncode == 1


@pytest.mark.integration
def test_a_pod_runs_by_the_kubelet_rules_and_a_restarted_one_ends_the_job(tmp_path, net):
    image = node_image()
    objs = objects(image)  # plain Kubernetes: runAsUser/runAsGroup/fsGroup 1000
    for i in range(2):
        started = start(objs, tmp_path, i)
        assert started.returncode == 0, started.stderr
    for i in range(2):
        for _ in range(30):
            if sh('rules-%d' % i, 'python3', '-c', 'import socket; socket.create_connection(("127.0.0.1", 29400), 2)',
                  check=False).returncode == 0:
                break
            time.sleep(1)
    probe = sh('rules-0', 'sh', '-c', 'id -u; id -G; readlink /etc/gpucluster/job.json; stat -c %a '
               '/etc/gpucluster/..data/k8s_pod.py; touch /etc/gpucluster/x 2>&1; echo "$GPUCLUSTER_POD_NAMESPACE '
               '$GPUCLUSTER_POD_IP $HOME"; df -k /dev/shm | tail -1; grep -E "^(CapEff|NoNewPrivs)" /proc/1/status; '
               'cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null; '
               'stat -c %g /shared; touch /shared/w && echo writable').stdout.splitlines()
    assert probe[0] == '1000' and '1000' in probe[1].split()
    assert probe[2] == '..data/job.json' and probe[3] == '555'
    assert 'Read-only file system' in probe[4]
    assert probe[5] == 'ns %s %s' % (IPS[0], km.HOME_DIR)
    assert probe[6].split()[1] == str(64 * 1024)
    assert probe[7].split() == ['CapEff:', '0000000000000000'] and probe[8].split() == ['NoNewPrivs:', '1']
    assert probe[9] == str(256 * 2 ** 20) and probe[10] == '1000' and probe[11] == 'writable'

    launched = sh('rules-0', 'python3', '/etc/gpucluster/k8s_pod.py', 'launch', '--job-id', 'r1', '--detach')
    assert 'job r1 started on 2 pods' in launched.stdout
    logs = kubelet.podman('logs', PREFIX + 'rules-1').stdout
    assert '[r1 rules-1] part 1 of r1' in logs  # the part's output is in the container log

    # one pod's PID 1 killed from outside (as an OOM kill of the container does): started again
    pid = kubelet.podman('inspect', '--format', '{{.State.Pid}}', PREFIX + 'rules-1').stdout.strip()
    killed = time.time()
    os.kill(int(pid), 9)
    status = {}
    while time.time() - killed < 60:
        out = sh('rules-0', 'python3', '/etc/gpucluster/k8s_pod.py', 'status', '--job-id', 'r1', check=False).stdout
        status = json.loads(out.splitlines()[-1]) if out.strip() else {}
        if status.get('state') == 'failed':
            break
        time.sleep(1)
    assert status.get('state') == 'failed' and status['failed_pod'] == 'rules-1', status
    assert status['reason'].startswith('restarted: the container ended while its part ran'), status
    assert time.time() - killed < 60
    assert kubelet.podman('inspect', '--format', '{{.RestartCount}}', PREFIX + 'rules-1').stdout.strip() == '1'
    for i in range(2):  # nothing of the job runs in any pod
        left = sh('rules-%d' % i, 'sh', '-c', 'cat /proc/[0-9]*/cmdline 2>/dev/null | tr "\\0" " "').stdout
        assert 'sleep 300' not in left
