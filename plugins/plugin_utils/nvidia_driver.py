# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The NVIDIA driver role's decisions: settings checks, package choice per OS, repository answers."""

from __future__ import annotations

import re

# Lowest driver branch each CUDA toolkit release runs on (the driver shipped with the toolkit,
# CUDA release notes table 3, Linux). A toolkit newer than the driver's own CUDA version fails.
CUDA_MIN_BRANCH = {
    '11.8': 520, '12.0': 525, '12.1': 530, '12.2': 535, '12.3': 545, '12.4': 550, '12.5': 555,
    '12.6': 560, '12.8': 570, '12.9': 575, '13.0': 580, '13.1': 590, '13.2': 595,
}

SOURCES = ('distro', 'cuda_repo')


def _is_branch(value):
    return isinstance(value, str) and re.match(r'^[0-9]{3}$', value) is not None


def cuda_major_minor(version):
    match = re.match(r'^([0-9]+)\.([0-9]+)', str(version or ''))
    return '%s.%s' % (match.group(1), match.group(2)) if match else None


def setting_errors(settings):
    """Problems with the role's settings, one line each naming the variable."""
    errors = []
    branch = settings.get('nvidia_driver_branch')
    branch = str(branch) if isinstance(branch, int) and not isinstance(branch, bool) else branch
    if not _is_branch(branch):
        errors.append('nvidia_driver_branch %s is not a driver branch number (three digits, e.g. "580")' % (branch,))
        branch = None
    version = settings.get('nvidia_driver_version') or ''
    if version:
        if not re.match(r'^[0-9]+(\.[0-9]+)+$', str(version)):
            errors.append('nvidia_driver_version %s is not a driver version such as 580.95.05' % (version,))
        elif branch and not str(version).startswith(branch + '.'):
            errors.append('nvidia_driver_version %s is not in nvidia_driver_branch %s' % (version, branch))
    for name in ('nvidia_driver_open', 'nvidia_driver_fabricmanager'):
        if tristate(settings.get(name, 'auto')) is None:
            errors.append('%s %s is not auto, true or false' % (name, settings.get(name)))
    if settings.get('nvidia_driver_source') not in SOURCES:
        errors.append('nvidia_driver_source %s is not one of %s' % (settings.get('nvidia_driver_source'),
                                                                    ', '.join(SOURCES)))
    if settings.get('nvidia_driver_cuda_toolkit'):
        cuda = cuda_major_minor(settings.get('nvidia_driver_cuda_toolkit_version'))
        if cuda is None:
            errors.append('nvidia_driver_cuda_toolkit_version %s is not a CUDA version such as 12.8'
                          % (settings.get('nvidia_driver_cuda_toolkit_version'),))
        elif cuda not in CUDA_MIN_BRANCH:
            errors.append('nvidia_driver_cuda_toolkit_version %s is not a CUDA release this role knows (%s)'
                          % (cuda, ', '.join(sorted(CUDA_MIN_BRANCH, key=_version_key))))
        elif branch and int(branch) < CUDA_MIN_BRANCH[cuda]:
            errors.append('nvidia_driver_cuda_toolkit_version %s needs driver branch %d or newer; '
                          'nvidia_driver_branch %s cannot run it' % (cuda, CUDA_MIN_BRANCH[cuda], branch))
    return errors


def _version_key(text):
    return [int(p) if p.isdigit() else p for p in re.split(r'[.\-~+]', text)]


def tristate(value):
    """'auto', True or False from what a user may write; None for anything else."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == 'auto':
        return 'auto'
    if text in ('true', 'yes', 'on', '1'):
        return True
    if text in ('false', 'no', 'off', '0'):
        return False
    return None


def use_open_modules(setting, device_ids):
    """auto: open kernel modules when every NVIDIA GPU is Turing or newer (device id >= 0x1e00)."""
    setting = tristate(setting)
    if setting is True or setting is False:
        return setting
    ids = [d for d in device_ids or []]
    if not ids:
        return True
    for dev in ids:
        try:
            if int(str(dev), 16) < 0x1e00:
                return False
        except ValueError:
            return False
    return True


def _fill(items, values):
    out = []
    for item in items or []:
        out.append(item.format(**values))
    return out


def package_plan(os_vars, settings, facts=None):
    """What to install on this OS for these settings.

    os_vars is the role's per-OS vars dict (__nvidia_driver_os); settings the public variables;
    facts: kernel, gpu_device_ids, nvswitch_count. Returns a dict: source, repository (words
    naming where packages come from), open (bool), driver, headers, persistenced,
    fabricmanager, toolkit (package lists), dnf_module (EL module stream or '') and errors.
    """
    facts = facts or {}
    errors = []
    source_name = settings.get('nvidia_driver_source')
    source = (os_vars.get('sources') or {}).get(source_name)
    plan = {'source': source_name, 'repository': '', 'open': False, 'driver': [], 'headers': [],
            'persistenced': [], 'fabricmanager': [], 'toolkit': [], 'dnf_module': '', 'errors': errors}
    if source is None:
        errors.append('nvidia_driver_source %s is not offered on %s (choose one of %s)'
                      % (source_name, os_vars.get('name', 'this OS'), ', '.join(sorted(os_vars.get('sources') or {}))))
        return plan
    branch = str(settings.get('nvidia_driver_branch'))
    version = str(settings.get('nvidia_driver_version') or '')
    plan['repository'] = source.get('repository', '')
    if source.get('branches') and branch not in [str(b) for b in source['branches']]:
        errors.append('nvidia_driver_branch %s is not offered by %s (it has branch %s); choose that branch '
                      'or nvidia_driver_source: cuda_repo' % (branch, plan['repository'],
                                                              ', '.join(str(b) for b in source['branches'])))
    is_open = use_open_modules(settings.get('nvidia_driver_open', 'auto'), facts.get('gpu_device_ids'))
    if is_open and not source.get('open_packages'):
        if tristate(settings.get('nvidia_driver_open')) is True:
            errors.append('nvidia_driver_open is true but %s offers no open kernel modules for branch %s'
                          % (plan['repository'], branch))
        is_open = False
    if is_open and tristate(settings.get('nvidia_driver_open', 'auto')) == 'auto' \
            and source.get('open_by_default') is False:
        is_open = False
    plan['open'] = is_open
    values = {'branch': branch, 'version': version, 'kernel': facts.get('kernel', ''),
              'flavour': 'open' if is_open else 'dkms'}
    # A pinned version goes on every driver package (apt: name=VERSION*, dnf: name-VERSION).
    suffix = source.get('version_suffix', '').format(**values) if version else ''
    packages = source.get('open_packages') if is_open else source.get('packages')
    plan['driver'] = [p + suffix for p in _fill(packages, values)]
    if not version and source.get('dnf_module'):
        plan['dnf_module'] = source['dnf_module'].format(**values)
        plan['driver'] = []
    if settings.get('nvidia_driver_kernel_headers', True):
        plan['headers'] = _fill(os_vars.get('headers'), values)
    if settings.get('nvidia_driver_persistenced', True):
        plan['persistenced'] = [p + suffix if source.get('pin_persistenced') else p
                                for p in _fill(source.get('persistenced'), values)]
    fabric = tristate(settings.get('nvidia_driver_fabricmanager', 'auto'))
    wants_fabric = fabric is True or (fabric == 'auto' and int(facts.get('nvswitch_count') or 0) > 0)
    if wants_fabric:
        if not source.get('fabricmanager'):
            errors.append('this node has NVSwitches and needs nvidia-fabricmanager, which %s does not offer; '
                          'set nvidia_driver_source: cuda_repo' % plan['repository'])
        plan['fabricmanager'] = _fill(source.get('fabricmanager'), values)
    if settings.get('nvidia_driver_cuda_toolkit'):
        cuda = cuda_major_minor(settings.get('nvidia_driver_cuda_toolkit_version')) or ''
        offered = [str(v) for v in source.get('toolkit_versions') or []]
        if offered and cuda not in offered:
            errors.append('nvidia_driver_cuda_toolkit_version %s is not offered by %s (it has %s)'
                          % (cuda, plan['repository'], ', '.join(offered)))
        elif not source.get('toolkit'):
            errors.append('%s offers no CUDA toolkit; set nvidia_driver_source: cuda_repo' % plan['repository'])
        major, _dot, minor = cuda.partition('.')
        plan['toolkit'] = _fill(source.get('toolkit'), dict(values, cuda_major=major, cuda_minor=minor))
    return plan


def parse_apt_madison(text):
    """[(package, version, repository line)] from `apt-cache madison PKG`."""
    found = []
    for line in (text or '').splitlines():
        parts = [p.strip() for p in line.split('|')]
        if len(parts) >= 3 and parts[0] and parts[1]:
            found.append((parts[0], parts[1], parts[2]))
    return found


def parse_dnf_list(text):
    """[(package, version, repository)] from `dnf --showduplicates list PKG` (available rows)."""
    found = []
    for line in (text or '').splitlines():
        parts = line.split()
        if len(parts) == 3 and '.' in parts[0] and re.match(r'^[0-9]', parts[1].split(':')[-1]):
            found.append((parts[0].rsplit('.', 1)[0], parts[1].split(':')[-1], parts[2].lstrip('@')))
    return found


def version_offered(pin, versions):
    """Whether a pinned upstream version (580.95.05) is among package versions (580.95.05-0ubuntu1)."""
    pin = str(pin)
    for version in versions:
        upstream = str(version).split(':')[-1]
        if upstream == pin or upstream.startswith(pin + '-') or upstream.startswith(pin + '.el') \
                or upstream.startswith(pin + '~'):
            return True
    return False


def upstream_versions(versions):
    """Driver versions without the packaging revision, newest first, each once."""
    seen = []
    for version in versions:
        upstream = re.split(r'[-~]', str(version).split(':')[-1])[0]
        if upstream not in seen:
            seen.append(upstream)
    return sorted(seen, key=_version_key, reverse=True)


def reboot_reasons(state):
    """Why a reboot is due, from what the node shows after the install.

    state: has_gpu, nouveau_loaded, loaded_version (of the nvidia module in the kernel, '' when
    not loaded), installed_version (of the driver packages).
    """
    reasons = []
    if not state.get('has_gpu'):
        return reasons
    if state.get('nouveau_loaded'):
        reasons.append('nouveau is loaded and holds the GPUs (it is blacklisted now)')
    loaded = state.get('loaded_version') or ''
    installed = state.get('installed_version') or ''
    if loaded and installed and loaded != installed:
        reasons.append('the running kernel module is %s but driver %s is installed' % (loaded, installed))
    elif not loaded and installed:
        reasons.append('driver %s is installed but its kernel module is not loaded' % installed)
    return reasons


def version_mismatches(versions_by_host):
    """One line per driver version found, naming its nodes, when the nodes differ."""
    by_version = {}
    for host, version in sorted(versions_by_host.items()):
        by_version.setdefault(version or 'none', []).append(host)
    if len(by_version) < 2:
        return []
    return ['driver %s on %s' % (v, ', '.join(h)) for v, h in sorted(by_version.items())]
