# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""DeepSpeed ops built ahead of the first job: the probe run in the environment, its parser,
the stamp that records what was built (keyed by the versions) and how long it took."""

from __future__ import annotations

import json
import os

from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions

MARKER = 'GPUCLUSTER_DS_OPS '
STAMP_NAME = 'gpucluster-deepspeed-ops.json'
KEY_FIELDS = ('python', 'torch', 'deepspeed', 'accelerator')

# Run by the environment's interpreter as the job's account:
#   python -c PROBE_SCRIPT MODE OPS_JSON      MODE: probe | build; OPS_JSON: {accelerator: [builder class, ...]}
# DeepSpeed picks the accelerator as the job does (DS_ACCELERATOR, else detection); the ops of that
# accelerator are loaded with the builder's own load(), i.e. the job's JIT path, into torch's
# extension directory of this account (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions/pyXY_ACC).
# Torch's extension directory of this account, as torch's JIT build names it: TORCH_EXTENSIONS_DIR,
# else <build root>/pyXY<abiflags>_<cpu|cuNNN|rocmNNN>. Shared by the probe (torch imported) and
# the file-only read (versions read from files).
EXTENSIONS_DIR_SOURCE = r'''
def extensions_dir(build_root, cuda, hip):
    import os, sys
    root = os.environ.get('TORCH_EXTENSIONS_DIR')
    if root is not None:
        return root
    if hip:
        tag = 'rocm' + hip.replace('.', '')
    elif cuda:
        tag = 'cu' + cuda.replace('.', '')
    else:
        tag = 'cpu'
    return os.path.join(build_root, 'py%d%d%s_%s' % (
        sys.version_info[0], sys.version_info[1], getattr(sys, 'abiflags', ''), tag))
'''

PROBE_SCRIPT = EXTENSIONS_DIR_SOURCE + r'''
import json, os, sys, time
mode, wanted = sys.argv[1], json.loads(sys.argv[2])
import torch
from torch.utils import cpp_extension
import deepspeed
from deepspeed.accelerator import get_accelerator
try:
    from deepspeed.git_version_info import installed_ops
except ImportError:
    installed_ops = {}
acc = get_accelerator()
acc_name = acc._name
root = extensions_dir(cpp_extension.get_default_build_root(), torch.version.cuda, torch.version.hip)
ops = []
for cls in wanted.get(acc_name, []):
    entry = {'builder': cls, 'name': None, 'compatible': False, 'installed': False, 'built': False}
    try:
        builder = acc.create_op_builder(cls)
    except Exception as exc:
        builder, entry['error'] = None, '%s: %s' % (type(exc).__name__, exc)
    if builder is None or getattr(builder, 'name', None) is None:
        entry.setdefault('error', 'no such op builder for accelerator %s' % acc_name)
        ops.append(entry)
        continue
    name = builder.name
    entry['name'] = name
    entry['compatible'] = bool(builder.is_compatible(False))
    entry['installed'] = bool(installed_ops.get(name, False))
    so = os.path.join(root, name, name + '.so')
    entry['built'] = os.path.isfile(so)
    if mode == 'build' and entry['compatible'] and not entry['installed']:
        started = time.time()
        try:
            builder.load(verbose=False)
            entry['seconds'] = round(time.time() - started, 1)
        except Exception as exc:
            entry['error'] = '%s: %s' % (type(exc).__name__, str(exc)[-600:])
        entry['built'] = os.path.isfile(so)
    ops.append(entry)
v = sys.version_info
import platform
from importlib import metadata
print('GPUCLUSTER_DS_OPS ' + json.dumps({
    'python': '%d.%d.%d' % (v[0], v[1], v[2]), 'torch': torch.__version__,
    'deepspeed': deepspeed.__version__, 'accelerator': acc_name, 'extensions_dir': root, 'ops': ops,
    'dist': {'python': platform.python_version(), 'torch': metadata.version('torch'),
             'deepspeed': metadata.version('deepspeed')}}), flush=True)
'''

STAMP_MAIN = r'''
import json, os, platform
from importlib import metadata
found = versions_from_distributions(metadata.distributions())
try:
    built_with = torch_build_versions(metadata.distribution('torch'))
except metadata.PackageNotFoundError:
    built_with = {'cuda': None, 'hip': None}
cache = os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')
root = extensions_dir(os.path.realpath(os.path.join(cache, 'torch_extensions')), built_with['cuda'], built_with['hip'])
stamp = None
try:
    with open(os.path.join(root, 'gpucluster-deepspeed-ops.json')) as handle:
        stamp = json.load(handle)
except (OSError, ValueError):
    pass
present = {}
if isinstance(stamp, dict) and isinstance(stamp.get('ops'), dict):
    for name in stamp['ops']:
        present[name] = os.path.isfile(os.path.join(root, name, name + '.so'))
print('GPUCLUSTER_DS_OPS ' + json.dumps({
    'dist': {'python': platform.python_version(), 'torch': found['torch'], 'deepspeed': found['deepspeed']},
    'ds_accelerator': os.environ.get('DS_ACCELERATOR') or None, 'extensions_dir': root,
    'stamp': stamp, 'present': present}), flush=True)
'''
# Run the same way (python -c STAMP_SCRIPT stamp OPS_JSON) when only files are to be read: the
# installed versions from package metadata (env_versions' reader), torch's CUDA/HIP tag from
# torch/version.py (read, not imported), the extension directory a job would use, the stamp in it
# and whether each op's .so is there. Imports neither torch nor DeepSpeed: a fraction of a second
# instead of seconds per node.
STAMP_SCRIPT = env_versions.READER_SOURCE + EXTENSIONS_DIR_SOURCE + STAMP_MAIN


class ProbeError(Exception):
    """The probe printed no result line."""


def parse_probe_output(stdout, fields=KEY_FIELDS + ('extensions_dir', 'ops')):
    """The probe's result: the last line that starts with MARKER, as a dict."""
    lines = [line for line in (stdout or '').splitlines() if line.startswith(MARKER)]
    if not lines:
        raise ProbeError('the probe printed no %r line' % MARKER.strip())
    try:
        info = json.loads(lines[-1][len(MARKER):])
    except ValueError as exc:
        raise ProbeError('the probe line is not JSON: %s' % exc)
    for field in fields:
        if field not in info:
            raise ProbeError('the probe line lacks %s' % field)
    return info


def version_key(info):
    """What a build is valid for: Python, torch, DeepSpeed and the accelerator."""
    return dict((field, str(info[field])) for field in KEY_FIELDS)


def stamp_path(extensions_dir):
    return os.path.join(extensions_dir, STAMP_NAME)


def read_stamp(path):
    """The stamp as a dict, or {} when missing or unreadable."""
    try:
        with open(path) as handle:
            stamp = json.load(handle)
    except (IOError, OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def _buildable(info):
    return [op for op in info['ops'] if op.get('name') and op.get('compatible') and not op.get('installed')]


def ops_to_build(info, stamp):
    """Names of the ops the role builds: compatible, not in the wheel, and not yet recorded in the
    stamp for these versions (a version change rebuilds) or missing on disk."""
    recorded = stamp.get('ops', {}) if stamp.get('key') == version_key(info) else {}
    return [op['name'] for op in _buildable(info) if not op.get('built') or op['name'] not in recorded]


def ops_the_job_builds(info, stamp):
    """Names of the ops a job would build before step 1: missing on disk, or built for other
    versions according to the stamp."""
    stale = bool(stamp) and stamp.get('key') != version_key(info)
    return [op['name'] for op in _buildable(info) if not op.get('built') or stale]


def unusable_ops(info):
    """'builder: reason' for every op asked for that cannot be built here."""
    bad = []
    for op in info['ops']:
        if op.get('error') and not op.get('name'):
            bad.append('%s: %s' % (op['builder'], op['error']))
        elif op.get('name') and not op.get('compatible'):
            bad.append('%s: not compatible with this node (DeepSpeed says so)' % op['builder'])
    return bad


def build_errors(info):
    """'name: error' for every op whose build failed."""
    return ['%s: %s' % (op['name'], op['error']) for op in info['ops'] if op.get('name') and op.get('error')]


def updated_stamp(stamp, info, built_at):
    """The stamp after a probe or a build: the versions' key, the installed packages' versions
    (what the file-only read compares), and per op its builder, its build seconds and time, or that
    the wheel holds it."""
    key = version_key(info)
    ops = dict(stamp.get('ops', {})) if stamp.get('key') == key else {}
    for op in info['ops']:
        if not op.get('name'):
            continue
        if op.get('installed'):
            ops[op['name']] = {'builder': op['builder'], 'installed': True}
        elif op.get('built') and 'seconds' in op:
            ops[op['name']] = {'builder': op['builder'], 'seconds': op['seconds'], 'built_at': built_at}
        elif op['name'] in ops and op.get('built'):
            ops[op['name']] = dict(ops[op['name']], builder=op['builder'])
    return {'key': key, 'dist': info.get('dist'), 'ops': ops}


def read_without_import(quick, wanted):
    """From the file-only read (STAMP_SCRIPT), whether the ops of `wanted` ({accelerator: [builder,
    ...]}) are ready for the installed versions, without importing torch or DeepSpeed.

    Returns (verdict, stamp, accelerator): verdict 'ready' (every op asked for the recorded
    accelerator is built for these versions and on disk, or in the wheel), 'stale' (a stamp for other
    versions, or an op missing: the probe decides) or 'unknown' (no stamp). The accelerator is the
    recorded one; DS_ACCELERATOR, when set, must agree with it."""
    stamp = quick.get('stamp')
    if not isinstance(stamp, dict) or not isinstance(stamp.get('key'), dict):
        return 'unknown', {}, None
    accelerator = stamp['key'].get('accelerator')
    if not stamp.get('dist') or stamp['dist'] != quick.get('dist'):
        return 'stale', stamp, accelerator
    if quick.get('ds_accelerator') and quick['ds_accelerator'] != accelerator:
        return 'stale', stamp, accelerator
    by_builder = dict((entry.get('builder'), name) for name, entry in stamp.get('ops', {}).items())
    for builder in wanted.get(accelerator, []):
        name = by_builder.get(builder)
        if name is None:
            return 'stale', stamp, accelerator
        if not stamp['ops'][name].get('installed') and not quick.get('present', {}).get(name):
            return 'stale', stamp, accelerator
    return 'ready', stamp, accelerator


def ready_message(stamp, quick, wanted):
    """The preflight's line when the file-only read says ready."""
    accelerator = stamp['key'].get('accelerator')
    names = [name for name, entry in sorted(stamp.get('ops', {}).items()) if entry.get('builder') in wanted.get(accelerator, [])]
    if not names:
        return 'no DeepSpeed op to build for accelerator %s' % accelerator
    return 'DeepSpeed ops ready in %s (%s): no build before step 1' % (quick['extensions_dir'], ', '.join(names))


def unread_message(verdict, stamp, wanted):
    """The preflight's line when the files cannot say the ops are ready (no probe is run then)."""
    accelerator = stamp.get('key', {}).get('accelerator') if stamp else None
    seconds = last_seconds(stamp, [name for name, entry in stamp.get('ops', {}).items()
                                   if entry.get('builder') in wanted.get(accelerator, [])]) if stamp else None
    when = ('the last build here took %.0f s' % seconds) if seconds is not None else 'no build recorded here'
    if verdict == 'unknown':
        return ('no record of DeepSpeed ops built for this environment: the job may build ops before step 1 (%s); '
                'python_env builds them at install time' % when)
    return ('the DeepSpeed ops recorded here were built for other versions or are missing: the job builds them '
            'before step 1 (%s); python_env builds them at install time' % when)


def last_seconds(stamp, names):
    """Seconds the last recorded build of these ops took in all (any versions), or None."""
    recorded = stamp.get('ops', {})
    times = [recorded[name]['seconds'] for name in names if name in recorded and 'seconds' in recorded[name]]
    return round(sum(times), 1) if times else None


def preflight_message(todo, seconds, info):
    """One line for the training preflight."""
    names = [op['name'] for op in info['ops'] if op.get('name')]
    if not names:
        return 'no DeepSpeed op to build for accelerator %s' % info['accelerator']
    if not todo:
        return 'DeepSpeed ops ready in %s (%s): no build before step 1' % (info['extensions_dir'], ', '.join(names))
    when = ('the last build here took %.0f s' % seconds) if seconds is not None else 'no build recorded here'
    return 'the job builds DeepSpeed ops %s before step 1 (%s); python_env builds them at install time' % (
        ', '.join(todo), when)


# ----- ops built into a container image ---------------------------------------------------------
# Run at image build time (the recipe's RUN step) by the image's python:
#   python build_deepspeed_ops.py OPS_JSON OPS_DIR STAMP
# For each accelerator of OPS_JSON ({accelerator: [builder class, ...]}) the probe above runs in
# build mode with DS_ACCELERATOR set and TORCH_EXTENSIONS_DIR=OPS_DIR, i.e. the job's JIT path, and
# the image records in STAMP what was built, for which versions, and what could not be.
IMAGE_BUILD_MAIN = r'''
import json, os, subprocess, sys, time
wanted, ops_dir, stamp_path = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
os.makedirs(ops_dir, exist_ok=True)
os.makedirs(os.path.dirname(stamp_path), exist_ok=True)
record = {'extensions_dir': ops_dir, 'built_at': int(time.time()), 'accelerators': {}}
for acc, builders in sorted(wanted.items()):
    if not builders:
        continue
    env = dict(os.environ, DS_ACCELERATOR=acc, TORCH_EXTENSIONS_DIR=ops_dir)
    done = subprocess.run([sys.executable, '-c', PROBE, 'build', json.dumps({acc: builders})], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    lines = [l for l in done.stdout.splitlines() if l.startswith('GPUCLUSTER_DS_OPS ')]
    if not lines:
        record['accelerators'][acc] = {'error': (done.stderr or done.stdout).strip()[-600:] or 'no answer'}
        print('deepspeed ops for %s: the probe failed: %s' % (acc, record['accelerators'][acc]['error']))
        continue
    info = json.loads(lines[-1][len('GPUCLUSTER_DS_OPS '):])
    entry = {'key': dict((f, str(info[f])) for f in ('python', 'torch', 'deepspeed', 'accelerator')),
             'ops': {}, 'errors': []}
    for op in info['ops']:
        if op.get('installed'):
            entry['ops'][op['name']] = {'builder': op['builder'], 'installed': True}
        elif op.get('built'):
            entry['ops'][op['name']] = {'builder': op['builder'], 'seconds': op.get('seconds')}
        else:
            why = op.get('error') or ('not compatible with the image' if op.get('name') else 'unknown builder')
            entry['errors'].append('%s: %s' % (op['builder'], why))
    record['accelerators'][acc] = entry
    print('deepspeed ops for %s: built %s%s' % (acc, ', '.join(sorted(entry['ops'])) or 'none',
                                                '; not built: ' + '; '.join(entry['errors']) if entry['errors'] else ''))
with open(stamp_path, 'w') as handle:
    json.dump(record, handle, indent=1, sort_keys=True)
'''


def image_build_script():
    """The program the image recipe runs to build DeepSpeed's ops into the image and record them."""
    return ('# Built from gpucluster.multinode deepspeed_ops: builds the DeepSpeed ops into the image.\n'
            'PROBE = %r\n' % PROBE_SCRIPT) + IMAGE_BUILD_MAIN


def image_ops_lines(stamp_text, wanted, accelerator=None, image=''):
    """(ready, lines): whether the job's image carries the ops a job needs ({accelerator: [builder, ...]})
    for the accelerator DeepSpeed will pick (None: every accelerator asked for), read from the image's
    stamp (the text of /etc/gpucluster/deepspeed-ops.json; empty when the image has none)."""
    try:
        stamp = json.loads(stamp_text) if (stamp_text or '').strip() else None
    except ValueError:
        stamp = None
    accs = [accelerator] if accelerator else sorted(a for a, b in wanted.items() if b)
    if not isinstance(stamp, dict) or not isinstance(stamp.get('accelerators'), dict):
        needed = [a for a in accs if wanted.get(a)]
        if not needed:
            return True, ['image %s: no DeepSpeed op to build' % image]
        return False, ['image %s carries no record of DeepSpeed ops (built by an older recipe): a DeepSpeed job '
                       'builds %s in its container before step 1, every run; rebuild the image (site.yml --tags '
                       'container)' % (image, ', '.join('%s for %s' % (', '.join(wanted[a]), a) for a in needed))]
    ready, lines = True, []
    for acc in accs:
        builders = wanted.get(acc) or []
        entry = stamp['accelerators'].get(acc) or {}
        have = dict((e.get('builder'), name) for name, e in (entry.get('ops') or {}).items())
        missing = [b for b in builders if b not in have]
        if not builders:
            lines.append('image %s: no DeepSpeed op to build for %s' % (image, acc))
        elif missing:
            ready = False
            why = '; '.join(entry.get('errors') or []) or entry.get('error') or 'not asked for when the image was built'
            lines.append('image %s lacks the DeepSpeed op(s) %s for %s (%s): a job on %s builds them in its container '
                         'before step 1, every run' % (image, ', '.join(missing), acc, why, acc))
        else:
            lines.append('image %s carries the DeepSpeed ops for %s (%s, built for DeepSpeed %s, torch %s): no build '
                         'before step 1' % (image, acc, ', '.join(sorted(have[b] for b in builders)),
                                            entry['key'].get('deepspeed'), entry['key'].get('torch')))
    return ready, lines
