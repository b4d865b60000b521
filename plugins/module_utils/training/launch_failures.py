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

from ansible_collections.gpucluster.multinode.plugins.module_utils.training.commands import PDSH_EXIT_RE

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


# What `ssh -v` prints as a login goes through its stages (OpenSSH 7 to 9, recorded from 9.2 in
# tests/unit/fixtures/ssh): the TCP connection, the authentication, the login session (sshd opens
# it through PAM: pam_systemd waits there for systemd-logind and the account's user manager, a slow
# NSS/LDAP lookup or PAM module waits there too) and the command.
PROBE_STAGES = (
    ('connect', 'debug1: Connection established.'),
    ('authentication', 'Authenticated to '),
    ('session', 'debug1: Sending command: '),
    ('command', 'debug1: Exit status '),
)
_PROBE_NOISE = ('debug', 'OpenSSH_', 'Authenticated to ', 'Transferred: ', 'Bytes per second')


def probe_attempt_limit(connect_timeout):
    """Seconds one probe of one node may take (the bound of its `timeout`)."""
    return int(connect_timeout) * 2 + 5


def ssh_probe_script(targets, connect_timeout=5):
    """A bash script that runs `ssh -v TARGET true` to every target at once (BatchMode, the pinned
    host keys only, ConnectTimeout, the whole bounded by `timeout`), printing one line per target:
    TARGET<TAB>exit code<TAB>what ssh said (lines, CR LF or LF, joined by ' | '), its -v lines
    included: probe_stage reads from them how far the login went. Each target's line goes to a file of its own
    and the files are printed once every ssh ended: a line is longer than one atomic write to a pipe (ssh -v
    says about 4.4 KB of a login that works), so lines written at once to one pipe would be mixed."""
    opts = ' '.join(shlex.quote(o) for o in ('-v',) + SSH_OPTIONS + ('-o', 'ConnectTimeout=%d' % int(connect_timeout)))
    limit = probe_attempt_limit(connect_timeout)
    lines = []
    for i, target in enumerate(targets):
        t = shlex.quote(str(target))
        lines.append('( out=$(timeout %d ssh -n %s %s true 2>&1); rc=$?; '
                     'printf "%%s\\t%%s\\t%%s\\n" %s "$rc" "$(printf "%%s" "$out" | tr -s "\\r\\n" "|" | sed "s/|$//; s/|/ | /g")" '
                     '>"$probe/%d" ) &' % (limit, opts, t, t, i))
    return ('set +e\nprobe=$(mktemp -d) || exit 1\ntrap \'rm -rf "$probe"\' EXIT\n' + '\n'.join(lines)
            + '\nwait\ncat "$probe"/* 2>/dev/null\n')


def parse_ssh_probe(text):
    """{target: {rc, message, stage}} from the output of ssh_probe_script: message keeps what ssh
    said without its -v lines, stage is the first stage of PROBE_STAGES that did not finish
    (None when the command ran to its end)."""
    out = {}
    for line in (text or '').splitlines():
        parts = line.split('\t', 2)
        if len(parts) < 2 or not parts[1].strip().lstrip('-').isdigit():
            continue
        said = [x.strip() for x in (parts[2] if len(parts) > 2 else '').split(' | ') if x.strip()]
        out[parts[0]] = {'rc': int(parts[1]), 'stage': probe_stage(said),
                         'message': ' | '.join(x for x in said if not x.startswith(_PROBE_NOISE))}
    return out


def probe_stage(lines):
    """The first stage of PROBE_STAGES whose marker is missing from ssh -v's lines, or None when
    every stage finished. Without any -v line (another ssh, or none ran) a stage cannot be told:
    'connect'."""
    for stage, marker in PROBE_STAGES:
        if not any(x.startswith(marker) for x in lines):
            return stage
    return None


def probe_retry_targets(results, targets):
    """The targets worth a second probe: connected and authenticated, but the login session or
    the command did not finish in time (a user manager that is still stopping, a slow PAM or NSS
    lookup). Unreachable, refused and rejected targets are not retried."""
    return [t for t in targets
            if (results.get(str(t)) or {}).get('rc') == 124
            and results[str(t)].get('stage') in ('session', 'command')]


def probe_refusals(results, targets, user, uid=None, limit=None):
    """One line per target the probe did not log in to and run `true` on, naming the stage that
    did not finish: 'head cannot reach NODE over SSH as USER: WHY' when the TCP connection did not
    (a target missing from the output counts: its ssh never reported), and for a node that
    answered, what did not finish after it (authentication, the login session, the command) with
    where to look on that node."""
    lines = []
    within = ' within %d s' % limit if limit else ' within the time limit'
    manager = 'user@%s' % (uid if uid is not None else '$(id -u %s)' % user)
    for target in targets:
        got = results.get(str(target))
        if got is None:
            lines.append('head cannot reach %s over SSH as %s: no answer from ssh' % (target, user))
            continue
        if got['rc'] == 0:
            continue
        # every stage's marker but a non-zero exit: the command itself failed
        stage = got.get('stage', 'connect') or 'command'
        why = got['message'] or ('no answer%s' % within if got['rc'] == 124
                                 else 'ssh exited with exit code %d' % got['rc'])
        if stage == 'connect':
            if got['rc'] == 124:
                why = 'no answer%s' % within
            lines.append('head cannot reach %s over SSH as %s: %s' % (target, user, why))
        elif stage == 'authentication':
            lines.append('head reached %s over SSH, but the SSH handshake or the authentication as %s did not '
                         'finish (%s): run site.yml --tags ssh_trust (keys, pinned host keys) and see '
                         '`journalctl -u ssh` on %s' % (target, user, why.rstrip('.'), target))
        elif stage == 'session':
            late = ('did not start%s (tried twice)' % within if got['rc'] == 124
                    else 'did not start (%s)' % why)
            lines.append('head reached %s over SSH and authenticated as %s, but the login session %s: '
                         'sshd waits there on systemd-logind and the account\'s user manager, or on a slow '
                         'PAM or NSS lookup; see `journalctl -u %s` and `loginctl user-status %s` on %s '
                         '(ssh_trust_linger keeps the user manager running between jobs)'
                         % (target, user, late, manager, user, target))
        else:
            late = ('did not finish%s (tried twice)' % within if got['rc'] == 124
                    else 'failed (%s)' % why)
            lines.append('head logged in to %s over SSH as %s, but the command `true` %s: the account\'s '
                         'login shell or its start-up files (~/.bashrc, /etc/bash.bashrc) stop it there; '
                         'try `sudo -u %s bash -c true` and see `journalctl -u %s` on %s'
                         % (target, user, late, user, manager, target))
    return lines
