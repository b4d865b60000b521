# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Which node a launch could not reach, and why, from what ssh, pdsh and mpirun print.

Pure functions over text, tested on recorded lines (tests/unit/fixtures/pdsh, .../openmpi):

- ssh's own refusals (``ssh: connect to host 10.99.0.14 port 22: Connection timed out``,
  ``Permission denied (publickey)``, ``Host key verification failed.``);
- pdsh's per-host prefix (``delta: ssh: connect to host ...``), its ``pdsh@alpha: delta: ssh
  exited with exit code 255`` and ``Timeout, server 10.99.0.12 not responding``;
- the parallel SSH probe the launch preflight runs on the head (ssh_probe_script / parse_ssh_probe).
"""

from __future__ import annotations

import re
import shlex

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import PDSH_EXIT_RE

SSH_OPTIONS = ('-o', 'BatchMode=yes', '-o', 'StrictHostKeyChecking=yes', '-o', 'NumberOfPasswordPrompts=0')

_SSH_ERRORS = (
    r'ssh: connect to host (?P<addr1>\S+) port \d+: .+',
    r'ssh: Could not resolve hostname (?P<addr3>[^:\s]+): .+',
    r'Permission denied \(.+\)\.?',
    r'Host key verification failed\.',
    r'No ECDSA host key is known for .+|No ED25519 host key is known for .+|No RSA host key is known for .+',
    r'Connection (?:closed|reset) by (?P<addr4>\S+) port \d+',
    r'kex_exchange_identification: .+',
    r'Connection to (?P<addr2>\S+) port \d+ timed out',
    r'Connection timed out during banner exchange',
)
SSH_ERROR_RE = re.compile(r'(?P<msg>(?:%s))\s*$' % '|'.join(_SSH_ERRORS))
PDSH_PREFIX_RE = re.compile(r'^(?:pdsh@[^:\s]+: )?(?P<host>[A-Za-z0-9_.:-]+): (?P<rest>.*)$')
PDSH_TIMEOUT_RE = re.compile(r'Timeout, server (?P<host>\S+) not responding')
SSH_UNREACHABLE_CODE = 255


def _node_for(label, nodes):
    """The node whose name or address is label (None when none is)."""
    for node in nodes:
        if label in (node.get('name'), node.get('address')):
            return node['name']
    return None


def unreachable_nodes(text, nodes):
    """[{node, cause, line}] of the nodes the head's launcher could not reach over SSH, first seen
    first, one entry per node; nodes are {name, address} dicts, and a line naming an address or
    a name not in the job is kept under that label. pdsh's 'exited with exit code 255' counts
    (ssh's own code for a connection failure) when no better line names the node."""
    found = {}
    for raw in (text or '').splitlines():
        line = raw.strip()
        if not line:
            continue
        match = PDSH_TIMEOUT_RE.search(line)
        if match:
            label = match.group('host')
            found.setdefault(_node_for(label, nodes) or label, {'cause': match.group(0), 'line': line})
            continue
        match = PDSH_EXIT_RE.match(line)
        if match:
            if int(match.group('code')) == SSH_UNREACHABLE_CODE:
                label = match.group('host')
                node = _node_for(label, nodes) or label
                found.setdefault(node, {'cause': 'ssh exited with exit code 255', 'line': line})
            continue
        host, rest = None, line
        prefix = PDSH_PREFIX_RE.match(line)
        if prefix and SSH_ERROR_RE.match(prefix.group('rest')):
            host, rest = prefix.group('host'), prefix.group('rest')
        error = SSH_ERROR_RE.match(rest)
        if not error:
            continue
        label = host or next((v for k, v in error.groupdict().items() if k.startswith('addr') and v), None)
        if not label:
            continue  # an ssh error that names no node (mpirun prints these unprefixed)
        node = _node_for(label, nodes) or label
        if node in found and found[node]['cause'] == 'ssh exited with exit code 255':
            del found[node]
        found.setdefault(node, {'cause': error.group('msg'), 'line': line})
    return [dict(node=n, **v) for n, v in found.items()]


def ssh_probe_script(targets, connect_timeout=5):
    """A bash script that runs `ssh TARGET true` to every target at once (BatchMode, the pinned
    host keys only, ConnectTimeout, the whole bounded by `timeout`), printing one line per target:
    TARGET<TAB>exit code<TAB>what ssh said (lines, CR LF or LF, joined by ' | ')."""
    opts = ' '.join(shlex.quote(o) for o in SSH_OPTIONS + ('-o', 'ConnectTimeout=%d' % int(connect_timeout)))
    limit = int(connect_timeout) * 2 + 5
    lines = []
    for target in targets:
        t = shlex.quote(str(target))
        lines.append('( out=$(timeout %d ssh -n %s %s true 2>&1); rc=$?; '
                     'printf "%%s\\t%%s\\t%%s\\n" %s "$rc" "$(printf "%%s" "$out" | tr -s "\\r\\n" "|" | sed "s/|$//; s/|/ | /g")" ) &'
                     % (limit, opts, t, t))
    return 'set +e\n' + '\n'.join(lines) + '\nwait\n'


def parse_ssh_probe(text):
    """{target: {rc, message}} from the output of ssh_probe_script."""
    out = {}
    for line in (text or '').splitlines():
        parts = line.split('\t', 2)
        if len(parts) < 2 or not parts[1].strip().lstrip('-').isdigit():
            continue
        out[parts[0]] = {'rc': int(parts[1]), 'message': (parts[2] if len(parts) > 2 else '').strip()}
    return out


def probe_refusals(results, targets, user):
    """Lines 'head cannot reach NODE over SSH as USER: WHY' for every target the probe did not reach
    (a target missing from the output counts: its ssh never reported)."""
    lines = []
    for target in targets:
        got = results.get(str(target))
        if got is None:
            lines.append('head cannot reach %s over SSH as %s: no answer from ssh' % (target, user))
        elif got['rc'] == 124:
            lines.append('head cannot reach %s over SSH as %s: no answer within the time limit' % (target, user))
        elif got['rc'] != 0:
            why = got['message'] or 'ssh exited with exit code %d' % got['rc']
            lines.append('head cannot reach %s over SSH as %s: %s' % (target, user, why))
    return lines
