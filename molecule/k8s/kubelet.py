# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A stand-in for the kubelet: runs one pod of a rendered StatefulSet as a podman container by the
kubelet's rules, not by our convenience (no API server can be installed where this is tested).

    python3 molecule/k8s/kubelet.py run OBJECTS.json ORDINAL --prefix mol-k8s- --network NET --ip ADDR \
        --work DIR [--openshift-uid 1000680000]
    python3 molecule/k8s/kubelet.py rm OBJECTS.json ORDINAL --prefix mol-k8s- --work DIR

What it does as the kubelet does (pkg/kubelet/kuberuntime, volume/configmap, volume/emptydir):
- runAsNonRoot: with no runAsUser, the image's USER decides; root ('' or 0) and a non-numeric user are
  refused with the kubelet's own messages (CreateContainerConfigError); runAsUser 0 too;
- the uid, gid (runAsGroup, else the image's, else 0) and fsGroup as a supplementary group; fsGroup
  owns the claims (setgid, group-writable; OnRootMismatch: only when their root's group differs);
  with --openshift-uid the uid and fsGroup OpenShift's restricted-v2 assigns (gid 0);
- capabilities: drop and add as the spec says; allowPrivilegeEscalation false: no_new_privs;
- HOME is the image's unless the spec's env sets it (podman's own default, as containerd's);
- a ConfigMap is projected read-only: its keys are symlinks to ..data/<key>, files with defaultMode;
- the downward API: metadata.name, metadata.namespace, status.podIP, spec.nodeName (node-<pod>);
- /dev/shm is the memory emptyDir's sizeLimit; other emptyDirs are 0777 directories kept across
  container restarts; limits.memory is the whole container's memory (no swap), limits.cpu its CPUs;
- restartPolicy Always: a container whose PID 1 exits is started again, with a fresh /tmp (a new
  container has a new writable layer; here /tmp is a tmpfs);
- a JobSet's pod (the first replicated Job's, completion index ORDINAL): named and addressed as the JobSet
  names it, the Job's and JobSet's annotations for the downward API, its restartPolicy (Never: not again);
- dnsPolicy ClusterFirst: with --dns, that server (the cluster DNS stand-in, cluster_dns.py) is the
  pod's resolver.
Only the standard library and the podman CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

UNITS = {'': 1, 'k': 10 ** 3, 'M': 10 ** 6, 'G': 10 ** 9, 'T': 10 ** 12,
         'Ki': 2 ** 10, 'Mi': 2 ** 20, 'Gi': 2 ** 30, 'Ti': 2 ** 40}


class Refused(Exception):
    """What the kubelet would report (a container that is not created)."""


def quantity(text):
    match = re.match(r'^([0-9.]+)([A-Za-z]*)$', str(text))
    return int(float(match.group(1)) * UNITS[match.group(2)])


def podman(*args, check=True):
    proc = subprocess.run(['podman'] + list(args), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise SystemExit('podman %s: %s' % (' '.join(args[:3]), proc.stderr.strip()))
    return proc


def image_config(image):
    out = podman('image', 'inspect', '--format', '{{json .Config}}', image).stdout
    return json.loads(out or '{}') or {}


def pod_parts(objects, ordinal, restart_attempt=0):
    """The pod at an ordinal: {template, namespace, service, configmaps, name, annotations, restart}. A
    StatefulSet's pod <name>-<i> under its Service, restarted always; a JobSet's pod <name>-<job>-0-<i> (its
    first replicated Job's completion index i) under the JobSet's subdomain, never restarted, with the
    annotations the Job and JobSet controllers put on it."""
    cms = {o['metadata']['name']: o for o in objects if o['kind'] == 'ConfigMap'}
    js = next((o for o in objects if o['kind'] == 'JobSet'), None)
    if js is not None:
        job = js['spec']['replicatedJobs'][0]
        name = '%s-%s-0-%d' % (js['metadata']['name'], job['name'], ordinal)
        annotations = {'batch.kubernetes.io/job-completion-index': str(ordinal),
                       'jobset.sigs.k8s.io/restart-attempt': str(restart_attempt),
                       'jobset.sigs.k8s.io/jobset-name': js['metadata']['name']}
        return {'template': job['template']['spec']['template'], 'namespace': js['metadata']['namespace'],
                'service': (js['spec'].get('network') or {}).get('subdomain') or js['metadata']['name'],
                'configmaps': cms, 'name': name, 'annotations': annotations,
                'restart': 'always' if job['template']['spec']['template']['spec'].get('restartPolicy', 'Always')
                == 'Always' else 'no'}
    sts = next(o for o in objects if o['kind'] == 'StatefulSet')
    svc = next(o for o in objects if o['kind'] == 'Service')
    return {'template': sts['spec']['template'], 'namespace': sts['metadata']['namespace'],
            'service': svc['metadata']['name'], 'configmaps': cms, 'name': '%s-%d' % (sts['metadata']['name'], ordinal),
            'annotations': {}, 'restart': 'always'}


def run_as(pod_spec, container, image_user, openshift_uid=None):
    """(uid, gid, groups) the kubelet would run the container with, or Refused with its message."""
    psc = pod_spec.get('securityContext') or {}
    csc = container.get('securityContext') or {}
    uid = csc.get('runAsUser', psc.get('runAsUser'))
    gid = csc.get('runAsGroup', psc.get('runAsGroup'))
    fs_group = psc.get('fsGroup')
    if openshift_uid is not None:   # restricted-v2: MustRunAsRange uid, MustRunAs fsGroup
        if uid is not None:
            raise Refused('unable to validate against any security context constraint: runAsUser: Invalid value: '
                          '%s: must be in the ranges' % uid)
        uid, fs_group = openshift_uid, openshift_uid
    non_root = csc.get('runAsNonRoot', psc.get('runAsNonRoot'))
    user, _, group = (image_user or '').partition(':')
    from_image = uid is None
    if uid is None:
        if non_root and user in ('', '0', 'root'):
            raise Refused('container has runAsNonRoot and image will run as root')
        if non_root and not user.isdigit():
            raise Refused('container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is '
                          'non-root' % user)
        uid = int(user) if user.isdigit() else 0
    elif non_root and int(uid) == 0:
        raise Refused("container's runAsUser breaks non-root policy")
    if gid is None:
        # the image's group goes with the image's user only; a uid set by the spec (or OpenShift)
        # gets the group of its /etc/passwd entry in the image, none for an arbitrary uid: 0
        gid = int(group) if group.isdigit() and from_image else 0
    groups = [fs_group] if fs_group is not None else []
    groups += list(psc.get('supplementalGroups') or [])
    return int(uid), int(gid), [int(g) for g in groups]


def project_configmap(cm, items_mode, dest, group=None):
    """The kubelet's atomic writer: <dest>/..<ts>/<key> files, ..data -> ..<ts>, <key> -> ..data/<key>."""
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    stamp = '..%s' % time.strftime('%Y_%m_%d_%H_%M_%S', time.gmtime())
    os.makedirs(os.path.join(dest, stamp), mode=0o755)
    for key, text in (cm.get('data') or {}).items():
        path = os.path.join(dest, stamp, key)
        with open(path, 'w') as handle:
            handle.write(text)
        os.chmod(path, items_mode)
        if group is not None:
            os.chown(path, 0, group)
        os.symlink(os.path.join('..data', key), os.path.join(dest, key))
    os.symlink(stamp, os.path.join(dest, '..data'))


def podman_args(objects, ordinal, prefix, network, ip, work, openshift_uid=None, hosts=(), dns='', restart_attempt=0):
    pod = pod_parts(objects, ordinal, restart_attempt)
    cms, name = pod['configmaps'], pod['name']
    spec = pod['template']['spec']
    ctr = spec['containers'][0]
    config = image_config(ctr['image'])
    uid, gid, groups = run_as(spec, ctr, config.get('User', ''), openshift_uid)
    fs_group = groups[0] if (spec.get('securityContext') or {}).get('fsGroup') is not None or openshift_uid else None
    args = ['run', '-d', '--name', prefix + name, '--hostname', name, '--network', network, '--ip', ip,
            '--network-alias', '%s.%s.%s.svc.cluster.local' % (name, pod['service'], pod['namespace']),
            '--user', '%d:%d' % (uid, gid), '--restart', pod['restart'], '--tmpfs', '/tmp:rw,mode=1777',
            '--label', 'gpucluster.kubelet-standin=%s' % name]
    for host in hosts:   # without the network's DNS: the Service names as fixed entries
        args += ['--add-host', host]
    if dns:              # dnsPolicy ClusterFirst: the cluster DNS is the pod's resolver
        args += ['--dns', dns]
    for group in groups:
        args += ['--group-add', str(group)]
    csc = ctr.get('securityContext') or {}
    caps = csc.get('capabilities') or {}
    for cap in caps.get('drop') or []:
        args += ['--cap-drop', cap.lower()]
    for cap in caps.get('add') or []:
        args += ['--cap-add', cap.lower()]
    if csc.get('allowPrivilegeEscalation') is False:
        args += ['--security-opt', 'no-new-privileges']
    limits = (ctr.get('resources') or {}).get('limits') or {}
    if 'memory' in limits:
        memory = quantity(limits['memory'])
        args += ['--memory', str(memory), '--memory-swap', str(memory)]
    if 'cpu' in limits:
        cpu = str(limits['cpu'])
        args += ['--cpus', str(int(cpu[:-1]) / 1000 if cpu.endswith('m') else float(cpu))]
    env = {}
    # each pod on a node of its own (the anti-affinity's wish), named as a node would be
    fields = {'metadata.name': name, 'metadata.namespace': pod['namespace'], 'status.podIP': ip,
              'spec.nodeName': 'node-%s' % name}
    fields.update({"metadata.annotations['%s']" % k: v for k, v in pod['annotations'].items()})
    for item in ctr.get('env') or []:
        if 'value' in item:
            env[item['name']] = item['value']
        else:
            env[item['name']] = fields[item['valueFrom']['fieldRef']['fieldPath']]
    for key, value in env.items():
        args += ['--env', '%s=%s' % (key, value)]
    volumes = {v['name']: v for v in spec.get('volumes') or []}
    base = os.path.join(work, name)
    claims = []     # their root goes to fsGroup once the container runs (podman chowns a new volume)
    for mount in ctr.get('volumeMounts') or []:
        vol = volumes[mount['name']]
        ro = ':ro' if mount.get('readOnly') else ''
        if 'configMap' in vol:
            dest = os.path.join(base, 'configmap-' + mount['name'])
            project_configmap(cms[vol['configMap']['name']], vol['configMap'].get('defaultMode', 0o644), dest,
                              fs_group)
            args += ['--volume', '%s:%s:ro' % (dest, mount['mountPath'])]
        elif 'emptyDir' in vol and (vol['emptyDir'] or {}).get('medium') == 'Memory':
            if mount['mountPath'] != '/dev/shm':
                raise SystemExit('%s: a memory emptyDir at %s is not supported here' % (name, mount['mountPath']))
            args += ['--shm-size', str(quantity(vol['emptyDir'].get('sizeLimit', '64Mi')))]
        elif 'emptyDir' in vol:
            dest = os.path.join(base, 'emptydir-' + mount['name'])
            os.makedirs(dest, exist_ok=True)
            os.chmod(dest, 0o777)
            args += ['--volume', '%s:%s%s' % (dest, mount['mountPath'], ro)]
        elif 'persistentVolumeClaim' in vol:
            claim = prefix + vol['persistentVolumeClaim']['claimName']
            if podman('volume', 'exists', claim, check=False).returncode != 0:
                podman('volume', 'create', claim)
            if fs_group is not None:
                claims.append(podman('volume', 'inspect', '--format', '{{.Mountpoint}}', claim).stdout.strip())
            args += ['--volume', '%s:%s%s' % (claim, mount['mountPath'], ro)]
        else:
            raise SystemExit('%s: volume %s of an unsupported kind' % (name, mount['name']))
    if ctr.get('workingDir'):
        args += ['--workdir', ctr['workingDir']]
    command = list(ctr.get('command') or []) + list(ctr.get('args') or [])
    if command:
        args += ['--entrypoint', json.dumps(command[:1])]
    if ip:
        args[args.index('--ip') + 1] = ip
    else:
        del args[args.index('--ip'):args.index('--ip') + 2]
    args += [ctr['image']] + command[1:]
    return args, claims, fs_group


def own_claim(root, fs_group):
    """fsGroup on a claim as the kubelet sets it (fsGroupChangePolicy OnRootMismatch: only when the
    root's group differs): group fs_group, group-writable, setgid directories."""
    if os.stat(root).st_gid == fs_group:
        return
    for path, _, files in os.walk(root):
        for entry in [path] + [os.path.join(path, f) for f in files]:
            os.lchown(entry, -1, fs_group)
            mode = os.lstat(entry).st_mode
            os.chmod(entry, mode | (0o2070 if os.path.isdir(entry) else 0o060))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('action', choices=['run', 'rm'])
    parser.add_argument('objects', help='the rendered objects (a JSON list)')
    parser.add_argument('ordinal', type=int)
    parser.add_argument('--prefix', default='mol-k8s-')
    parser.add_argument('--network', default='podman')
    parser.add_argument('--ip', default='')
    parser.add_argument('--work', required=True)
    parser.add_argument('--openshift-uid', type=int, default=None)
    parser.add_argument('--add-host', action='append', default=[], help='NAME:IP (where the network has no DNS)')
    parser.add_argument('--dns', default='', help="the cluster DNS's address (the pods' resolver)")
    parser.add_argument('--restart-attempt', type=int, default=0, help="a JobSet pod's restart attempt")
    args = parser.parse_args(argv)
    with open(args.objects) as handle:
        objects = json.load(handle)
    name = pod_parts(objects, args.ordinal)['name']
    if args.action == 'rm':
        podman('rm', '-f', '-t', '5', args.prefix + name, check=False)
        shutil.rmtree(os.path.join(args.work, name), ignore_errors=True)
        return 0
    state = podman('inspect', '--format', '{{.State.Status}}', args.prefix + name, check=False)
    if state.returncode == 0 and state.stdout.strip() == 'running':
        print('%s: already running as %s' % (name, args.prefix + name))
        return 0
    podman('rm', '-f', '-t', '5', args.prefix + name, check=False)
    try:
        argv, claims, fs_group = podman_args(objects, args.ordinal, args.prefix, args.network, args.ip, args.work,
                                             args.openshift_uid, args.add_host, args.dns, args.restart_attempt)
    except Refused as exc:
        print('%s: CreateContainerConfigError: Error: %s' % (name, exc), file=sys.stderr)
        return 2
    podman(*argv)
    for root in claims:
        own_claim(root, fs_group)
    print('%s: started as %s' % (name, args.prefix + name))
    return 0


if __name__ == '__main__':
    sys.exit(main())
