# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Parse the result table of the perftest bandwidth tools (ib_write_bw, ib_read_bw, ib_send_bw, ...).

    #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
    65536      5000             204.12             203.85             0.388818

The unit comes from the header: MB/sec (the default; perftest divides by 2^20) or
Gb/sec (--report_gbits; 10^9 bits). Every bandwidth is also given in Gbit/s, whatever
the unit printed. A peak of 0.00 means "not measured" (duration runs) and is None.
"""

from __future__ import annotations

import re

_HEADER_RE = re.compile(r'#?bytes\s+#?iterations\s+BW peak\[(?P<unit>[MG]b?B?/sec)\]\s+BW average\[(?P=unit)\]'
                        r'(?P<rate>\s+MsgRate\[Mpps\])?', re.IGNORECASE)
_TITLE_RE = re.compile(r'^\s*(?P<title>[A-Za-z_ ]*?(?:BW|Bandwidth)[A-Za-z ]*Test)\s*$')
_SETTING_RE = re.compile(r'^\s*([A-Za-z][A-Za-z0-9* .]+?)\s*:\s*(\S.*?)\s*$')
_NUMBER_RE = re.compile(r'^\d+(?:\.\d+)?$')

# bytes per second of one unit
_UNIT_BYTES = {'MB/sec': float(1 << 20), 'Gb/sec': 1e9 / 8}


def _unit(text):
    return 'Gb/sec' if text.lower().startswith('gb') else 'MB/sec'


def _to_gbps(value, unit):
    return None if value is None else value * _UNIT_BYTES[unit] * 8 / 1e9


def _settings(lines):
    """'Device : mlx5_0' style settings of the banner, two per line where perftest prints two."""
    found = {}
    for line in lines:
        for part in re.split(r'\t+|\s{3,}(?=[A-Z][A-Za-z* ]+\s*:)', line):
            m = _SETTING_RE.match(part)
            if m and m.group(1).strip().lower() not in ('local address', 'remote address', 'gid'):
                found[m.group(1).strip()] = m.group(2).strip()
    return found


def parse_perftest_bw(output):
    """A dict from perftest bandwidth output.

    Keys: test (e.g. 'RDMA_Write BW Test'), bidirectional, device, link_type, qps,
    unit ('MB/sec' or 'Gb/sec'), rows (one per message size: bytes, iterations,
    bw_peak, bw_average, msg_rate_mpps, bw_peak_gbps, bw_average_gbps), and for the
    largest message size: bytes, bw_average_gbps, bw_peak_gbps.
    Raises ValueError when the table header or its rows are missing.
    """
    if isinstance(output, (bytes, bytearray)):
        output = output.decode('utf-8', errors='replace')
    if not isinstance(output, str) or not output.strip():
        raise ValueError('perftest output is empty')
    lines = output.splitlines()

    header_at = None
    unit = None
    has_rate = False
    for i, line in enumerate(lines):
        m = _HEADER_RE.search(line)
        if m:
            header_at, unit, has_rate = i, _unit(m.group('unit')), bool(m.group('rate'))
            break
    if header_at is None:
        errors = [line.strip() for line in lines if re.search(r'(?i)\b(error|failed|couldn\'t|unable)\b', line)]
        hint = ('; the tool said: %s' % ' | '.join(errors[:3])) if errors else ''
        raise ValueError("perftest output has no result header ('#bytes #iterations BW peak[...] "
                         "BW average[...]'); is it the output of an ib_*_bw client?%s" % hint)

    rows = []
    for line in lines[header_at + 1:]:
        fields = line.split()
        if not fields or fields[0].startswith('-'):
            if rows:
                break
            continue
        if not fields[0].isdigit():
            continue  # a warning printed inside the table (e.g. CPU frequency)
        want = 5 if has_rate else 4
        if len(fields) < want or not all(_NUMBER_RE.match(f) for f in fields[:want]):
            raise ValueError('perftest row %r does not have the %d numeric columns of its header' % (line.strip(), want))
        peak = float(fields[2])
        average = float(fields[3])
        rows.append({
            'bytes': int(fields[0]),
            'iterations': int(fields[1]),
            'bw_peak': peak if peak > 0 else None,
            'bw_average': average,
            'msg_rate_mpps': float(fields[4]) if has_rate else None,
            'bw_peak_gbps': _to_gbps(peak, unit) if peak > 0 else None,
            'bw_average_gbps': _to_gbps(average, unit),
        })
    if not rows:
        raise ValueError('perftest output has the result header but no result rows after it; '
                         'did the client stop before the test ran?')

    banner = lines[:header_at]
    test = None
    for line in banner:
        m = _TITLE_RE.match(line)
        if m:
            test = ' '.join(m.group('title').split())
    settings = _settings(banner)
    qps = settings.get('Number of qps')
    last = max(rows, key=lambda r: r['bytes'])
    return {
        'test': test,
        'bidirectional': bool(test and 'Bidirectional' in test),
        'device': settings.get('Device'),
        'link_type': settings.get('Link type'),
        'qps': int(qps) if qps and qps.isdigit() else None,
        'unit': unit,
        'rows': rows,
        'bytes': last['bytes'],
        'bw_average_gbps': last['bw_average_gbps'],
        'bw_peak_gbps': last['bw_peak_gbps'],
    }
