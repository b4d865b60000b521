# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The collection-wide defaults, defined once: modules take them as their argument defaults, and
roles read a cluster-wide value through the ``gpucluster.multinode.cluster_value`` lookup (the
inventory's cluster_<name>, else the default here), e.g.

    cluster_tests_env_path: "{{ lookup('gpucluster.multinode.cluster_value', 'env_path') }}"
"""

from __future__ import annotations

# The cluster's Python environment (cluster_env_path; the python_env role makes it).
ENV_PATH = '/opt/gpucluster/env'
# The NCCL/gloo environment of every node (cluster_nccl_profile; the nccl_env role writes it,
# launchers source it).
NCCL_PROFILE = '/etc/profile.d/gpucluster-nccl.sh'
# Where every node sees the shared storage (cluster_shared_dir): the NFS export and mount, and the
# jobs, images and hostfiles directories under it.
SHARED_DIR = '/shared'
# The rendezvous port on the head (cluster_master_port), and how many ports from it the
# firewall opens for rendezvous (torchrun c10d, DeepSpeed, a second job beside the first).
MASTER_PORT = 29500
RENDEZVOUS_PORT_COUNT = 101
# The training account's uid (and gid) on every node (cluster_user_uid; ssh_trust makes the account,
# the NFS roles give a created owner the same).
USER_UID = 2000
# Ranks one node may start (node_slots) and GPUs it may have (gpu_slots).
MAX_SLOTS = 1024
# Ray on the head: GCS, dashboard, client server; and how many ports from the client server's
# the firewall opens for Ray's workers.
RAY_PORT = 6379
RAY_DASHBOARD_PORT = 8265
RAY_CLIENT_SERVER_PORT = 10001
RAY_CLIENT_PORT_COUNT = 100
# The Ray service of the training account on every node, and the manifest of what each node brings
# (the ray role writes them, health reads them).
RAY_UNIT = 'gpucluster-ray'
RAY_MANIFEST = '/etc/gpucluster/ray.json'
# iperf3's server port (cluster_tests_bandwidth_port), checked free on the head by preflight.
BANDWIDTH_PORT = 5201
# The Python pins of the cluster's environment (cluster_torch_version, cluster_deepspeed_version:
# python_env installs them, the container role builds them into the image, training and health
# compare them).
TORCH_VERSION = '2.13.0'
DEEPSPEED_VERSION = '0.19.8'
NINJA_VERSION = '1.13.2'
# DeepSpeed op builders prebuilt where DeepSpeed picks the CPU (cluster_deepspeed_cpu_ops): gloo
# jobs JIT-build the shm op otherwise.
DEEPSPEED_CPU_OPS = ['ShareMemCommBuilder']
# The training image the container role builds: this repository, tagged with the pins.
TRAIN_IMAGE_REPOSITORY = 'localhost/gpucluster-train'


def train_image(torch=None, deepspeed=None):
    """The default training image reference for these pins (the collection's pins when empty)."""
    return '%s:torch%s-ds%s' % (TRAIN_IMAGE_REPOSITORY, torch or TORCH_VERSION, deepspeed or DEEPSPEED_VERSION)


DEFAULTS = {
    'env_path': ENV_PATH,
    'nccl_profile': NCCL_PROFILE,
    'shared_dir': SHARED_DIR,
    'user_uid': USER_UID,
    'master_port': MASTER_PORT,
    'rendezvous_port_count': RENDEZVOUS_PORT_COUNT,
    'max_slots': MAX_SLOTS,
    'ray_port': RAY_PORT,
    'ray_dashboard_port': RAY_DASHBOARD_PORT,
    'ray_client_server_port': RAY_CLIENT_SERVER_PORT,
    'ray_client_port_count': RAY_CLIENT_PORT_COUNT,
    'ray_unit': RAY_UNIT,
    'ray_manifest': RAY_MANIFEST,
    'bandwidth_port': BANDWIDTH_PORT,
    'torch_version': TORCH_VERSION,
    'deepspeed_version': DEEPSPEED_VERSION,
    'ninja_version': NINJA_VERSION,
    'deepspeed_cpu_ops': DEEPSPEED_CPU_OPS,
    # Empty unless the inventory sets them (cluster_<name>): where pip finds the cluster's packages,
    # what else it installs, the CUDA op builders, the launcher, containers, Ray, nccl-tests.
    'pip_index_url': '',
    'pip_extra_index_urls': [],
    'pip_find_links': [],
    'pip_offline': False,
    'python_packages': [],
    'deepspeed_ops': [],
    'user': 'train',
    'launcher': 'deepspeed',
    'deepspeed_launcher': 'pdsh',
    'ssh_all_to_all': False,
    'container_runtime': 'none',
    'container_image': '',
    'container_image_digest': '',
    'ray_enabled': False,
    'nccl_tests_dir': '',
    # The cluster's name in reports (cluster_name).
    'name': '',
}
# Defaults that derive from another cluster-wide value.
DERIVED = {'container_mounts': lambda value: [value('shared_dir')]}
UNSET = object()


def cluster_value(name, read, unset=UNSET, empty_is_unset=False):
    """The cluster-wide value <name>: read('cluster_<name>') where it is set (not UNSET, not None, and not
    empty with empty_is_unset), else unset where given, else the collection's default (a derived one read the
    same way). The one rule of the cluster_value lookup and of the preflight's reading of site.yml."""
    if name not in DEFAULTS and name not in DERIVED:
        raise KeyError('no cluster-wide value named %r (there are %s)' % (name, ', '.join(sorted(list(DEFAULTS) + list(DERIVED)))))
    found = read('cluster_' + name)
    if found is UNSET or found is None or (empty_is_unset and found in ('', [], {})):
        if unset is not UNSET:
            return unset
        return DERIVED[name](lambda other: cluster_value(other, read)) if name in DERIVED else DEFAULTS[name]
    return found


def port_range(first, count):
    """'first:last' of count ports from first (a single port when count is 1)."""
    first, count = int(first), int(count)
    return str(first) if count <= 1 else '%d:%d' % (first, first + count - 1)
