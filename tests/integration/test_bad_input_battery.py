"""Bad input against two real nodes: every playbook refuses it with one line naming the host and
the variable (and, for site.yml's steps, the step), exits non-zero, and leaves the nodes as they
were (hosts file, sshd config, firewall rules, exports, profile files, accounts, packages).

The nodes are two systemd containers from the node image on their own podman network, reached
over SSH with pinned host keys (battery_nodes.py). The cases run several at a time; after each,
one `podman exec` per node reads a fingerprint that must equal the one taken before the first.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

import battery_nodes as nodes

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which('ansible-playbook') is None, reason='needs ansible-playbook (make setup)')]

HEAD, WORKER = 'bat-head', 'bat-worker-1'
PARALLEL = int(os.environ.get('GPUCLUSTER_BATTERY_PARALLEL', '6'))
CASE_TIMEOUT = int(os.environ.get('GPUCLUSTER_BATTERY_CASE_TIMEOUT', '420'))  # seconds; more on a busy machine


def case(name, playbook, expected, extra=None, host_vars=None, edit=None, args=(), rc=2, step=None):
    """One bad input: playbook, -e values, per-host values or an inventory edit; the line expected
    (and, for a step of site.yml, the step it must name)."""
    return pytest.param({'playbook': playbook, 'expected': expected, 'extra': extra or {}, 'host_vars': host_vars or {},
                         'edit': edit, 'args': list(args), 'rc': rc, 'step': step}, id=name)


def _two_heads(inv):
    workers = inv['all']['children']['cluster']['children']['workers']['hosts']
    inv['all']['children']['cluster']['children']['head']['hosts'][WORKER] = workers.pop(WORKER)


def _no_head(inv):
    groups = inv['all']['children']['cluster']['children']
    groups['workers']['hosts'][HEAD] = groups['head']['hosts'].pop(HEAD)


def _stray(inv):
    inv['all'].setdefault('hosts', {})['stray-box'] = {'ansible_host': nodes.PREFIX + '.50'}


def _rename(inv):
    workers = inv['all']['children']['cluster']['children']['workers']['hosts']
    workers['bat_worker_1'] = workers.pop(WORKER)


CASES = [
    # The inventory contract: checked on the controller first by every playbook.
    case('site-cidr-everything', 'site', 'host bat-head: cluster_cidr 0.0.0.0/0 is every address there is',
         extra={'cluster_cidr': '0.0.0.0/0', 'cluster_cidr_allow_wide': True}),
    case('site-cidr-too-wide', 'site', 'host bat-head: cluster_cidr 10.0.0.0/8 holds 16777216 addresses, wider than /16',
         extra={'cluster_cidr': '10.0.0.0/8'}),
    case('site-cidr-differs', 'site', 'host bat-worker-1: cluster_cidr 10.234.0.0/16 differs from %s' % nodes.SUBNET,
         host_vars={WORKER: {'cluster_cidr': '10.234.0.0/16'}}),
    case('site-name-not-rfc1123', 'site', "host bat_worker_1: the inventory name 'bat_worker_1' is not a valid host name",
         edit=_rename),
    case('site-address-not-ip', 'site', "host bat-worker-1: ansible_host 'node-b.example' is not an IP address",
         host_vars={WORKER: {'ansible_host': 'node-b.example'}}),
    case('site-address-outside-cidr', 'site', 'host bat-worker-1: cluster_address 10.9.0.7 is outside cluster_cidr',
         host_vars={WORKER: {'cluster_address': '10.9.0.7'}}),
    case('site-shared-dir-relative', 'site', "host bat-worker-1: cluster_shared_dir must be an absolute path like /shared",
         host_vars={WORKER: {'cluster_shared_dir': 'shared'}}),
    case('site-env-path-alone', 'site', 'host bat-head: python_env_path is /srv/env but cluster_env_path is /opt/gpucluster/env',
         extra={'python_env_path': '/srv/env'}),
    case('train-launcher-unknown', 'train', 'value of training_launcher must be one of: deepspeed, torchrun, mpirun, slurm, got: srun',
         extra={'training_launcher': 'srun'}),
    case('train-two-heads', 'train', "group 'head' must hold exactly one host, it holds 2: bat-head, bat-worker-1",
         edit=_two_heads),
    case('train-gpu-slots-word', 'train', "host bat-worker-1: gpu_slots must be an integer from 0 to 1024, got 'two' (str)",
         host_vars={WORKER: {'gpu_slots': 'two'}}),
    case('train-node-slots-zero', 'train', 'host bat-head: node_slots must be from 1 to 1024, got 0',
         host_vars={HEAD: {'node_slots': 0}}),
    # train.yml's own inputs: refused before the job starts (nothing written, no unit).
    case('train-resume-from-missing', 'train',
         'host bat-head: training_resume_from /shared/ckpt/none does not exist; nothing was started',
         extra={'training_resume_from': '/shared/ckpt/none'}),
    # an empty directory: the head's resume_point (the rule the examples load by) finds nothing in it
    case('train-resume-from-empty', 'train',
         'host bat-head: training_resume_from /srv holds no checkpoint (no latest file under /srv, and no complete '
         'checkpoint); nothing was started', extra={'training_resume_from': '/srv'}),
    case('train-tensorboard-port-range', 'train',
         'host bat-head: training_tensorboard_port must be an integer from 1 to 65535, got 70000',
         extra={'training_state': 'tensorboard', 'training_tensorboard_port': 70000}),
    case('train-tensorboard-port-is-master-port', 'train',
         'host bat-head: training_tensorboard_port 29500 is also training_master_port and cluster_master_port',
         extra={'training_state': 'tensorboard', 'training_tensorboard_port': 29500}),
    case('train-limit-without-head', 'train', '--limit leaves out the head bat-head', args=['--limit', '!bat-head']),
    case('train-status-nodes-unknown', 'train',
         'host bat-head: training_status_nodes names bat-worker-9, where job bat-job was not started (its nodes: '
         'bat-head, bat-worker-1)',
         extra={'training_state': 'status', 'training_job_id': 'bat-job', 'training_status_nodes': ['bat-worker-9']}),
    # status/watch/logs: the documented bounds are checked before any node is read or written.
    case('train-status-sample-seconds-60', 'train',
         'training: training_progress_sample_seconds must be 0 to 30 (got 60)',
         extra={'training_state': 'status', 'training_job_id': 'bat-job', 'training_progress_sample_seconds': 60}),
    case('train-watch-metrics-dir-under-proc', 'train',
         'training: training_metrics_dir must be an absolute directory outside /proc, /sys and /dev',
         extra={'training_state': 'watch', 'training_job_id': 'bat-job', 'training_metrics_dir': '/proc/gpucluster'}),
    # A job id becomes a path (<training_jobs_dir>/<id>): every state that takes one refuses anything but
    # a plain name before any path is made of it, naming the variable the user sets.
    case('train-status-job-id-path', 'train', 'host bat-head: training_job_id ../x must be 1-64 letters, digits,',
         extra={'training_state': 'status', 'training_job_id': '../x'}),
    case('train-started-job-id-path', 'train', 'host bat-head: training_job_id a/../../etc must be 1-64 letters, digits,',
         extra={'training_job_id': 'a/../../etc'}),
    case('train-stopped-job-id-dotdot', 'train', 'host bat-head: training_job_id .. must be 1-64 letters, digits,',
         extra={'training_state': 'stopped', 'training_job_id': '..'}),
    case('train-watch-job-id-dot', 'train', 'host bat-head: training_job_id . must be 1-64 letters, digits,',
         extra={'training_state': 'watch', 'training_job_id': '.'}),
    case('train-logs-job-id-absolute', 'train', 'host bat-head: training_job_id /shared/jobs/x must be 1-64 letters, digits,',
         extra={'training_state': 'logs', 'training_job_id': '/shared/jobs/x'}),
    case('train-tensorboard-job-id-path', 'train', 'host bat-head: training_job_id ../.. must be 1-64 letters, digits,',
         extra={'training_state': 'tensorboard', 'training_job_id': '../..'}),
    # The supervision bounds: checked at every start, supervised or not (a negative count would start
    # the job unsupervised without a word).
    case('train-restarts-negative', 'train',
         'host bat-head: training_restarts must be a count (0 or more), got -1; nothing was started',
         extra={'training_restarts': -1}),
    case('train-failure-policy-kind', 'train',
         "host bat-head: training_failure_policy[0].on must be exit or signal or unreachable or restarted or stalled, "
         "got 'oom'; nothing was started",
         extra={'training_failure_policy': [{'on': ['oom'], 'action': 'fail'}]}),
    # the one step pattern of a user's script: a pattern Python cannot compile is refused before the start
    case('train-progress-regex-invalid', 'train',
         'host bat-head: training_progress_regex "it (?P<step>[0-9]+" is not a Python regular expression',
         extra={'training_progress_regex': 'it (?P<step>[0-9]+'}),
    case('train-supervise-seconds-negative', 'train',
         'host bat-head: training_supervise_seconds must be a count of seconds (0: until the job ends), got -5; '
         'nothing was started', extra={'training_supervise_seconds': -5}),
    # A supervised start on nodes site.yml's supervisor step never prepared: refused before anything is written
    # (the jobs directory, the examples, training_metrics_dir), on the host supervisor_host names when set.
    case('train-supervised-without-supervisor', 'train',
         'host bat-head: the supervisor host lacks /usr/local/lib/gpucluster/supervisor/ansible/bin/ansible-playbook',
         extra={'training_supervise': True, 'training_metrics_dir': '/var/lib/gpucluster-battery-metrics'}),
    case('train-supervised-supervisor-host', 'train',
         'host bat-worker-1: the supervisor host lacks /usr/local/lib/gpucluster/supervisor/ansible/bin/ansible-playbook',
         extra={'training_supervise': True, 'supervisor_host': WORKER}),
    case('train-supervised-supervisor-host-unknown', 'train',
         'host bat-head: supervisor_host ghost-box is not a host of the inventory',
         extra={'training_restarts': 1, 'supervisor_host': 'ghost-box'}),
    case('train-container-runtime-one-node', 'train',
         'host bat-worker-1: training_container_runtime is podman, on bat-head none; '
         'training_container_runtime must be the same on every node of the cluster',
         host_vars={WORKER: {'training_container_runtime': 'podman'}}),
    case('train-container-extra-args-net', 'train',
         'training_container_extra_args: --net=bridge conflicts with --network host that every launcher needs',
         extra={'training_container_runtime': 'podman', 'training_container_extra_args': ['--net=bridge']}),
    case('health-no-head', 'health', "group 'head' is empty", edit=_no_head),
    case('health-stray-host', 'health', 'host stray-box: is in no group', edit=_stray),
    case('health-schedule-node-slots-word', 'health_schedule',
         "host bat-worker-1: node_slots must be an integer from 1 to 1024, got 'many' (str)",
         host_vars={WORKER: {'node_slots': 'many'}}),
    case('network-test-duplicate-address', 'bandwidth',
         'host bat-worker-1: cluster_address %s.10 is already used by host bat-head' % nodes.PREFIX,
         host_vars={WORKER: {'cluster_address': nodes.PREFIX + '.10'}}),
    case('nccl-test-bad-user', 'collective', "host bat-head: cluster_user must be a POSIX user name",
         extra={'cluster_user': 'Bad User'}),
    case('dist-check-port-range', 'smoke', 'host bat-head: cluster_master_port must be from 1 to 65535, got 70000',
         host_vars={HEAD: {'cluster_master_port': 70000}}),
    case('slurm-cidr-everything', 'slurm', 'host bat-head: cluster_cidr ::/0 is every address there is',
         extra={'cluster_cidr': '::/0'}),
    case('bootstrap-gpu-slots-negative', 'bootstrap', 'host bat-worker-1: gpu_slots must be from 0 to 1024, got -1',
         host_vars={WORKER: {'gpu_slots': -1}}),
    case('site-unreachable-node', 'site', 'host bat-worker-1 (%s.99): ' % nodes.PREFIX,
         host_vars={WORKER: {'ansible_host': nodes.PREFIX + '.99', 'cluster_address': nodes.PREFIX + '.11'}},
         extra={'ansible_ssh_timeout': 5}),
    # Each step's own inputs: site.yml refuses them in its preflight, before the first step.
    case('site-network-domain-space', 'site', "host bat-head: network_domain 'my lab' is not a valid DNS domain",
         extra={'network_domain': 'my lab'}, step='network'),
    case('network-hostname-underscore', 'site', "host bat-head: network_hostname 'bad_name' is not a valid host name",
         host_vars={HEAD: {'network_hostname': 'bad_name'}}, args=['--tags', 'network'], step='network'),
    # read from the inventory alone: the contract refuses it on the controller, before any node is contacted
    case('network-static-outside-cidr', 'site', 'host bat-worker-1: network_static.address 10.9.0.7/24 is outside cluster_cidr',
         host_vars={WORKER: {'network_static': {'interface': 'eth0', 'address': '10.9.0.7/24'}}}, args=['--tags', 'network']),
    case('train-network-static-outside-cidr', 'train',
         'host bat-worker-1: network_static.address 10.9.0.7/24 is outside cluster_cidr',
         host_vars={WORKER: {'network_static': {'interface': 'eth0', 'address': '10.9.0.7/24'}}}),
    case('ssh-trust-uid-taken', 'site', 'host bat-head: cluster_user_uid 1000 is already the uid of account batadmin',
         extra={'cluster_user_uid': 1000}, args=['--tags', 'ssh_trust'], step='ssh_trust'),
    case('ssh-trust-uid-word', 'site', "host bat-head: cluster_user_uid must be an integer from 1 to 65533, got 'abc' (str)",
         extra={'cluster_user_uid': 'abc'}, args=['--tags', 'ssh_trust']),
    case('ssh-trust-unknown-cipher', 'site', 'host bat-head: sshd refuses the config with ssh_trust_sshd_dropin',
         extra={'ssh_trust_sshd_ciphers': ['nosuch-cipher@example.com']}, args=['--tags', 'ssh_trust'], step='ssh_trust'),
    case('ssh-trust-user-upper', 'site', 'host bat-worker-1: ssh_trust_user: not a POSIX account name: Bad',
         extra={'ssh_trust_user': 'Bad'}, args=['--tags', 'ssh_trust'], step='ssh_trust'),
    case('ssh-trust-dsa-keys', 'site', 'host bat-head: ssh_trust_host_key_types: choose among ed25519, ecdsa, rsa',
         extra={'ssh_trust_host_key_types': ['dsa']}, args=['--tags', 'ssh_trust'], step='ssh_trust'),
    case('site-firewall-port-out-of-range', 'site',
         "host bat-head: firewall_rendezvous_ports entry '29500:70000' is not a port (1-65535)",
         extra={'firewall_rendezvous_ports': '29500:70000'}, step='firewall'),
    case('firewall-admin-not-cidr', 'site', "host bat-head: firewall_admin_networks entry 'office' is not an address or a network",
         extra={'firewall_admin_networks': ['office']}, args=['--tags', 'firewall'], step='firewall'),
    case('firewall-ray-source-word', 'site', "host bat-worker-1: firewall_ray_sources entry 'lab' is not an address",
         extra={'firewall_ray_sources': ['lab']}, args=['--tags', 'firewall'], step='firewall'),
    case('firewall-enabled-maybe', 'site', "host bat-head: argument 'firewall_enabled' is of type",
         extra={'firewall_enabled': 'maybe'}, args=['--tags', 'firewall'], step='firewall'),
    case('nfs-export-to-everyone', 'site', 'host bat-head: nfs_server_export_clients: * exports to every host',
         extra={'nfs_client_mode': 'mount', 'nfs_server_export_clients': ['*']}, args=['--tags', 'nfs'], step='shared_storage'),
    case('nfs-export-path-missing', 'site', "host bat-head: nfs_server_export_path: '' is not an absolute path",
         extra={'nfs_client_mode': 'mount', 'nfs_server_export_path': ''}, args=['--tags', 'nfs'], step='shared_storage'),
    case('nfs-client-path-relative', 'site', 'host bat-worker-1: nfs_client_path: shared is not an absolute path',
         extra={'nfs_client_path': 'shared'}, args=['--tags', 'shared_storage'], step='shared_storage'),
    case('nfs-client-timeout-zero', 'site', 'host bat-head: nfs_client_probe_timeout: must be above 0',
         extra={'nfs_client_probe_timeout': 0}, args=['--tags', 'nfs'], step='shared_storage'),
    case('nfs-client-mode-choice', 'site', "host bat-head: value of nfs_client_mode must be one of: mount, check, got: mirror",
         extra={'nfs_client_mode': 'mirror'}, args=['--tags', 'nfs'], step='shared_storage'),
    case('site-nfs-check-not-mounted', 'site',
         'host bat-head: nfs_client_path /data/missing is not a mount point (findmnt found nothing)',
         extra={'nfs_client_mode': 'check', 'nfs_client_path': '/data/missing'}, step='shared_storage'),
    case('nfs-check-file-not-mounted', 'site', 'host bat-worker-1: nfs_client_path /etc is not a mount point',
         extra={'nfs_client_path': '/etc'}, args=['--tags', 'nfs'], step='shared_storage'),
    # Ports the collection listens on, held on the head by another process (sshd holds 22).
    case('site-master-port-held', 'site',
         'host bat-head: cluster_master_port 22 is held on the head: port 22 is in use by pid',
         host_vars={HEAD: {'cluster_master_port': 22}}),
    case('site-bandwidth-port-held', 'site',
         'host bat-head: cluster_bandwidth_port 22 is held on the head: port 22 is in use by pid',
         extra={'cluster_bandwidth_port': 22}, args=['--tags', 'python_env']),
    # Report directories: made as mkdir -p would, or refused before any test starts.
    case('bandwidth-report-dir-under-a-file', 'bandwidth',
         'controller: cluster_tests_report_dir /dev/null/reports cannot be made or written',
         extra={'cluster_tests_report_dir': '/dev/null/reports'}),
    case('smoke-report-dir-under-a-file', 'smoke',
         'controller: cluster_tests_report_dir /dev/null/reports cannot be made or written',
         extra={'cluster_tests_report_dir': '/dev/null/reports'}),
    case('health-report-dir-under-a-file', 'health',
         'host bat-head: health_report_dir /etc/hostname/reports cannot be written',
         extra={'health_report_dir': '/etc/hostname/reports'}),
    case('health-local-report-dir-under-a-file', 'health',
         'controller: health_local_report_dir /dev/null/reports',
         extra={'health_local_report_dir': '/dev/null/reports'}),
    case('nvidia-branch-word', 'site', 'host bat-head: nvidia_driver_branch latest is not a driver branch number',
         extra={'nvidia_driver_branch': 'latest'}, args=['--tags', 'nvidia_driver'], step='nvidia_driver'),
    case('nvidia-version-other-branch', 'site', 'host bat-worker-1: nvidia_driver_version 550.54.15 is not in nvidia_driver_branch 580',
         extra={'nvidia_driver_branch': '580', 'nvidia_driver_version': '550.54.15'}, args=['--tags', 'nvidia_driver'], step='nvidia_driver'),
    case('site-python-offline-no-wheelhouse', 'site', 'host bat-head: cluster_pip_offline needs cluster_pip_find_links',
         extra={'cluster_pip_offline': True, 'cluster_pip_find_links': []}, step='python_env'),
    case('python-wheelhouse-missing', 'site', 'host bat-head: cluster_pip_find_links /no/such/wheelhouse is not a directory',
         extra={'cluster_pip_offline': True, 'cluster_pip_find_links': ['/no/such/wheelhouse']}, args=['--tags', 'python_env'], step='python_env'),
    # An offline wheelhouse that lacks what a step installs: refused in the preflight, naming the step.
    case('site-wheelhouse-without-ansible-core', 'site',
         'host bat-head: cluster_pip_find_links /etc holds no wheel of ansible-core==2.19.14, jinja2, markupsafe',
         extra={'cluster_pip_offline': True, 'cluster_pip_find_links': ['/etc']}, args=['--tags', 'supervisor'],
         step='supervisor'),
    case('site-wheelhouse-without-torch', 'site', 'host bat-head: cluster_pip_find_links /etc holds no wheel of torch==',
         extra={'cluster_pip_offline': True, 'cluster_pip_find_links': ['/etc'], 'cluster_env_path': '/opt/battery-no-env'},
         args=['--tags', 'python_env'], step='python_env'),
    case('site-pip-offline-alone', 'site',
         'host bat-head: python_env_offline is true but cluster_pip_offline is false; cluster_pip_offline is what ray '
         'and the training image read, not python_env_offline: set cluster_pip_offline: true instead',
         extra={'python_env_offline': True}),
    case('python-backend-choice', 'site', "host bat-worker-1: value of python_env_backend must be one of: venv, conda, got: pipx",
         extra={'python_env_backend': 'pipx'}, args=['--tags', 'python_env'], step='python_env'),
    case('site-nccl-rdma-without-devices', 'site', 'host bat-worker-1: nccl_env_mode is rdma but /sys/class/infiniband is empty',
         extra={'nccl_env_mode': 'rdma'}, step='nccl_env'),
    case('nccl-ifname-absent', 'site', 'host bat-head: nccl_env_socket_ifname ib9 is not an interface of this node',
         extra={'nccl_env_socket_ifname': 'ib9'}, args=['--tags', 'nccl_env'], step='nccl_env'),
    # The container step (site.yml runs it where cluster_container_runtime is set): refused in the preflight.
    case('site-container-runtime-choice', 'site',
         "host bat-head: cluster_container_runtime must be one of none, podman, apptainer, singularity, enroot, "
         "got 'docker' (str)", extra={'cluster_container_runtime': 'docker'}),
    case('site-container-runtime-alone', 'site',
         'host bat-head: container_runtime is podman but cluster_container_runtime is none; cluster_container_runtime '
         'is what site.yml, node_tools, training and health read, not container_runtime: set '
         'cluster_container_runtime: podman instead', extra={'container_runtime': 'podman'}),
    case('site-container-runtime-without-package', 'site', 'host bat-head: cluster_container_runtime enroot has no package for',
         extra={'cluster_container_runtime': 'enroot', 'cluster_container_image': '/shared/images/train.sqsh',
                'container_image_source': 'present'}, step='container'),
    case('site-container-archive-missing', 'site',
         'host bat-worker-1: container_image_archive /shared/images/none.oci.tar does not exist',
         extra={'cluster_container_runtime': 'podman', 'container_image_source': 'archive',
                'container_image_archive': '/shared/images/none.oci.tar'}, step='container'),
    case('site-container-runtime-one-node', 'site',
         'hosts bat-head, bat-worker-1: cluster_container_runtime differs between nodes (none, podman); it must be '
         'the same on every node, set it once for all', host_vars={WORKER: {'cluster_container_runtime': 'podman'}}),
    case('site-container-extra-args-network', 'site',
         'host bat-head: training_container_extra_args: --network bridge conflicts with --network host that every launcher '
         'needs (ranks reach each other on the cluster addresses; podman takes no second --network)',
         extra={'cluster_container_runtime': 'podman', 'training_container_extra_args': ['--network', 'bridge']}, step='container'),
    case('nccl-mode-choice', 'site', "host bat-head: value of nccl_env_mode must be one of: tcp, rdma, got: udp",
         extra={'nccl_env_mode': 'udp'}, args=['--tags', 'nccl_env'], step='nccl_env'),
]


@pytest.fixture(scope='session')
def battery():
    """The two nodes, their inventory and the fingerprint taken before any case ran."""
    state = None
    try:
        inventory = nodes.up()
    except nodes.NodesUnavailable as exc:
        nodes.down()
        pytest.skip('bad-input battery needs podman and the node image: %s' % exc)
    try:
        with open(inventory, encoding='utf-8') as handle:
            base = json.load(handle)
        state = {'inventory': base, 'fingerprint': nodes.fingerprint(), 'results': {}, 'pool': None}
        yield state
    finally:
        if state is not None and state['pool'] is not None:
            state['pool'].shutdown(wait=True, cancel_futures=True)
        nodes.down()


def _run(base, params):
    inv = copy.deepcopy(base)
    groups = inv['all']['children']['cluster']['children']
    for host, values in params['host_vars'].items():
        for group in groups.values():
            if host in group['hosts']:
                group['hosts'][host].update(values)
    if params['edit']:
        params['edit'](inv)
    workdir = tempfile.mkdtemp(prefix='gpucluster-battery-')
    try:
        with open(os.path.join(workdir, 'hosts.yml'), 'w', encoding='utf-8') as handle:
            json.dump(inv, handle)
        with open(os.path.join(workdir, 'extra.json'), 'w', encoding='utf-8') as handle:
            # No summary table: it reads every node's GPUs (one more round trip) and says nothing about the input.
            json.dump(dict({'preflight_summary': False}, **params['extra']), handle)
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(nodes.ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
                   ANSIBLE_FORCE_COLOR='0', ANSIBLE_COLLECTIONS_PATH=os.path.join(nodes.ROOT, '.build', 'collections'),
                   ANSIBLE_LOCAL_TEMP=os.path.join(workdir, 'tmp'),
                   # several cases run at once: each its own ssh control sockets, and a connection the
                   # loaded machine drops (ssh exit 255) tried again rather than read as a node that is down
                   ANSIBLE_SSH_CONTROL_PATH_DIR=os.path.join(workdir, 'cp'), ANSIBLE_SSH_RETRIES='2')
        cmd = ['ansible-playbook', os.path.join(nodes.ROOT, 'playbooks', params['playbook'] + '.yml'),
               '-i', os.path.join(workdir, 'hosts.yml'), '-e', '@' + os.path.join(workdir, 'extra.json')] + params['args']
        started = time.time()
        try:
            proc = subprocess.run(cmd, cwd=nodes.ROOT, env=env, capture_output=True, text=True,
                                  timeout=CASE_TIMEOUT, check=False)
            rc, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out = 'timeout', str(exc.stdout or '')
        after = nodes.fingerprint()
        return {'rc': rc, 'out': out, 'fingerprint': after, 'seconds': time.time() - started}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _result(battery, request, params):
    """Every case is submitted at the first one's turn, so several run at once; each test waits for its own."""
    if battery['pool'] is None:
        battery['pool'] = concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL)
        todo = []
        for item in request.session.items:
            spec = getattr(item, 'callspec', None)
            if spec is not None and item.originalname == 'test_bad_input_is_refused_and_nothing_changes':
                todo.append((spec.id, spec.params['params']))
        # The whole-site runs (every step checked) take longest: they start first.
        for key, params in sorted(todo, key=lambda kv: (kv[1]['playbook'] != 'site' or bool(kv[1]['args']),)):
            battery['results'][key] = battery['pool'].submit(_run, battery['inventory'], params)
    key = request.node.callspec.id
    if key not in battery['results']:
        battery['results'][key] = battery['pool'].submit(_run, battery['inventory'], params)
    return battery['results'][key].result()


def _lines(out):
    """The output as logical lines: ansible's wrapped YAML joined back, one message per line."""
    lines = []
    out = out.replace("\\'", "'").replace("''", "'")
    for raw in out.splitlines():
        text = ' '.join(raw.split())
        if lines and raw.startswith('        ') and not raw.strip().startswith('-'):
            lines[-1] += ' ' + text
        else:
            lines.append(text)
    return lines + [' '.join(out.split())]


@pytest.mark.parametrize('params', CASES)
def test_bad_input_is_refused_and_nothing_changes(battery, request, params):
    result = _result(battery, request, params)
    out = result['out']
    unreachable = [line for line in out.splitlines() if 'UNREACHABLE' in line or 'Failed to connect' in line]
    assert result['rc'] == params['rc'], '\n'.join(unreachable[:5] + [out[-3000:]])
    # One line names the host and the variable; nothing after the check touched a node.
    assert any(params['expected'] in line for line in _lines(out)), out[-3000:]
    assert 'changed=' in out and all(part.startswith('changed=0') for part in out.split()[1:] if part.startswith('changed=')), \
        out[out.find('PLAY RECAP'):]
    assert nodes.changes(battery['fingerprint'], result['fingerprint']) == []
    if params['step']:
        # site.yml says which step the refused value belongs to, and refused it before any step ran.
        assert any(params['expected'] in line and '(step %s)' % params['step'] in line for line in _lines(out)), out[-3000:]
        assert 'PLAY [Network' not in out


def test_the_battery_covers_every_playbook_and_step():
    playbooks = {c.values[0]['playbook'] for c in CASES}
    assert playbooks >= {'site', 'train', 'health', 'health_schedule', 'bandwidth', 'collective', 'smoke',
                         'slurm', 'bootstrap'}
    assert len(CASES) >= 40
