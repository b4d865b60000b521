# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The Kubernetes objects of a training cluster, rendered from a checked cluster file, and the
semantic checks every rendered (or hand-edited) set of objects must pass.

render() returns the objects in apply order: ServiceAccount, (OpenShift) SecurityContextConstraints,
Role and RoleBinding, (RDMA) NetworkAttachmentDefinition, NetworkPolicy, ConfigMap, PersistentVolumeClaim
(rwx), headless Service, StatefulSet. problems() reads a list of objects the way the cluster will and
returns one line per inconsistency (selector and template labels, serviceName, hostfile against
replicas and slots, /dev/shm, RDMA and TCP settings, OpenShift's restricted-v2 rules).
"""

from __future__ import annotations

import copy
import json
import os

from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import supervision
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s.cluster import get_path

RDMA_SCC_REASON = ('IPC_LOCK (RDMA memory registration pins pages) is not allowed by restricted-v2; '
                   'this SCC is restricted-v2 plus IPC_LOCK in allowedCapabilities (drop ALL, non-root, '
                   'no privilege escalation)')
SHM_VOLUME = 'dshm'
HOME_VOLUME = 'home'
HOME_DIR = '/home/gpucluster'   # an emptyDir: writable by any uid (OpenShift's random one), kept across restarts
CONFIG_VOLUME = 'gpucluster-config'
DATA_VOLUME = 'data'
AGENT_PORT_NAME = 'agent'
MASTER_PORT_NAME = 'master'
MANAGED_BY = 'gpucluster.multinode'


def labels(cluster):
    """The labels that select the pods (and mark every object the collection made)."""
    return {kc.NAME_LABEL: 'gpucluster-training', kc.INSTANCE_LABEL: cluster['name']}


def _meta(cluster, name, namespaced=True):
    meta = {'name': name, 'labels': dict(cluster['labels'], **labels(cluster),
                                         **{'app.kubernetes.io/managed-by': MANAGED_BY})}
    if namespaced:
        meta['namespace'] = cluster['namespace']
    return meta


def hostfile_text(cluster):
    """The DeepSpeed hostfile of the pods' DNS names and slots (through the collection's renderer)."""
    hosts = hf.normalize([{'name': p['address'], 'slots': p['slots']} for p in kc.pods(cluster)])
    return hf.render(hosts, 'deepspeed')


def job_settings(cluster):
    """job.json in the ConfigMap: what the pod entrypoint needs besides the environment."""
    train = cluster['train']
    return {
        'name': cluster['name'], 'service': kc.service_name(cluster), 'namespace': cluster['namespace'],
        'cluster_domain': cluster['cluster_domain'], 'replicas': cluster['replicas'],
        'pods': [{'name': p['name'], 'address': p['address'], 'slots': p['slots']} for p in kc.pods(cluster)],
        'command': train['command'], 'python': train['python'], 'deepspeed': train['deepspeed'],
        'master_port': train['master_port'], 'agent_port': train['agent_port'], 'peer_wait': train['peer_wait'],
        'workdir': train['workdir'], 'config_dir': kc.CONFIG_DIR,
        'deepspeed_config': 'ds_config.json' if train['deepspeed_config'] else None,
        'network_mode': cluster['network']['mode'], 'restarts': train['restarts'],
        'resume_args': train['resume_args'], 'failure_policy': train['failure_policy'],
        'lost_pod_wait': train['lost_pod_wait'], 'unreachable_after': train['unreachable_after'],
        'stall_seconds': train['stall_seconds'], 'checkpoint_seconds': train['checkpoint_seconds'],
        'progress_regex': train['progress_regex'],
        'spares': train['spares'], 'min_pods': train['min_pods'],
        # each pod's part (state and log) on the volume: a restarted container knows what it ran
        'state_dir': '%s/.gpucluster/jobs' % cluster['storage']['mount_path'].rstrip('/'),
        # what the agent checks it can write before a job starts, and names when it cannot
        'mount_path': cluster['storage']['mount_path'],
        'claim': claim_name(cluster) if cluster['storage']['mode'] == 'rwx' else '<per-pod volume>',
        'fs_group': cluster['security'].get('fs_group'),
    }


def scc_name(cluster):
    """The SCC the pods use: restricted-v2 (tcp), or <namespace>-<name>-rdma (cluster-scoped: the
    namespace in its name keeps two namespaces' clusters of one name apart)."""
    if cluster['network']['mode'] != 'rdma':
        return 'restricted-v2'
    return '%s-%s-rdma' % (cluster['namespace'], cluster['name'])


def needs_admin(cluster):
    """OpenShift with RDMA: the SCC and the grant of its use are a cluster administrator's to apply."""
    return cluster['openshift'] and cluster['network']['mode'] == 'rdma'


def _container_security(cluster):
    caps = {'drop': ['ALL']}
    if cluster['network']['mode'] == 'rdma':
        caps['add'] = ['IPC_LOCK']
    return {'allowPrivilegeEscalation': False, 'capabilities': caps, 'runAsNonRoot': True,
            'seccompProfile': {'type': 'RuntimeDefault'}}


def _pod_security(cluster):
    sec = cluster['security']
    out = {'runAsNonRoot': True, 'seccompProfile': {'type': 'RuntimeDefault'},
           # a large claim is not re-chowned at every pod start, only when its root is not the fsGroup's
           'fsGroupChangePolicy': 'OnRootMismatch'}
    for key, field in (('runAsUser', 'run_as_user'), ('runAsGroup', 'run_as_group'), ('fsGroup', 'fs_group')):
        if sec.get(field) is not None:
            out[key] = sec[field]
    if sec.get('supplemental_groups'):
        out['supplementalGroups'] = list(sec['supplemental_groups'])
    return out


def _affinity(cluster):
    if cluster['affinity'] is not None:
        return cluster['affinity']
    if cluster['anti_affinity'] == 'none':
        return None
    term = {'labelSelector': {'matchLabels': labels(cluster)}, 'topologyKey': 'kubernetes.io/hostname'}
    if cluster['anti_affinity'] == 'required':
        return {'podAntiAffinity': {'requiredDuringSchedulingIgnoredDuringExecution': [term]}}
    return {'podAntiAffinity': {'preferredDuringSchedulingIgnoredDuringExecution': [
        {'weight': 100, 'podAffinityTerm': term}]}}


def _env_list(env):
    return [{'name': k, 'value': str(v)} for k, v in env.items()]


def _resources(cluster):
    limits, requests = {}, {}
    if cluster['gpus_per_pod']:
        limits[cluster['gpu_resource']] = str(cluster['gpus_per_pod'])
        requests[cluster['gpu_resource']] = str(cluster['gpus_per_pod'])
    if cluster['network']['mode'] == 'rdma':
        count = str(cluster['network']['rdma_resource_count'])
        limits[cluster['network']['rdma_resource']] = count
        requests[cluster['network']['rdma_resource']] = count
    for key in ('cpu', 'memory'):
        if key in cluster['resources']:
            limits[key] = cluster['resources'][key]
            requests[key] = cluster['resources'][key]
    out = {}
    if limits:
        out['limits'] = limits
    if requests:
        out['requests'] = requests
    return out


def pod_environment(cluster, nccl_env):
    """The container's variables: the NCCL/gloo environment, the pod identity, the job's own."""
    env = dict(nccl_env)
    # a uid the image does not know (OpenShift's, or runAsUser) has no writable home: HOME and the
    # caches torch, DeepSpeed's JIT and Triton write go to an emptyDir
    env['HOME'] = HOME_DIR
    env['XDG_CACHE_HOME'] = HOME_DIR + '/.cache'
    env['GPUCLUSTER_CONFIG_DIR'] = kc.CONFIG_DIR
    env['PYTHONUNBUFFERED'] = '1'
    env.update(cluster['train']['env'])
    return env


def statefulset(cluster, nccl_env):
    name = cluster['name']
    train = cluster['train']
    env = _env_list(pod_environment(cluster, nccl_env))
    env.insert(0, {'name': 'GPUCLUSTER_POD_NAME', 'valueFrom': {'fieldRef': {'fieldPath': 'metadata.name'}}})
    env.insert(1, {'name': 'GPUCLUSTER_POD_NAMESPACE', 'valueFrom': {'fieldRef': {'fieldPath': 'metadata.namespace'}}})
    env.insert(2, {'name': 'GPUCLUSTER_POD_IP', 'valueFrom': {'fieldRef': {'fieldPath': 'status.podIP'}}})
    env.insert(3, {'name': 'GPUCLUSTER_NODE_NAME', 'valueFrom': {'fieldRef': {'fieldPath': 'spec.nodeName'}}})
    mounts = [{'name': CONFIG_VOLUME, 'mountPath': kc.CONFIG_DIR, 'readOnly': True},
              {'name': SHM_VOLUME, 'mountPath': '/dev/shm'},
              {'name': HOME_VOLUME, 'mountPath': HOME_DIR},
              {'name': DATA_VOLUME, 'mountPath': cluster['storage']['mount_path']}]
    container = {
        'name': 'trainer', 'image': cluster['image'], 'imagePullPolicy': cluster['image_pull_policy'],
        'command': [train['python'], '%s/%s' % (kc.CONFIG_DIR, kc.ENTRYPOINT), 'agent'],
        'workingDir': train['workdir'],
        'env': env,
        'ports': [{'name': AGENT_PORT_NAME, 'containerPort': train['agent_port'], 'protocol': 'TCP'},
                  {'name': MASTER_PORT_NAME, 'containerPort': train['master_port'], 'protocol': 'TCP'}],
        'readinessProbe': {'tcpSocket': {'port': AGENT_PORT_NAME}, 'periodSeconds': 5, 'failureThreshold': 3},
        'securityContext': _container_security(cluster),
        'volumeMounts': mounts,
    }
    resources = _resources(cluster)
    if resources:
        container['resources'] = resources
    volumes = [
        {'name': CONFIG_VOLUME, 'configMap': {'name': '%s-config' % name, 'defaultMode': 0o555}},
        {'name': SHM_VOLUME, 'emptyDir': {'medium': 'Memory', 'sizeLimit': cluster['shm_size']}},
        {'name': HOME_VOLUME, 'emptyDir': {}},
    ]
    spec = {
        'serviceAccountName': name,
        'automountServiceAccountToken': False,
        'securityContext': _pod_security(cluster),
        'terminationGracePeriodSeconds': 30,
        'containers': [container],
        'volumes': volumes,
    }
    if cluster['node_selector']:
        spec['nodeSelector'] = dict(cluster['node_selector'])
    affinity = _affinity(cluster)
    if affinity:
        spec['affinity'] = affinity
    if cluster['priority_class']:
        spec['priorityClassName'] = cluster['priority_class']
    if cluster['tolerations']:
        spec['tolerations'] = [dict(t) for t in cluster['tolerations']]
    if cluster['image_pull_secrets']:
        spec['imagePullSecrets'] = [{'name': s} for s in cluster['image_pull_secrets']]
    template_meta = {'labels': dict(cluster['labels'], **labels(cluster))}
    if cluster['network']['mode'] == 'rdma':
        template_meta['annotations'] = {'k8s.v1.cni.cncf.io/networks': cluster['network']['attachment']}
    sts_spec = {
        'serviceName': kc.service_name(cluster),
        'replicas': cluster['replicas'],
        'podManagementPolicy': 'Parallel',
        'selector': {'matchLabels': labels(cluster)},
        'template': {'metadata': template_meta, 'spec': spec},
    }
    storage = cluster['storage']
    if storage['mode'] == 'rwx':
        volumes.append({'name': DATA_VOLUME, 'persistentVolumeClaim': {'claimName': claim_name(cluster)}})
    else:
        pvc = {'metadata': {'name': DATA_VOLUME, 'labels': labels(cluster)},
               'spec': {'accessModes': ['ReadWriteOnce'], 'resources': {'requests': {'storage': storage['size']}}}}
        if storage['storage_class']:
            pvc['spec']['storageClassName'] = storage['storage_class']
        sts_spec['volumeClaimTemplates'] = [pvc]
    return {'apiVersion': 'apps/v1', 'kind': 'StatefulSet', 'metadata': _meta(cluster, name), 'spec': sts_spec}


def jobset(cluster, nccl_env):
    """The job as a JobSet (jobset.x-k8s.io/v1alpha2; Kueue admits it): one replicated Job of Indexed pods, one
    per pod of the cluster file, each running its part at once (k8s_pod.py run: its rank is its completion
    index); the JobSet restarts the whole set on a failure, train.restarts times (failurePolicy.maxRestarts,
    train.restart_strategy, train.failure_policy as podFailurePolicy and failurePolicy rules), and names the pods
    <name>-node-0-<i> under its own headless Service (network.subdomain)."""
    train = cluster['train']
    template = copy.deepcopy(statefulset(cluster, nccl_env)['spec']['template'])
    pod = template['spec']
    container = pod['containers'][0]
    container['command'] = [train['python'], '%s/%s' % (kc.CONFIG_DIR, kc.ENTRYPOINT), 'run']
    container.pop('readinessProbe', None)
    container['ports'] = [p for p in container['ports'] if p['name'] == MASTER_PORT_NAME]
    identity = 1 + next(i for i, e in enumerate(container['env']) if e['name'] == 'GPUCLUSTER_NODE_NAME')
    container['env'][identity:identity] = [
        {'name': 'GPUCLUSTER_NODE_RANK',
         'valueFrom': {'fieldRef': {'fieldPath': "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {'name': 'GPUCLUSTER_JOB_ATTEMPT',
         'valueFrom': {'fieldRef': {'fieldPath': "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"}}}]
    pod['restartPolicy'] = 'Never'
    pod_rules, rules = kc.jobset_failure_rules(train['failure_policy'])
    count = cluster['replicas']
    job_spec = {'parallelism': count, 'completions': count, 'completionMode': 'Indexed', 'backoffLimit': 0,
                'template': template}
    if pod_rules:
        job_spec['podFailurePolicy'] = {'rules': pod_rules}
    spec = {
        'network': {'enableDNSHostnames': True, 'subdomain': kc.service_name(cluster), 'publishNotReadyAddresses': True},
        'failurePolicy': {'maxRestarts': train['restarts'], 'restartStrategy': train['restart_strategy'],
                          'rules': rules},
        'successPolicy': {'operator': 'All'},
        'replicatedJobs': [{'name': kc.JOBSET_JOB, 'replicas': 1,
                            'template': {'metadata': {'labels': labels(cluster)}, 'spec': job_spec}}],
    }
    return {'apiVersion': 'jobset.x-k8s.io/v1alpha2', 'kind': 'JobSet', 'metadata': _meta(cluster, cluster['name']),
            'spec': spec}


def claim_name(cluster):
    return cluster['storage']['claim_name'] or '%s-data' % cluster['name']


def per_pod_claims(cluster):
    """The PVC names a StatefulSet makes from its volumeClaimTemplates (kept by absent unless asked)."""
    if cluster['storage']['mode'] != 'per-pod':
        return []
    return ['%s-%s' % (DATA_VOLUME, p['name']) for p in kc.pods(cluster)]


def core_text():
    """The supervision core's text, put in the ConfigMap beside the entrypoint (which imports it)."""
    with open(os.path.splitext(supervision.__file__)[0] + '.py') as handle:
        return handle.read()


def agent_module_texts():
    """{name: text} of the entrypoint's parts (kc.AGENT_MODULES, the k8s role's files), put in the ConfigMap
    beside it (it imports them by their names)."""
    out = {}
    for name in kc.AGENT_MODULES:
        with open(os.path.join(kc.role_files(), name)) as handle:
            out[name] = handle.read()
    return out


def render(cluster, nccl_env, entrypoint, files=None):
    """The objects of the cluster in apply order. nccl_env: the ordered variables made by the nccl_env
    rules; entrypoint: the pod entrypoint script; files: extra ConfigMap entries {key: text}."""
    name = cluster['name']
    objs = [{'apiVersion': 'v1', 'kind': 'ServiceAccount', 'metadata': _meta(cluster, name),
             'automountServiceAccountToken': False}]
    if cluster['openshift'] and not needs_admin(cluster):
        objs.extend(scc_grant(cluster))
    if cluster['network']['mode'] == 'rdma' and cluster['network']['attachment_config'] is not None:
        objs.append({'apiVersion': 'k8s.cni.cncf.io/v1', 'kind': 'NetworkAttachmentDefinition',
                     'metadata': _meta(cluster, cluster['network']['attachment']),
                     'spec': {'config': json.dumps(cluster['network']['attachment_config'], sort_keys=True)}})
    if cluster['network_policy']:
        objs.append({'apiVersion': 'networking.k8s.io/v1', 'kind': 'NetworkPolicy',
                     'metadata': _meta(cluster, '%s-peers' % name),
                     'spec': {'podSelector': {'matchLabels': labels(cluster)}, 'policyTypes': ['Ingress'],
                              'ingress': [{'from': [{'podSelector': {'matchLabels': labels(cluster)}}]}]}})
    data = {'hostfile': hostfile_text(cluster), kc.ENTRYPOINT: entrypoint, kc.CORE: core_text(),
            'job.json': json.dumps(job_settings(cluster), indent=2, sort_keys=True) + '\n'}
    data.update(agent_module_texts())
    if cluster['train']['deepspeed_config']:
        data['ds_config.json'] = json.dumps(cluster['train']['deepspeed_config'], indent=2, sort_keys=True) + '\n'
    data.update(files or {})
    objs.append({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': _meta(cluster, '%s-config' % name),
                 'data': data})
    if cluster['storage']['mode'] == 'rwx' and not cluster['storage']['claim_name']:
        pvc = {'apiVersion': 'v1', 'kind': 'PersistentVolumeClaim', 'metadata': _meta(cluster, claim_name(cluster)),
               'spec': {'accessModes': ['ReadWriteMany'],
                        'resources': {'requests': {'storage': cluster['storage']['size']}}}}
        if cluster['storage']['storage_class']:
            pvc['spec']['storageClassName'] = cluster['storage']['storage_class']
        objs.append(pvc)
    train = cluster['train']
    if cluster['workload'] == 'jobset':     # its own headless Service comes with it (network.subdomain)
        objs.append(jobset(cluster, nccl_env))
        return objs
    objs.append({'apiVersion': 'v1', 'kind': 'Service', 'metadata': _meta(cluster, kc.service_name(cluster)),
                 'spec': {'clusterIP': 'None', 'publishNotReadyAddresses': True, 'selector': labels(cluster),
                          'ports': [{'name': AGENT_PORT_NAME, 'port': train['agent_port'],
                                     'targetPort': train['agent_port'], 'protocol': 'TCP'},
                                    {'name': MASTER_PORT_NAME, 'port': train['master_port'],
                                     'targetPort': train['master_port'], 'protocol': 'TCP'}]}})
    objs.append(statefulset(cluster, nccl_env))
    return objs


def scc_grant(cluster):
    """The Role granting use of the pods' SCC and its binding to their ServiceAccount."""
    name = cluster['name']
    return [
        {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'Role', 'metadata': _meta(cluster, '%s-scc' % name),
         'rules': [{'apiGroups': ['security.openshift.io'], 'resources': ['securitycontextconstraints'],
                    'resourceNames': [scc_name(cluster)], 'verbs': ['use']}]},
        {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'RoleBinding', 'metadata': _meta(cluster, '%s-scc' % name),
         'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Role', 'name': '%s-scc' % name},
         'subjects': [{'kind': 'ServiceAccount', 'name': name, 'namespace': cluster['namespace']}]},
    ]


def admin_objects(cluster):
    """What a cluster administrator applies once (OpenShift with RDMA): the SCC, and the Role and
    RoleBinding granting its use (RBAC lets only a holder of \"use\" on an SCC grant it). present
    applies none of them; it checks that they exist before any pod is made."""
    if not needs_admin(cluster):
        return []
    return [rdma_scc(cluster)] + scc_grant(cluster)


def rdma_scc(cluster):
    """restricted-v2 (OpenShift 4.11+) field by field, plus IPC_LOCK in allowedCapabilities."""
    return {
        'apiVersion': 'security.openshift.io/v1', 'kind': 'SecurityContextConstraints',
        'metadata': dict(_meta(cluster, scc_name(cluster), namespaced=False),
                         annotations={'kubernetes.io/description': RDMA_SCC_REASON}),
        'allowHostDirVolumePlugin': False, 'allowHostIPC': False, 'allowHostNetwork': False,
        'allowHostPID': False, 'allowHostPorts': False, 'allowPrivilegeEscalation': False,
        'allowPrivilegedContainer': False, 'allowedCapabilities': ['NET_BIND_SERVICE', 'IPC_LOCK'],
        'defaultAddCapabilities': None, 'requiredDropCapabilities': ['ALL'],
        'fsGroup': {'type': 'MustRunAs'}, 'runAsUser': {'type': 'MustRunAsRange'},
        'seLinuxContext': {'type': 'MustRunAs'}, 'supplementalGroups': {'type': 'RunAsAny'},
        'seccompProfiles': ['runtime/default'], 'readOnlyRootFilesystem': False, 'priority': None,
        'users': [], 'groups': [],
        'volumes': ['configMap', 'csi', 'downwardAPI', 'emptyDir', 'ephemeral', 'persistentVolumeClaim',
                    'projected', 'secret'],
    }


# ----- semantic checks ------------------------------------------------------------------------------
def _by_kind(objs, kind):
    return [o for o in objs if isinstance(o, dict) and o.get('kind') == kind]


def _one(objs, kind, problems):
    found = _by_kind(objs, kind)
    if len(found) != 1:
        problems.append('%d %s object(s), expected exactly one' % (len(found), kind))
        return None
    return found[0]


def _env_of(container):
    return {e.get('name'): e.get('value') for e in container.get('env') or [] if isinstance(e, dict)}


def _parse_hostfile(text):
    rows = []
    for line in (text or '').splitlines():
        line = line.split('#', 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = None
        for part in parts[1:]:
            if part.startswith('slots='):
                try:
                    slots = int(part[len('slots='):])
                except ValueError:
                    slots = None
        rows.append((parts[0], slots))
    return rows


def problems(objs, cluster):
    """One line per inconsistency between the objects and the cluster (empty list: consistent)."""
    out = []
    if cluster.get('workload') == 'jobset':
        cm = _one(objs, 'ConfigMap', out)
        js = _one(objs, 'JobSet', out)
        if js is None:
            return out
        out += _jobset_problems(js, cluster)
        jobs = get_path(js, 'spec', 'replicatedJobs', default=[]) or [{}]
        return out + _pod_problems(objs, cluster, 'JobSet %s' % get_path(js, 'metadata', 'name'),
                                   get_path(jobs[0], 'template', 'spec', default={}), cm)
    sts = _one(objs, 'StatefulSet', out)
    svc = _one(objs, 'Service', out)
    cm = _one(objs, 'ConfigMap', out)
    if sts is None:
        return out
    name = get_path(sts, 'metadata', 'name')
    spec = sts.get('spec') or {}
    tmpl_labels = get_path(spec, 'template', 'metadata', 'labels', default={})
    selector = get_path(spec, 'selector', 'matchLabels', default={})
    if not selector or any(tmpl_labels.get(k) != v for k, v in selector.items()):
        out.append('StatefulSet %s: spec.selector.matchLabels %s does not match the pod template labels %s'
                   % (name, selector, tmpl_labels))
    if spec.get('podManagementPolicy') != 'Parallel':
        out.append('StatefulSet %s: podManagementPolicy must be Parallel (pods start together; OrderedReady '
                   'waits for pod 0 to be Ready, which waits for its peers)' % name)
    if spec.get('replicas') != cluster['replicas']:
        out.append('StatefulSet %s: replicas %r, the cluster file says %d'
                   % (name, spec.get('replicas'), cluster['replicas']))
    if svc is not None:
        svc_name = get_path(svc, 'metadata', 'name')
        if spec.get('serviceName') != svc_name:
            out.append('StatefulSet %s: serviceName %r is not the headless Service %r'
                       % (name, spec.get('serviceName'), svc_name))
        sspec = svc.get('spec') or {}
        if sspec.get('clusterIP') != 'None':
            out.append('Service %s: clusterIP must be None (headless: one DNS name per pod)' % svc_name)
        if sspec.get('publishNotReadyAddresses') is not True:
            out.append('Service %s: publishNotReadyAddresses must be true (pod 0 resolves its peers before '
                       'they are Ready)' % svc_name)
        ssel = sspec.get('selector') or {}
        if not ssel or any(tmpl_labels.get(k) != v for k, v in ssel.items()):
            out.append('Service %s: selector %s does not select the pod template labels %s'
                       % (svc_name, ssel, tmpl_labels))
    if cluster['storage']['mode'] != 'rwx' and not spec.get('volumeClaimTemplates'):
        out.append('StatefulSet %s: per-pod storage needs volumeClaimTemplates' % name)
    return out + _pod_problems(objs, cluster, 'StatefulSet %s' % name, spec, cm)


def _jobset_problems(js, cluster):
    """The JobSet's own settings against the cluster file."""
    out, name = [], get_path(js, 'metadata', 'name')
    spec = js.get('spec') or {}
    jobs = spec.get('replicatedJobs') or []
    if len(jobs) != 1 or jobs[0].get('replicas') != 1:
        return ['JobSet %s: one replicated Job of 1 replica expected, got %s'
                % (name, [(j.get('name'), j.get('replicas')) for j in jobs])]
    job = get_path(jobs[0], 'template', 'spec', default={})
    want = cluster['replicas']
    if (job.get('parallelism'), job.get('completions'), job.get('completionMode')) != (want, want, 'Indexed'):
        out.append('JobSet %s: the Job must run %d Indexed pods at once (parallelism, completions %d, completionMode '
                   'Indexed: the completion index is the rank), got %s, %s, %s'
                   % (name, want, want, job.get('parallelism'), job.get('completions'), job.get('completionMode')))
    if job.get('backoffLimit') != 0:
        out.append('JobSet %s: backoffLimit must be 0 (a failed pod fails the Job; the JobSet restarts all pods)' % name)
    if get_path(job, 'template', 'spec', 'restartPolicy') != 'Never':
        out.append('JobSet %s: restartPolicy must be Never (a rank restarted alone cannot rejoin the job)' % name)
    net = spec.get('network') or {}
    if not net.get('enableDNSHostnames') or net.get('subdomain') != kc.service_name(cluster):
        out.append('JobSet %s: network.enableDNSHostnames must be true with subdomain %s (the hostfile names)'
                   % (name, kc.service_name(cluster)))
    policy = spec.get('failurePolicy') or {}
    if (policy.get('maxRestarts'), policy.get('restartStrategy')) != (cluster['train']['restarts'],
                                                                      cluster['train']['restart_strategy']):
        out.append('JobSet %s: failurePolicy maxRestarts %r, restartStrategy %r; the cluster file says %d, %s'
                   % (name, policy.get('maxRestarts'), policy.get('restartStrategy'), cluster['train']['restarts'],
                      cluster['train']['restart_strategy']))
    return out


def _pod_problems(objs, cluster, who, spec, cm):
    """The pod template's problems (spec: the workload's spec holding template), each line starting with who."""
    out = []
    pod = get_path(spec, 'template', 'spec', default={})
    containers = pod.get('containers') or []
    if not containers:
        out.append('%s: the pod template has no container' % who)
        return out
    container = containers[0]
    env = _env_of(container)
    mounts = {m.get('mountPath'): m.get('name') for m in container.get('volumeMounts') or []}
    volumes = {v.get('name'): v for v in pod.get('volumes') or []}
    shm = volumes.get(mounts.get('/dev/shm'))
    if not shm or get_path(shm, 'emptyDir', 'medium') != 'Memory':
        out.append('%s: /dev/shm must be a memory emptyDir (the runtime default of 64 MiB '
                   'kills NCCL)' % who)
    elif get_path(shm, 'emptyDir', 'sizeLimit') != cluster['shm_size']:
        out.append('%s: /dev/shm sizeLimit %r, the cluster file says %r'
                   % (who, get_path(shm, 'emptyDir', 'sizeLimit'), cluster['shm_size']))
    if kc.CONFIG_DIR not in mounts:
        out.append('%s: the ConfigMap is not mounted at %s' % (who, kc.CONFIG_DIR))
    if cm is not None:
        rows = _parse_hostfile(get_path(cm, 'data', 'hostfile', default=''))
        want = [(p['address'], p['slots']) for p in kc.pods(cluster)]
        if len(rows) != cluster['replicas']:
            out.append('ConfigMap %s: the hostfile has %d line(s) for %d replicas'
                       % (get_path(cm, 'metadata', 'name'), len(rows), cluster['replicas']))
        else:
            for (host, slots), (w_host, w_slots) in zip(rows, want):
                if host != w_host or slots != w_slots:
                    out.append('ConfigMap %s: hostfile line %r slots=%r, expected %s slots=%d (the pods of %s)'
                               % (get_path(cm, 'metadata', 'name'), host, slots, w_host, w_slots, who))
                    break
        for key, what in ((kc.ENTRYPOINT, 'the pod entrypoint'), (kc.CORE, "the entrypoint's supervision core")) \
                + tuple((name, "the entrypoint's part") for name in kc.AGENT_MODULES):
            if key not in (cm.get('data') or {}):
                out.append('ConfigMap %s: %s %s is missing' % (get_path(cm, 'metadata', 'name'), what, key))
    limits = get_path(container, 'resources', 'limits', default={})
    if cluster['gpus_per_pod'] and str(limits.get(cluster['gpu_resource'])) != str(cluster['gpus_per_pod']):
        out.append('%s: limits %s=%r, the cluster file says gpus_per_pod %d'
                   % (who, cluster['gpu_resource'], limits.get(cluster['gpu_resource']), cluster['gpus_per_pod']))
    caps = get_path(container, 'securityContext', 'capabilities', default={})
    added = caps.get('add') or []
    net = cluster['network']
    if env.get('NCCL_SOCKET_IFNAME') != net['socket_ifname']:
        out.append('%s: NCCL_SOCKET_IFNAME %r, the cluster file says %r'
                   % (who, env.get('NCCL_SOCKET_IFNAME'), net['socket_ifname']))
    if net['mode'] == 'rdma':
        if net['rdma_resource'] not in limits:
            out.append('%s: rdma mode without the RDMA device resource %s in limits'
                       % (who, net['rdma_resource']))
        if 'IPC_LOCK' not in added:
            out.append('%s: rdma mode without the IPC_LOCK capability (memory registration fails)'
                       % who)
        if env.get('NCCL_IB_DISABLE') != '0' or not env.get('NCCL_IB_HCA'):
            out.append('%s: rdma mode needs NCCL_IB_DISABLE=0 and NCCL_IB_HCA' % who)
        if get_path(spec, 'template', 'metadata', 'annotations', 'k8s.v1.cni.cncf.io/networks') != net['attachment']:
            out.append('%s: the pod template does not request the network attachment %s'
                       % (who, net['attachment']))
    else:
        if env.get('NCCL_IB_DISABLE') != '1':
            out.append('%s: tcp mode needs NCCL_IB_DISABLE=1' % who)
        if added:
            out.append('%s: tcp mode adds capabilities %s (restricted-v2 allows none)' % (who, added))
    if cluster['openshift'] or net['mode'] == 'tcp':
        sc = container.get('securityContext') or {}
        psc = pod.get('securityContext') or {}
        if sc.get('allowPrivilegeEscalation') is not False:
            out.append('%s: allowPrivilegeEscalation must be false' % who)
        if 'ALL' not in (caps.get('drop') or []):
            out.append('%s: capabilities must drop ALL' % who)
        if not (sc.get('runAsNonRoot') or psc.get('runAsNonRoot')):
            out.append('%s: runAsNonRoot must be true' % who)
        if get_path(sc, 'seccompProfile', 'type', default=get_path(psc, 'seccompProfile', 'type')) != 'RuntimeDefault':
            out.append('%s: seccompProfile must be RuntimeDefault' % who)
        if cluster['openshift'] and ('runAsUser' in sc or 'runAsUser' in psc):
            out.append('%s: runAsUser is set; OpenShift assigns the uid from the namespace range'
                       % who)
    psc = pod.get('securityContext') or {}
    uid = (container.get('securityContext') or {}).get('runAsUser', psc.get('runAsUser'))
    if not cluster['openshift']:
        if uid == 0:
            out.append('%s: runAsUser 0 with runAsNonRoot: the kubelet refuses the pod' % who)
        elif uid is None and kc.image_user_verdict(cluster['security'].get('image_user')):
            out.append('%s: no runAsUser and the image user %r: the kubelet refuses the pod (%s)'
                       % (who, cluster['security'].get('image_user'),
                          kc.image_user_verdict(cluster['security'].get('image_user'))))
    if psc.get('fsGroupChangePolicy') != 'OnRootMismatch':
        out.append('%s: fsGroupChangePolicy must be OnRootMismatch (else the claim is re-chowned at '
                   'every pod start)' % who)
    if cluster['resources']['qos'] == 'Guaranteed':
        res = container.get('resources') or {}
        req = res.get('requests') or {}
        lim = res.get('limits') or {}
        if not all(lim.get(k) for k in ('cpu', 'memory')) or any(req.get(k) != v for k, v in lim.items()):
            out.append('%s: requests %s and limits %s are not equal with cpu and memory (not '
                       'Guaranteed QoS: evicted first)' % (who, req, lim))
    if cluster['openshift']:
        wanted = scc_name(cluster)
        roles = [r for r in _by_kind(objs, 'Role')
                 if any(wanted in (rule.get('resourceNames') or []) and 'use' in (rule.get('verbs') or [])
                        for rule in r.get('rules') or [])]
        if not roles:
            out.append('OpenShift: no Role grants use of the SCC %s to the pods' % wanted)
        if net['mode'] == 'rdma':
            scc = _by_kind(objs, 'SecurityContextConstraints')
            if not scc or 'IPC_LOCK' not in (scc[0].get('allowedCapabilities') or []):
                out.append('OpenShift: rdma mode needs the SCC %s allowing IPC_LOCK' % wanted)
    if cluster['storage']['mode'] == 'rwx':
        claim = get_path(volumes.get(mounts.get(cluster['storage']['mount_path'])), 'persistentVolumeClaim', 'claimName')
        pvcs = {get_path(p, 'metadata', 'name'): p for p in _by_kind(objs, 'PersistentVolumeClaim')}
        if claim != claim_name(cluster):
            out.append('%s: %s is not the shared claim %s'
                       % (who, cluster['storage']['mount_path'], claim_name(cluster)))
        elif claim in pvcs and 'ReadWriteMany' not in (get_path(pvcs[claim], 'spec', 'accessModes') or []):
            out.append('PersistentVolumeClaim %s: rwx storage needs accessModes ReadWriteMany' % claim)
    return out
