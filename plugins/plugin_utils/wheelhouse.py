# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""What an offline wheelhouse (cluster_pip_find_links with cluster_pip_offline) holds, read from its file
names alone, and what a step that installs from it would miss. Controller only: the roles list the
directory on the node (bounded) and refuse before any change (python_env, ray, supervisor)."""

from __future__ import annotations

import re
import shlex


# The wheel file name (binary distribution format): {distribution}-{version}(-{build tag})?-{python tag}-{abi tag}
# -{platform tag}.whl, the distribution's '-' written '_'. A source distribution: {name}-{version}.tar.gz (or .zip).
WHEEL = re.compile(r'^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-[0-9][^-]*)?-[^-]+-[^-]+-[^-]+\.whl$', re.I)
SDIST = re.compile(r'^(?P<name>.+)-(?P<version>[0-9][^-]*)\.(?:tar\.gz|zip)$', re.I)
# A requirement as the roles write them: name, optional [extras], optional ==version (other specifiers: any version).
REQUIREMENT = re.compile(r'^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:==\s*(?P<version>[^\s,;]+))?')


def normalize(name):
    """A distribution name as pip compares them (PEP 503): runs of -, _ and . are one -, case ignored."""
    return re.sub(r'[-_.]+', '-', str(name)).lower()


def distribution_of(filename):
    """(normalized name, version) of a wheel or source archive's file name, None for any other file."""
    base = str(filename).rsplit('/', 1)[-1]
    match = WHEEL.match(base) or SDIST.match(base)
    return (normalize(match.group('name')), match.group('version')) if match else None


RELEASE = re.compile(r'^v?(?P<release>[0-9]+(?:\.[0-9]+)*)(?P<rest>[^+]*)(?:\+(?P<local>.*))?$', re.I)


def _version_key(text):
    """(release without trailing zeros, the rest lowercased, local label) of a version (PEP 440's parts that
    tell two pins apart here), None for one that does not start with a release number."""
    match = RELEASE.match(str(text).strip())
    if not match:
        return None
    release = [int(part) for part in match.group('release').split('.')]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return tuple(release), match.group('rest').lower().lstrip('.-_'), (match.group('local') or '').lower()


def _same_version(wanted, found):
    """found is wanted: equal as versions (2.13 is 2.13.0), a local label on found allowed (torch 2.13.0+cpu
    for ==2.13.0) unless wanted names one."""
    want, have = _version_key(wanted), _version_key(found)
    if want is None or have is None:
        return found == wanted or ('+' not in wanted and found.split('+', 1)[0] == wanted)
    return want == have or (not want[2] and want[:2] == have[:2])


def missing(filenames, requirements):
    """The requirements (as given) no file of filenames satisfies: none of the distribution, or none at the
    ==version asked for."""
    held = {}
    for name in filenames or []:
        found = distribution_of(name)
        if found:
            held.setdefault(found[0], []).append(found[1])
    lacking = []
    for text in requirements or []:
        match = REQUIREMENT.match(str(text))
        if not match:
            lacking.append(str(text))
            continue
        versions = held.get(normalize(match.group('name')), [])
        wanted = match.group('version')
        if not versions or (wanted and not any(_same_version(wanted, v) for v in versions)):
            lacking.append(str(text).strip())
    return lacking


def refusal(lacking, host, directories, step, download=None):
    """One line naming the host, the variable, the directories, what they lack and the command that adds it;
    '' when nothing lacks."""
    if not lacking:
        return ''
    directories = [str(d) for d in directories or []]
    where = ', '.join(directories) or '(none)'
    return ('host %s: cluster_pip_find_links %s %s no wheel of %s (the %s step installs %s offline, '
            'cluster_pip_offline); add %s: pip download -d %s %s (on a machine with the node\'s Python version and '
            'platform, or with --python-version, --platform and --only-binary=:all:)'
            % (host, where, 'holds' if len(directories) < 2 else 'hold', ', '.join(lacking), step,
               'it' if len(lacking) == 1 else 'them', 'it' if len(lacking) == 1 else 'them',
               shlex.quote(directories[0]) if directories else '<wheelhouse>',
               ' '.join(shlex.quote(r) for r in (download or lacking))))
