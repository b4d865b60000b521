"""The alert rules shipped in files/prometheus: promtool's own unit tests of them (input series ->
the alerts that fire and those that must not), and that every metric and label they read is one
the textfile writers emit, so the rules cannot drift from the textfiles."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpucluster.multinode.plugins.module_utils import health_records
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_reports
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm
from test_job_monitor import h100_gpus, rows_from

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
RULES = os.path.join(ROOT, 'files', 'prometheus', 'gpucluster-rules.yml')
RULES_TEST = os.path.join(ROOT, 'tests', 'unit', 'fixtures', 'prometheus', 'gpucluster-rules.test.yml')
PROMTOOL = shutil.which('promtool')
NO_PROMTOOL = 'promtool not installed (Debian package prometheus; scripts/setup.sh installs it)'


def emitted():
    """{metric name: set of label names} of a training textfile and a health textfile written by
    the real writers, with every figure present."""
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    rows[0].update(cpu_pct=97.5, rss_kib=300000, peak_rss_kib=320000, gpu=dict(h100_gpus()[0], index=0))
    text = jm.textfile_records(rows, 'j-1', 1795589350.0, node='head', world=3)
    records = [health_records.record('n1', check, 'fail', 1.0, 'x') for check in health_reports.VALUE_METRICS]
    text += health_reports.prometheus_text(records, 'quick', 1795589350.0)
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def rule_exprs():
    with open(RULES) as handle:
        doc = yaml.safe_load(handle)
    return [(rule['alert'], rule['expr']) for group in doc['groups'] for rule in group['rules']]


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_accepts_the_rules_and_its_unit_tests_pass():
    check = subprocess.run([PROMTOOL, 'check', 'rules', RULES], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run([PROMTOOL, 'test', 'rules', RULES_TEST], capture_output=True, text=True, check=False)
    assert run.returncode == 0 and 'SUCCESS' in run.stdout, run.stdout + run.stderr


def test_every_metric_and_label_the_rules_read_is_written_by_the_textfile_writers():
    names = emitted()
    labels = set().union(*names.values())
    exprs = rule_exprs()
    assert {alert for alert, _ in exprs} == {
        'GpuclusterTrainingStalled', 'GpuclusterTrainingRankDown', 'GpuclusterTrainingNodeSlow',
        'GpuclusterTrainingFiguresStale', 'GpuclusterHealthCheckFailing'}
    for alert, expr in exprs:
        used = set(re.findall(r'\bgpucluster_[a-z_]+', expr))
        assert used, alert
        assert used <= set(names), '%s reads %s, which no textfile writes' % (alert, sorted(used - set(names)))
        for group in re.findall(r'\b(?:by|on)\s*\(([^)]*)\)', expr):
            wanted = {name.strip() for name in group.split(',') if name.strip()}
            assert wanted <= labels, '%s groups by %s, a label no textfile writes' % (alert, sorted(wanted - labels))


def test_the_promtool_test_series_are_named_as_the_writers_write_them():
    names = emitted()
    with open(RULES_TEST) as handle:
        doc = yaml.safe_load(handle)
    series = [s['series'] for test in doc['tests'] for s in test['input_series']]
    for text in series:
        name, _, rest = text.partition('{')
        assert name in names, text
        written = {pair.split('=')[0] for pair in rest.rstrip('}').split(',')} - {'instance', 'job'}
        assert written <= names[name], text
