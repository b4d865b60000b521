# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Parse the output of nccl-tests (all_reduce_perf, all_gather_perf, ...) by its column header.

The columns changed between versions: old builds print ``type redop`` and an ``error``
column (the largest error, a float); later ones add ``root`` and count wrong elements in
``#wrong``; newer ones add per-iteration columns. The header line names them, so the
rows are read by name, never by position. Out-of-place and in-place are two groups, each
starting at a ``time`` column.

Also read: the device lines (``#  Rank  0 Group  0 Pid 1234 on host device  0 [0x1b]
NVIDIA H100 80GB HBM3``, ``Group`` missing in old builds), the version and test name
lines of newer builds, ``# Out of bounds values : 0 OK`` and ``# Avg bus bandwidth``.

The formulas of nccl-tests (doc/PERFORMANCE.md) are here too: algbw = size / time, and
busbw = algbw x a factor that depends on the collective and the number of ranks.
"""

from __future__ import annotations

import re

_PREFIX_RE = re.compile(r'^\[\d+,\d+\]<std(?:out|err)>:')
_DEVICE_RE = re.compile(
    r'^#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+(?P<group>\d+)\s+)?Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)'
    r'\s+device\s+(?P<device>\d+)\s+\[(?P<bus>[^\]]+)\]\s+(?P<name>.*?)\s*$')
_VERSION_RE = re.compile(r'^#\s*nccl-tests version\s+(?P<version>\S+)(?:\s+nccl-headers=(?P<headers>\d+))?'
                         r'(?:\s+nccl-library=(?P<library>\d+))?')
_START_RE = re.compile(r'^#\s*Collective test starting:\s*(?P<name>\S+)')
_END_RE = re.compile(r'^#\s*Collective test concluded:\s*(?P<name>\S+)')
_OOB_RE = re.compile(r'^#\s*Out of bounds values\s*:\s*(?P<count>\d+)\s*(?P<verdict>\S+)?')
_AVG_RE = re.compile(r'^#\s*Avg bus bandwidth\s*:\s*(?P<value>[-+0-9.eE]+|nan|inf)', re.IGNORECASE)
_NUM_RE = re.compile(r'^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$')

# busbw = algbw * factor(n); see nccl-tests doc/PERFORMANCE.md
_BUS_FACTORS = {
    'all_reduce': lambda n: 2.0 * (n - 1) / n,
    'all_gather': lambda n: float(n - 1) / n,
    'reduce_scatter': lambda n: float(n - 1) / n,
    'alltoall': lambda n: float(n - 1) / n,
    'gather': lambda n: float(n - 1) / n,
    'scatter': lambda n: float(n - 1) / n,
    'broadcast': lambda n: 1.0,
    'reduce': lambda n: 1.0,
    'sendrecv': lambda n: 1.0,
}
COLLECTIVES = tuple(sorted(_BUS_FACTORS))

# how a group column is called in the result
_GROUP_KEYS = {'time': 'time_us', 'algbw': 'algbw_gbs', 'busbw': 'busbw_gbs', '#wrong': 'wrong', 'error': 'error'}


def collective_name(name):
    """'all_reduce' from 'all_reduce_perf', 'AllReduce', 'allreduce' or 'all_reduce'."""
    if not name:
        return None
    key = re.sub(r'(?<=[a-z])(?=[A-Z])', '_', str(name).strip())
    key = re.sub(r'_perf(_mpi)?$', '', key.lower())
    compact = key.replace('_', '')
    for op in COLLECTIVES:
        if op.replace('_', '') == compact:
            return op
    return key


def algbw(size_bytes, time_us):
    """Algorithm bandwidth in GB/s (10^9 bytes per second) as nccl-tests prints it."""
    if time_us is None or time_us <= 0:
        raise ValueError('algbw: time must be above 0 microseconds, got %r' % (time_us,))
    return float(size_bytes) / (time_us * 1e-6) / 1e9


def bus_factor(collective, nranks):
    """The factor from algbw to busbw for a collective on nranks ranks."""
    op = collective_name(collective)
    if op not in _BUS_FACTORS:
        raise ValueError('bus_factor: unknown collective %r; known: %s' % (collective, ', '.join(COLLECTIVES)))
    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
        raise ValueError('bus_factor: nranks must be a whole number of 1 or more, got %r' % (nranks,))
    return _BUS_FACTORS[op](nranks)


def busbw(collective, algbw_gbs, nranks):
    """Bus bandwidth in GB/s: algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather,
    reduce_scatter, alltoall, gather, scatter), x 1 (broadcast, reduce, sendrecv)."""
    return algbw_gbs * bus_factor(collective, nranks)


def _number(text):
    if text in ('N/A', 'n/a', '-'):
        return None
    if re.match(r'^[-+]?\d+$', text):
        return int(text)
    if _NUM_RE.match(text) or text.lower() in ('nan', 'inf', '-inf'):
        return float(text)
    return text


def _header(tokens, groups_line):
    """Leading column names, and the groups [(label, [names])] from the header tokens."""
    starts = [i for i, t in enumerate(tokens) if t == 'time']
    if not starts:
        raise ValueError("nccl-tests column header has no 'time' column: %s" % ' '.join(tokens))
    for needed in ('size', 'count', 'algbw', 'busbw'):
        if needed not in tokens:
            raise ValueError("nccl-tests column header has no '%s' column: %s" % (needed, ' '.join(tokens)))
    labels = groups_line.split() if groups_line else []
    labels = [label.replace('-', '_') for label in labels]
    defaults = ['out_of_place', 'in_place']
    groups = []
    for g, start in enumerate(starts):
        end = starts[g + 1] if g + 1 < len(starts) else len(tokens)
        names = tokens[start:end]
        if g + 1 == len(starts):
            # trailing columns that are not per-group (e.g. a timestamp) follow the last group
            known = [n for n in names if n in _GROUP_KEYS or n.startswith('i_')]
            names = names[:len(known)] if known else names
        label = labels[g] if g < len(labels) else (defaults[g] if g < len(defaults) else 'group_%d' % g)
        groups.append((label, names))
    lead = tokens[:starts[0]]
    used = len(lead) + sum(len(n) for _, n in groups)
    tail = tokens[used:]
    return lead, groups, tail


def parse_nccl_tests(output, nranks=None, collective=None):
    """A dict from the output of one nccl-tests run.

    nranks / collective: what the output itself does not say (an excerpt without device
    lines or test name); values found in the output win.

    Keys: collective, version, nranks, devices [{rank, group, pid, host, device, bus_id,
    name}], hosts (in rank order), columns, rows [{size, count, type, redop, root, ...,
    out_of_place: {time_us, algbw_gbs, busbw_gbs, wrong | error}, in_place: {...}}],
    wrong_total, rows_with_wrong, out_of_bounds {count, ok}, avg_busbw_gbs,
    max_busbw_gbs, concluded.
    Raises ValueError when there is no column header or no result row.
    """
    if isinstance(output, (bytes, bytearray)):
        output = output.decode('utf-8', errors='replace')
    if not isinstance(output, str) or not output.strip():
        raise ValueError('nccl-tests output is empty')

    result = {
        'collective': collective_name(collective),
        'version': None,
        'nranks': None,
        'devices': [],
        'hosts': [],
        'columns': [],
        'rows': [],
        'wrong_total': 0,
        'rows_with_wrong': [],
        'out_of_bounds': None,
        'avg_busbw_gbs': None,
        'max_busbw_gbs': None,
        'concluded': False,
    }
    lead = groups = tail = None
    previous = None
    problems = []
    for raw in output.splitlines():
        line = _PREFIX_RE.sub('', raw).rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith('#'):
            body = stripped
            m = _VERSION_RE.match(body)
            if m:
                result['version'] = m.group('version')
            elif _START_RE.match(body):
                result['collective'] = collective_name(_START_RE.match(body).group('name'))
            elif _END_RE.match(body):
                result['concluded'] = True
            elif _DEVICE_RE.match(body):
                d = _DEVICE_RE.match(body)
                result['devices'].append({
                    'rank': int(d.group('rank')),
                    'group': int(d.group('group')) if d.group('group') is not None else None,
                    'pid': int(d.group('pid')),
                    'host': d.group('host'),
                    'device': int(d.group('device')),
                    'bus_id': d.group('bus'),
                    'name': d.group('name'),
                })
            elif _OOB_RE.match(body):
                m = _OOB_RE.match(body)
                result['out_of_bounds'] = {'count': int(m.group('count')),
                                           'ok': (m.group('verdict') or '').upper() == 'OK'}
            elif _AVG_RE.match(body):
                result['avg_busbw_gbs'] = float(_AVG_RE.match(body).group('value'))
            else:
                tokens = body.lstrip('#').split()
                if 'size' in tokens and 'busbw' in tokens and lead is None:
                    groups_line = previous if previous and 'place' in previous else None
                    lead, groups, tail = _header(tokens, groups_line.lstrip('#') if groups_line else None)
                    result['columns'] = tokens
            previous = body
            continue
        previous = None
        if lead is None:
            if re.search(r'(?i)(test nccl failure|failure|error)', stripped):
                problems.append(stripped)
            continue
        fields = stripped.split()
        if not fields[0].isdigit():
            if re.search(r'(?i)(test nccl failure|test cuda failure|failure)', stripped):
                problems.append(stripped)
            continue  # NCCL INFO/WARN lines interleaved with the table
        width = len(lead) + sum(len(names) for _, names in groups)
        if len(fields) < width:
            continue
        row = {}
        for name, value in zip(lead, fields):
            row[name.lstrip('#')] = _number(value)
        at = len(lead)
        for label, names in groups:
            part = {}
            for name, value in zip(names, fields[at:at + len(names)]):
                part[_GROUP_KEYS.get(name, name.lstrip('#').rstrip('%'))] = _number(value)
            row[label] = part
            at += len(names)
        if tail:
            row[' '.join(tail).lstrip('#')] = ' '.join(fields[at:]) or None
        if not isinstance(row.get('size'), int):
            continue
        rows_wrong = 0
        for label, _ in groups:
            wrong = row[label].get('wrong')
            if isinstance(wrong, int):
                rows_wrong += wrong
        if rows_wrong:
            result['rows_with_wrong'].append(row['size'])
            result['wrong_total'] += rows_wrong
        result['rows'].append(row)

    if lead is None:
        hint = ('; it says: %s' % ' | '.join(problems[:3])) if problems else ''
        raise ValueError("nccl-tests output has no column header (a '#  size  count  type ... time  algbw  busbw' "
                         "line); is it the output of an nccl-tests binary?%s" % hint)
    if not result['rows']:
        hint = ('; it says: %s' % ' | '.join(problems[:3])) if problems else ''
        raise ValueError('nccl-tests output has the column header but no result rows; the test did not run%s' % hint)

    if result['devices']:
        result['nranks'] = len(result['devices'])
        for d in sorted(result['devices'], key=lambda d: d['rank']):
            if d['host'] not in result['hosts']:
                result['hosts'].append(d['host'])
    elif nranks is not None:
        result['nranks'] = int(nranks)
    busbws = [row[label].get('busbw_gbs') for row in result['rows'] for label, _ in groups]
    busbws = [b for b in busbws if isinstance(b, (int, float))]
    result['max_busbw_gbs'] = max(busbws) if busbws else None
    return result


def allreduce_rows(raw_rows, world_size):
    """Rows of the torch benchmark with algbw and busbw by the nccl-tests formulas.

    raw_rows: [{'size', 'count', 'time_us', 'wrong'}]; algbw = size / time (GB/s),
    busbw = algbw x 2(n-1)/n.
    """
    rows = []
    for raw in raw_rows:
        alg = algbw(raw['size'], raw['time_us'])
        rows.append(dict(raw, algbw_gbs=alg, busbw_gbs=busbw('all_reduce', alg, world_size)))
    return rows


def size_label(size):
    for unit, factor in (('G', 1 << 30), ('M', 1 << 20), ('K', 1 << 10)):
        if size >= factor and size % factor == 0:
            return '%d%s' % (size // factor, unit)
    return str(size)
