# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The training environment: the probe run inside it, parsing its output, comparing nodes."""

from __future__ import annotations

import json
import re

MARKER = 'GPUCLUSTER_PYTHON_ENV_INFO '

# Run by the environment's own interpreter. Importing deepspeed logs to stdout, so the
# result is one marked JSON line among whatever else the imports print.
PROBE_SCRIPT = r'''
import json, platform, sys
info = {"python": platform.python_version()}
try:
    import torch
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    info["cuda_available"] = bool(torch.cuda.is_available())
    info["nccl"] = None
    if torch.version.cuda and torch.distributed.is_nccl_available():
        info["nccl"] = torch.cuda.nccl.version()
    import deepspeed
    info["deepspeed"] = deepspeed.__version__
except Exception as exc:  # report, do not crash: the caller names the node
    info["error"] = "%s: %s" % (type(exc).__name__, exc)
print("GPUCLUSTER_PYTHON_ENV_INFO " + json.dumps(info), flush=True)
'''

KEYS = ('python', 'torch', 'cuda', 'nccl', 'deepspeed')


class ProbeError(ValueError):
    """The probe printed no usable result."""


def format_nccl_version(value):
    """torch.cuda.nccl.version() is a tuple (2, 28, 9) in torch >= 1.13, an int 21805 before."""
    if value is None or value == '':
        return None
    if isinstance(value, (list, tuple)):
        return '.'.join(str(int(v)) for v in value)
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        num = int(value)
        major, rest = divmod(num, 10000) if num >= 10000 else divmod(num, 1000)
        minor, patch = divmod(rest, 100)
        return '%d.%d.%d' % (major, minor, patch)
    return str(value)


def parse_probe_output(stdout):
    """The result dict from the probe's stdout (last marked line wins).

    Raises ProbeError when there is no marked line or it is not JSON, and when the
    probe caught an import error (its message is kept).
    """
    found = None
    for line in (stdout or '').splitlines():
        if line.startswith(MARKER):
            found = line[len(MARKER):]
    if found is None:
        raise ProbeError('the probe printed no result line')
    try:
        raw = json.loads(found)
    except ValueError as exc:
        raise ProbeError('the probe result is not JSON: %s' % exc)
    if raw.get('error'):
        raise ProbeError(raw['error'])
    return {
        'python_version': raw.get('python'),
        'torch_version': raw.get('torch'),
        'cuda_version': raw.get('cuda') or None,
        'cuda_available': bool(raw.get('cuda_available')),
        'nccl_version': format_nccl_version(raw.get('nccl')),
        'deepspeed_version': raw.get('deepspeed'),
    }


def versions_line(host, info, width=0):
    """'HOST  torch 2.13.0+cpu  cuda -  nccl -  deepspeed 0.19.8  python 3.11.2' (HOST padded to width)."""
    info = info or {}
    return '%s  torch %s  cuda %s  nccl %s  deepspeed %s  python %s' % (
        str(host).ljust(width), info.get('torch_version') or '-', info.get('cuda_version') or '-',
        info.get('nccl_version') or '-', info.get('deepspeed_version') or '-',
        info.get('python_version') or '-')


def version_mismatches(infos):
    """One line per version that differs between nodes, naming the nodes of each value.

    infos: {host: info dict}. Empty list when every node reports the same versions.
    """
    problems = []
    for key in ('torch_version', 'cuda_version', 'nccl_version', 'deepspeed_version', 'python_version'):
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


_VERSION = re.compile(r'^[0-9]+(\.[0-9]+)*([a-z0-9.!+-]*)$', re.IGNORECASE)
_SHA256 = re.compile(r'^[0-9a-f]{64}$', re.IGNORECASE)


def setting_errors(s):
    """Problems with the python_env settings (a dict of the variables), one line each naming the variable."""
    errors = []
    path = str(s.get('python_env_path') or '')
    if not path.startswith('/'):
        errors.append('python_env_path must be an absolute path (got %r)' % path)
    for key in ('python_env_torch_version', 'python_env_deepspeed_version'):
        if not _VERSION.match(str(s.get(key) or '')):
            errors.append('%s must be a version like 2.13.0 (got %r)' % (key, s.get(key)))
    ninja = str(s.get('python_env_ninja_version') or '')
    if ninja and not _VERSION.match(ninja):
        errors.append('python_env_ninja_version must be a version or empty (got %r)' % ninja)
    for req in s.get('python_env_packages') or []:
        if '==' not in str(req):
            errors.append('python_env_packages entry %r is not pinned with ==' % (req,))
    if s.get('python_env_offline') in (True, 'true', 'True', 'yes', 1) and not s.get('python_env_find_links'):
        errors.append('python_env_offline needs python_env_find_links (a wheelhouse) to install from')
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
