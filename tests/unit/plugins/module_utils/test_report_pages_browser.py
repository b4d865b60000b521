"""The report pages in a real browser: Debian's headless Chromium, driven by playwright (scripts/setup.sh
installs both; playwright's own browsers are never downloaded).

Each page is opened from its file with the network off; the test records every request and every console
message and page error. The job's page is built from recorded progress files and a supervisor's events
(report_fixtures), the health page from the recorded lab."""

from __future__ import annotations

import json
import os
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import health_page
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import report as jr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_fixtures as rf  # noqa: E402

CHROMIUM = '/usr/bin/chromium'
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                 '--disable-background-networking', '--disable-component-update', '--disable-sync']
SETUP = 'run scripts/setup.sh (it installs the chromium package and playwright into .venv)'


@pytest.fixture(scope='module')
def browser():
    """Headless Chromium with a fresh profile; the test fails (never skips) when it is missing."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail('%s not found: %s' % (CHROMIUM, SETUP))
    try:
        from playwright.sync_api import sync_playwright  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        pytest.fail('playwright cannot be imported (%s): %s' % (exc, SETUP))
    with sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60000)
        try:
            yield chromium
        finally:
            chromium.close()


class Opened:
    """A page opened from its file, offline, with what it asked for and what it complained about."""

    def __init__(self, browser, path):
        self.url = 'file://' + str(path)
        self.context = browser.new_context(offline=True, java_script_enabled=True)
        self.page = self.context.new_page()
        self.requests, self.errors = [], []
        self.context.on('request', lambda request: self.requests.append(request.url))
        self.page.on('console', lambda msg: self.errors.append('console: %s' % msg.text) if msg.type == 'error' else None)
        self.page.on('pageerror', lambda exc: self.errors.append('page error: %s' % exc))
        self.page.goto(self.url, wait_until='load', timeout=30000)

    def js(self, expression, arg=None):
        return self.page.evaluate(expression, arg)

    def data(self, element_id):
        return self.js('id => JSON.parse(document.getElementById(id).textContent)', element_id)

    def check_clean(self):
        assert self.requests == [self.url], 'the page asked for more than its own file: %s' % self.requests
        assert self.errors == [], '\n'.join(self.errors)

    def close(self):
        self.context.close()


def job_page(tmp_path):
    job = rf.make_job(tmp_path)
    progress, events, summary, layout, earlier = jr.read_job(str(job))
    path = job / jr.PAGE
    path.write_text(jr.render(jr.job_data(job.name, progress, events, summary, layout, earlier=earlier), str(job)))
    return job, path


def test_the_job_page_shows_the_jobs_data_offline_and_without_an_error(browser, tmp_path):
    job, path = job_page(tmp_path)
    opened = Opened(browser, path)
    try:
        parsed = dict((rank, jm.parse_progress((job / 'progress' / ('rank-%d.log' % rank)).read_text()))
                      for rank in (0, 1, 2))
        losses = [[s['step'], s['loss']] for s in parsed[0]['steps'] if 'loss' in s]
        # the loss plot: one vertex per step of rank 0's progress file
        vertices = opened.js('() => [...document.querySelectorAll("#loss-plot polyline.series")]'
                             '.map(p => p.points.numberOfItems)')
        assert vertices == [len(losses)] == [60]
        # the data it was drawn from, read through the DOM, is what parse_progress reads
        data = opened.data(jr.DATA_ID)
        assert data['loss']['points'] == losses
        assert [(r['rank'], r['last_step'], r['steps_logged']) for r in data['ranks']] == [
            (rank, p['steps'][-1]['step'], len(p['steps'])) for rank, p in sorted(parsed.items())]
        # the x of the vertices grows with the step, the highest loss is drawn highest (smallest y)
        xs, ys = opened.js('() => { const p = document.querySelector("#loss-plot polyline.series").points;'
                           ' const xs = [], ys = []; for (let i = 0; i < p.numberOfItems; i++) {'
                           ' xs.push(p.getItem(i).x); ys.push(p.getItem(i).y); } return [xs, ys]; }')
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
        top = max(range(len(losses)), key=lambda i: losses[i][1])
        assert ys[top] == min(ys)
        # steps per second: one line per node, as many vertices as the data holds
        rates = opened.js('() => [...document.querySelectorAll("#rate-plot polyline.series")]'
                          '.map(p => [p.dataset.series, p.points.numberOfItems])')
        assert rates == [['%s (rank %d)' % (n['node'], n['rate_rank']), len(n['rate'])] for n in data['nodes']]
        assert [n['node'] for n in data['nodes']] == ['lab-head', 'lab-worker-1']
        # the slowest node, named and drawn in bold
        assert opened.js('() => document.getElementById("slowest-node").textContent') == 'lab-worker-1'
        bars = opened.js('() => [...document.querySelectorAll("#steptime-plot rect.bar")].map(r => r.dataset.node)')
        assert sorted(set(bars)) == ['lab-head', 'lab-worker-1']
        # the supervisor's events on the time line, in the order of events.jsonl
        events = [json.loads(line) for line in (job / 'events.jsonl').read_text().splitlines()]
        on_line = opened.js('() => [...document.querySelectorAll("#timeline g.event")]'
                            '.map(g => [g.dataset.event, Number(g.dataset.time), g.getBBox().width > 0])')
        assert [(kind, when) for kind, when, _ in on_line] == [(e['event'], e['time']) for e in events]
        assert all(shown for _, _, shown in on_line)
        assert opened.js('() => [...document.querySelectorAll("table.events td[class^=event-]")].map(td => td.textContent)') == [
            e['event'] for e in events]
        # the summary
        summary = opened.js('() => Object.fromEntries([...document.querySelectorAll("table.summary tr")]'
                            '.map(tr => [tr.cells[0].textContent, tr.cells[1].textContent]))')
        assert summary['state'] == 'finished' and summary['steps'] == '60' and summary['world size'] == '3'
        assert summary['nodes'] == 'lab-head (2), lab-worker-1 (1)'
        assert summary['supervised'].startswith('finished (the job finished); 1 fault(s), 1 restart(s), 10 step(s) lost')
        opened.check_clean()
    finally:
        opened.close()


def test_the_health_page_shows_each_failing_check_with_its_node_and_remedy(browser, tmp_path):
    report = rf.health_report('lab-fault-port', previous_scenario='lab-healthy')
    path = tmp_path / health_page.page_name('quick')
    path.write_text(health_page.render(report))
    opened = Opened(browser, path)
    try:
        bad = sorted((r for r in report['records'] if r['status'] in ('fail', 'warn')),
                     key=lambda r: (r['status'] != 'fail', r['node'], r['check']))
        assert any(r['status'] == 'fail' for r in bad)
        shown = opened.js('() => [...document.querySelectorAll("tr.problem")].map(tr => ({node: tr.dataset.node,'
                          ' check: tr.dataset.check, status: tr.dataset.status,'
                          ' remedy: tr.querySelector("td.remedy").textContent,'
                          ' cell: tr.querySelector("td.node").textContent}))')
        assert shown == [{'node': r['node'], 'check': r['check'], 'status': r['status'], 'remedy': r['remedy'],
                          'cell': r['node']} for r in bad]
        # in the grid each failing check is red (its cell's colour as the browser computed it)
        for r in bad:
            colour = opened.js('([n, c]) => getComputedStyle(document.querySelector('
                               '`td[data-node="${n}"][data-check="${c}"]`)).backgroundColor', [r['node'], r['check']])
            assert colour == {'fail': 'rgb(198, 40, 40)', 'warn': 'rgb(239, 108, 0)'}[r['status']]
        cells = opened.js('() => document.querySelectorAll("table.grid td[data-status]").length')
        assert cells == len(report['records'])
        # a check that does not apply (the lab declares no GPU) is a neutral grey, not unknown's dark grey
        na = opened.js('() => [...document.querySelectorAll(\'table.grid td[data-status="n/a"]\')]'
                       '.map(td => getComputedStyle(td).backgroundColor)')
        assert len(na) == len([r for r in report['records'] if r['status'] == 'n/a']) > 0
        assert set(na) == {'rgb(236, 239, 241)'}
        assert opened.js('() => [...document.querySelectorAll("ul.changes li")].map(li => li.textContent)') == report['changes']
        assert opened.data(health_page.DATA_ID) == json.loads(json.dumps(report))
        opened.check_clean()
    finally:
        opened.close()


def test_a_restarted_jobs_page_draws_both_attempts_against_their_own_steps(browser, tmp_path):
    """The morning view of a job restarted once from its step-20 checkpoint: attempt 1 logged steps 1-23 (its files
    kept as progress/attempt-1 when attempt 2 began), attempt 2 steps 21-40; the page spans both."""
    rf.write_attempt(str(tmp_path / 'progress'), 1, list(range(1, 24)))
    rf.write_attempt(str(tmp_path / 'progress'), 2, list(range(21, 41)), done=True)
    progress, events, summary, layout, earlier = jr.read_job(str(tmp_path))
    path = tmp_path / jr.PAGE
    path.write_text(jr.render(jr.job_data('j-restarted', progress, events, summary, layout, earlier=earlier),
                              str(tmp_path)))
    opened = Opened(browser, path)
    try:
        lines = opened.js('() => [...document.querySelectorAll("#loss-plot polyline.series")].map(p => {'
                          ' const xs = []; for (let i = 0; i < p.points.numberOfItems; i++) xs.push(p.points.getItem(i).x);'
                          ' return [p.dataset.series, xs]; })')
        assert [(name, len(xs)) for name, xs in lines] == [('attempt 1', 23), ('attempt 2', 20)]
        (_, first), (_, second) = lines
        # one x axis of steps: attempt 2 begins at step 21, left of attempt 1's last point (step 23), and goes past it
        assert first == sorted(first) and second == sorted(second)
        assert first[0] < second[0] < first[-1] < second[-1]
        step_width = (first[-1] - first[0]) / 22
        assert abs((second[0] - first[0]) - 20 * step_width) < 0.5  # step 21 sits where attempt 1's step 21 is
        rows = opened.js('() => [...document.querySelectorAll("table.attempts tr")].slice(1)'
                         '.map(tr => [tr.cells[0].textContent, tr.cells[2].textContent])')
        assert rows == [['1', '1-23'], ['2', '21-40']]
        assert '2 attempts, one line each' in opened.js('() => document.getElementById("loss-attempts").textContent')
        opened.check_clean()
    finally:
        opened.close()
