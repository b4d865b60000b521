# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The training environment: comparing the nodes' versions (read by env_versions), pip output, settings."""

from __future__ import annotations

import re

from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.replaced_vars import SET_AS

# Compared across nodes, in this order: every key of env_versions, python last.
COMPARED = tuple(k for k in env_versions.KEYS if k != 'python') + ('python',)


def versions_line(host, versions, width=0):
    """'HOST  torch 2.13.0+cpu  torch_cuda -  torch_nccl -  nccl_wheel -  deepspeed 0.19.8  python 3.11.2'
    (HOST padded to width; ray only when installed)."""
    versions = versions or {}
    keys = [k for k in COMPARED if k != 'python' and (k != 'ray' or versions.get('ray'))] + ['python']
    return '  '.join([str(host).ljust(width)] + ['%s %s' % (k, versions.get(k) or '-') for k in keys])


# What python_env installs, and so compares: Ray is the ray role's (ray.yml, or site.yml's ray step
# with cluster_ray_enabled), so a node that has no Ray yet is no python_env problem.
INSTALLED = tuple(k for k in COMPARED if k != 'ray')


def version_mismatches(infos, keys=INSTALLED):
    """One line per version of keys that differs between nodes, naming the nodes of each value.

    infos: {host: versions dict (env_versions keys)}. Empty list when every node reports the same versions.
    """
    problems = []
    for key in keys:
        by_value = {}
        for host in infos:
            by_value.setdefault(str((infos[host] or {}).get(key)), []).append(host)
        if len(by_value) > 1:
            parts = ['%s on %s' % (value, ', '.join(hosts)) for value, hosts in sorted(by_value.items())]
            problems.append('%s differs: %s' % (key, '; '.join(parts)))
    return problems


def parse_index_versions(stdout):
    """Versions listed by `pip index versions NAME` ('Available versions: a, b, ...')."""
    for line in (stdout or '').splitlines():
        if line.strip().startswith('Available versions:'):
            return [v.strip() for v in line.split(':', 1)[1].split(',') if v.strip()]
    return []


def version_offered(wanted, offered):
    """True when `==wanted` matches an offered version (a local label like +cpu is allowed)."""
    wanted = str(wanted)
    return any(v == wanted or v.split('+', 1)[0] == wanted for v in offered)


VERSION_RE = re.compile(r'^[0-9]+(\.[0-9]+)*([a-z0-9.!+-]*)$', re.IGNORECASE)
_SHA256 = re.compile(r'^[0-9a-f]{64}$', re.IGNORECASE)


def setting_errors(s):
    """Problems with the python_env settings (a dict of the variables), one line each naming the variable
    the user sets (the cluster_* one of replaced_vars.SET_AS, else the role's own)."""
    errors = []
    path = str(s.get('python_env_path') or '')
    if not path.startswith('/'):
        errors.append('%s must be an absolute path (got %r)' % (SET_AS['python_env_path'], path))
    for key in ('python_env_torch_version', 'python_env_deepspeed_version'):
        if not VERSION_RE.match(str(s.get(key) or '')):
            errors.append('%s must be a version like 2.13.0 (got %r)' % (SET_AS[key], s.get(key)))
    ninja = str(s.get('python_env_ninja_version') or '')
    if ninja and not VERSION_RE.match(ninja):
        errors.append('%s must be a version or empty (got %r)' % (SET_AS['python_env_ninja_version'], ninja))
    for req in s.get('python_env_packages') or []:
        if '==' not in str(req):
            errors.append('%s entry %r is not pinned with ==' % (SET_AS['python_env_packages'], req))
    if s.get('python_env_offline') in (True, 'true', 'True', 'yes', 1) and not s.get('python_env_find_links'):
        errors.append('%s needs %s (a wheelhouse) to install from'
                      % (SET_AS['python_env_offline'], SET_AS['python_env_find_links']))
    if s.get('python_env_installer') == 'uv' and s.get('python_env_backend') == 'conda':
        errors.append('python_env_installer uv works with python_env_backend venv only')
    if s.get('python_env_backend') == 'conda':
        url = s.get('python_env_conda_installer_url') or ''
        local = s.get('python_env_conda_installer_file') or ''
        if bool(url) == bool(local):
            errors.append('python_env_backend conda needs exactly one of python_env_conda_installer_url '
                          'and python_env_conda_installer_file')
        if not _SHA256.match(str(s.get('python_env_conda_installer_sha256') or '')):
            errors.append('python_env_conda_installer_sha256 must be the 64 hex digit sha256 of the installer '
                          '(got %r)' % (s.get('python_env_conda_installer_sha256'),))
        prefix = str(s.get('python_env_conda_prefix') or '')
        if not prefix.startswith('/'):
            errors.append('python_env_conda_prefix must be an absolute path (got %r)' % prefix)
    return errors


_INSTALL_MARKERS = ('Successfully installed ', 'Would install ', 'Installed ')


def install_changed(stdout, stderr=''):
    """True when pip ('Successfully installed', dry run 'Would install') or uv ('Installed N
    packages', dry run 'Would install') reports a change; 'Requirement already satisfied' and
    uv's 'Audited' are no change."""
    for line in ((stdout or '') + '\n' + (stderr or '')).splitlines():
        if line.strip().startswith(_INSTALL_MARKERS):
            return True
    return False


# user[:password]@ in a URL (scheme://user:password@host/...), anywhere in a text.
_URL_CREDENTIALS = re.compile(r'(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<auth>[^/@\s]+)@')


def mask_credentials(text):
    """text with the credentials of every URL in it replaced by ****: https://****@host/simple."""
    if text is None:
        return text
    return _URL_CREDENTIALS.sub(lambda m: m.group('scheme') + '****@', str(text))
