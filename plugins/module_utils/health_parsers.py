# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Node-side parsers of the health probe: profile scripts, the kernel log, /proc/self/mountinfo."""

from __future__ import annotations

import re

_EXPORT_RE = re.compile(r'''^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(?:"([^"]*)"|'([^']*)'|(\S*))''')


def parse_profile_env(text):
    """Variables a profile script sets (``export NAME=value`` / ``NAME="value"``), last one wins."""
    env = {}
    for line in (text or '').splitlines():
        m = _EXPORT_RE.match(line)
        if m:
            value = next(v for v in m.groups()[1:] if v is not None)
            env[m.group(1)] = value
    return env


_XID_RE = re.compile(r'NVRM: Xid \((?P<pci>[^)]*)\): (?P<code>\d+)(?:, (?P<text>.*))?')


def parse_xid_lines(text):
    """Xid events in kernel log text: [{'pci': 'PCI:0000:3b:00', 'code': 79, 'text': ...}]."""
    found = []
    for line in (text or '').splitlines():
        m = _XID_RE.search(line)
        if m:
            found.append({'pci': m.group('pci'), 'code': int(m.group('code')),
                          'text': (m.group('text') or '').strip()})
    return found


def mount_point_type(mountinfo, path):
    """(mounted, fstype) of the mount point path in /proc/self/mountinfo text; fstype gets
    ' (ro)' for a read-only mount. The last mount on path wins (it hides the earlier ones)."""
    mounted, fstype = False, None
    for line in (mountinfo or '').splitlines():
        parts = line.split(' - ')
        if len(parts) != 2:
            continue
        left, right = parts[0].split(), parts[1].split()
        if len(left) < 6 or not right:
            continue
        if left[4].replace('\\040', ' ') == path:
            mounted, fstype = True, right[0]
            if 'ro' in left[5].split(','):
                fstype = '%s (ro)' % fstype
    return mounted, fstype
