# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Controller-side helpers of the k8s_manifests action: reading the cluster file, the schema checks of
the rendered objects (kubernetes-validate for the Kubernetes kinds, JSON schemas shipped in the
collection for NetworkAttachmentDefinition and OpenShift's SecurityContextConstraints) and writing
the manifest directory (one file per object, in apply order, idempotent)."""

from __future__ import annotations

import ast
import glob
import json
import os
import re

import yaml

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import manifests as km
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.nccl_env import nccl_environment

# The two Kubernetes versions every rendered object is validated against (strict schemas): the
# oldest still common (OpenShift 4.17 runs 1.30) and a current one.
DEFAULT_VERSIONS = ('1.30.0', '1.34.0')
CRD_SCHEMAS = {
    ('k8s.cni.cncf.io/v1', 'NetworkAttachmentDefinition'): 'networkattachmentdefinition-k8s.cni.cncf.io-v1.json',
    ('security.openshift.io/v1', 'SecurityContextConstraints'): 'securitycontextconstraints-security.openshift.io-v1.json',
    ('jobset.x-k8s.io/v1alpha2', 'JobSet'): 'jobset-jobset.x-k8s.io-v1alpha2.json',
}
FILE_RE = re.compile(r'^[0-9]{2}-[a-z]+-[a-z0-9.-]+\.yaml$')
ADMIN_DIR = 'admin'     # objects a cluster administrator applies (OpenShift RDMA SCC); present does not


class RenderError(ValueError):
    """A refusal that names the file (cluster file or manifest) and the field."""


role_files = kc.role_files


def environment(cluster):
    """The NCCL, gloo and rendezvous variables of every pod, from the cluster file's network and nccl."""
    network = cluster['network']
    return nccl_environment(
        network['mode'], network['socket_ifname'], debug=cluster['nccl']['debug'], ib_hca=network.get('ib_hca', ''),
        ib_gid_index=network['ib_gid_index'], master_addr=kc.pod_dns(cluster, 0),
        master_port=cluster['train']['master_port'], ds_accelerator='' if cluster['gpus_per_pod'] else 'cpu',
        extra=cluster['nccl']['extra'])


def read_text(path, label):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError) as exc:
        raise RenderError('%s: cannot read %s: %s' % (label, path, exc.strerror or exc)) from None


def load_cluster_file(path):
    text = read_text(path, 'cluster file')
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, 'problem_mark', None)
        where = ' line %d' % (mark.line + 1) if mark is not None else ''
        raise RenderError('%s:%s is not valid YAML: %s' % (path, where, getattr(exc, 'problem', exc))) from None
    return kc.check(data, where=path)


def config_files(cluster, cluster_file):
    """The extra ConfigMap entries {key: text}; relative paths are read next to the cluster file."""
    base = os.path.dirname(os.path.abspath(cluster_file))
    out = {}
    for key, path in cluster['files'].items():
        full = path if os.path.isabs(path) else os.path.join(base, path)
        try:
            with open(full) as handle:
                out[key] = handle.read()
        except (IOError, OSError) as exc:
            raise RenderError('%s: files.%s: cannot read %s: %s' % (cluster_file, key, full, exc.strerror or exc)) from None
    size = sum(len(v.encode()) for v in out.values())
    if size > 900 * 1024:
        raise RenderError('%s: files: %d KiB in all; a ConfigMap holds at most 1 MiB (put large files on the '
                          'shared volume and use k8s_state=synced)' % (cluster_file, size // 1024))
    return out


def module_imports(text):
    """Top-level module names a Python source imports (absolute imports; an import guarded by
    try/except ImportError is optional and left out)."""
    tree = ast.parse(text)
    optional = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ('ImportError', 'ModuleNotFoundError')
                for h in node.handlers):
            for inner in node.body:
                for sub in ast.walk(inner):
                    optional.add(id(sub))
    names = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.split('.')[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split('.')[0])
    return names


def check_imports(cluster, files, cluster_file):
    """Refuse a ConfigMap script that imports a module lying next to it on the controller but not
    shipped in the ConfigMap (the pods would die with ModuleNotFoundError). files: {key: text}."""
    base = os.path.dirname(os.path.abspath(cluster_file))
    for key, text in sorted(files.items()):
        if not key.endswith('.py'):
            continue
        try:
            names = module_imports(text)
        except SyntaxError as exc:
            raise RenderError('%s: files.%s is not valid Python (line %s: %s)'
                              % (cluster_file, key, exc.lineno, exc.msg)) from None
        path = cluster['files'][key]
        here = os.path.dirname(path if os.path.isabs(path) else os.path.join(base, path))
        for name in sorted(names):
            sibling = os.path.join(here, name + '.py')
            if name + '.py' not in files and os.path.isfile(sibling):
                shown = os.path.join(os.path.dirname(path), name + '.py')
                raise RenderError('%s: files.%s imports %s, which is not in the ConfigMap (the pods would fail '
                                  'with ModuleNotFoundError): add files.%s.py: %s'
                                  % (cluster_file, key, name, name, shown))


def _describe(obj):
    meta = obj.get('metadata') if isinstance(obj, dict) else None
    return '%s %s' % (obj.get('kind', '?') if isinstance(obj, dict) else '?',
                      meta.get('name', '?') if isinstance(meta, dict) else '?')


def _path_of(error):
    return '.'.join(str(p) for p in error.absolute_path) or '(top)'


def schema_check(obj, versions, schema_dir):
    """'' when the object passes its schema for every version, else the first error in one line."""
    import jsonschema  # here: an optional controller dependency (requirements/controller.txt), only the schema check needs it
    key = (obj.get('apiVersion'), obj.get('kind'))
    if key in CRD_SCHEMAS:
        with open(os.path.join(schema_dir, CRD_SCHEMAS[key])) as handle:
            schema = json.load(handle)
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
        if errors:
            return '%s: %s: %s (schema %s)' % (_describe(obj), _path_of(errors[0]), errors[0].message,
                                               CRD_SCHEMAS[key])
        # a JobSet's Job templates are Kubernetes Jobs: each is checked as one, by the strict schemas
        for index, job in enumerate((obj.get('spec') or {}).get('replicatedJobs') or []):
            template = job.get('template') or {}
            problem = schema_check({'apiVersion': 'batch/v1', 'kind': 'Job',
                                    'metadata': dict(template.get('metadata') or {}, name=job.get('name', 'job')),
                                    'spec': template.get('spec') or {}}, versions, schema_dir)
            if problem:
                return '%s: spec.replicatedJobs.%d.template: %s' % (_describe(obj), index, problem)
        return ''
    try:  # here: an optional controller dependency, only the schema check needs it
        import kubernetes_validate
    except ImportError:
        raise RenderError('kubernetes-validate is not installed on the controller (pip install -r '
                          'requirements/controller.txt)') from None
    for version in versions:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return '%s: Kubernetes %s: %s: %s' % (_describe(obj), version, _path_of(exc), exc.message)
        except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.VersionNotSupportedError) as exc:
            return '%s: Kubernetes %s: %s' % (_describe(obj), version, exc)
    return ''


def check_objects(objects, cluster, versions, schema_dir, where='manifests', sources=None):
    """Schema checks (every object, every version) then the semantic checks; raises RenderError
    with every problem found, '; ' between them, the first one first. sources: the file of each
    object (named in its problem)."""
    problems = []
    for index, obj in enumerate(objects):
        prefix = '%s: ' % sources[index] if sources else ''
        if not isinstance(obj, dict) or 'kind' not in obj or 'apiVersion' not in obj:
            problems.append('%s%r is not a Kubernetes object (kind and apiVersion)' % (prefix, obj))
            continue
        problem = schema_check(obj, versions, schema_dir)
        if problem:
            problems.append(prefix + problem)
    problems += km.problems(objects, cluster)
    if problems:
        raise RenderError('%s: %d problem(s) in the rendered objects: %s' % (where, len(problems), '; '.join(problems)))
    return {'kubernetes_versions': list(versions), 'objects': len(objects),
            'crd_schemas': sorted({CRD_SCHEMAS[(o['apiVersion'], o['kind'])] for o in objects
                                   if (o['apiVersion'], o['kind']) in CRD_SCHEMAS})}


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value):
    style = '|' if '\n' in value else None
    return dumper.represent_scalar('tag:yaml.org,2002:str', value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(obj):
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


def file_name(index, obj):
    return '%02d-%s-%s.yaml' % (index, obj['kind'].lower(), obj['metadata']['name'])


def read_manifests(directory, missing_ok=False):
    """(objects, their file names) of a manifest directory in file order."""
    objects, sources = [], []
    paths = sorted(p for p in glob.glob(os.path.join(directory, '*.yaml')) if FILE_RE.match(os.path.basename(p)))
    if not paths and missing_ok:
        return objects, sources
    if not paths:
        raise RenderError('%s: no manifests (NN-kind-name.yaml) in this directory' % directory)
    for path in paths:
        try:
            with open(path) as handle:
                docs = [o for o in yaml.safe_load_all(handle) if o is not None]
        except yaml.YAMLError as exc:
            raise RenderError('%s: not valid YAML: %s' % (path, exc)) from None
        objects.extend(docs)
        sources.extend([path] * len(docs))
    return objects, sources


def write_manifests(objects, dest, check=False):
    """Write one file per object; remove our own files of objects no longer rendered.
    Returns (paths, removed, diffs); nothing is written in check mode."""
    wanted = {}
    for index, obj in enumerate(objects, start=1):
        wanted[file_name(index, obj)] = to_yaml(obj)
    diffs, written = [], []
    existing = sorted(os.listdir(dest)) if os.path.isdir(dest) else []
    removed = [os.path.join(dest, n) for n in existing if FILE_RE.match(n) and n not in wanted]
    for name, text in wanted.items():
        path = os.path.join(dest, name)
        written.append(path)
        try:
            with open(path) as handle:
                before = handle.read()
        except (IOError, OSError):
            before = None
        if before == text:
            continue
        diffs.append({'before_header': path, 'after_header': path, 'before': before or '', 'after': text})
        if not check:
            os.makedirs(dest, mode=0o750, exist_ok=True)
            tmp = '%s.tmp%d' % (path, os.getpid())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
            with os.fdopen(fd, 'w') as handle:
                handle.write(text)
            os.rename(tmp, path)
    if not check:
        for path in removed:
            os.unlink(path)
    return written, removed, diffs


def dry_run_lines(checked, api_error, admin_dir):
    """What a dry run of present says where no API server answers (checked: the k8s_manifests result of
    state=checked): that nothing was applied and why, what was validated, the objects it would apply in
    order, and what a cluster administrator applies first."""
    cluster = checked['cluster']
    report = checked.get('validated') or {}
    why = ' '.join(str(api_error or 'no answer').split())
    why = re.sub(r'^(Task failed: )?(Module failed: )?', '', why)
    lines = ['dry run of %s: no API server answered (%s); nothing was applied'
             % (cluster['name'], why if len(why) <= 160 else why[:157] + '...'),
             'rendered and validated %d object(s) against Kubernetes %s%s' % (
                 report.get('objects', len(checked['manifests']) + len(checked.get('admin_manifests') or [])),
                 ', '.join(report.get('kubernetes_versions') or []),
                 ' and %s' % ', '.join(report['crd_schemas']) if report.get('crd_schemas') else ''),
             'would apply, in this order, in namespace %s:' % cluster['namespace']]
    lines += ['  %s/%s' % (o['kind'], o['metadata']['name']) for o in checked['manifests']]
    pods = ', '.join('%s (%d)' % (p['name'], p['slots']) for p in checked['pods'])
    lines.append('pods: %s (world size %d)' % (pods, checked['world_size']))
    admin = checked.get('admin_manifests') or []
    if admin:
        lines.append('a cluster administrator applies %s first (once): %s' % (
            admin_dir, ', '.join('%s/%s' % (o['kind'], o['metadata']['name']) for o in admin)))
    else:
        lines.append('no administrator step: nothing outside the namespace is needed')
    return lines
