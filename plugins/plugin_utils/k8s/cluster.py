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

import os
import re

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults
from ansible_collections.gpucluster.multinode.plugins.module_utils.hostfile import type_name
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import failure_policy

# The API server's rules (k8s.io/apimachinery/pkg/util/validation): an RFC 1035 label (a Service
# name: a letter first), an RFC 1123 label (namespaces: digits first allowed), an RFC 1123 subdomain,
# label keys (optional subdomain prefix, "/", a name of at most 63) and label values.
DNS_LABEL_RE = re.compile(r'^[a-z]([-a-z0-9]*[a-z0-9])?$')
DNS1123_LABEL_RE = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')
DNS_SUBDOMAIN_RE = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')
QUALIFIED_NAME_RE = re.compile(r'^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$')
LABEL_MAX = 63
SUBDOMAIN_MAX = 253
QUANTITY_RE = re.compile(r'^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$')
RESOURCE_NAME_RE = re.compile(r'^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')
ENV_NAME_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
# NCCL_IB_HCA: an optional "^" (exclude these) then an optional "=" (exact names, not prefixes: mlx5_1
# would also match mlx5_10), then device[:port] items separated by commas.
HCA_RE = re.compile(r'^\^?=?[A-Za-z0-9_]+(:[0-9]+)?(,[A-Za-z0-9_]+(:[0-9]+)?)*$')
HCA_ITEM_RE = re.compile(r'^[A-Za-z0-9_]+(:[0-9]+)?$')
IMAGE_USER_RE = re.compile(r'^[^:\s]+(:[^:\s]+)?$')
MAX_ID = 2 ** 31 - 1
DEFAULT_ID = 1000       # plain Kubernetes: runAsUser/runAsGroup/fsGroup unless the cluster file says otherwise
MAX_NAME = 52           # a StatefulSet name longer than 52 breaks its controller-revision-hash label
MAX_REPLICAS = 1024
NETWORK_MODES = ('tcp', 'rdma')
STORAGE_MODES = ('rwx', 'per-pod')
DEFAULT_IFNAME = {'tcp': 'eth0', 'rdma': 'net1'}
CONFIG_DIR = '/etc/gpucluster'
ENTRYPOINT = 'k8s_pod.py'
# the supervision core the entrypoint imports (plugins/module_utils/training/supervision.py), beside it
CORE = 'supervision.py'
# the entrypoint's parts (the k8s role's files), beside it in the ConfigMap: it imports them by their names
AGENT_MODULES = ('pod_agent.py', 'pod_driver.py', 'pod_cluster.py', 'pod_job.py', 'pod_checks.py', 'pod_progress.py',
                 'pod_net.py')
# The label keys that select a cluster's pods: the collection sets them (manifests.labels), a cluster
# file's labels may not (roles/k8s/tasks/validate.yml spells the same selector).
NAME_LABEL = 'app.kubernetes.io/name'
INSTANCE_LABEL = 'app.kubernetes.io/instance'


def get_path(obj, *path, default=None):
    """obj[path[0]][path[1]]... of an object read from YAML or JSON (a key, or an index into a list);
    default when a step is missing or None."""
    for key in path:
        if isinstance(obj, dict):
            obj = obj.get(key)
        elif isinstance(obj, list) and isinstance(key, int) and key < len(obj):
            obj = obj[key]
        else:
            return default
        if obj is None:
            return default
    return obj


class ClusterFileError(ValueError):
    """A bad cluster file; the message names the file and the field."""


def _kind(value):
    """The type name of a value of the cluster file, null for YAML's null."""
    return 'null' if value is None else type_name(value)


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

    def dns(self, value, field, kind, empty=False, limit=None, why=None):
        """A name as the API server checks it: kind is 'label' (RFC 1123, digits first allowed, at most
        63), 'service' (RFC 1035: a letter first, at most 63) or 'subdomain' (RFC 1123, at most 253).
        limit, why: a lower bound that another object puts on the name, and the reason, so one refusal
        gives the real bound."""
        pattern, own, hint = {
            'label': (DNS1123_LABEL_RE, LABEL_MAX, 'a DNS-1123 label (lower case letters, digits and "-", '
                      'a letter or digit at both ends)'),
            'service': (DNS_LABEL_RE, LABEL_MAX, 'a DNS-1035 label (lower case letters, digits and "-", '
                        'a letter first: it names a Service)'),
            'subdomain': (DNS_SUBDOMAIN_RE, SUBDOMAIN_MAX, 'a DNS-1123 subdomain (lower case letters, digits, '
                          '"-" and ".")'),
        }[kind]
        self.string(value, field, pattern, hint, empty=empty)
        if why is not None and limit is not None and limit < own:
            own, reason = limit, why
        else:
            reason = hint.split(' (')[0]
        if len(value) > own:
            self.fail(field, 'must be at most %d characters (%s), got %d: %r' % (own, reason, len(value), value))
        return value

    def label_key(self, key, field):
        """A label (or node selector, toleration) key: [prefix/]name, prefix a subdomain of at most 253,
        name at most 63 of letters, digits, "-", "_", "." with a letter or digit at both ends."""
        if not isinstance(key, str) or not key:
            self.fail(field, 'must be a label key such as "example.com/team", got %r (%s)' % (key, _kind(key)))
        prefix, _, name = key.rpartition('/')
        if '/' in key and (not prefix or len(prefix) > SUBDOMAIN_MAX or not DNS_SUBDOMAIN_RE.match(prefix)):
            self.fail(field, 'has the prefix %r, which must be a DNS-1123 subdomain of at most %d characters'
                      % (prefix, SUBDOMAIN_MAX))
        if len(name) > LABEL_MAX or not QUALIFIED_NAME_RE.match(name):
            self.fail(field, 'must be a label key: a name of at most %d letters, digits, "-", "_" or "." '
                      '(a letter or digit at both ends), optionally after a DNS subdomain and "/", got %r'
                      % (LABEL_MAX, key))
        return key

    def label_value(self, value, field):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(field, 'must be a string, got %r (%s)' % (value, _kind(value)))
        value = str(value)
        if value and (len(value) > LABEL_MAX or not QUALIFIED_NAME_RE.match(value)):
            self.fail(field, 'must be a label value: empty or at most %d letters, digits, "-", "_" or "." '
                      '(a letter or digit at both ends), got %r' % (LABEL_MAX, value))
        return value

    def label_map(self, value, field):
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(field, 'must be a mapping of label keys to values, got %r (%s)' % (value, _kind(value)))
        return {self.label_key(k, '%s.%s' % (field, k)): self.label_value(v, '%s.%s' % (field, k))
                for k, v in value.items()}

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
       'train', 'nccl', 'files', 'labels', 'network_policy', 'security', 'affinity', 'anti_affinity',
       'priority_class', 'workload')
WORKLOADS = ('statefulset', 'jobset')
JOBSET_JOB = 'node'     # the JobSet's one replicated Job: its pods are <name>-node-0-<i>
RESTART_STRATEGIES = ('BlockingRecreate', 'Recreate')
NETWORK = ('mode', 'rdma_resource', 'rdma_resource_count', 'ib_hca', 'attachment', 'attachment_config',
           'socket_ifname', 'ib_gid_index')
STORAGE = ('mode', 'storage_class', 'size', 'mount_path', 'claim_name')
TRAIN = ('command', 'deepspeed_config', 'env', 'peer_wait', 'master_port', 'agent_port', 'python',
         'deepspeed', 'workdir', 'restarts', 'resume_args', 'failure_policy', 'lost_pod_wait', 'spares',
         'min_pods', 'unreachable_after', 'restart_strategy', 'stall_seconds', 'checkpoint_seconds', 'progress_regex')
# train.failure_policy: what kind of failure restarts the job (as JobSet's failurePolicy rules): the pod
# agent's kinds, and the actions (RestartJobSet, RestartJobSetAndIgnoreMaxRestarts, FailJobSet).
FAILURE_KINDS = failure_policy.KINDS
NCCL = ('debug', 'extra')
RESOURCES = ('cpu', 'memory', 'qos')
QOS = ('Guaranteed', 'BestEffort')
SECURITY = ('run_as_user', 'run_as_group', 'fs_group', 'image_user', 'supplemental_groups')
ANTI_AFFINITY = ('preferred', 'required', 'none')
UNITS = {'': 1, 'k': 10 ** 3, 'M': 10 ** 6, 'G': 10 ** 9, 'T': 10 ** 12, 'P': 10 ** 15, 'E': 10 ** 18,
         'Ki': 2 ** 10, 'Mi': 2 ** 20, 'Gi': 2 ** 30, 'Ti': 2 ** 40, 'Pi': 2 ** 50, 'Ei': 2 ** 60}


def quantity_bytes(text):
    """The number of a Kubernetes quantity (checked by QUANTITY_RE): '16Gi' -> 17179869184."""
    match = re.match(r'^([0-9.]+)([A-Za-z]*)$', str(text))
    return float(match.group(1)) * UNITS[match.group(2)]


def image_user_verdict(user):
    """What the kubelet says of an image's USER under runAsNonRoot without runAsUser: '' when it
    starts, else its refusal (kuberuntime_container_linux.go verifyRunAsNonRoot)."""
    uid = (user or '').split(':', 1)[0]
    if uid in ('', '0'):
        return 'container has runAsNonRoot and image will run as root'
    if not uid.isdigit():
        return 'container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root' % uid
    return ''


TOLERATION = ('key', 'operator', 'value', 'effect', 'tolerationSeconds')


def check(data, where='cluster file'):
    """The cluster settings with defaults filled in; raises ClusterFileError naming where and the field."""
    c = _Checker(where)
    data = c.mapping(data, '', TOP)
    for field in ('name', 'namespace', 'image'):
        if field not in data:
            c.fail(field, 'is required')
    out = {}
    out['name'] = c.dns(data['name'], 'name', 'service', limit=MAX_NAME,
                        why='a DNS-1035 label; the StatefulSet labels its pods controller-revision-hash=<name>-'
                            '<10-character hash>, and a label value is at most 63')
    out['namespace'] = c.dns(data['namespace'], 'namespace', 'label')
    out['context'] = c.string(data.get('context', ''), 'context', empty=True)
    out['kubeconfig'] = c.string(data.get('kubeconfig', ''), 'kubeconfig', empty=True)
    out['cluster_domain'] = c.dns(data.get('cluster_domain', 'cluster.local'), 'cluster_domain', 'subdomain')
    out['replicas'] = c.integer(data.get('replicas', 2), 'replicas', 1, MAX_REPLICAS)
    out['workload'] = c.choice(data.get('workload', 'statefulset'), 'workload', WORKLOADS)
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
    for index, secret in enumerate(out['image_pull_secrets']):
        c.dns(secret, 'image_pull_secrets[%d]' % index, 'subdomain')

    net = c.mapping(data.get('network'), 'network', NETWORK)
    mode = c.choice(net.get('mode', 'tcp'), 'network.mode', NETWORK_MODES)
    network = {'mode': mode}
    network['socket_ifname'] = c.string(net.get('socket_ifname', DEFAULT_IFNAME[mode]), 'network.socket_ifname',
                                        re.compile(r'^[A-Za-z0-9_.:-]{1,15}$'), 'an interface name')
    # unset unless given: NCCL picks the GID itself (RoCE v2 where there is one), usually right
    network['ib_gid_index'] = (None if net.get('ib_gid_index') is None
                               else c.integer(net['ib_gid_index'], 'network.ib_gid_index', 0, 255))
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
            items = c.str_list(hca, 'network.ib_hca', empty=False)
            for index, item in enumerate(items):
                if not HCA_ITEM_RE.match(item.lstrip('^=') if index == 0 else item):
                    c.fail('network.ib_hca[%d]' % index, 'must be an HCA name with an optional :port such as '
                           '"mlx5_1:1" ("^" and "=" go before the first one only), got %r' % item)
            hca = ','.join(items)
        network['ib_hca'] = c.string(hca, 'network.ib_hca', HCA_RE,
                                     'NCCL_IB_HCA: HCA names with optional :port, comma-separated, after an '
                                     'optional "^" (exclude) and "=" (exact names), such as "=mlx5_0:1,mlx5_1:1"')
        attachment = c.string(net['attachment'], 'network.attachment')
        att_ns, _, att_name = attachment.rpartition('/')
        if att_ns or '/' in attachment:
            c.dns(att_ns, 'network.attachment', 'label')
        c.dns(att_name, 'network.attachment', 'subdomain')
        network['attachment'] = attachment
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
    storage['storage_class'] = c.dns(sto.get('storage_class', ''), 'storage.storage_class', 'subdomain', empty=True)
    storage['size'] = c.quantity(sto.get('size', '100Gi'), 'storage.size')
    storage['mount_path'] = c.string(sto.get('mount_path', '/shared'), 'storage.mount_path',
                                     re.compile(r'^/[^\s]*$'), 'an absolute path')
    if storage['mount_path'] in ('/', '/dev/shm', CONFIG_DIR):
        c.fail('storage.mount_path', 'must not be %s' % storage['mount_path'])
    storage['claim_name'] = c.dns(sto.get('claim_name', ''), 'storage.claim_name', 'subdomain', empty=True)
    if storage['claim_name'] and smode != 'rwx':
        c.fail('storage.claim_name', 'names an existing ReadWriteMany claim; it needs storage.mode rwx')
    out['storage'] = storage
    out['shm_size'] = c.quantity(data.get('shm_size', '16Gi'), 'shm_size')
    out['node_selector'] = c.label_map(data.get('node_selector'), 'node_selector')
    out['labels'] = c.label_map(data.get('labels'), 'labels')
    for reserved in (NAME_LABEL, INSTANCE_LABEL):
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
        if tol.get('key'):
            item['key'] = c.label_key(tol['key'], field + '.key')
        if 'value' in tol:
            item['value'] = c.label_value(tol['value'], field + '.value')
        if 'operator' in tol:
            item['operator'] = c.choice(tol['operator'], field + '.operator', ('Exists', 'Equal'))
        if 'effect' in tol:
            item['effect'] = c.choice(tol['effect'], field + '.effect', ('NoSchedule', 'PreferNoSchedule', 'NoExecute'))
        if 'tolerationSeconds' in tol:
            item['tolerationSeconds'] = c.integer(tol['tolerationSeconds'], field + '.tolerationSeconds', 0, 10 ** 9)
        out['tolerations'].append(item)
    out['openshift'] = c.boolean(data.get('openshift', False), 'openshift')
    out['network_policy'] = c.boolean(data.get('network_policy', True), 'network_policy')
    out['security'] = _security(c, data.get('security'), out['openshift'])
    out['resources'] = _resources(c, data.get('resources'), out['shm_size'])
    affinity = data.get('affinity')
    if affinity is not None and not isinstance(affinity, dict):
        c.fail('affinity', 'must be a pod affinity mapping (nodeAffinity, podAffinity, podAntiAffinity), got %r (%s)'
               % (affinity, _kind(affinity)))
    out['affinity'] = affinity
    out['anti_affinity'] = c.choice(data.get('anti_affinity', 'preferred'), 'anti_affinity', ANTI_AFFINITY)
    if affinity is not None and 'anti_affinity' in data:
        c.fail('anti_affinity', 'is set together with affinity, which replaces the rendered anti-affinity; '
               'put the podAntiAffinity into affinity')
    out['priority_class'] = c.dns(data.get('priority_class', ''), 'priority_class', 'subdomain', empty=True)

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
    job['restarts'] = c.integer(train.get('restarts', 0), 'train.restarts', 0, 100)
    job['resume_args'] = c.str_list(train.get('resume_args', []), 'train.resume_args')
    job['failure_policy'] = _failure_policy(c, train.get('failure_policy', []))
    if job['resume_args'] and not job['restarts'] and not any(
            r['action'] == 'restart_uncounted' for r in job['failure_policy']):
        c.fail('train.resume_args', 'are added when the job is restarted; they need train.restarts 1 or more')
    job['lost_pod_wait'] = c.integer(train.get('lost_pod_wait', 60), 'train.lost_pod_wait', 5, 86400)
    job['unreachable_after'] = c.integer(train.get('unreachable_after', 30), 'train.unreachable_after', 5, 3600)
    # a stall, as the training role judges it (training_stall_seconds, training_checkpoint_seconds,
    # training_progress_regex): every part quiet (no step line, no heartbeat) for stall_seconds; 0: no stall
    job['stall_seconds'] = c.integer(train.get('stall_seconds', 600), 'train.stall_seconds', 0, 7 * 86400)
    job['checkpoint_seconds'] = c.integer(train.get('checkpoint_seconds', 1800), 'train.checkpoint_seconds', 1,
                                          7 * 86400)
    job['progress_regex'] = c.string(train.get('progress_regex', 'step [0-9]+ loss'), 'train.progress_regex')
    try:
        re.compile(job['progress_regex'])
    except re.error as exc:
        c.fail('train.progress_regex', 'is not a regular expression (%s): %r' % (exc, job['progress_regex']))
    # the last train.spares pods of the StatefulSet wait, each ready to take a lost pod's place (and its slots:
    # every pod has the same resources) at a restart
    job['spares'] = c.integer(train.get('spares', 0), 'train.spares', 0, out['replicas'] - 1)
    working = out['replicas'] - job['spares']
    job['min_pods'] = c.integer(train.get('min_pods', working), 'train.min_pods', 1, working)
    # JobSet's failurePolicy.restartStrategy: BlockingRecreate deletes every pod of an attempt before the next
    job['restart_strategy'] = c.choice(train.get('restart_strategy', 'BlockingRecreate'), 'train.restart_strategy',
                                       RESTART_STRATEGIES)
    if out['workload'] == 'jobset':
        _jobset_limits(c, out, job, storage)
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
        c.string(key, 'files', re.compile(r'^[-._a-zA-Z0-9]{1,253}$'), 'a ConfigMap key (letters, digits, - _ .)')
        if key in RESERVED_KEYS:
            c.fail('files.' + key, 'is a key the collection writes itself')
        out['files'][key] = c.string(path, 'files.' + key)
    return out


RESERVED_KEYS = ('hostfile', 'job.json', 'ds_config.json', ENTRYPOINT, CORE) + AGENT_MODULES


def role_files():
    """roles/k8s/files of this collection."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, '..', '..', '..', 'roles', 'k8s', 'files'))


def _failure_policy(c, value):
    """train.failure_policy: rules in order, the first that matches a failure decides (JobSet's rules):
    on (kinds), exit_codes (with exit only, optional), action (plugin_utils/failure_policy.py, the training
    role's rules too)."""
    try:
        return failure_policy.read(value, 'train.failure_policy', FAILURE_KINDS)
    except failure_policy.PolicyError as exc:
        c.fail(exc.field, exc.text)


def _supplemental_groups(c, value):
    """Groups the pods' processes get besides their own (supplementalGroups): the group that owns a
    ReadWriteMany volume where the storage driver does not apply fsGroup (NFS, CephFS and most others)."""
    if not isinstance(value, list):
        c.fail('security.supplemental_groups', 'must be a list of group ids, got %r (%s)' % (value, _kind(value)))
    groups = [c.integer(g, 'security.supplemental_groups[%d]' % i, 1, MAX_ID) for i, g in enumerate(value)]
    if len(set(groups)) != len(groups):
        c.fail('security.supplemental_groups', 'lists a group twice: %s' % groups)
    return groups


def _security(c, data, openshift):
    """runAsUser/runAsGroup/fsGroup of the pods. Plain Kubernetes: a numeric non-root uid (1000 unless
    set), so any image starts under runAsNonRoot, or run_as_user: image with the image's USER
    (image_user, e.g. from podman image inspect), refused where the kubelet would refuse it. OpenShift:
    none (restricted-v2 assigns them from the namespace's range)."""
    sec = c.mapping(data, 'security', SECURITY)
    out = {'run_as_user': None, 'run_as_group': None, 'fs_group': None, 'image_user': None,
           'supplemental_groups': _supplemental_groups(c, sec.get('supplemental_groups', []))}
    if openshift:
        for key in ('run_as_user', 'run_as_group', 'fs_group'):
            if sec.get(key) is not None:
                c.fail('security.' + key, 'is set but openshift is true: restricted-v2 assigns the uid, gid and '
                       'fsGroup from the namespace range (remove it)')
        if sec.get('image_user') is not None:
            out['image_user'] = c.string(sec['image_user'], 'security.image_user', IMAGE_USER_RE, 'user[:group]')
        return out
    user = sec.get('run_as_user', DEFAULT_ID)
    if user == 'image':
        if sec.get('image_user') is None:
            c.fail('security.image_user', 'is required with run_as_user: image (the image\'s USER, as '
                   'podman image inspect --format "{{.Config.User}}" IMAGE prints it; "" for root)')
        image_user = c.string(sec['image_user'], 'security.image_user', IMAGE_USER_RE, 'user[:group]', empty=True)
        verdict = image_user_verdict(image_user)
        if verdict:
            c.fail('security.image_user', '%r: the kubelet refuses the pod (%s); set security.run_as_user to a '
                   'number or build the image with a numeric non-root USER' % (image_user, verdict))
        out['image_user'] = image_user
        uid, _, gid = image_user.partition(':')
        default_group = int(gid) if gid.isdigit() else None
    else:
        if user == 0 and not isinstance(user, bool):
            c.fail('security.run_as_user', 'is 0 (root): the pods run with runAsNonRoot; use a uid of 1 or more, '
                   'or image')
        out['run_as_user'] = c.integer(user, 'security.run_as_user', 1, MAX_ID)
        default_group = sec.get('run_as_group', DEFAULT_ID)
    group = sec.get('run_as_group', default_group)
    out['run_as_group'] = None if group is None else c.integer(group, 'security.run_as_group', 0, MAX_ID)
    fs_group = sec.get('fs_group', out['run_as_group'])
    out['fs_group'] = None if fs_group is None else c.integer(fs_group, 'security.fs_group', 0, MAX_ID)
    return out


def _resources(c, data, shm_size):
    """cpu and memory, requests = limits (Guaranteed QoS: evicted last) unless qos: BestEffort."""
    res = c.mapping(data, 'resources', RESOURCES)
    qos = c.choice(res.get('qos', 'Guaranteed'), 'resources.qos', QOS)
    out = {'qos': qos}
    if qos == 'BestEffort':
        for key in ('cpu', 'memory'):
            if key in res:
                c.fail('resources.' + key, 'is set but resources.qos is BestEffort (no requests, no limits)')
        return out
    for key in ('cpu', 'memory'):
        if key not in res:
            c.fail('resources.' + key, 'is required: the pods get requests = limits (Guaranteed QoS, evicted last); '
                   'set resources.cpu and resources.memory (the memory counts /dev/shm, shm_size), or '
                   'resources.qos: BestEffort')
        out[key] = c.quantity(res[key], 'resources.' + key)
    if quantity_bytes(out['memory']) <= quantity_bytes(shm_size):
        c.fail('resources.memory', 'is %s but /dev/shm alone may hold shm_size %s: a memory emptyDir is counted in '
               'the container\'s memory limit (raise resources.memory above shm_size)' % (out['memory'], shm_size))
    return out


def _jobset_limits(c, out, job, storage):
    """What a JobSet cannot do of the cluster file, refused naming the field."""
    if job['spares']:
        c.fail('train.spares', 'needs workload: statefulset (a JobSet recreates every pod at a restart: no pod waits '
                               'as a spare)')
    if job['min_pods'] != out['replicas']:
        c.fail('train.min_pods', 'needs workload: statefulset (a JobSet restarts the job on all its pods)')
    if storage['mode'] != 'rwx':
        c.fail('storage.mode', 'must be rwx with workload: jobset (a Job has no volumeClaimTemplates)')
    longest = len('%s-%s-0-%d' % (out['name'], JOBSET_JOB, out['replicas'] - 1))
    if longest > 63:
        c.fail('name', 'is too long for workload: jobset: its last pod\'s hostname %s-%s-0-%d would have %d characters '
                       '(at most 63)' % (out['name'], JOBSET_JOB, out['replicas'] - 1, longest))
    jobset_failure_rules(job['failure_policy'], c)


# the launcher's exit code when a rank was killed by a signal: 128+N from a shell, 256-N from DeepSpeed's launcher
_SIGNALS = (1, 2, 6, 7, 9, 11, 15)
SIGNAL_EXIT_CODES = sorted({128 + n for n in _SIGNALS} | {256 - n for n in _SIGNALS})
JOBSET_ACTIONS = {'restart': 'RestartJobSet', 'restart_uncounted': 'RestartJobSetAndIgnoreMaxRestarts',
                  'fail': 'FailJobSet'}


def jobset_failure_rules(policy, c=None):
    """train.failure_policy as a JobSet says it: (the Job's podFailurePolicy rules, the JobSet's failurePolicy
    rules). Each rule becomes a podFailurePolicy rule that fails the Job (exit codes: the container's; signal:
    the launcher's codes for a rank killed by a signal; restarted and unreachable: the pod's DisruptionTarget
    condition, an eviction, a preemption or a lost node); the JobSet sees such a failure as reason
    PodFailurePolicy, so the rules may have one action only. c: the checker that refuses what cannot be said."""
    pod_rules, actions = [], []
    for index, rule in enumerate(policy):
        kinds = rule['on']
        if 'stalled' in kinds:
            if c:
                c.fail('train.failure_policy[%d].on' % index, 'names stalled: a JobSet\'s pods run their ranks with no '
                       'agent, nothing reads their steps, and no stall is seen (workload: statefulset has it)')
            continue
        if ('exit' in kinds or 'signal' in kinds) and ('unreachable' in kinds or 'restarted' in kinds):
            if c:
                c.fail('train.failure_policy[%d].on' % index, 'mixes exit codes and pod conditions, which a Job\'s '
                       'podFailurePolicy rule cannot: split it in two rules (workload: jobset)')
            continue
        if 'exit' in kinds or 'signal' in kinds:
            codes = list(rule.get('exit_codes') or [])
            if 'signal' in kinds:
                codes += SIGNAL_EXIT_CODES
            requirement = {'onExitCodes': {'containerName': 'trainer', 'operator': 'In', 'values': sorted(set(codes))}}
            if not codes:       # any exit that is not 0
                requirement = {'onExitCodes': {'containerName': 'trainer', 'operator': 'NotIn', 'values': [0]}}
        else:
            requirement = {'onPodConditions': [{'type': 'DisruptionTarget', 'status': 'True'}]}
        pod_rules.append(dict({'action': 'FailJob'}, **requirement))
        actions.append(JOBSET_ACTIONS[rule['action']])
    if len(set(actions)) > 1:
        if c:
            c.fail('train.failure_policy', 'has actions %s: a JobSet sees every podFailurePolicy failure as reason '
                   'PodFailurePolicy and cannot tell them apart; keep one action (workload: jobset) or use workload: '
                   'statefulset' % ', '.join(sorted({r['action'] for r in policy})))
        return pod_rules, []
    rules = [{'name': 'trainFailurePolicy', 'action': actions[0], 'onJobFailureReasons': ['PodFailurePolicy']}] \
        if actions else []
    return pod_rules, rules


def service_name(cluster):
    return cluster['name']


def pod_dns(cluster, ordinal):
    """<name>-<i>.<service>.<namespace>.svc.<domain>: the headless Service's name of a pod."""
    return '%s.%s.%s.svc.%s' % (pod_name(cluster, ordinal), service_name(cluster), cluster['namespace'],
                                cluster['cluster_domain'])


def pod_name(cluster, ordinal):
    """A pod's hostname: <name>-<i> (StatefulSet), <name>-node-0-<i> (JobSet, its Job's completion index i)."""
    if cluster.get('workload') == 'jobset':
        return '%s-%s-0-%d' % (cluster['name'], JOBSET_JOB, ordinal)
    return '%s-%d' % (cluster['name'], ordinal)


def pods(cluster):
    """[{name, ordinal, address (DNS name), slots}] in ordinal order."""
    return [{'name': pod_name(cluster, i), 'ordinal': i, 'address': pod_dns(cluster, i),
             'slots': cluster['pod_slots'].get(i, cluster['slots_per_pod'])}
            for i in range(cluster['replicas'])]
