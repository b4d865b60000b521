# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The health report as one self-contained HTML page (the health_report module writes it beside the
JSON, ``latest-<tier>.html``): every check of every node in a grid coloured by status, what failed or
warned with its detail and remedy, the checks that could not be measured, those that do not apply (n/a,
in a neutral grey, with why), and what changed since the last run of the tier. The report (health_reports.make_report, with its changes) is embedded as JSON
(DATA_ID)."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.module_utils import report_html as rh
from ansible_collections.gpucluster.multinode.plugins.module_utils.health_records import STATUSES, _SEVERITY, fmt, worst
from ansible_collections.gpucluster.multinode.plugins.module_utils.health_reports import not_applicable_lines

DATA_ID = 'gpucluster-health-data'
# The CSS class of a status ('n/a' is no class name a selector can write plainly).
STATUS_CLASS = {'n/a': 'na'}


def status_class(status):
    return STATUS_CLASS.get(status, status)


def page_name(tier):
    return 'latest-%s.html' % tier


def _grid(report):
    nodes = list(report.get('nodes') or [])
    cells = {}
    for r in report.get('records') or []:
        cells[(r['check'], r['node'])] = r
    checks = sorted({check for check, _ in cells})
    out = ['<table class="grid">', '<tr><th>check</th>%s</tr>' % ''.join(
        '<th class="node">%s</th>' % rh.esc(n) for n in nodes)]
    for check in checks:
        row = ['<td>%s</td>' % rh.esc(check)]
        for node in nodes:
            r = cells.get((check, node))
            if r is None:
                row.append('<td class="none">-</td>')
                continue
            title = '%s %s: %s (value %s, threshold %s)' % (
                node, check, r.get('detail') or r['status'], fmt(r.get('value')), fmt(r.get('threshold')))
            row.append('<td class="%s" data-node="%s" data-check="%s" data-status="%s" title="%s">%s</td>'
                       % (rh.esc(status_class(r['status'])), rh.esc(node), rh.esc(check), rh.esc(r['status']), rh.esc(title),
                          rh.esc(r['status'])))
        out.append('<tr>%s</tr>' % ''.join(row))
    out.append('</table>')
    return '\n'.join(out)


def render(report):
    """The page of a report (health_reports.make_report's, with 'changes' and 'previous_report' when the
    module compared it with the previous one)."""
    records = report.get('records') or []
    counts = report.get('counts') or {}
    state = worst(r['status'] for r in records)
    title = 'health %s%s' % (report.get('tier', ''), (' of %s' % report['cluster']) if report.get('cluster') else '')
    body = ['<h1>Cluster health: %s tier%s <span class="badge %s">%s</span></h1>'
            % (rh.esc(report.get('tier', '')), rh.esc((' of ' + report['cluster']) if report.get('cluster') else ''),
               rh.esc(state), rh.esc(state.upper())),
            '<p class="note">started %s, finished %s; %d node(s), %d check(s): %s</p>'
            % (rh.esc(report.get('started', '-')), rh.esc(report.get('finished', '-')), len(report.get('nodes') or []),
               len(records), rh.esc(', '.join('%d %s' % (counts.get(s, 0), s) for s in STATUSES)))]

    bad = sorted((r for r in records if r['status'] in ('fail', 'warn')),
                 key=lambda r: (-_SEVERITY[r['status']], r['node'], r['check']))
    body.append('<h2>What failed</h2>')
    if bad:
        rows = ['<table class="problems">', '<tr><th>status</th><th>node</th><th>check</th><th>what</th><th>value</th>'
                '<th>threshold</th><th>remedy</th></tr>']
        for r in bad:
            rows.append('<tr class="problem" data-node="%s" data-check="%s" data-status="%s"><td class="%s">%s</td>'
                        '<td class="node">%s</td><td class="check">%s</td><td>%s</td><td>%s</td><td>%s</td>'
                        '<td class="remedy">%s</td></tr>'
                        % (rh.esc(r['node']), rh.esc(r['check']), rh.esc(r['status']), rh.esc(r['status']),
                           rh.esc(r['status'].upper()), rh.esc(r['node']), rh.esc(r['check']), rh.esc(r.get('detail')),
                           rh.esc(fmt(r.get('value'))), rh.esc(fmt(r.get('threshold'))), rh.esc(r.get('remedy'))))
        rows.append('</table>')
        body.append('\n'.join(rows))
    else:
        body.append('<p class="note" id="nothing-failed">nothing failed or warned</p>')

    body.append('<h2>Changed since the last run</h2>')
    changes = report.get('changes')
    if not report.get('previous_report'):
        body.append('<p class="note" id="no-previous">no earlier report of this tier to compare with</p>')
    elif changes:
        body.append('<ul class="changes">%s</ul>' % ''.join('<li>%s</li>' % rh.esc(c) for c in changes))
        body.append('<p class="note">compared with %s</p>' % rh.esc(report['previous_report']))
    else:
        body.append('<p class="note" id="no-changes">nothing changed since %s</p>' % rh.esc(report['previous_report']))

    body.append('<h2>Every check by node</h2>')
    body.append(_grid(report))
    unknown = sorted({r['check'] for r in records if r['status'] == 'unknown'})
    if unknown:
        body.append('<p class="note">unknown (not measurable here): %s</p>' % rh.esc(', '.join(unknown)))
    body.extend('<p class="note not-applicable">%s</p>' % rh.esc(line) for line in not_applicable_lines(records))
    return rh.page(title, body, report, DATA_ID)
