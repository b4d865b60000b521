# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The Python tracebacks in a node's training log, each with its rank and whether it is the rank's own
error (a root error) or a follow-on of another rank's failure (a peer that closed its connection, a
collective that timed out, the launcher reporting a child that died).

Every launcher's log shape is read: the head's deepspeed log through pdsh (``host: `` before each
line), torch's ``[rank1]: `` and torchrun's ``[default0]:`` (``--tee``) prefixes, a rank's own stderr
(torchrun's per-rank logs), what mpirun and srun forward unprefixed, and torchrun's error report
(``Root Cause (first observed failure)`` with its traceback where the script used ``@record``).
Lines of different prefixes are different streams, so interleaved ranks are told apart.
Standard library only: the training_job and training_progress modules run it on each node."""

from __future__ import annotations

import os
import re

from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr

TRACEBACK = 'Traceback (most recent call last):'
CHAIN_MARKERS = ('During handling of the above exception, another exception occurred:',
                 'The above exception was the direct cause of the following exception:')
# at most this many errors per node, each with at most this many lines of its end
MAX_ERRORS = 4
TAIL_LINES = 15
LINE_CHARS = 400
MESSAGE_LINES = 12
# the bounded tail of a log that is read
READ_BYTES = 4 * 1024 * 1024
READ_LINES = 2000

PREFIX_RE = re.compile(r'^\[(?P<tag>[A-Za-z_][A-Za-z_-]*?)(?P<num>\d+)\]:')
EXCEPTION_RE = re.compile(r'^(?P<type>[A-Za-z_][\w.]*)(?::(?: (?P<message>.*)|$)|$)')
# a line that is no part of an exception's message: a log record, a launcher's line, a step line
RECORD_RE = re.compile(r'^(?:\[\d{4}-\d\d-\d\d[ T]|[IWEF]\d{4} \d\d:\d\d|pdsh@|srun: |slurmstepd|step \d|-{10}|={10})')
PDSH_HOST_RE = re.compile(r'^pdsh@[^:\s]+: (?P<host>[^:\s]+): ', re.M)
DS_WORKERS_RE = re.compile(r'Running on the following workers: (?P<hosts>\S+)')

# A rank's error caused by another rank's failure: what gloo, NCCL and torch.distributed raise in the
# ranks left waiting for a peer that died, and what the launchers raise once one of their ranks died.
FOLLOW_ON = (
    ('a peer closed its connection', re.compile(r'Connection closed by peer')),
    ('a peer reset its connection', re.compile(r'Connection reset by peer|Broken pipe')),
    ('NCCL lost a peer', re.compile(r'remote process exited or there was a network error')),
    ('torch.distributed backend error', re.compile(r'\bDistBackendError\b')),
    ('a collective timed out', re.compile(r'Watchdog caught collective operation timeout|Timed out waiting \d+ms '
                                          r'for (?:recv|send) operation|Some NCCL operations have failed or timed out')),
    ('the NCCL communicator was aborted', re.compile(r'NCCL communicator was aborted|NCCL error:? .*aborted')),
    ('the torchrun agent reports a child that failed', re.compile(r'\bChildFailedError\b')),
    ('the rendezvous closed', re.compile(r'\bRendezvousClosedError\b')),
    ('the process was signalled', re.compile(r'\bSignalException\b|^KeyboardInterrupt\b')),
)


def follow_on_reason(text):
    """Why an exception (its 'Type: message' and message lines) is a follow-on of another rank's
    failure; '' for a root error."""
    for why, pattern in FOLLOW_ON:
        if pattern.search(text or ''):
            return why
    return ''


def known_hosts(text, hosts=()):
    """The host prefixes of a pdsh log: the given names and addresses, the hosts pdsh reports on and the
    workers the deepspeed runner names."""
    found = set(h for h in hosts or () if h)
    found.update(m.group('host') for m in PDSH_HOST_RE.finditer(text or ''))
    for match in DS_WORKERS_RE.finditer(text or ''):
        found.update(h for h in match.group('hosts').split(',') if h)
    return found


def split_prefix(line, hosts):
    """(host, tags, rank, local_rank, body) of a log line: a pdsh host, torchrun's [default0]: and torch's
    [rank1]: prefixes taken off."""
    host = None
    name, sep, rest = line.partition(': ')
    if sep and name in hosts:
        host, line = name, rest
    tags, rank, local_rank = [], None, None
    match = PREFIX_RE.match(line)
    while match:
        tag, num = match.group('tag'), int(match.group('num'))
        tags.append(tag + str(num))
        line = line[match.end():]
        if tag == 'rank':
            rank = num
            line = line[1:] if line.startswith(' ') else line
        else:
            local_rank = num
        match = PREFIX_RE.match(line)
    return host, tuple(tags), rank, local_rank, line


def _exception(line):
    """(type, message) of an exception line, None for any other line."""
    if not line or line[0].isspace():
        return None
    match = EXCEPTION_RE.match(line.rstrip())
    if not match:
        return None
    return match.group('type'), (match.group('message') or '').strip()


class _Stream:
    """One prefix's lines: the traceback (chained group) being read."""

    def __init__(self, key, host, rank, local_rank):
        self.key, self.host, self.rank, self.local_rank = key, host, rank, local_rank
        self.group = None
        self.phase = None

    def start(self, number, line):
        if self.group is None:
            self.group = {'line': number, 'lines': [], 'exceptions': []}
        self.group['lines'].append(line)
        self.phase = 'frames'

    def feed(self, number, line, done):
        """Read one line; a group that ended goes to done (a list)."""
        phase = self.phase
        if phase is None:
            if line.startswith(TRACEBACK):
                self.start(number, line)
            return
        if phase == 'frames':
            if line[:1].isspace():
                self.group['lines'].append(line)
                return
            exc = _exception(line)
            if exc and not line.startswith(TRACEBACK):
                self.group['lines'].append(line)
                self.group['exceptions'].append([exc[0], exc[1], []])
                self.phase = 'message'
                return
            self.close(done)
            return self.feed(number, line, done)
        if phase == 'message':
            if line.strip() in CHAIN_MARKERS:
                self.group['lines'].append(line.strip())
                self.phase = 'chain'
            elif not line.strip():
                self.phase = 'after'
            elif line.startswith(TRACEBACK) or RECORD_RE.match(line) \
                    or len(self.group['exceptions'][-1][2]) >= MESSAGE_LINES:
                self.close(done)
                self.feed(number, line, done)
            else:
                self.group['exceptions'][-1][2].append(line)
                self.group['lines'].append(line)
            return
        # after a blank line or a chain marker: only the chained traceback goes on with the group
        if line.strip() in CHAIN_MARKERS:
            self.group['lines'].append(line.strip())
            self.phase = 'chain'
        elif not line.strip():
            return
        elif line.startswith(TRACEBACK) and phase == 'chain':
            self.start(number, line)
        else:
            self.close(done)
            self.feed(number, line, done)

    def close(self, done):
        group, self.group, self.phase = self.group, None, None
        if not group or not group['exceptions']:
            return
        chain = []
        for kind, message, more in group['exceptions']:
            text = '%s: %s' % (kind, message) if message else kind
            chain.append((text, follow_on_reason('\n'.join([text] + more))))
        roots = [text for text, why in chain if not why]
        error = roots[0] if roots else chain[-1][0]
        done.append({'error': error[:LINE_CHARS], 'type': error.partition(':')[0],
                     'follow_on': not roots, 'why': '' if roots else chain[-1][1],
                     'rank': self.rank, 'local_rank': self.local_rank, 'host': self.host,
                     'line': group['line'] + 1,
                     'lines': [text[:LINE_CHARS] for text in group['lines'][-TAIL_LINES:]]})


REPORT_ENTRY_RE = re.compile(
    r'^\[\d+\]:\n\s+time\s*: (?P<time>\S+)\n\s+host\s*: (?P<host>\S+)\n\s+rank\s*: (?P<rank>-?\d+)'
    r'(?: \(local_rank: (?P<local>\d+)\))?\n\s+exitcode\s*: (?P<code>-?\d+)[^\n]*\n\s+error_file: [^\n]*\n'
    r'\s+traceback : (?P<traceback>(?:[^\n]*\n?)*?)(?=^-{20,}|^={20,}|\Z)', re.M)


def report_errors(text):
    """The errors torchrun's report names: one per failed rank whose traceback it carries (the script
    used @record), the root cause's marked root_cause."""
    out = []
    start = (text or '').find('Root Cause (first observed failure):')
    for match in REPORT_ENTRY_RE.finditer(text or ''):
        body = match.group('traceback')
        if not body.startswith(TRACEBACK):
            continue
        lines = [line[2:] if line.startswith('  ') else line for line in body.splitlines()]
        stream, found = _Stream(None, match.group('host'), int(match.group('rank')), None), []
        for number, line in enumerate(lines):
            stream.feed(number, line, found)
        stream.close(found)
        offset = text.count('\n', 0, match.start())
        for item in found:
            item.update(line=offset + 1, local_rank=int(match.group('local')) if match.group('local') else None,
                        root_cause=0 <= start < match.start(), exit_code=int(match.group('code')))
        out.extend(found)
    return out


def parse(text, hosts=(), local_rank=None):
    """[error] of every traceback in a log's text, in the order they started: {error ('Type: message',
    a chained group's first root exception, else its last), type, follow_on, why (the follow-on's
    reason), rank, local_rank, host (the pdsh host), line (its first line's number), lines (its end)}."""
    hosts = known_hosts(text, hosts)
    streams, done = {}, []
    for number, raw in enumerate((text or '').splitlines()):
        host, tags, rank, local, body = split_prefix(raw, hosts)
        key = (host, tags)
        stream = streams.get(key)
        if stream is None:
            stream = streams[key] = _Stream(key, host, rank, local if local is not None else local_rank)
        stream.feed(number, body.rstrip('\r'), done)
    for stream in streams.values():
        stream.close(done)
    seen = set((e['rank'], e['error']) for e in done)
    for item in report_errors(text):
        if (item['rank'], item['error']) not in seen:
            done.append(item)
        else:
            for e in done:
                if (e['rank'], e['error']) == (item['rank'], item['error']):
                    e['root_cause'] = item['root_cause']
    return sorted(done, key=lambda e: e['line'])


def bound(errors, most=MAX_ERRORS):
    """At most most errors, in their order: the earliest root errors first kept, then the last follow-ons
    (the last traceback of a log whose ranks only saw a peer fail)."""
    roots = [e for e in errors if not e['follow_on']]
    keep = roots[:most - 1] if len(roots) < len(errors) else roots[:most]
    rest = [e for e in errors if e['follow_on']]
    if most - len(keep) > 0 and rest:
        keep += rest[-(most - len(keep)):]
    order = dict((id(e), i) for i, e in enumerate(errors))
    return sorted(keep, key=lambda e: order[id(e)])


def read_tail(path, max_bytes=READ_BYTES, max_lines=READ_LINES):
    """The last max_lines lines within the last max_bytes of a file ('' when it cannot be read)."""
    read = pr.tail_text(path, max_bytes)
    return '\n'.join(read[0].splitlines()[-max_lines:]) if read else ''


def log_errors(paths, hosts=(), most=MAX_ERRORS):
    """The bounded errors of a node's logs (its launcher or agent log first, then per-rank logs), each
    with the log it was read from; the same rank's same error read twice (the agent's --tee and the
    rank's own log) is kept once."""
    found, seen = [], set()
    for path in paths:
        local = None
        parent = os.path.basename(os.path.dirname(path))
        if os.path.basename(path) in ('stderr.log', 'stdout.log') and parent.isdigit():
            local = int(parent)  # torchrun's per-rank log: <log_dir>/<run>/attempt_N/<local rank>/
        for item in parse(read_tail(path), hosts, local):
            key = (item['rank'], item['local_rank'] if item['rank'] is None else None, item['host'], item['error'])
            if key in seen:
                continue
            seen.add(key)
            item['log'] = path
            found.append(item)
    return bound(found, most)
