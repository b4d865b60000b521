# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""This collection as one reproducible archive, for a host that runs its playbooks itself (the supervisor)."""

from __future__ import annotations

DOCUMENTATION = r'''
name: collection_bundle
short_description: This collection, as the controller runs it, packed into one reproducible archive
version_added: "0.1.0"
description:
  - Packs the collection the controller runs (C(galaxy.yml) or C(MANIFEST.json), C(meta/), C(playbooks/),
    C(plugins/) and C(roles/); no tests, lab, documentation or caches) into C(<cache>/gpucluster-multinode-<version>-<digest>.tar.gz)
    on the controller, once per content, and returns where it is, its version and its digest.
  - The digest is a SHA-256 of every packed file's path and content, so two controllers with the same
    files give the same digest, and a host whose installed copy carries another digest runs other code.
  - The archive is the same bytes for the same files (sorted names, no times, no owners), so copying it
    again changes nothing.
options:
  cache_dir:
    description: Where the archives are kept on the controller.
    type: str
    default: ~/.cache/gpucluster-multinode
'''

EXAMPLES = r'''
- name: Where this collection's archive is, and its digest
  ansible.builtin.debug:
    msg: "{{ lookup('gpucluster.multinode.collection_bundle') }}"
'''

RETURN = r'''
_raw:
  description: One dict, C(path) (the archive on the controller), C(version), C(digest) (64 hex digits), C(files).
  type: list
  elements: dict
'''

import gzip
import hashlib
import io
import json
import os
import tarfile

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

PACKED = ('meta', 'playbooks', 'plugins', 'roles')
TOP_FILES = ('galaxy.yml', 'MANIFEST.json', 'FILES.json')
SKIPPED_DIRS = ('__pycache__', '.pytest_cache', 'molecule', 'tests')
SKIPPED_FILES = ('lab.yml',)


def collection_root():
    """The collection's root directory: two levels above plugins/lookup."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def collection_version(root):
    """The version galaxy.yml (a source tree) or MANIFEST.json (an installed collection) gives."""
    manifest = os.path.join(root, 'MANIFEST.json')
    if os.path.isfile(manifest):
        with open(manifest) as handle:
            return str(json.load(handle)['collection_info']['version'])
    with open(os.path.join(root, 'galaxy.yml')) as handle:
        for line in handle:
            if line.startswith('version:'):
                return line.split(':', 1)[1].strip().strip('"\'')
    raise AnsibleLookupError('collection_bundle: no version in %s/galaxy.yml' % root)


def packed_files(root):
    """The collection's files to pack, relative to its root, sorted."""
    out = [name for name in TOP_FILES if os.path.isfile(os.path.join(root, name))]
    for top in PACKED:
        for here, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith('.'))
            for name in files:
                # documentation is not what runs: a changed README needs no new copy on the supervisor host
                if name.endswith(('.pyc', '.pyo', '.md')) or name.startswith('.') or name in SKIPPED_FILES:
                    continue
                out.append(os.path.relpath(os.path.join(here, name), root))
    return sorted(out)


def digest(root, files):
    sha = hashlib.sha256()
    for rel in files:
        with open(os.path.join(root, rel), 'rb') as handle:
            data = handle.read()
        sha.update(rel.encode() + b'\0' + str(len(data)).encode() + b'\0' + data)
    return sha.hexdigest()


def write_archive(root, files, path):
    """A tar.gz of the files with no times, owners or gzip name: the same bytes for the same files."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode='w', format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            full = os.path.join(root, rel)
            info = tarfile.TarInfo(rel)
            info.size = os.path.getsize(full)
            info.mode = 0o755 if os.access(full, os.X_OK) else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = 'root'
            with open(full, 'rb') as handle:
                tar.addfile(info, handle)
    tmp = path + '.tmp.%d' % os.getpid()
    with open(tmp, 'wb') as out:
        with gzip.GzipFile(filename='', mode='wb', fileobj=out, mtime=0) as zipped:
            zipped.write(raw.getvalue())
    os.replace(tmp, path)


def bundle(cache_dir, root=None):
    root = root or collection_root()
    files = packed_files(root)
    version = collection_version(root)
    sha = digest(root, files)
    cache_dir = os.path.expanduser(cache_dir)
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, 'gpucluster-multinode-%s-%s.tar.gz' % (version, sha[:16]))
    if not os.path.isfile(path):
        write_archive(root, files, path)
    return {'path': path, 'version': version, 'digest': sha, 'files': len(files)}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        try:
            return [bundle(self.get_option('cache_dir'))]
        except (OSError, ValueError, KeyError) as exc:
            raise AnsibleLookupError('collection_bundle: cannot pack this collection: %s' % exc)
