# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A job's report page (the training_report module): one self-contained HTML file of how the job went.

Read from the job directory on the head: the ranks' progress files (``progress/rank-<N>.log``, parsed
with monitor.parse_progress), the supervisor's ``events.jsonl`` (one JSON object a line, written
by a supervisor: supervision.append_event), ``summary.json`` (written by the first status read after the
job ended) and ``layout.json`` (the nodes the job was started on, {node: ranks}).

The page shows rank 0's loss per step, every node's steps per second over time (its lowest rank's
steps; in synchronous training every rank makes the same), each node's median seconds per step split
into computing and waiting for the others, the slowest node, the supervisor's events on a time line
and the job's summary. The data the plots were drawn from is embedded as JSON (DATA_ID); a series
longer than max_points is downsampled (evenly, first and last step kept) and the page says so.
"""

from __future__ import annotations

import bisect
import json
import os
import re

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import supervision as sup_core
from ansible_collections.gpucluster.multinode.plugins.module_utils import report_html as rh

PAGE = 'report.html'
EVENTS = sup_core.EVENTS
SUMMARY = 'summary.json'
LAYOUT = 'layout.json'
DATA_ID = 'gpucluster-report-data'
MAX_POINTS = 2000
RATE_POINTS = 240
EVENT_COLORS = {'fault': '#c62828', 'gave_up': '#7f0000', 'restart_failed': '#c62828', 'job_stopped': '#ef6c00',
                'checked': '#1565c0', 'restart': '#6a1b9a', 'training': '#2e7d32', 'done': '#1b5e20',
                'stopped': '#616161', 'supervising': '#616161', 'report_failed': '#616161'}
EVENT_FIELDS = ('seen', 'nodes', 'step', 'step_read', 'resume_step', 'lost_steps', 'left_out', 'attempt', 'why')


# ----- reading the job directory ---------------------------------------------------------------
def read_json(path):
    """The JSON object of a file, None when it is missing or not a JSON object."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_events(path):
    """The events of events.jsonl in time order (supervision.read_events; a line cut short is skipped); None
    when the file does not exist (the job was not supervised)."""
    events = sup_core.read_events(path)
    return None if events is None else sorted(events, key=lambda e: e['time'])


def read_job(job_dir, step_regex=None):
    """(progress {rank: parsed}, events or None, summary or None, layout or None, earlier) of a job directory;
    progress holds the files of the job's newest attempt only (a rank an older attempt had and the
    newest has not leaves its file behind: monitor.fence_attempts); earlier: {attempt: {rank: parsed}} of the
    attempts before it (read_earlier_attempts). A job whose script writes no progress file has its steps from
    the logs, the lines step_regex matches (log_progress)."""
    texts = jm.read_progress_files(job_dir)
    fenced = jm.fence_attempts(dict((rank, jm.parse_progress(texts[rank])) for rank in sorted(texts)))
    progress = fenced['progress']
    layout = read_json(os.path.join(job_dir, LAYOUT))
    if not progress and step_regex:
        progress = log_progress(job_dir, layout, step_regex)
    earlier = read_earlier_attempts(job_dir, fenced['attempt'])
    return (progress, read_events(os.path.join(job_dir, EVENTS)), read_json(os.path.join(job_dir, SUMMARY)), layout,
            earlier)


def read_earlier_attempts(job_dir, newest=None):
    """{attempt: {rank: parsed}} of the attempts before the newest: the files each rank of a later attempt moved
    to progress/attempt-<N>/ when it started (gpucluster_progress.keep_earlier_attempt), and a rank's top-level
    file that an older attempt left (a rank the newest attempt has not). {} for a job that never restarted."""
    out = {}
    folder = os.path.join(job_dir, jm.PROGRESS_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        match = re.match(r'^attempt-(\d+)$', name)
        if match and os.path.isdir(os.path.join(folder, name)):
            texts = jm.read_progress_files(os.path.join(folder, name), '')
            if texts:
                out[int(match.group(1))] = dict((rank, jm.parse_progress(text)) for rank, text in texts.items())
    if newest:
        for rank, text in jm.read_progress_files(job_dir).items():
            parsed = jm.parse_progress(text)
            number = jm.progress_attempt(parsed)
            if number < newest and rank not in out.get(number, {}):
                out.setdefault(number, {})[rank] = parsed
    return out


def every_attempt(progress, earlier):
    """{attempt: {rank: parsed}} of every attempt: the earlier ones and the newest (progress)."""
    every = dict(earlier or {})
    if progress:
        every[max(jm.progress_attempt(p) for p in progress.values())] = progress
    return every


def attempt_rows(progress, earlier):
    """[{attempt, started_at, first_step, last_step, last_step_time, ranks}] of every attempt, the first first."""
    rows = []
    every = every_attempt(progress, earlier)
    for number in sorted(every):
        files = every[number]
        steps = [s for p in files.values() for s in p['steps'] if s.get('dated', True)]
        starts = [p['header'].get('time') for p in files.values() if _num((p.get('header') or {}).get('time'))]
        rows.append({'attempt': number, 'ranks': len(files),
                     'started_at': min(starts) if starts else (min(s['time'] for s in steps) if steps else None),
                     'first_step': min((s['step'] for s in steps), default=None),
                     'last_step': max((s['step'] for s in steps), default=None),
                     'last_step_time': max((s['time'] for s in steps), default=None)})
    return rows


def fault_rows(events, progress, earlier, rank):
    """[{time, seen, nodes, step, attempt, resume_step, passed_at, cost_s}] of every fault of the supervisor's
    events: the time it cost, from the last step before it to the first step of the attempt that followed it past
    the fault's step (the steps it recomputed from its checkpoint included), as rank `rank` logged them; passed_at
    and cost_s are None where no attempt passed that step again (it gave up, or the job stopped first)."""
    every = every_attempt(progress, earlier)
    events = [e for e in events or [] if isinstance(e, dict)]
    rows = []
    for index, fault in enumerate(events):
        if fault.get('event') != 'fault':
            continue
        restart = None
        for later in events[index + 1:]:
            if later.get('event') in ('fault', 'restart'):
                restart = later if later.get('event') == 'restart' else None
                break
        step = fault.get('step') if isinstance(fault.get('step'), int) else None
        passed = None
        if restart is not None and isinstance(restart.get('attempt'), int):
            past = step if step is not None else restart.get('resume_step')
            steps = ((every.get(restart['attempt']) or {}).get(rank) or {}).get('steps') or []
            if isinstance(past, int):
                passed = next((s['time'] for s in steps if s['step'] > past and _num(s.get('time'))), None)
        began = fault.get('last_step_time') if _num(fault.get('last_step_time')) else fault.get('time')
        rows.append({'time': fault.get('time'), 'seen': fault.get('seen'), 'nodes': fault.get('nodes') or [],
                     'step': step, 'attempt': (restart or {}).get('attempt'),
                     'resume_step': (restart or {}).get('resume_step'), 'passed_at': passed,
                     'cost_s': round(passed - began, 1) if passed is not None and _num(began) else None})
    return rows


def log_progress(job_dir, layout, step_regex):
    """{rank: parsed} of a job whose script writes no progress file: each node's steps from the logs
    (monitor.read_node_log, the reader of status and the supervisor: the node's own log, else its lines in
    another node's log, else the log with the latest step), under the node's first rank (layout.json's
    order, every node's ranks in turn), its header naming the node. Without layout.json, one entry per log."""
    nodes = [(n, c) for n, c in layout.items() if isinstance(c, int)] if isinstance(layout, dict) else []
    if not nodes:
        folder = os.path.join(job_dir, 'logs')
        names = sorted(f[:-len('.log')] for f in os.listdir(folder) if f.endswith('.log')) if os.path.isdir(folder) else []
        nodes = [(n, 1) for n in names]
    out, rank = {}, 0
    for node, count in nodes:
        parsed = jm.read_node_log(job_dir, node, step_regex)
        if parsed and parsed['steps']:
            out[rank] = dict(parsed, header=dict(parsed.get('header') or {}, host=node))
        rank += max(1, count)
    return out


# ----- figures ---------------------------------------------------------------------------------
def _num(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def rank_figures(rank, parsed):
    """One rank over the whole run: its node (the host its progress file names), steps, loss, when it
    started and ended, mean steps per second, and the median seconds per step, waiting and computing."""
    steps = [s for s in parsed['steps'] if s.get('dated', True)]
    header = parsed.get('header') or {}
    done = parsed.get('done') or {}
    out = {'rank': rank, 'node': str(header.get('host') or 'rank %d' % rank), 'steps_logged': len(parsed['steps']),
           'last_step': parsed['steps'][-1]['step'] if parsed['steps'] else None,
           'last_loss': parsed['steps'][-1].get('loss') if parsed['steps'] else None,
           'done': bool(parsed.get('done')), 'started_at': header.get('time') if _num(header.get('time')) else None,
           'ended_at': done.get('time') if _num(done.get('time')) else (steps[-1]['time'] if steps else None),
           'first_step_time': steps[0]['time'] if steps else None,
           'mean_steps_per_s': None, 'step_s': None, 'wait_s': None, 'compute_s': None}
    if out['started_at'] is None:
        out['started_at'] = out['first_step_time']
    if len(steps) >= 2 and steps[-1]['time'] > steps[0]['time']:
        out['mean_steps_per_s'] = round((steps[-1]['step'] - steps[0]['step']) / (steps[-1]['time'] - steps[0]['time']), 4)
    gaps, waits, computes = [], [], []
    for a, b in zip(steps, steps[1:]):
        if b['step'] <= a['step']:
            continue
        gap = (b['time'] - a['time']) / (b['step'] - a['step'])
        gaps.append(gap)
        if _num(b.get('wait')):
            waits.append(b['wait'])
            computes.append(max(0.0, gap - b['wait']))
    if gaps:
        out['step_s'] = round(jm.median(gaps), 5)
        if len(waits) == len(gaps):
            out['wait_s'] = round(jm.median(waits), 5)
            out['compute_s'] = round(jm.median(computes), 5)
    return out


def rate_series(steps, points=RATE_POINTS):
    """[[time, steps per second]] of a rank: its run cut into at most `points` equal spans of time (five
    steps a span on average at least), each the steps made in it over its length (the time is the span's
    end); [] with fewer than two dated steps."""
    dated = [(s['time'], s['step']) for s in steps if s.get('dated', True)]
    if len(dated) < 2 or dated[-1][0] <= dated[0][0]:
        return []
    t0, t1 = dated[0][0], dated[-1][0]
    # five steps a span at least: a span of one step is all or nothing
    count = max(1, min(int(points), (len(dated) - 1) // 5))
    width = (t1 - t0) / count
    times = [t for t, _ in dated]
    out, before = [], dated[0][1]
    for i in range(1, count + 1):
        end = t1 if i == count else t0 + i * width
        now = dated[max(0, bisect.bisect_right(times, end) - 1)][1]
        out.append([round(end, 3), round(max(0.0, (now - before) / width), 4)])
        before = now
    return out


def supervision(events):
    """{restarts, steps_lost, time_lost_s, faults, left_out, outcome, why} counted from the events
    (supervision.summarize, as the supervisor's status says them; None: not supervised)."""
    return None if events is None else sup_core.summarize(events)


def _all_steps(rank, progress, earlier):
    """The steps of one rank over every attempt (earlier: {attempt: {rank: parsed}}), in the order they were
    logged: a restart's recomputed steps come after the steps of the attempt it followed."""
    steps = []
    for number in sorted(earlier or {}):
        steps += (earlier[number].get(rank) or {}).get('steps') or []
    return steps + ((progress.get(rank) or {}).get('steps') or [])


def job_data(job_id, progress, events=None, summary=None, layout=None, max_points=MAX_POINTS, rate_points=RATE_POINTS,
             earlier=None):
    """Everything the page shows, as the JSON embedded in it. earlier: {attempt: {rank: parsed}} of the attempts
    before the newest (read_earlier_attempts): the loss curve, the rates and the start span every attempt."""
    earlier = earlier or {}
    ranks = [rank_figures(rank, progress[rank]) for rank in sorted(progress)]
    by_node = {}
    for row in ranks:
        by_node.setdefault(row['node'], []).append(row)
    layout = layout if isinstance(layout, dict) else None
    order = [n for n in (layout or {}) if n in by_node] + sorted(n for n in by_node if n not in (layout or {}))
    nodes = []
    for name in order:
        rows = by_node[name]
        first = rows[0]['rank']
        figures = {}
        for key in ('step_s', 'wait_s', 'compute_s', 'mean_steps_per_s'):
            values = [r[key] for r in rows if _num(r.get(key))]
            figures[key] = round(sum(values) / len(values), 5) if len(values) == len(rows) else None
        nodes.append(dict(figures, node=name, ranks=[r['rank'] for r in rows], rate_rank=first,
                          rate=rate_series(sorted(_all_steps(first, progress, earlier),
                                                  key=lambda s: s.get('time') if _num(s.get('time')) else 0),
                                           min(rate_points, max_points))))
    slowest, why = jm.slowest_node([{'node': r['node'], 'rank': r['rank'], 'alive': True, 'compute_s': r['compute_s'],
                                     'steps_per_s': r['mean_steps_per_s']} for r in ranks])

    loss_rank = 0 if 0 in progress else (min(progress) if progress else None)
    attempts = attempt_rows(progress, earlier)
    # one curve a attempt, the same rank's, so that a restart's recomputed steps show beside those it repeats
    loss_series = []
    for row in attempts:
        files = progress if row is attempts[-1] and progress else earlier.get(row['attempt']) or {}
        points = [[s['step'], s['loss']] for s in (files.get(loss_rank) or {}).get('steps') or [] if _num(s.get('loss'))]
        if points:
            loss_series.append({'attempt': row['attempt'], 'points': points})
    loss_all = [p for series in loss_series for p in series['points']]
    most = max(2, int(max_points) // max(1, len(loss_series)))
    for series in loss_series:
        series['points'] = rh.downsample(series['points'], most)
    loss = [p for series in loss_series for p in series['points']]

    summary = summary if isinstance(summary, dict) else {}
    last_steps = [r['last_step'] for r in ranks if isinstance(r['last_step'], int)]
    rates = [r['mean_steps_per_s'] for r in ranks if _num(r['mean_steps_per_s'])]
    starts = [r['started_at'] for r in ranks if _num(r['started_at'])] + [
        a['started_at'] for a in attempts if _num(a['started_at'])]
    ends = [r['ended_at'] for r in ranks if _num(r['ended_at'])]
    if summary.get('state'):
        state = str(summary['state'])
    elif not ranks:
        state = 'no progress files'
    elif all(r['done'] for r in ranks):
        state = 'finished'
    else:
        state = 'not finished (running, stopped or failed: no summary.json yet)'
    world = jm.world_size(progress) or (sum(v for v in layout.values() if isinstance(v, int)) if layout else None)
    return {
        'format': 1,
        'job_id': job_id,
        'summary': {
            'state': state,
            'steps': summary.get('steps') if isinstance(summary.get('steps'), int) else (max(last_steps) if last_steps else None),
            'mean_steps_per_s': (summary.get('mean_steps_per_s') if _num(summary.get('mean_steps_per_s'))
                                 else (round(sum(rates) / len(rates), 3) if rates else None)),
            'world_size': world,
            'nodes': dict((n, layout[n]) for n in layout) if layout else dict((n['node'], len(n['ranks'])) for n in nodes),
            'started_at': min(starts) if starts else None,
            'ended_at': max(ends) if ends else None,
            'finished': bool(ranks) and all(r['done'] for r in ranks),
            'from_summary_json': bool(summary),
        },
        'ranks': ranks,
        'loss': {'rank': loss_rank, 'steps_logged': len(loss_all), 'shown': len(loss), 'points': loss,
                 'attempts': loss_series},
        'attempts': attempts,
        'faults': fault_rows(events, progress, earlier, loss_rank),
        'nodes': nodes,
        'slowest': {'node': slowest, 'why': why},
        'events': events,
        'supervision': supervision(events),
        'max_points': int(max_points),
        'rate_points': min(int(rate_points), int(max_points)),
        'downsampled': len(loss) < len(loss_all),
    }


# ----- the page --------------------------------------------------------------------------------
def _event_text(ev):
    words = []
    for key in EVENT_FIELDS:
        value = ev.get(key)
        if value in (None, [], ''):
            continue
        words.append('%s %s' % (key.replace('_', ' '), ', '.join(str(v) for v in value) if isinstance(value, list) else value))
    return '; '.join(words)


def _timeline(events, start, end, width=900):
    """The events as markers on a time line (the job's run drawn under them), one row per third of
    them so their labels do not overlap."""
    times = [e['time'] for e in events] + [t for t in (start, end) if _num(t)]
    frame = rh.Frame((min(times), max(times)), (0, 4), width=width, height=150, top=10, bottom=34, right=90)
    out = ['<svg id="timeline" width="%d" height="150" viewBox="0 0 %d 150" '
           'role="img">' % (width, width), '<title>the events of the job on a time line</title>']
    ticks, step = rh._time_ticks(frame.x0, frame.x1)
    for t in ticks:
        x = frame.x(t)
        out.append('<line x1="%.1f" x2="%.1f" y1="10" y2="116" stroke="#e3e3e3"/>' % (x, x))
        out.append('<text x="%.1f" y="131" text-anchor="middle">%s</text>' % (x, rh.esc(rh._clock(t, step))))
    if _num(start) and _num(end):
        out.append('<rect x="%.1f" y="102" width="%.1f" height="8" fill="#90caf9"><title>steps logged from %s to %s'
                   '</title></rect>' % (frame.x(start), max(1.0, frame.x(end) - frame.x(start)), rh.esc(rh.utc(start)),
                                        rh.esc(rh.utc(end))))
    out.append('<line x1="%d" x2="%d" y1="116" y2="116" stroke="#999"/>' % (frame.left, width - frame.right))
    for i, ev in enumerate(events):
        x = frame.x(ev['time'])
        y = 22 + (i % 3) * 26
        color = EVENT_COLORS.get(ev.get('event'), '#333')
        out.append('<g class="event" data-event="%s" data-time="%s"><line x1="%.1f" x2="%.1f" y1="%d" y2="116" '
                   'stroke="%s" stroke-dasharray="2 2"/><circle cx="%.1f" cy="%d" r="5" fill="%s"/>'
                   '<text x="%.1f" y="%d">%s</text><title>%s %s: %s</title></g>'
                   % (rh.esc(ev.get('event')), rh.esc(repr(ev['time'])), x, x, y, color, x, y, color, x + 7, y + 4,
                      rh.esc(ev.get('event')), rh.esc(rh.utc(ev['time'])), rh.esc(ev.get('event')), rh.esc(_event_text(ev))))
    out.append('</svg>')
    return '\n'.join(out)


def render(data, job_dir=''):
    """The page of job_data's data."""
    s = data['summary']
    sup = data['supervision']
    job = data['job_id']
    badge = 'ok' if s['state'] in ('finished', 'succeeded') else ('fail' if s['state'] in ('failed', 'gave up') else 'info')
    body = ['<h1>Training job %s <span class="badge %s">%s</span></h1>' % (rh.esc(job), badge, rh.esc(s['state'])),
            '<p class="note">%s; times in UTC</p>' % rh.esc(job_dir or 'job directory')]
    slow = data['slowest']
    rows = [('state', s['state']), ('steps', rh.number(s['steps'])),
            ('mean steps/s', rh.number(s['mean_steps_per_s'])), ('world size', rh.number(s['world_size'])),
            ('nodes', ', '.join('%s (%s)' % (n, k) for n, k in s['nodes'].items()) or '-'),
            ('started', rh.utc(s['started_at'])),
            ('ended' if s['finished'] else 'last step', rh.utc(s['ended_at'])),
            ('ran for', rh.duration(s['ended_at'] - s['started_at']) if _num(s['started_at']) and _num(s['ended_at']) else '-'),
            ('slowest node', '%s: %s' % (slow['node'], slow['why']) if slow['node'] else 'none (%s)' % slow['why']),
            ('supervised', 'not supervised' if sup is None else '%s%s; %d fault(s), %d restart(s), %d step(s) lost' % (
                sup['outcome'], ' (%s)' % sup['why'] if sup['why'] else '', sup['faults'], sup['restarts'],
                sup['steps_lost']))]
    body.append('<h2>Summary</h2>')
    body.append(rh.table(None, rows, cls='summary'))
    if not s['from_summary_json']:
        body.append('<p class="note">No summary.json in the job directory (the first status read after the job '
                    'ended writes it): the state and figures are read from the progress files.</p>')
    if not data['ranks']:
        body.append('<p class="note" id="no-progress">No progress files (progress/rank-&lt;N&gt;.log) in the job '
                    'directory: the job logged no step this page can show (a script that writes no progress file '
                    'is followed by its log lines only, in status and watch).</p>')

    loss = data['loss']
    body.append('<h2>Loss per step (rank %s)</h2>' % rh.esc(loss['rank'] if loss['rank'] is not None else '-'))
    if loss['points'] and len(loss.get('attempts') or []) > 1:
        series = [('attempt %d' % a['attempt'], a['points']) for a in loss['attempts']]
        body.append(rh.legend([name for name, _ in series]))
        body.append(rh.line_plot('loss-plot', series, 'step', 'loss'))
        body.append('<p class="note" id="loss-attempts">%d attempts, one line each: a restart resumes from its '
                    'checkpoint, so its first steps repeat the last ones of the attempt before it.</p>'
                    % len(loss['attempts']))
    elif loss['points']:
        body.append(rh.line_plot('loss-plot', [('rank %s' % loss['rank'], loss['points'])], 'step', 'loss'))
    else:
        body.append('<p class="note">no loss logged</p>')
    if loss['shown'] < loss['steps_logged']:
        body.append('<p class="note" id="loss-downsampled">%d steps logged, %d shown: downsampled evenly to at most %d '
                    'points, the first and the last step kept.</p>'
                    % (loss['steps_logged'], loss['shown'], data['max_points']))

    nodes = data['nodes']
    markers = [(e['time'], '%s %s' % (e.get('event'), _event_text(e)), EVENT_COLORS.get(e.get('event'), '#333'))
               for e in (data['events'] or []) if e.get('event') in ('fault', 'restart', 'gave_up', 'done', 'training')]
    body.append('<h2>Steps per second per node</h2>')
    series = [('%s (rank %d)' % (n['node'], n['rate_rank']), n['rate']) for n in nodes if n['rate']]
    if series:
        body.append(rh.legend([name for name, _ in series]))
        body.append(rh.line_plot('rate-plot', series, 'time (UTC)', 'steps/s', time_axis=True, markers=markers))
        body.append('<p class="note">Each node\'s lowest rank, its run cut into at most %d equal spans of time (steps '
                    'made in a span over its length); dashed lines: the supervisor\'s faults, restarts and ends.</p>'
                    % min(data['max_points'], data['rate_points']))
    else:
        body.append('<p class="note">fewer than two timed steps: no rate to show</p>')

    body.append('<h2>Seconds per step per node</h2>')
    bars = [(n['node'], [('computing', n['compute_s'], '#1f77b4'), ('waiting for the others', n['wait_s'], '#ffbb78')]
             if _num(n['compute_s']) else [('step', n['step_s'], '#1f77b4')]) for n in nodes if _num(n['step_s'])]
    if bars:
        body.append('<div class="legend"><span><i style="background:#1f77b4"></i>computing</span><span><i '
                    'style="background:#ffbb78"></i>waiting for the others</span></div>')
        body.append(rh.bar_rows('steptime-plot', bars, 's', highlight=slow['node']))
        body.append('<p class="note">Median over the run of each rank, averaged over the node\'s ranks. Slowest node: '
                    '<b id="slowest-node">%s</b> (%s).</p>' % (rh.esc(slow['node'] or 'none'), rh.esc(slow['why'])))
    else:
        body.append('<p class="note">no step times yet. Slowest node: <b id="slowest-node">none</b> (%s)</p>'
                    % rh.esc(slow['why']))

    body.append('<h2>Events of the supervisor</h2>')
    events = data['events']
    if events is None:
        body.append('<p class="note" id="not-supervised">not supervised: no events.jsonl in the job directory '
                    '(training_supervise starts a supervisor that logs its faults, checks and restarts there).</p>')
    elif not events:
        body.append('<p class="note" id="no-events">supervised, no event logged yet</p>')
    else:
        body.append(_timeline(events, s['started_at'], s['ended_at']))
        start = s['started_at'] if _num(s['started_at']) else events[0]['time']
        body.append(rh.table(('time', 'since start', 'event', 'what'),
                             [(rh.utc(e['time']), rh.duration(e['time'] - start) if e['time'] >= start else '-',
                               (e.get('event'), 'event-%s' % e.get('event')), _event_text(e)) for e in events],
                             cls='events'))
        if any(e.get('event') == 'restart' for e in events) and len(data['attempts']) < 2:
            body.append('<p class="note">The progress files of the attempts before the last one are not in the job '
                        'directory (a script that keeps no earlier attempt): the plots show the last start, the '
                        'events the whole run.</p>')

    if len(data['attempts']) > 1:
        body.append('<h2>Attempts</h2>')
        body.append(rh.table(('attempt', 'started', 'steps', 'last step at', 'ranks'),
                             [(a['attempt'], rh.utc(a['started_at']),
                               '%s-%s' % (rh.number(a['first_step']), rh.number(a['last_step'])),
                               rh.utc(a['last_step_time']), a['ranks']) for a in data['attempts']], cls='attempts'))

    if data.get('faults'):
        body.append('<h2>Faults</h2>')
        body.append('<p class="note">The time each fault cost: from the last step before it to the first step of '
                    'the next attempt past that step (its recomputed steps included).</p>')
        body.append(rh.table(('fault at', 'seen', 'nodes', 'step', 'attempt after it', 'resumed from', 'step passed again',
                              'time it cost'),
                             [(rh.utc(f['time']), f['seen'] or '-', ', '.join(f['nodes']) or '-', rh.number(f['step']),
                               rh.number(f['attempt']), rh.number(f['resume_step']), rh.utc(f['passed_at']),
                               rh.duration(f['cost_s']) if f['cost_s'] is not None else 'not passed again')
                              for f in data['faults']], cls='faults'))

    body.append('<h2>Ranks</h2>')
    body.append(rh.table(('rank', 'node', 'steps logged', 'last step', 'last loss', 'mean steps/s', 's/step',
                          'waiting s/step', 'done'),
                         [(r['rank'], r['node'], r['steps_logged'], rh.number(r['last_step']), rh.number(r['last_loss']),
                           rh.number(r['mean_steps_per_s']), rh.number(r['step_s']), rh.number(r['wait_s']),
                           'yes' if r['done'] else 'no') for r in data['ranks']], cls='ranks'))
    return rh.page('job %s' % job, body, data, DATA_ID)
