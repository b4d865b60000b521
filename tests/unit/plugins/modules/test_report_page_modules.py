"""training_report and health_report's page, run as Ansible runs them: a subprocess reading a JSON args file."""

from __future__ import annotations

import json
import os
import stat
import sys

from module_run import ROOT, run_module

sys.path.insert(0, os.path.join(ROOT, 'tests', 'unit', 'plugins', 'module_utils'))
import report_fixtures as rf  # noqa: E402

TRAINING_REPORT = os.path.join(ROOT, 'plugins', 'modules', 'training_report.py')
HEALTH_REPORT = os.path.join(ROOT, 'plugins', 'modules', 'health_report.py')


def test_the_page_is_written_once_mode_0644_and_a_second_run_changes_nothing(tmp_path):
    job = rf.make_job(tmp_path)
    args = {'job_id': job.name, 'job_dir': str(job)}
    first = run_module(TRAINING_REPORT, tmp_path, args)
    page = job / 'report.html'
    assert first['changed'] and first['page'] == str(page) and page.is_file()
    assert stat.S_IMODE(os.stat(str(page)).st_mode) == 0o644
    assert (first['ranks'], first['steps'], first['job_state'], first['loss_points'], first['loss_steps']) == (
        3, 60, 'finished', 60, 60)
    assert first['supervised'] and first['events'] == len(rf.EVENTS) and first['slowest_node'] == 'lab-worker-1'
    assert first['bytes'] == len(page.read_bytes()) and not first['downsampled']
    assert [n for n in os.listdir(str(job)) if n.startswith('.report-')] == []
    assert run_module(TRAINING_REPORT, tmp_path, args)['changed'] is False
    # a new event changes the page
    with open(str(job / 'events.jsonl'), 'a') as handle:
        handle.write(json.dumps({'event': 'stopped', 'time': rf.first_step_time() + 60, 'why': 'by hand'}) + '\n')
    assert run_module(TRAINING_REPORT, tmp_path, args)['changed'] is True


def test_check_mode_says_it_would_write_and_writes_nothing(tmp_path):
    job = rf.make_job(tmp_path)
    result = run_module(TRAINING_REPORT, tmp_path, {'job_id': job.name, 'job_dir': str(job)}, check=True)
    assert result['changed'] and not (job / 'report.html').exists()
    assert run_module(TRAINING_REPORT, tmp_path, {'job_id': job.name, 'job_dir': str(job), 'max_points': 10},
                      check=True)['downsampled'] is True


def test_a_job_that_never_ran_and_a_bad_bound_are_refused(tmp_path):
    result = run_module(TRAINING_REPORT, tmp_path, {'job_id': 'nope', 'job_dir': str(tmp_path / 'nope')})
    assert result['failed'] and result['msg'].startswith('job nope: its directory %s does not exist' % (tmp_path / 'nope'))
    job = rf.make_job(tmp_path)
    result = run_module(TRAINING_REPORT, tmp_path, {'job_id': job.name, 'job_dir': str(job), 'max_points': 1})
    assert result['failed'] and 'max_points must be at least 2' in result['msg']


def test_the_health_report_writes_its_page_beside_the_json(tmp_path):
    report = rf.health_report('lab-fault-port')
    rdir = tmp_path / 'health'
    args = {'report_dir': str(rdir), 'records': report['records'], 'tier': 'quick', 'cluster': 'lab'}
    first = run_module(HEALTH_REPORT, tmp_path, args)
    page = rdir / 'latest-quick.html'
    assert first['html_file'] == str(page) and str(page) in first['files']
    assert stat.S_IMODE(os.stat(str(page)).st_mode) == 0o644
    assert rf.embedded_json(page.read_text(), 'gpucluster-health-data')['previous_report'] is None
    second = run_module(HEALTH_REPORT, tmp_path, dict(args, records=rf.health_report('lab-healthy')['records']))
    data = rf.embedded_json(page.read_text(), 'gpucluster-health-data')
    assert data['previous_report'] == first['report_file'] and data['changes'] == second['changes']
    assert any('fail -> ok' in c for c in data['changes'])
    third = run_module(HEALTH_REPORT, tmp_path / 'health', dict(args, html=False))
    assert third['html_file'] == '' and not any(f.endswith('.html') for f in third['files'])
