# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Self-contained HTML pages: the page shell, inline SVG plots and the page's data as JSON.

A page holds everything it shows: its style inline, its plots as SVG drawn here, no script (a
Content-Security-Policy forbids scripts, fonts, images and requests from anywhere), so it opens
from a file with no server and no network. The data the plots were drawn from is embedded as JSON
(``<script type="application/json" id="...">``, which the browser never runs) for a reader or a
test to compare with its source.
"""

from __future__ import annotations

import html
import json
import math
import time

CSP = "default-src 'none'; style-src 'unsafe-inline'"
COLORS = ('#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f',
          '#bcbd22', '#17becf')
STATUS_COLORS = {'ok': '#2e7d32', 'warn': '#ef6c00', 'fail': '#c62828', 'unknown': '#757575', 'n/a': '#eceff1'}
STYLE = '''
body{font-family:"DejaVu Sans",Arial,Helvetica,sans-serif;margin:24px;color:#222;background:#fff;max-width:1100px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}.note{color:#555;font-size:13px}.badge{display:inline-block;padding:1px 8px;border-radius:9px;
color:#fff;font-size:13px}.ok{background:#2e7d32}.warn{background:#ef6c00}.fail{background:#c62828}
.unknown{background:#757575}.info{background:#1565c0}td.ok,td.warn,td.fail,td.unknown{color:#fff;text-align:center}
.na{background:#eceff1;color:#546e7a;border:1px dashed #b0bec5}td.na{text-align:center;font-style:italic}
svg{display:block;margin:6px 0}svg text{font-family:"DejaVu Sans",Arial,sans-serif;font-size:11px;fill:#333}
.legend span{display:inline-block;margin-right:14px;font-size:13px}.legend i{display:inline-block;width:14px;height:3px;
margin:0 5px 3px 0;vertical-align:middle}td.node,th.node{white-space:nowrap}
'''


def esc(value):
    return html.escape('' if value is None else str(value), quote=True)


def downsample(items, most):
    """At most `most` items of a list, evenly spread, the first and the last always kept."""
    items = list(items)
    most = max(2, int(most))
    if len(items) <= most:
        return items
    last = len(items) - 1
    picked = sorted({int(round(i * last / float(most - 1))) for i in range(most)})
    return [items[i] for i in picked]


def json_script(data, element_id):
    """The data as JSON in a script element the browser does not run (a '</script>' in it is escaped)."""
    text = json.dumps(data, sort_keys=True, separators=(',', ':'), allow_nan=False)
    text = text.replace('<', '\\u003c').replace('>', '\\u003e').replace('&', '\\u0026')
    return '<script type="application/json" id="%s">%s</script>' % (esc(element_id), text)


def page(title, body, data=None, data_id=None):
    """The whole HTML document: title, inline style, body (a list of HTML parts), the data as JSON."""
    parts = ['<!DOCTYPE html>', '<html lang="en">', '<head>', '<meta charset="utf-8">',
             '<meta http-equiv="Content-Security-Policy" content="%s">' % esc(CSP),
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             '<title>%s</title>' % esc(title), '<style>%s</style>' % STYLE, '</head>', '<body>']
    parts += list(body)
    if data is not None:
        parts.append(json_script(data, data_id))
    parts += ['</body>', '</html>']
    return '\n'.join(parts) + '\n'


def table(header, rows, cls=None):
    """A table (header None: none); a cell is text, or (text, css class)."""
    out = ['<table%s>' % (' class="%s"' % esc(cls) if cls else '')]
    if header:
        out.append('<tr>%s</tr>' % ''.join('<th>%s</th>' % esc(h) for h in header))
    for row in rows:
        cells = []
        for cell in row:
            if isinstance(cell, tuple):
                cells.append('<td class="%s">%s</td>' % (esc(cell[1]), esc(cell[0])))
            else:
                cells.append('<td>%s</td>' % esc(cell))
        out.append('<tr>%s</tr>' % ''.join(cells))
    out.append('</table>')
    return '\n'.join(out)


def utc(epoch, seconds=True):
    """'2026-11-23 05:15:00 UTC' of seconds since the epoch, '-' for none."""
    if not isinstance(epoch, (int, float)) or isinstance(epoch, bool):
        return '-'
    return time.strftime('%Y-%m-%d %H:%M' + (':%S' if seconds else '') + ' UTC', time.gmtime(epoch))


def duration(seconds):
    """'1 h 02 min', '4 min 05 s', '12.5 s'."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return '-'
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return '%.1f s' % seconds
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return '%d min %02d s' % (minutes, sec)
    hours, minutes = divmod(minutes, 60)
    return '%d h %02d min' % (hours, minutes)


def number(value, pattern='%.4g'):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return '-'
    return str(value) if isinstance(value, int) else pattern % value


# ----- plots -------------------------------------------------------------------------------------
def nice_ticks(lo, hi, count=5):
    """Round tick values covering lo..hi."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / float(count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    out, value = [], first
    while value <= hi + step * 1e-9:
        out.append(round(value, 12))
        value += step
    return out


def _time_ticks(lo, hi):
    """Tick times (epoch) at round clock values between lo and hi."""
    span = hi - lo
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400):
        if span / step <= 7:
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) // step) + 1)], step


def _clock(epoch, step):
    return time.strftime('%H:%M:%S' if step < 60 else '%H:%M', time.gmtime(epoch))


class Frame:
    """The drawing area of a plot and its scales."""

    def __init__(self, x_range, y_range, width=900, height=280, left=64, right=16, top=14, bottom=40):
        self.width, self.height, self.left, self.right, self.top, self.bottom = width, height, left, right, top, bottom
        self.x0, self.x1 = x_range
        self.y0, self.y1 = y_range
        if self.x1 <= self.x0:
            self.x0, self.x1 = self.x0 - 1, self.x1 + 1
        if self.y1 <= self.y0:
            pad = abs(self.y0) * 0.1 or 1.0
            self.y0, self.y1 = self.y0 - pad, self.y1 + pad

    def x(self, value):
        return self.left + (value - self.x0) * (self.width - self.left - self.right) / (self.x1 - self.x0)

    def y(self, value):
        return self.top + (self.y1 - value) * (self.height - self.top - self.bottom) / (self.y1 - self.y0)


def _axes(frame, x_label, y_label, time_axis):
    f = frame
    out = ['<rect x="%d" y="%d" width="%d" height="%d" fill="#fafafa" stroke="#ccc"/>'
           % (f.left, f.top, f.width - f.left - f.right, f.height - f.top - f.bottom)]
    for value in nice_ticks(f.y0, f.y1):
        y = f.y(value)
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e3e3e3"/>' % (f.left, f.width - f.right, y, y))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (f.left - 5, y + 4, esc('%g' % value)))
    if time_axis:
        ticks, step = _time_ticks(f.x0, f.x1)
        labels = [(t, _clock(t, step)) for t in ticks]
    else:
        labels = [(t, '%g' % t) for t in nice_ticks(f.x0, f.x1, 8)]
    for value, text in labels:
        x = f.x(value)
        out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#e3e3e3"/>' % (x, x, f.top, f.height - f.bottom))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (x, f.height - f.bottom + 15, esc(text)))
    out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
               % ((f.left + f.width - f.right) / 2.0, f.height - 6, esc(x_label)))
    out.append('<text transform="translate(14 %.1f) rotate(-90)" text-anchor="middle">%s</text>'
               % ((f.top + f.height - f.bottom) / 2.0, esc(y_label)))
    return out


def legend(names):
    return '<div class="legend">%s</div>' % ''.join(
        '<span><i style="background:%s"></i>%s</span>' % (COLORS[i % len(COLORS)], esc(n)) for i, n in enumerate(names))


def line_plot(plot_id, series, x_label, y_label, time_axis=False, markers=(), width=900, height=280):
    """An SVG line plot: series is [(name, [(x, y), ...])], one polyline each (class "series",
    data-series its name, data-count its points); markers [(x, label, color)] are dashed vertical lines."""
    xs = [p[0] for _, points in series for p in points] + [m[0] for m in markers]
    ys = [p[1] for _, points in series for p in points]
    if not ys:
        return '<p class="note">nothing to plot</p>'
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.05
    frame = Frame((min(xs), max(xs)), (y0 - pad, y1 + pad), width=width, height=height)
    if y0 >= 0 and frame.y0 < 0:
        frame.y0 = 0.0
    out = ['<svg id="%s" width="%d" height="%d" viewBox="0 0 %d %d" role="img">'
           % (esc(plot_id), width, height, width, height), '<title>%s over %s</title>' % (esc(y_label), esc(x_label))]
    out += _axes(frame, x_label, y_label, time_axis)
    for x, label, color in markers:
        px = frame.x(x)
        out.append('<line class="marker" x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s" stroke-dasharray="4 3">'
                   '<title>%s</title></line>' % (px, px, frame.top, frame.height - frame.bottom, esc(color), esc(label)))
    for i, (name, points) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        coords = ' '.join('%.1f,%.1f' % (frame.x(x), frame.y(y)) for x, y in points)
        out.append('<polyline class="series" data-series="%s" data-count="%d" fill="none" stroke="%s" '
                   'stroke-width="1.5" stroke-linejoin="round" points="%s"><title>%s</title></polyline>'
                   % (esc(name), len(points), color, coords, esc(name)))
        if len(points) == 1:
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (frame.x(points[0][0]), frame.y(points[0][1]), color))
    out.append('</svg>')
    return '\n'.join(out)


def bar_rows(plot_id, rows, unit, width=900, highlight=None):
    """Horizontal stacked bars: rows is [(label, [(part name, value, color)])]; the label named
    highlight is drawn in bold."""
    totals = [sum(v for _, v, _ in parts if isinstance(v, (int, float))) for _, parts in rows]
    top = max(totals + [0.0]) or 1.0
    left, right, row_h = 170, 90, 24
    height = row_h * len(rows) + 10
    out = ['<svg id="%s" width="%d" height="%d" viewBox="0 0 %d %d" role="img">'
           % (esc(plot_id), width, height, width, height), '<title>%s per node</title>' % esc(unit)]
    for i, ((label, parts), total) in enumerate(zip(rows, totals)):
        y = 5 + i * row_h
        weight = ' font-weight="bold"' if label == highlight else ''
        out.append('<text x="%d" y="%d" text-anchor="end"%s>%s</text>' % (left - 6, y + 15, weight, esc(label)))
        x = float(left)
        for name, value, color in parts:
            if not isinstance(value, (int, float)) or value <= 0:
                continue
            w = value * (width - left - right) / top
            out.append('<rect class="bar" data-node="%s" data-part="%s" data-value="%s" x="%.1f" y="%d" width="%.1f" '
                       'height="%d" fill="%s"><title>%s %s: %s %s</title></rect>'
                       % (esc(label), esc(name), esc(repr(value)), x, y + 3, w, row_h - 8, esc(color), esc(label),
                          esc(name), esc(number(value)), esc(unit)))
            x += w
        out.append('<text x="%.1f" y="%d">%s %s</text>' % (x + 5, y + 15, esc(number(total)), esc(unit)))
    out.append('</svg>')
    return '\n'.join(out)
