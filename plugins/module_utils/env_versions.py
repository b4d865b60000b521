# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The versions of a training environment (a venv or conda prefix), one key set for every reader.

Keys (``KEYS``), each a string or None when the component is not installed or cannot be known:

``python``
    the interpreter's version, ``3.11.2``
``torch``
    ``torch.__version__`` with its local label, ``2.13.0+cpu``
``torch_cuda``
    the CUDA version torch was built with (``torch.version.cuda``), None for a CPU build
``torch_nccl``
    the NCCL torch uses (``torch.cuda.nccl.version()``, as ``2.28.9``); only known by importing
    torch (``read(..., imports=True)``), None otherwise and for a CPU build
``nccl_wheel``
    the version of the ``nvidia-nccl-cu*`` distribution, None when it is not installed
``deepspeed``
    ``deepspeed.__version__``
``ray``
    the ``ray`` distribution, None when it is not installed

Everything but ``torch_nccl`` is read from the installed distributions' metadata: on disk, with
no interpreter started, when the environment's site-packages can be found from the interpreter's
path (a venv without system site-packages, a conda prefix); otherwise by running the
environment's interpreter with ``probe_script()`` (which reads the same metadata, or imports torch
and DeepSpeed with ``imports=True``). Both paths run the same reader, ``READER_SOURCE``.

API (kept stable): ``KEYS``, ``empty()``, ``site_dirs(python)``, ``from_site_dirs(dirs)``,
``probe_script(imports=False)``, ``parse_probe_output(stdout)``, ``format_nccl_version(value)``,
``read(module, python, imports=False, environ=None, timeout=300)``, ``ProbeError``,
``unsatisfied(module, python, requirements, timeout=300)``.
"""

from __future__ import annotations

import glob
import json
import os
import re

KEYS = ('python', 'torch', 'torch_cuda', 'torch_nccl', 'nccl_wheel', 'deepspeed', 'ray')

MARKER = 'GPUCLUSTER_ENV_VERSIONS '

# The one reader of the distributions' metadata. It runs here (compiled below) and inside the
# environment's own interpreter (probe_script), so it may use only the standard library.
READER_SOURCE = r'''
import re as _re


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


def versions_from_distributions(dists):
    """The keys but python and torch_nccl, from importlib.metadata distributions."""
    out = {'torch': None, 'torch_cuda': None, 'nccl_wheel': None, 'deepspeed': None, 'ray': None}
    torch = None
    for d in dists:
        name = (d.metadata.get('Name') or '').lower().replace('_', '-')
        if name in ('torch', 'deepspeed', 'ray') and out[name] is None:
            out[name] = d.version
            if name == 'torch':
                torch = d
        elif name.startswith('nvidia-nccl-cu') and out['nccl_wheel'] is None:
            out['nccl_wheel'] = d.version
    if torch is not None:
        out['torch_cuda'] = torch_build_versions(torch)['cuda']
    return out


def torch_build_versions(torch):
    """{'cuda', 'hip'}: the CUDA and ROCm versions a torch distribution was built with, read from
    its torch/version.py (not imported); None where it has none."""
    out = {'cuda': None, 'hip': None}
    try:
        with open(str(torch.locate_file('torch/version.py'))) as f:
            text = f.read()
    except (IOError, OSError):
        return out
    for name in out:
        found = _re.search(r"^%s\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]" % name, text, _re.M)
        out[name] = found.group(1) if found else None
    return out
'''

_MAIN = r'''
import json as _json, platform as _platform, sys as _sys
from importlib import metadata as _metadata
_info = versions_from_distributions(_metadata.distributions())
_info['python'] = _platform.python_version()
_info['torch_nccl'] = None
if IMPORTS:
    try:
        import torch
        _info['torch'] = torch.__version__
        _info['torch_cuda'] = torch.version.cuda
        _info['cuda_available'] = bool(torch.cuda.is_available())
        if torch.version.cuda and torch.distributed.is_nccl_available():
            _info['torch_nccl'] = format_nccl_version(torch.cuda.nccl.version())
        import deepspeed
        _info['deepspeed'] = deepspeed.__version__
    except Exception as exc:  # reported, not raised: the caller names the node
        _info['error'] = '%s: %s' % (type(exc).__name__, exc)
print(MARKER + _json.dumps(_info), flush=True)
'''

_reader = {}
exec(compile(READER_SOURCE, 'env_versions.READER_SOURCE', 'exec'), _reader)  # pylint: disable=exec-used
versions_from_distributions = _reader['versions_from_distributions']
format_nccl_version = _reader['format_nccl_version']


class ProbeError(ValueError):
    """The environment's interpreter printed no usable result."""


def empty():
    """Every key, None."""
    return dict.fromkeys(KEYS)


def probe_script(imports=False):
    """Python source that prints one ``MARKER`` line with the versions as JSON. With imports, it
    also imports torch and DeepSpeed (adding ``cuda_available``, ``torch_nccl``, and ``error`` when
    an import fails); DeepSpeed logs to stdout on import, hence the marker."""
    return '%s\nMARKER = %r\nIMPORTS = %r\n%s' % (READER_SOURCE, MARKER, bool(imports), _MAIN)


def _last_marked(stdout):
    """What follows MARKER on the last line that starts with it, or None."""
    found = None
    for line in (stdout or '').splitlines():
        if line.startswith(MARKER):
            found = line[len(MARKER):]
    return found


def _run_bounded(module, cmd, timeout, environ=None):
    """(rc, stdout, stderr, timed_out) of cmd under `timeout` seconds where the timeout tool exists."""
    timeout_bin = module.get_bin_path('timeout') if timeout else None
    if timeout_bin:
        cmd = [timeout_bin, str(int(timeout))] + list(cmd)
    rc, out, err = module.run_command(cmd, environ_update=dict(environ or {}))
    return rc, out, err, bool(timeout_bin) and rc == 124


def parse_probe_output(stdout):
    """The versions (every key) from the probe's stdout; the last marked line wins. Keys the
    probe adds (``cuda_available``, ``error``) are kept. Raises ProbeError without a marked JSON line."""
    found = _last_marked(stdout)
    if found is None:
        raise ProbeError('the probe printed no result line')
    try:
        raw = json.loads(found)
    except ValueError as exc:
        raise ProbeError('the probe result is not JSON: %s' % exc)
    if not isinstance(raw, dict):
        raise ProbeError('the probe result is not a JSON object')
    out = empty()
    out.update(raw)
    out['torch_nccl'] = format_nccl_version(out.get('torch_nccl'))
    out['torch_cuda'] = out.get('torch_cuda') or None
    return out


def site_dirs(python):
    """The site-packages directories of the environment whose interpreter is ``python``, found on
    disk; None when only the interpreter knows them (a system interpreter, a venv that also sees
    the system's packages, no such directory)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    cfg = os.path.join(root, 'pyvenv.cfg')
    if os.path.isfile(cfg):
        with open(cfg) as f:
            if re.search(r'^\s*include-system-site-packages\s*=\s*true', f.read(), re.M | re.I):
                return None
    elif not os.path.isdir(os.path.join(root, 'conda-meta')):
        return None
    return site_packages(root) or None


def site_packages(root):
    """The site-packages directories under an environment's prefix (empty when there are none)."""
    return [d for pattern in ('lib/python3*/site-packages', 'lib64/python3*/site-packages')
            for d in sorted(glob.glob(os.path.join(root, pattern)))]


def ray_version(env_path):
    """Ray's version in the environment at env_path, read from its metadata on disk ('' when none)."""
    dirs = site_packages(env_path)
    if not dirs:
        return ''
    # imported here: importlib.metadata is Python 3.8+, and ansible-core 2.16 (requires_ansible) still
    # runs modules with an older node Python, where only this reading should fail, not the whole module
    from importlib import metadata
    return versions_from_distributions(metadata.distributions(path=dirs))['ray'] or ''


def _python_on_disk(dirs):
    """The interpreter's version from pyvenv.cfg (``version``/``version_info``) or conda-meta,
    else major.minor from the site-packages path."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(dirs[0])))
    cfg = os.path.join(root, 'pyvenv.cfg')
    if os.path.isfile(cfg):
        with open(cfg) as f:
            found = re.search(r'^\s*version(?:_info)?\s*=\s*([0-9]+\.[0-9]+\.[0-9]+)', f.read(), re.M)
        if found:
            return found.group(1)
    metas = glob.glob(os.path.join(root, 'conda-meta', 'python-[0-9]*.json'))
    if metas:
        found = re.match(r'python-([0-9][^-]*)-', os.path.basename(sorted(metas)[-1]))
        if found:
            return found.group(1)
    found = re.search(r'python([0-9]+\.[0-9]+)', dirs[0])
    return found.group(1) if found else None


def from_site_dirs(dirs):
    """Every key read from the metadata in ``dirs`` (``torch_nccl`` None)."""
    # imported here: importlib.metadata is Python 3.8+, and ansible-core 2.16 (requires_ansible) still
    # runs modules with an older node Python, where only this reading should fail, not the whole module
    from importlib import metadata
    out = empty()
    out.update(versions_from_distributions(metadata.distributions(path=list(dirs))))
    out['python'] = _python_on_disk(list(dirs))
    return out


def read(module, python, imports=False, environ=None, timeout=300):
    """(versions, error) of the environment of interpreter ``python``.

    Without imports the metadata is read on disk when possible, else by the interpreter; with
    imports the interpreter imports torch and DeepSpeed (bounded by ``timeout`` seconds). error is
    None or one line saying why nothing (or not everything) could be read."""
    if not python:
        return {}, None
    if not os.access(python, os.X_OK):
        return {}, '%s does not exist or is not executable' % python
    if not imports:
        dirs = site_dirs(python)
        if dirs:
            try:
                return from_site_dirs(dirs), None
            except Exception:  # an unreadable record: ask the interpreter below  # pylint: disable=broad-except
                pass
    rc, out, err, timed_out = _run_bounded(module, [python, '-c', probe_script(imports)], timeout, environ)
    try:
        versions = parse_probe_output(out)
    except ProbeError as exc:
        if timed_out:
            return {}, '%s did not answer within %s s' % (python, timeout)
        lines = (err or out or '').strip().splitlines()
        return {}, '%s (%s)' % (exc, lines[-1] if lines else 'exit code %d' % rc)
    return versions, versions.pop('error', None)


# Run by the environment's interpreter: which requirement strings its distributions do not satisfy,
# parsed by pip's own packaging, with their dependencies (and those of the extras asked for).
# Prints MARKER + a JSON list, or null when there is no parser.
REQUIREMENTS_SCRIPT = r'''
import json, sys
from importlib import metadata
try:
    from pip._vendor.packaging.requirements import Requirement
except ImportError:
    try:
        from packaging.requirements import Requirement
    except ImportError:
        print(sys.argv[1] + 'null')
        sys.exit(0)


def satisfied(req, extra=None, seen=None):
    """The requirement holds, and so does every requirement of what it names, all the way down
    (what pip check reads): a dependency removed by hand means pip has work to do."""
    seen = set() if seen is None else seen
    if req.url:
        return False
    if req.marker is not None and not req.marker.evaluate({'extra': extra or ''}):
        return True
    try:
        dist = metadata.distribution(req.name)
    except metadata.PackageNotFoundError:
        return False
    if not req.specifier.contains(dist.version, prereleases=True):
        return False
    extras = tuple(sorted(req.extras))
    if (req.name.lower(), extras) in seen:
        return True
    seen.add((req.name.lower(), extras))
    for text in dist.requires or []:
        dep = Requirement(text)
        wanted = [e for e in extras if dep.marker is not None and dep.marker.evaluate({'extra': e})]
        if dep.marker is not None and not wanted and not dep.marker.evaluate({'extra': ''}):
            continue
        dep.marker = None
        if not satisfied(dep, None, seen):
            return False
    return True


out = []
for text in json.loads(sys.argv[2]):
    try:
        ok = satisfied(Requirement(text))
    except Exception:
        ok = False
    if not ok:
        out.append(text)
print(sys.argv[1] + json.dumps(out))
'''


def unsatisfied(module, python, requirements, timeout=300):
    """The requirement strings the environment of ``python`` does not satisfy, or None when it
    cannot tell (no interpreter, no parser, no answer in ``timeout`` seconds)."""
    if not os.access(python, os.X_OK):
        return None
    rc, out, _err, _timed_out = _run_bounded(
        module, [python, '-c', REQUIREMENTS_SCRIPT, MARKER, json.dumps(list(requirements))], timeout)
    marked = _last_marked(out)
    if rc != 0 or marked is None:
        return None
    try:
        found = json.loads(marked)
    except ValueError:
        return None
    return found if isinstance(found, list) else None
