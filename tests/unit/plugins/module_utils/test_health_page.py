"""The health report's page without a browser, on the recorded lab: every check by node, what failed with
its node and remedy, what changed since the last run, the report embedded as JSON."""

from __future__ import annotations

import html
import json
import os
import re
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import health_page

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_fixtures as rf  # noqa: E402


@pytest.mark.parametrize('scenario', ['lab-fault-port', 'lab-fault-shared', 'lab-fault-hosts', 'lab-fault-nccl-iface',
                                      'lab-fault-clock'])
def test_each_failing_check_is_shown_with_its_node_and_remedy(scenario):
    report = rf.health_report(scenario, previous_scenario='lab-healthy')
    page = health_page.render(report)
    bad = [r for r in report['records'] if r['status'] == 'fail']
    assert bad
    rows = re.findall(r'<tr class="problem" data-node="([^"]+)" data-check="([^"]+)" data-status="(\w+)">(.*?)</tr>', page)
    assert [(n, c, s) for n, c, s, _ in rows if s == 'fail'] == [(r['node'], r['check'], 'fail') for r in bad]
    for record, (_, _, _, cells) in zip(bad, rows):
        assert '<td class="remedy">%s</td>' % html.escape(record['remedy'], quote=True) in cells
    # the grid: one cell per record, coloured by its status (n/a: class na)
    cells = re.findall(r'<td class="(\w+)" data-node="([^"]+)" data-check="([^"]+)" data-status="([\w/]+)"', page)
    expected = sorted((r['node'], r['check'], r['status']) for r in report['records'])
    assert sorted((n, c, s) for _, n, c, s in cells) == expected
    assert all(cls == {'n/a': 'na'}.get(s, s) for cls, _, _, s in cells)
    assert '<span class="badge fail">FAIL</span>' in page
    # what changed since the healthy run: the failing check, ok -> fail
    assert report['changes'] and all('<li>%s</li>' % html.escape(c, quote=True) in page for c in report['changes'])
    assert any('ok -> fail' in c for c in report['changes'])


def test_the_page_embeds_the_report_and_reaches_nothing_outside():
    report = rf.health_report('lab-fault-port', previous_scenario='lab-healthy')
    page = health_page.render(report)
    assert rf.embedded_json(page, health_page.DATA_ID) == json.loads(json.dumps(report))
    assert not re.search(r'(?i)\b(?:https?:|//[a-z])|@import|url\(|<link|<img|<iframe', page)
    assert page.count('<script') == 1


def test_a_healthy_first_run_says_nothing_failed_and_has_nothing_to_compare():
    report = rf.health_report('lab-healthy')
    page = health_page.render(report)
    assert 'id="nothing-failed"' in page and 'id="no-previous"' in page
    assert 'class="problem"' not in page
    # the lab declares no GPU and has none: a healthy cluster for what it declares, its GPU checks n/a
    # (grey, not the unknown's colour) with why
    assert '<span class="badge ok">OK</span>' in page
    assert 'unknown (not measurable here)' not in page
    assert ('<p class="note not-applicable">n/a (does not apply): version.cuda, version.driver, version.nccl_wheel, '
            'version.torch_cuda on every node: no GPU declared on this node (gpu_slots not set)</p>') in page
    assert re.search(r'<td class="na" data-node="lab-head" data-check="gpu" data-status="n/a" title="lab-head gpu: '
                     r'no GPU declared on this node \(gpu_slots not set\); [^"]*">n/a</td>', page)
    style = re.search(r'<style>(.*?)</style>', page, re.S).group(1)
    na = re.search(r'\.na\{background:(#[0-9a-f]+)', style).group(1)
    assert na not in {re.search(r'\.%s\{background:(#[0-9a-f]+)' % s, style).group(1) for s in ('ok', 'warn', 'fail', 'unknown')}


def test_a_run_like_the_last_says_nothing_changed():
    report = rf.health_report('lab-healthy', previous_scenario='lab-healthy')
    assert report['changes'] == []
    assert 'id="no-changes"' in health_page.render(report)
