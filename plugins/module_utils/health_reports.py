# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Health report formats: the report document, the summary table, JUnit XML, the Prometheus
textfile and the changes since the previous report."""

from __future__ import annotations

import json

from ansible_collections.gpucluster.multinode.plugins.module_utils.health_records import (
    _SEVERITY, PROM_STATUS_VALUE, STATUSES, fmt, worst)


def counts(records):
    c = dict((s, 0) for s in STATUSES)
    for r in records:
        c[r['status']] += 1
    return c


def make_report(records, tier, started, finished, cluster=None):
    return dict([
        ('format', 1),
        ('tier', tier),
        ('cluster', cluster or ''),
        ('started', started),
        ('finished', finished),
        ('counts', counts(records)),
        ('nodes', sorted(set(r['node'] for r in records))),
        ('records', list(records)),
    ])


def summary_lines(records, changes=None):
    """The human summary: one line per node with its counts, then every non-ok record."""
    lines = []
    nodes = {}
    for r in records:
        nodes.setdefault(r['node'], []).append(r)
    total = counts(records)
    lines.append('health: %d node(s), %d check(s): %d ok, %d warn, %d fail, %d unknown, %d n/a; status %s'
                 % (len(nodes), len(records), total['ok'], total['warn'], total['fail'], total['unknown'],
                    total['n/a'], worst(r['status'] for r in records).upper()))
    w = max([len(n) for n in nodes] + [4])
    lines.append('%s  %-7s %4s %4s %4s %7s %4s' % ('NODE'.ljust(w), 'STATUS', 'OK', 'WARN', 'FAIL', 'UNKNOWN', 'N/A'))
    for n, recs in nodes.items():
        c = counts(recs)
        lines.append('%s  %-7s %4d %4d %4d %7d %4d' % (n.ljust(w), worst(r['status'] for r in recs).upper(),
                                                       c['ok'], c['warn'], c['fail'], c['unknown'], c['n/a']))
    bad = [r for r in records if r['status'] in ('fail', 'warn')]
    if bad:
        lines.append('problems:')
        for r in sorted(bad, key=lambda r: (-_SEVERITY[r['status']], r['node'], r['check'])):
            lines.append('%s %s %s: %s (value %s, threshold %s)' % (r['status'].upper(), r['node'], r['check'],
                                                                    r['detail'], fmt(r['value']), fmt(r['threshold'])))
            lines.append('    remedy: %s' % r['remedy'])
    unknown = sorted(set(r['check'] for r in records if r['status'] == 'unknown'))
    if unknown:
        lines.append('unknown (not measurable here): %s' % ', '.join(unknown))
    lines.extend(not_applicable_lines(records))
    if changes is not None:
        if changes:
            lines.append('changed since the last run:')
            lines.extend('  ' + c for c in changes)
        else:
            lines.append('changed since the last run: nothing')
    return lines


def not_applicable_lines(records):
    """One line per reason checks do not apply (n/a): the checks, the nodes and why."""
    groups, every = {}, set(r['node'] for r in records)
    for r in (r for r in records if r['status'] == 'n/a'):
        checks, nodes = groups.setdefault(r['detail'], (set(), {}))
        checks.add(r['check'])
        nodes[r['node']] = True
    return ['n/a (does not apply): %s on %s: %s' % (', '.join(sorted(checks)), 'every node' if set(nodes) == every
                                                    else ', '.join(nodes), why) for why, (checks, nodes) in groups.items()]


def junit_xml(records, tier, timestamp, duration_s=0.0):
    """JUnit XML: one testsuite per node, one testcase per check; fail -> <failure>,
    unknown and n/a -> <skipped>, warn passes with the finding in <system-out>."""
    # imported here: xml.sax pulls in urllib, a third of the probe's start-up on every node
    from xml.sax.saxutils import escape as _xml_escape, quoteattr as _xml_quoteattr
    nodes = {}
    for r in records:
        nodes.setdefault(r['node'], []).append(r)
    c = counts(records)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<testsuites name=%s tests="%d" failures="%d" skipped="%d" time="%.3f">'
           % (_xml_quoteattr('gpucluster health %s' % tier), len(records), c['fail'], c['unknown'] + c['n/a'], duration_s)]
    for node, recs in nodes.items():
        nc = counts(recs)
        out.append('  <testsuite name=%s tests="%d" failures="%d" errors="0" skipped="%d" timestamp=%s>'
                   % (_xml_quoteattr(node), len(recs), nc['fail'], nc['unknown'] + nc['n/a'], _xml_quoteattr(timestamp)))
        for r in recs:
            head = '    <testcase classname=%s name=%s' % (_xml_quoteattr('%s.%s' % (tier, node)), _xml_quoteattr(r['check']))
            text = 'value %s, threshold %s: %s' % (fmt(r['value']), fmt(r['threshold']), r['detail'])
            if r['status'] == 'ok':
                out.append(head + '/>')
            elif r['status'] == 'fail':
                out.append(head + '>')
                out.append('      <failure message=%s type="fail">%s</failure>'
                           % (_xml_quoteattr(r['remedy']), _xml_escape(text)))
                out.append('    </testcase>')
            elif r['status'] in ('unknown', 'n/a'):
                out.append(head + '>')
                out.append('      <skipped message=%s/>' % _xml_quoteattr('%s: %s' % (r['status'], r['detail'])))
                out.append('    </testcase>')
            else:
                out.append(head + '>')
                out.append('      <system-out>%s</system-out>' % _xml_escape('WARN %s; remedy: %s' % (text, r['remedy'])))
                out.append('    </testcase>')
        out.append('  </testsuite>')
    out.append('</testsuites>')
    return '\n'.join(out) + '\n'


def _label(v):
    return str(v).replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


def gauge_lines(name, help_text, samples):
    """One gauge family in the text exposition format 0.0.4 (node_exporter's textfile collector):
    samples are (labels as [(name, value)], number); no lines when there are none."""
    if not samples:
        return []
    lines = ['# HELP %s %s' % (name, help_text), '# TYPE %s gauge' % name]
    for labels, value in samples:
        text = ','.join('%s="%s"' % (k, _label(v)) for k, v in labels)
        lines.append('%s{%s} %s' % (name, text, repr(float(value)) if not isinstance(value, int) else '%d' % value))
    return lines


# The numeric value of a check as its own gauge, in base units (Prometheus' naming guide: one
# unit per metric, ratios 0-1): check -> (metric name, help text, factor from the record's value).
# A check not listed here has its status only.
VALUE_METRICS = {
    'disk_free': ('gpucluster_health_disk_free_ratio', 'Free space of the fullest checked file system (0-1).', 0.01),
    'inodes_free': ('gpucluster_health_inodes_free_ratio', 'Free inodes of the fullest checked file system (0-1).', 0.01),
    'clock_offset': ('gpucluster_health_clock_offset_seconds', 'Clock offset against the shared storage server.', 1),
    'mtu': ('gpucluster_health_mtu_bytes', 'MTU of the interface that holds the cluster address.', 1),
    'gpu': ('gpucluster_health_gpus', 'Healthy GPUs the node has.', 1),
    'bandwidth': ('gpucluster_health_bandwidth_bits_per_second', "Median bandwidth of the node's links.", 1e9),
    'collective': ('gpucluster_health_collective_bus_bandwidth_bytes_per_second',
                   'Bus bandwidth of the collective test at its largest size.', 1e9),
}


def prometheus_text(records, tier, timestamp_s):
    """node_exporter textfile collector format (text exposition format 0.0.4)."""
    lines = gauge_lines('gpucluster_health_check_status', 'Health check status: 0 ok, 1 warn, 2 fail, 3 unknown, 4 n/a (does not apply).',
                        [([('tier', tier), ('node', r['node']), ('check', r['check'])], PROM_STATUS_VALUE[r['status']])
                         for r in records])
    numeric = [r for r in records if isinstance(r['value'], (int, float)) and not isinstance(r['value'], bool)]
    for check, (name, help_text, factor) in VALUE_METRICS.items():
        lines += gauge_lines(name, help_text, [([('tier', tier), ('node', r['node'])],
                                                float(round(r['value'] * factor, 6)))
                                               for r in numeric if r['check'] == check])
    c = counts(records)
    lines += gauge_lines('gpucluster_health_checks', 'Checks of the last run by status.',
                         [([('tier', tier), ('status', st)], c[st]) for st in STATUSES])
    lines += gauge_lines('gpucluster_health_last_run_timestamp_seconds', 'When the last run finished.',
                         [([('tier', tier)], float(timestamp_s))])
    return '\n'.join(lines) + '\n'


def changes_since(previous, current, drop_pct=20):
    """What changed from the previous report of the same tier: status changes, values that
    drifted (versions), numeric values that fell by more than drop_pct, nodes gone or new."""
    if not previous:
        return []
    prev = dict(((r['node'], r['check']), r) for r in previous.get('records') or [])
    cur = dict(((r['node'], r['check']), r) for r in current.get('records') or [])
    out = []
    pn = set(n for n, _ in prev)
    cn = set(n for n, _ in cur)
    for n in sorted(cn - pn):
        out.append('%s: new node' % n)
    for n in sorted(pn - cn):
        out.append('%s: no longer in the report' % n)
    for key in sorted(cur):
        if key not in prev:
            continue
        a, b = prev[key], cur[key]
        node, check = key
        va, vb = a.get('value'), b.get('value')
        if a['status'] != b['status']:
            out.append('%s %s: %s -> %s (%s -> %s)' % (node, check, a['status'], b['status'], fmt(va), fmt(vb)))
        elif check.startswith('version.') and va != vb:
            out.append('%s %s: %s -> %s (drifted)' % (node, check, fmt(va), fmt(vb)))
        elif (isinstance(va, (int, float)) and isinstance(vb, (int, float)) and not isinstance(va, bool)
              and va > 0 and check in ('bandwidth', 'collective') and (va - vb) * 100.0 / va > float(drop_pct)):
            out.append('%s %s: %s -> %s (-%.0f%%, became slow)' % (node, check, fmt(va), fmt(vb), (va - vb) * 100.0 / va))
    return out


def dumps(report):
    return json.dumps(report, indent=2) + '\n'
