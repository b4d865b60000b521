# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Action of gpucluster.multinode.k8s_manifests: runs on the controller (the cluster file, the schemas
and the manifest directory are the controller's), see plugins/modules/k8s_manifests.py."""

from __future__ import annotations

import os

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import manifests as km
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import render as kr

ARGS = {
    'cluster_file': {'type': 'path', 'required': True},
    'dest': {'type': 'path'},
    'state': {'type': 'str', 'choices': ['checked', 'rendered', 'validated'], 'default': 'rendered'},
    'kubernetes_versions': {'type': 'list', 'elements': 'str', 'default': list(kr.DEFAULT_VERSIONS)},
    'entrypoint': {'type': 'path'},
    'schema_dir': {'type': 'path'},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGS)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGS)
        if args['state'] in ('rendered', 'validated') and not args['dest']:
            raise AnsibleError('k8s_manifests: dest (the manifest directory) is required with state=%s'
                               % args['state'])
        files_root = kr.role_files()
        try:
            cluster = kr.load_cluster_file(args['cluster_file'])
            env = kr.environment(cluster)
            entrypoint = kr.read_text(args['entrypoint'] or os.path.join(files_root, kc.ENTRYPOINT), 'entrypoint')
            extra = kr.config_files(cluster, args['cluster_file'])
            schema_dir = args['schema_dir'] or os.path.join(files_root, 'schemas')
            kr.check_imports(cluster, extra, args['cluster_file'])
            objects = km.render(cluster, env, entrypoint, extra)
            admin = km.admin_objects(cluster)
            if args['state'] == 'validated':
                # the directory as it is (edited by hand, or by another tool) against the cluster file
                objects, sources = kr.read_manifests(args['dest'])
                admin, admin_sources = kr.read_manifests(os.path.join(args['dest'], kr.ADMIN_DIR), missing_ok=True)
                report = kr.check_objects(objects + admin, cluster, args['kubernetes_versions'], schema_dir,
                                          where=args['dest'], sources=sources + admin_sources)
            else:
                report = kr.check_objects(objects + admin, cluster, args['kubernetes_versions'], schema_dir,
                                          where=args['cluster_file'])
        except (kc.ClusterFileError, kr.RenderError) as exc:
            result.update(failed=True, msg=str(exc))
            return result
        except Exception as exc:  # nccl_environment's refusal (AnsibleFilterError) included
            result.update(failed=True, msg='%s: %s' % (args['cluster_file'], exc))
            return result
        pods = kc.pods(cluster)
        result.update(
            cluster=cluster, pods=pods,
            world_size=sum(p['slots'] for p in pods[:len(pods) - cluster['train']['spares']]),
            objects=[{'kind': o['kind'], 'name': o['metadata']['name'],
                      'namespace': o['metadata'].get('namespace')} for o in objects],
            manifests=objects, admin_manifests=admin, validated=report, per_pod_claims=km.per_pod_claims(cluster),
            scc=km.scc_name(cluster) if cluster['openshift'] else '',
            hostfile=km.hostfile_text(cluster), changed=False,
        )
        if args['state'] == 'rendered':
            written, removed, diffs = kr.write_manifests(objects, args['dest'], check=self._task.check_mode)
            a_written, a_removed, a_diffs = kr.write_manifests(admin, os.path.join(args['dest'], kr.ADMIN_DIR),
                                                               check=self._task.check_mode)
            diffs += a_diffs
            removed += a_removed
            result.update(files=written, admin_files=a_written, removed=removed, changed=bool(diffs or removed),
                          dest=args['dest'])
            if self._task.diff and diffs:
                result['diff'] = diffs
        return result
