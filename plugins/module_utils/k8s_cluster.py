# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The Kubernetes/OpenShift cluster file: its fields, their types and defaults, checked in one place.

A cluster file describes one training cluster run as a StatefulSet of pods (see roles/k8s/README.md).
check() returns the settings with every default filled in, or raises ClusterFileError with one line
that names the file and the field (``k8s-cluster.yml: network.mode must be tcp or rdma, got 'ib'``).
The pod names, their DNS names and their slots are derived here too (pods()), so the hostfile, the
ConfigMap and the semantic checks of the rendered objects read the same list.
"""

from __future__ import annotations

import re

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults

DNS_LABEL_RE = re.compile(r'^[a-z]([-a-z0-9]*[a-z0-9])?$')
DNS_SUBDOMAIN_RE = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')
QUANTITY_RE = re.compile(r'^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$')
RESOURCE_NAME_RE = re.compile(r'^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')
ENV_NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
HCA_RE = re.compile(r'^[A-Za-z0-9_]+(:[0-9]+)?(,[A-Za-z0-9_]+(:[0-9]+)?)*$')
MAX_NAME = 52           # a StatefulSet name longer than 52 breaks its controller-revision-hash label
MAX_REPLICAS = 1024
NETWORK_MODES = ('tcp', 'rdma')
STORAGE_MODES = ('rwx', 'per-pod')
DEFAULT_IFNAME = {'tcp': 'eth0', 'rdma': 'net1'}
CONFIG_DIR = '/etc/gpucluster'
ENTRYPOINT = 'k8s_pod.py'


class ClusterFileError(ValueError):
    """A bad cluster file; the message names the file and the field."""


def _kind(value):
    for kind in (bool, int, float, str, list, dict):
        if isinstance(value, kind):
            return kind.__name__
    return 'null' if value is None else type(value).__name__


class _Checker:
    def __init__(self, where):
        self.where = where

    def fail(self, field, text):
        raise ClusterFileError('%s: %s %s' % (self.where, field, text))

    def mapping(self, data, field, known):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(field or 'the file', 'must be a mapping, got %r (%s)' % (data, _kind(data)))
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            prefix = field + '.' if field else ''
            self.fail(prefix + unknown[0], 'is not a field of a cluster file (known: %s)' % ', '.join(sorted(known)))
        return data

    def string(self, value, field, pattern=None, hint='', empty=False):
        if not isinstance(value, str) or (not empty and not value):
            self.fail(field, 'must be a%s string, got %r (%s)' % ('' if empty else ' non-empty', value, _kind(value)))
        if pattern is not None and value and not pattern.match(value):
            self.fail(field, 'must be %s, got %r' % (hint, value))
        return value

    def integer(self, value, field, low, high):
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(field, 'must be a whole number from %d to %d, got %r (%s)' % (low, high, value, _kind(value)))
        if not low <= value <= high:
            self.fail(field, 'must be from %d to %d, got %d' % (low, high, value))
        return value

    def boolean(self, value, field):
        if not isinstance(value, bool):
            self.fail(field, 'must be true or false, got %r (%s)' % (value, _kind(value)))
        return value

    def choice(self, value, field, choices):
        if value not in choices:
            self.fail(field, 'must be %s, got %r' % (' or '.join(choices), value))
        return value

    def quantity(self, value, field):
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            self.fail(field, 'must be a Kubernetes quantity such as "16Gi", got %r (%s)' % (value, _kind(value)))
        if not QUANTITY_RE.match(str(value)):
            self.fail(field, 'must be a Kubernetes quantity such as "16Gi", got %r' % (value,))
        return str(value)

    def str_map(self, value, field, key_re=None, hint='a name'):
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(field, 'must be a mapping of names to strings, got %r (%s)' % (value, _kind(value)))
        out = {}
        for key, item in value.items():
            if key_re is not None and not (isinstance(key, str) and key_re.match(key)):
                self.fail('%s.%s' % (field, key), 'is not %s' % hint)
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                self.fail('%s.%s' % (field, key), 'must be a string, got %r (%s)' % (item, _kind(item)))
            out[str(key)] = str(item)
        return out

    def str_list(self, value, field, empty=True):
        if not isinstance(value, list) or (not empty and not value):
            self.fail(field, 'must be a%s list of strings, got %r (%s)'
                      % ('' if empty else ' non-empty', value, _kind(value)))
        for index, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                self.fail('%s[%d]' % (field, index), 'must be a string, got %r (%s)' % (item, _kind(item)))
        return [str(item) for item in value]


TOP = ('name', 'namespace', 'context', 'kubeconfig', 'cluster_domain', 'replicas', 'gpus_per_pod',
       'gpu_resource', 'slots_per_pod', 'pod_slots', 'image', 'image_pull_policy', 'image_pull_secrets',
       'resources', 'network', 'storage', 'shm_size', 'node_selector', 'tolerations', 'openshift',
       'train', 'nccl', 'files', 'labels', 'network_policy')
NETWORK = ('mode', 'rdma_resource', 'rdma_resource_count', 'ib_hca', 'attachment', 'attachment_config',
           'socket_ifname', 'ib_gid_index')
STORAGE = ('mode', 'storage_class', 'size', 'mount_path', 'claim_name')
TRAIN = ('command', 'deepspeed_config', 'env', 'peer_wait', 'master_port', 'agent_port', 'python',
         'deepspeed', 'workdir')
NCCL = ('debug', 'extra')
RESOURCES = ('cpu', 'memory')
TOLERATION = ('key', 'operator', 'value', 'effect', 'tolerationSeconds')


def check(data, where='cluster file'):
    """The cluster settings with defaults filled in; raises ClusterFileError naming where and the field."""
    c = _Checker(where)
    data = c.mapping(data, '', TOP)
    for field in ('name', 'namespace', 'image'):
        if field not in data:
            c.fail(field, 'is required')
    out = {}
    out['name'] = c.string(data['name'], 'name', DNS_LABEL_RE, 'a DNS label (lower case letters, digits, "-")')
    if len(out['name']) > MAX_NAME:
        c.fail('name', 'must be at most %d characters (the StatefulSet adds a hash label), got %d'
               % (MAX_NAME, len(out['name'])))
    out['namespace'] = c.string(data['namespace'], 'namespace', DNS_LABEL_RE, 'a DNS label')
    out['context'] = c.string(data.get('context', ''), 'context', empty=True)
    out['kubeconfig'] = c.string(data.get('kubeconfig', ''), 'kubeconfig', empty=True)
    out['cluster_domain'] = c.string(data.get('cluster_domain', 'cluster.local'), 'cluster_domain',
                                     DNS_SUBDOMAIN_RE, 'a DNS domain')
    out['replicas'] = c.integer(data.get('replicas', 2), 'replicas', 1, MAX_REPLICAS)
    out['gpus_per_pod'] = c.integer(data.get('gpus_per_pod', 1), 'gpus_per_pod', 0, 64)
    out['gpu_resource'] = c.string(data.get('gpu_resource', 'nvidia.com/gpu'), 'gpu_resource', RESOURCE_NAME_RE,
                                   'an extended resource name such as nvidia.com/gpu')
    slots = c.integer(data.get('slots_per_pod', out['gpus_per_pod'] or 1), 'slots_per_pod', 1, 1024)
    if out['gpus_per_pod'] and slots > out['gpus_per_pod']:
        c.fail('slots_per_pod', 'is %d but a pod gets %d GPU(s) (gpus_per_pod): a rank needs its own GPU'
               % (slots, out['gpus_per_pod']))
    out['slots_per_pod'] = slots
    pod_slots = data.get('pod_slots') or {}
    if not isinstance(pod_slots, dict):
        c.fail('pod_slots', 'must be a mapping of pod ordinals to slots, got %r (%s)' % (pod_slots, _kind(pod_slots)))
    out['pod_slots'] = {}
    for key, value in pod_slots.items():
        field = 'pod_slots.%s' % key
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < out['replicas']:
            c.fail(field, 'must be a pod ordinal from 0 to %d (replicas - 1)' % (out['replicas'] - 1))
        c.integer(value, field, 1, 1024)
        if out['gpus_per_pod'] and value > out['gpus_per_pod']:
            c.fail(field, 'is %d but a pod gets %d GPU(s) (gpus_per_pod)' % (value, out['gpus_per_pod']))
        out['pod_slots'][key] = value
    out['image'] = c.string(data['image'], 'image')
    if any(ch.isspace() for ch in out['image']):
        c.fail('image', 'must not hold spaces, got %r' % out['image'])
    out['image_pull_policy'] = c.choice(data.get('image_pull_policy', 'IfNotPresent'), 'image_pull_policy',
                                        ('Always', 'IfNotPresent', 'Never'))
    out['image_pull_secrets'] = c.str_list(data.get('image_pull_secrets', []), 'image_pull_secrets')
    res = c.mapping(data.get('resources'), 'resources', RESOURCES)
    out['resources'] = {k: c.quantity(v, 'resources.' + k) for k, v in res.items()}

    net = c.mapping(data.get('network'), 'network', NETWORK)
    mode = c.choice(net.get('mode', 'tcp'), 'network.mode', NETWORK_MODES)
    network = {'mode': mode}
    network['socket_ifname'] = c.string(net.get('socket_ifname', DEFAULT_IFNAME[mode]), 'network.socket_ifname',
                                        re.compile(r'^[A-Za-z0-9_.:-]{1,15}$'), 'an interface name')
    network['ib_gid_index'] = c.integer(net.get('ib_gid_index', 3), 'network.ib_gid_index', 0, 255)
    if mode == 'rdma':
        for field in ('rdma_resource', 'ib_hca', 'attachment'):
            if not net.get(field):
                c.fail('network.' + field, 'is required when network.mode is rdma')
        network['rdma_resource'] = c.string(net['rdma_resource'], 'network.rdma_resource', RESOURCE_NAME_RE,
                                            'an extended resource name such as rdma/rdma_shared_device_a')
        network['rdma_resource_count'] = c.integer(net.get('rdma_resource_count', 1),
                                                   'network.rdma_resource_count', 1, 64)
        hca = net['ib_hca']
        if isinstance(hca, list):
            hca = ','.join(c.str_list(hca, 'network.ib_hca', empty=False))
        network['ib_hca'] = c.string(hca, 'network.ib_hca', HCA_RE, 'HCA names such as "mlx5_0,mlx5_1"')
        network['attachment'] = c.string(net['attachment'], 'network.attachment',
                                         re.compile(r'^([a-z0-9-]+/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$'),
                                         'a NetworkAttachmentDefinition name (or namespace/name)')
        config = net.get('attachment_config')
        if config is not None and not isinstance(config, dict):
            c.fail('network.attachment_config', 'must be the CNI configuration as a mapping, got %r (%s)'
                   % (config, _kind(config)))
        if config is not None and '/' in network['attachment']:
            c.fail('network.attachment_config', 'renders the attachment in the cluster namespace; '
                   'network.attachment must then be a plain name, got %r' % network['attachment'])
        network['attachment_config'] = config
    else:
        for field in ('rdma_resource', 'ib_hca', 'attachment', 'attachment_config'):
            if net.get(field):
                c.fail('network.' + field, 'is set but network.mode is tcp (set mode: rdma, or remove it)')
    out['network'] = network

    sto = c.mapping(data.get('storage'), 'storage', STORAGE)
    smode = c.choice(sto.get('mode', 'rwx'), 'storage.mode', STORAGE_MODES)
    storage = {'mode': smode}
    storage['storage_class'] = c.string(sto.get('storage_class', ''), 'storage.storage_class', DNS_SUBDOMAIN_RE,
                                        'a StorageClass name', empty=True)
    storage['size'] = c.quantity(sto.get('size', '100Gi'), 'storage.size')
    storage['mount_path'] = c.string(sto.get('mount_path', '/shared'), 'storage.mount_path',
                                     re.compile(r'^/[^\s]*$'), 'an absolute path')
    if storage['mount_path'] in ('/', '/dev/shm', CONFIG_DIR):
        c.fail('storage.mount_path', 'must not be %s' % storage['mount_path'])
    storage['claim_name'] = c.string(sto.get('claim_name', ''), 'storage.claim_name', DNS_SUBDOMAIN_RE,
                                     'a PersistentVolumeClaim name', empty=True)
    if storage['claim_name'] and smode != 'rwx':
        c.fail('storage.claim_name', 'names an existing ReadWriteMany claim; it needs storage.mode rwx')
    out['storage'] = storage
    out['shm_size'] = c.quantity(data.get('shm_size', '16Gi'), 'shm_size')
    out['node_selector'] = c.str_map(data.get('node_selector'), 'node_selector')
    out['labels'] = c.str_map(data.get('labels'), 'labels')
    for reserved in ('app.kubernetes.io/name', 'app.kubernetes.io/instance'):
        if reserved in out['labels']:
            c.fail('labels.' + reserved, 'is set by the collection (it selects the pods)')
    tolerations = data.get('tolerations', [])
    if not isinstance(tolerations, list):
        c.fail('tolerations', 'must be a list of tolerations, got %r (%s)' % (tolerations, _kind(tolerations)))
    out['tolerations'] = []
    for index, tol in enumerate(tolerations):
        field = 'tolerations[%d]' % index
        tol = c.mapping(tol, field, TOLERATION)
        item = {}
        for key in ('key', 'value'):
            if key in tol:
                item[key] = c.string(tol[key], '%s.%s' % (field, key), empty=True)
        if 'operator' in tol:
            item['operator'] = c.choice(tol['operator'], field + '.operator', ('Exists', 'Equal'))
        if 'effect' in tol:
            item['effect'] = c.choice(tol['effect'], field + '.effect', ('NoSchedule', 'PreferNoSchedule', 'NoExecute'))
        if 'tolerationSeconds' in tol:
            item['tolerationSeconds'] = c.integer(tol['tolerationSeconds'], field + '.tolerationSeconds', 0, 10 ** 9)
        out['tolerations'].append(item)
    out['openshift'] = c.boolean(data.get('openshift', False), 'openshift')
    out['network_policy'] = c.boolean(data.get('network_policy', True), 'network_policy')

    train = c.mapping(data.get('train'), 'train', TRAIN)
    if 'command' not in train:
        c.fail('train.command', 'is required (the script and its arguments, run by deepspeed in every pod)')
    job = {'command': c.str_list(train['command'], 'train.command', empty=False)}
    config = train.get('deepspeed_config')
    if config is not None:
        if not isinstance(config, dict):
            c.fail('train.deepspeed_config', 'must be a mapping (the DeepSpeed JSON config), got %r (%s)'
                   % (config, _kind(config)))
        if not any(k in config for k in ('train_batch_size', 'train_micro_batch_size_per_gpu')):
            c.fail('train.deepspeed_config', 'has no batch settings: set train_batch_size or '
                   'train_micro_batch_size_per_gpu')
    job['deepspeed_config'] = config
    job['env'] = c.str_map(train.get('env'), 'train.env', ENV_NAME_RE, 'an environment variable name')
    job['peer_wait'] = c.integer(train.get('peer_wait', 300), 'train.peer_wait', 5, 86400)
    job['master_port'] = c.integer(train.get('master_port', cluster_defaults.MASTER_PORT), 'train.master_port', 1024, 65535)
    job['agent_port'] = c.integer(train.get('agent_port', 29400), 'train.agent_port', 1024, 65535)
    if job['agent_port'] == job['master_port']:
        c.fail('train.agent_port', 'must differ from train.master_port (%d)' % job['master_port'])
    job['python'] = c.string(train.get('python', 'python3'), 'train.python')
    job['deepspeed'] = c.string(train.get('deepspeed', 'deepspeed'), 'train.deepspeed')
    job['workdir'] = c.string(train.get('workdir', storage['mount_path']), 'train.workdir',
                              re.compile(r'^/[^\s]*$'), 'an absolute path')
    out['train'] = job

    nccl = c.mapping(data.get('nccl'), 'nccl', NCCL)
    out['nccl'] = {
        'debug': c.choice(nccl.get('debug', 'WARN'), 'nccl.debug', ('VERSION', 'WARN', 'INFO', 'TRACE')),
        'extra': c.str_map(nccl.get('extra'), 'nccl.extra', ENV_NAME_RE, 'an environment variable name'),
    }
    files = data.get('files') or {}
    if not isinstance(files, dict):
        c.fail('files', 'must map ConfigMap keys to local files, got %r (%s)' % (files, _kind(files)))
    out['files'] = {}
    for key, path in files.items():
        c.string(key, 'files', re.compile(r'^[-._a-zA-Z0-9]+$'), 'a ConfigMap key (letters, digits, - _ .)')
        if key in RESERVED_KEYS:
            c.fail('files.' + key, 'is a key the collection writes itself')
        out['files'][key] = c.string(path, 'files.' + key)
    return out


RESERVED_KEYS = ('hostfile', 'job.json', 'ds_config.json', ENTRYPOINT)


def service_name(cluster):
    return cluster['name']


def pod_dns(cluster, ordinal):
    """<name>-<i>.<service>.<namespace>.svc.<domain>: the headless Service's name of a pod."""
    return '%s-%d.%s.%s.svc.%s' % (cluster['name'], ordinal, service_name(cluster), cluster['namespace'],
                                   cluster['cluster_domain'])


def pods(cluster):
    """[{name, ordinal, address (DNS name), slots}] in ordinal order."""
    return [{'name': '%s-%d' % (cluster['name'], i), 'ordinal': i, 'address': pod_dns(cluster, i),
             'slots': cluster['pod_slots'].get(i, cluster['slots_per_pod'])}
            for i in range(cluster['replicas'])]
