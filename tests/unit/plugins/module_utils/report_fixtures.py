"""Recorded data for the report pages' tests: a job directory built from recorded progress files and a
supervisor's events (written with its own event()), and health reports from the recorded lab.

The job: tests/unit/fixtures/job_monitor/slow-rank-2 (3 ranks of train_tiny.py --engine ddp, rank 2 slowed by
0.1 s a step), recorded on one machine (host=vm); the headers' host is rewritten here to two nodes, ranks 0
and 1 on lab-head and rank 2 on lab-worker-1, as a job of two nodes writes them. Nothing else is changed.
"""

from __future__ import annotations

import json
import os
import re
import sys

from ansible_collections.gpucluster.multinode.plugins.module_utils import health_reports
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import health_checks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, '..', '..', '..', '..'))
FIX = os.path.join(ROOT, 'tests', 'unit', 'fixtures')
SLOW_RUN = os.path.join(FIX, 'job_monitor', 'slow-rank-2')
HOSTS = {0: 'lab-head', 1: 'lab-head', 2: 'lab-worker-1'}
LAYOUT = {'lab-head': 2, 'lab-worker-1': 1}

sys.path.insert(0, os.path.join(ROOT, 'roles', 'training', 'files'))
import gpucluster_progress as gp  # noqa: E402
import gpucluster_supervise as sv  # noqa: E402
import supervision as core  # noqa: E402  the supervision core, as the supervisor imports it

sys.path.insert(0, os.path.join(HERE, '..', 'plugin_utils'))
from test_health_checks import lab_nodes  # noqa: E402

# (seconds after the first step of rank 0, event, fields): a fault on lab-worker-1, its check, a restart
# from step 20 and the job's end, as the supervisor writes them
EVENTS = [
    (-0.6, 'supervising', {'nodes': ['lab-head', 'lab-worker-1'], 'why': 'restarts 3, min nodes 1, for 86400 s'}),
    (2.5, 'fault', {'seen': 'failed', 'nodes': ['lab-worker-1'], 'step': 30, 'last_step_time': 1795589363.1,
                    'why': 'a rank failed first on lab-worker-1 (exit -9)'}),
    (2.9, 'job_stopped', {'why': 'every rank, container and launcher stopped'}),
    (3.3, 'checked', {'nodes': [], 'why': 'quick health tier: every node passed'}),
    (3.6, 'restart', {'nodes': ['lab-head', 'lab-worker-1'], 'left_out': [], 'resume_step': 20, 'lost_steps': 10,
                      'attempt': 1, 'why': 'on all nodes (lab-worker-1 passed the check: a transient failure)'}),
    (4.4, 'training', {'step': 21, 'why': 'training again after the restart'}),
    (6.6, 'done', {'why': 'the job finished', 'step': 60}),
]


def progress_text(rank):
    with open(os.path.join(SLOW_RUN, 'rank-%d.log' % rank)) as handle:
        return re.sub(r'\bhost=\S+', 'host=%s' % HOSTS[rank], handle.read(), count=1)


def first_step_time():
    return float(re.search(r'^step=\d+ \S+ time=([0-9.]+)', progress_text(0), re.M).group(1))


def write_events(job_dir, events=EVENTS, monkeypatch=None):
    """The events written by the supervisor's own event() (its clock set to each event's time)."""
    start = first_step_time()
    times = iter([start + offset for offset, _, _ in events])
    saved = sv.time.time
    sv.time.time = lambda: next(times)
    try:
        for _, kind, fields in events:
            core.append_event(str(job_dir), kind, **fields)
    finally:
        sv.time.time = saved
    return core.read_events(os.path.join(str(job_dir), core.EVENTS))


def make_job(tmp_path, name='train_tiny-20261125-064920', events=True, summary=None, ranks=(0, 1, 2)):
    """A job directory: progress/rank-<N>.log, layout.json, events.jsonl (events=True), summary.json."""
    job = tmp_path / name
    (job / 'progress').mkdir(parents=True)
    for rank in ranks:
        (job / 'progress' / ('rank-%d.log' % rank)).write_text(progress_text(rank))
    (job / 'layout.json').write_text(json.dumps(LAYOUT) + '\n')
    if events:
        write_events(job)
    if summary is not None:
        (job / 'summary.json').write_text(json.dumps(summary, indent=2) + '\n')
    return job


def long_progress(steps, rank=0, host='lab-head', start=1795500000.0, step_s=0.25):
    """A progress file of `steps` steps (made here, in the format of the recorded ones)."""
    lines = ['# gpucluster-progress rank=%d host=%s pid=4242 world=1 time=%.3f' % (rank, host, start - 1)]
    for step in range(1, steps + 1):
        lines.append('step=%d loss=%.6f time=%.3f wait=0.0010' % (step, 10.0 / (1 + step * 0.01), start + step * step_s))
    lines.append('# done step=%d time=%.3f peak_rss_kib=316268' % (steps, start + steps * step_s + 0.01))
    return '\n'.join(lines) + '\n'


def embedded_json(page, element_id):
    match = re.search(r'<script type="application/json" id="%s">(.*?)</script>' % re.escape(element_id), page, re.S)
    assert match, 'no embedded data %s in the page' % element_id
    return json.loads(match.group(1))


def health_report(scenario, previous_scenario=None, tier='quick'):
    """The report the health_report module builds from a recorded lab (with its changes since the report of
    previous_scenario, when given), as it writes it."""
    def records_of(name):
        nodes, meta = lab_nodes(name)
        return health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    report = health_reports.make_report(records_of(scenario), tier, '2026-11-25T05:00:00+00:00',
                                        '2026-11-25T05:00:41+00:00', 'lab')
    previous = None
    if previous_scenario:
        previous = health_reports.make_report(records_of(previous_scenario), tier, '2026-11-24T05:00:00+00:00',
                                              '2026-11-24T05:00:40+00:00', 'lab')
    report['changes'] = health_reports.changes_since(previous, report)
    report['previous_report'] = '/var/lib/gpucluster/health/history/quick-20261124T050040000Z.json' if previous else None
    return report


def write_attempt(progress_dir, attempt, steps, world=2, done=False):
    """One attempt of a job of `world` ranks, written by the ranks' own progress writer (gpucluster_progress), which
    keeps an earlier attempt's files as progress/attempt-<N>/ when a later one starts: each rank logs every step of
    `steps` (loss 10/step), then ends (done: its done line)."""
    ranks = [gp.Progress(rank, world, progress_dir=progress_dir, tensorboard_dir='', attempt=attempt)
             for rank in range(world)]
    for step in steps:
        for progress in ranks:
            progress.step(step, 10.0 / step)
    for progress in ranks:
        if done:
            progress.done(steps[-1])
        elif progress.handle:
            progress.handle.close()
