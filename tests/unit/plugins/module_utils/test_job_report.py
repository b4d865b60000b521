"""The job's report page without a browser: its embedded data against the progress files, the
downsampling of long runs, an empty job, the events in order, the slowest node by the job view's rule."""

from __future__ import annotations

import html
import json
import os
import re
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import report as jr
from ansible_collections.gpucluster.multinode.plugins.module_utils import report_html as rh
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_state

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_fixtures as rf  # noqa: E402


def page_of(job):
    progress, events, summary, layout, earlier = jr.read_job(str(job))
    data = jr.job_data(job.name, progress, events, summary, layout, earlier=earlier)
    return jr.render(data, str(job)), data


def test_the_embedded_data_is_what_the_progress_files_say(tmp_path):
    job = rf.make_job(tmp_path)
    page, data = page_of(job)
    embedded = rf.embedded_json(page, jr.DATA_ID)
    assert embedded == json.loads(json.dumps(data))
    parsed = dict((rank, jm.parse_progress(rf.progress_text(rank))) for rank in (0, 1, 2))
    # the loss plot: rank 0's every step (60 < max_points: nothing dropped)
    assert embedded['loss']['rank'] == 0
    assert embedded['loss']['points'] == [[s['step'], s['loss']] for s in parsed[0]['steps']]
    assert embedded['loss']['steps_logged'] == embedded['loss']['shown'] == 60
    # the ranks and their nodes, as the headers name them
    assert [(r['rank'], r['node'], r['steps_logged'], r['last_step'], r['last_loss']) for r in embedded['ranks']] == [
        (rank, rf.HOSTS[rank], len(p['steps']), p['steps'][-1]['step'], p['steps'][-1]['loss'])
        for rank, p in sorted(parsed.items())]
    # each node's rate: the steps its lowest rank made, span by span, add up to its steps
    for node in embedded['nodes']:
        steps = parsed[node['rate_rank']]['steps']
        times = [t for t, _ in node['rate']]
        assert times == sorted(times) and times[-1] == pytest.approx(steps[-1]['time'], abs=1e-3)
        spans = [b - a for a, b in zip([steps[0]['time']] + times, times)]
        made = sum(r * w for (_, r), w in zip(node['rate'], spans))
        assert made == pytest.approx(steps[-1]['step'] - steps[0]['step'], rel=1e-3)
    assert [n['node'] for n in embedded['nodes']] == ['lab-head', 'lab-worker-1']
    summary = embedded['summary']
    assert (summary['state'], summary['steps'], summary['world_size'], summary['nodes']) == (
        'finished', 60, 3, rf.LAYOUT)
    # the recorded headers carry no time: the job started with its first step
    assert summary['started_at'] == min(p['steps'][0]['time'] for p in parsed.values())
    assert summary['ended_at'] == max(p['done']['time'] for p in parsed.values())


def test_the_slowest_node_is_the_one_the_others_wait_for(tmp_path):
    page, data = page_of(rf.make_job(tmp_path))
    assert data['slowest']['node'] == 'lab-worker-1'
    assert data['slowest']['why'].startswith('lab-worker-1 computes 0.10')
    assert '<b id="slowest-node">lab-worker-1</b>' in page


def test_the_page_and_the_job_state_name_the_slowest_node_by_one_rule():
    # one rule, in module_utils (the page is made on the head), which the job state on the controller imports
    assert job_state.slowest_node is jm.slowest_node


def test_downsampling_keeps_the_first_and_last_and_bounds_the_count():
    items = list(range(100001))
    for most in (2, 3, 7, 2000):
        kept = rh.downsample(items, most)
        assert kept[0] == 0 and kept[-1] == 100000 and len(kept) <= most and kept == sorted(set(kept))
    assert rh.downsample(items[:50], 2000) == items[:50]


def test_a_long_run_is_downsampled_and_its_page_stays_small(tmp_path):
    job = tmp_path / 'long'
    (job / 'progress').mkdir(parents=True)
    text = rf.long_progress(100000)
    (job / 'progress' / 'rank-0.log').write_text(text)
    (job / 'progress' / 'rank-1.log').write_text(rf.long_progress(5000, rank=1, host='lab-worker-1', step_s=5.0))
    page, data = page_of(job)
    points = rf.embedded_json(page, jr.DATA_ID)['loss']['points']
    steps = jm.parse_progress(text)['steps']
    assert len(points) == 2000 and data['downsampled']
    assert points[0] == [steps[0]['step'], steps[0]['loss']] and points[-1] == [steps[-1]['step'], steps[-1]['loss']]
    # every point shown is a step of the file, in order
    by_step = dict((s['step'], s['loss']) for s in steps)
    assert all(by_step[s] == loss for s, loss in points) and [p[0] for p in points] == sorted(p[0] for p in points)
    assert all(len(n['rate']) <= jr.RATE_POINTS for n in data['nodes'])
    assert re.search(r'100000 steps logged, 2000 shown: downsampled evenly to at most 2000 points', page)
    assert len(page.encode()) < 400 * 1024
    assert re.search(r'<polyline class="series" data-series="rank 0" data-count="2000"', page)


def test_an_empty_job_still_gets_a_page_that_says_so(tmp_path):
    job = tmp_path / 'empty'
    job.mkdir()
    page, data = page_of(job)
    assert data['ranks'] == [] and data['loss']['points'] == [] and data['events'] is None
    assert data['summary']['state'] == 'no progress files'
    assert 'id="no-progress"' in page and 'id="not-supervised"' in page and 'no loss logged' in page
    assert rf.embedded_json(page, jr.DATA_ID)['summary']['steps'] is None


def test_the_events_are_on_the_time_line_in_the_order_they_happened(tmp_path):
    job = rf.make_job(tmp_path)
    with open(str(job / 'events.jsonl'), 'a') as handle:
        handle.write('{"event": "fau')  # a line cut short by a crash is skipped, as the supervisor reads it
    # a line written out of order (clocks of two writers) still lands in its place
    early = {'event': 'checked', 'nodes': ['lab-worker-1'], 'time': rf.first_step_time() + 0.1, 'why': 'by hand'}
    with open(str(job / 'events.jsonl'), 'a') as handle:
        handle.write('\n' + json.dumps(early) + '\n')
    page, data = page_of(job)
    times = [e['time'] for e in data['events']]
    assert times == sorted(times) and len(times) == len(rf.EVENTS) + 1
    kinds = [e['event'] for e in data['events']]
    assert kinds == ['supervising', 'checked', 'fault', 'job_stopped', 'checked', 'restart', 'training', 'done']
    assert re.findall(r'<g class="event" data-event="([a-z_]+)"', page) == kinds
    assert re.findall(r'<td class="event-([a-z_]+)">', page) == kinds
    assert data['supervision'] == {'restarts': 1, 'steps_lost': 10, 'faults': 1, 'outcome': 'finished',
                                   'why': 'the job finished', 'left_out': [], 'time_lost_s': 2.1}
    assert 'finished (the job finished); 1 fault(s), 1 restart(s), 10 step(s) lost' in page


def test_a_job_without_events_was_not_supervised(tmp_path):
    page, data = page_of(rf.make_job(tmp_path, events=False))
    assert data['events'] is None and data['supervision'] is None
    assert 'not supervised' in page and '<svg id="timeline"' not in page


def test_the_summary_json_of_an_ended_job_gives_its_state_and_figures(tmp_path):
    summary = {'job_id': 'j', 'state': 'failed', 'written': 1795589400.0, 'steps': 61, 'mean_steps_per_s': 8.5,
               'slowest_node': None, 'ranks': []}
    page, data = page_of(rf.make_job(tmp_path, summary=summary))
    assert (data['summary']['state'], data['summary']['steps'], data['summary']['mean_steps_per_s']) == ('failed', 61, 8.5)
    assert data['summary']['from_summary_json'] and 'No summary.json' not in page
    assert '<span class="badge fail">failed</span>' in page


def test_nothing_in_the_data_can_end_the_script_element_or_reach_the_network(tmp_path):
    job = rf.make_job(tmp_path, events=False)
    (job / 'events.jsonl').write_text(json.dumps({'event': 'gave_up', 'time': rf.first_step_time() + 9,
                                                  'why': '</script><script>alert(1)</script> & <b>'}) + '\n')
    page, data = page_of(job)
    assert rf.embedded_json(page, jr.DATA_ID)['events'][0]['why'] == '</script><script>alert(1)</script> & <b>'
    assert page.count('<script') == 1 and '<b>' not in page.replace('<b id="slowest-node">', '')
    assert not re.search(r'(?i)\b(?:https?:|//[a-z])|@import|url\(|<link|<img|<iframe', page)
    assert "content=\"default-src 'none'; style-src 'unsafe-inline'\"" in html.unescape(page)


def test_a_script_of_ones_own_without_progress_files_is_plotted_from_its_step_lines(tmp_path):
    # the user's script prints "it N loss X" on every node (training_progress_regex), writes no progress file
    job = tmp_path / 'fh-user'
    (job / 'logs').mkdir(parents=True)
    (job / 'layout.json').write_text(json.dumps({'alpha': 2, 'bravo': 1}))
    for node in ('alpha', 'bravo'):
        (job / 'logs' / ('%s.log' % node)).write_text(
            'starting\n' + ''.join('it %d loss %.2f t %.1f\n' % (i, 3.0 - i / 10, 1795500000.0 + i) for i in range(1, 26)))
    regex = r'it (?P<step>[0-9]+) loss (?P<loss>[0-9.]+) t (?P<time>[0-9.]+)'
    progress, events, summary, layout, earlier = jr.read_job(str(job), regex)
    data = jr.job_data(job.name, progress, events, summary, layout, earlier=earlier)
    # the loss curve from rank 0's node's lines, each node under its first rank
    assert data['loss']['points'][0] == [1, 2.9] and data['loss']['points'][-1] == [25, 0.5]
    assert [(r['rank'], r['node'], r['last_step']) for r in data['ranks']] == [(0, 'alpha', 25), (2, 'bravo', 25)]
    assert data['summary']['steps'] == 25 and data['ranks'][0]['mean_steps_per_s'] == 1.0
    # without the pattern (or with one that matches nothing) the page says there is no progress
    assert jr.read_job(str(job))[0] == {} and jr.read_job(str(job), 'step [0-9]+ loss')[0] == {}
