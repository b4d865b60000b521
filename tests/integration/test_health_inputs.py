"""playbooks/health.yml refuses bad settings before any check runs.

The runs use the contract tests' inventory with a local connection: nothing leaves this
machine. Each must fail with one message naming the variable (and the host where it is on one)
and must not reach the probe.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORY = os.path.join(ROOT, 'tests', 'integration', 'inventories', 'good.yml')
PLAYBOOK = os.path.join(ROOT, 'playbooks', 'health.yml')

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which('ansible-playbook') is None,
                                 reason='ansible-playbook is not on PATH (source scripts/env.sh)')]


def run(*extra, cwd=ROOT):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'))
    cmd = ['ansible-playbook', PLAYBOOK, '-i', INVENTORY, '-e', 'ansible_connection=local',
           '-e', 'ansible_python_interpreter=' + shutil.which('python3')] + list(extra)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def no_check_ran(out):
    return 'Probe every node' not in out and 'hold it open for the test' not in out


def test_an_unknown_tier_is_refused():
    rc, out = run('-e', 'health_tier=fast')
    assert rc != 0
    assert 'value of health_tier must be one of: quick, deep, got: fast' in out, out[-3000:]
    assert no_check_ran(out)


@pytest.mark.parametrize('var, value, kind', [
    ('health_clock_offset_fail_s', 'soon', 'float'),
    ('health_disk_free_warn_pct', 'lots', 'float'),
    ('health_report_keep', 'ten', 'int'),
])
def test_a_threshold_of_the_wrong_type_is_refused(var, value, kind):
    rc, out = run('-e', '%s=%s' % (var, value))
    assert rc != 0
    assert "argument '%s' is of type str and we were unable to convert to %s" % (var, kind) in out, out[-3000:]
    assert no_check_ran(out)


def one_line(out):
    return ' '.join(out.split())


@pytest.mark.parametrize('args, message', [
    (['-e', 'health_disk_free_fail_pct=20', '-e', 'health_disk_free_warn_pct=10'],
     'host gpu-master: health_disk_free_warn_pct (10) must be above or equal to health_disk_free_fail_pct (20): '
     'a node warns before it fails. No check was run.'),
    (['-e', 'health_disk_free_fail_pct=-5'],
     'host gpu-master: health_disk_free_fail_pct must be a percentage from 0 to 100 (got -5). No check was run.'),
    (['-e', 'health_clock_offset_warn_s=0'],
     'host gpu-master: health_clock_offset_warn_s must be a positive number of seconds (got 0)'),
    (['-e', 'health_probe_timeout=10'],
     'health_storage_timeout (15) must be below health_probe_timeout (10)'),
])
def test_thresholds_out_of_range_or_order_are_refused(args, message):
    rc, out = run(*args)
    assert rc != 0
    assert message in one_line(out), out[-3000:]
    assert no_check_ran(out)


@pytest.mark.parametrize('inventory, found', [
    ('all:\n  children:\n    cluster:\n      children:\n        workers:\n          hosts:\n'
     '            w1: {ansible_host: 10.1.0.11}\n            w2: {ansible_host: 10.1.0.12}\n',
     "group 'head' is empty; exactly one host must be the head"),
    ('all:\n  children:\n    cluster:\n      children:\n        head:\n          hosts:\n'
     '            h1: {ansible_host: 10.1.0.10}\n            h2: {ansible_host: 10.1.0.11}\n'
     '        workers:\n          hosts:\n            w1: {ansible_host: 10.1.0.12}\n',
     "group 'head' must hold exactly one host, it holds 2: h1, h2"),
])
def test_an_inventory_without_exactly_one_head_is_refused(tmp_path, inventory, found):
    """No worker is ever taken as the head: the reports would be written there."""
    inv = tmp_path / 'hosts.yml'
    inv.write_text(inventory)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'))
    proc = subprocess.run(['ansible-playbook', PLAYBOOK, '-i', str(inv), '-e', 'ansible_connection=local',
                           '-e', 'ansible_python_interpreter=' + shutil.which('python3')],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # The inventory contract, the first play of health.yml, refuses it before any node is contacted.
    assert found in one_line(out), out[-3000:]
    assert 'inventory contract: ' in one_line(out) and 'nothing was changed' in one_line(out)
    assert no_check_ran(out) and 'Check that the head can keep the reports' not in out


def test_a_report_directory_that_cannot_be_written_is_refused(tmp_path):
    blocked = tmp_path / 'file'
    blocked.write_text('not a directory')
    rc, out = run('-e', 'health_report_dir=%s/reports' % blocked)
    assert rc != 0
    assert ('host gpu-master: health_report_dir %s/reports cannot be written: ' % blocked) in out, out[-3000:]
    assert 'No check was run.' in out
    assert no_check_ran(out)


def test_a_page_directory_that_is_a_file_or_cannot_be_created_is_refused(tmp_path):
    """health_report_page_dir is checked on the controller before any node is touched, not after the run
    when the page is fetched (which failed with a bare 'Not a directory')."""
    (tmp_path / 'reports').mkdir()
    (tmp_path / 'reports' / 'x.html').write_text('<html></html>')
    # relative, from the directory ansible-playbook was started from
    rc, out = run('-e', 'health_report_page_dir=reports/x.html', cwd=str(tmp_path))
    assert rc != 0
    assert ('host gpu-master: health_report_page_dir reports/x.html is a file on the controller; name a directory '
            '(it is created when missing). No check was run.') in one_line(out), out[-3000:]
    assert no_check_ran(out) and 'Check that the head can keep the reports' not in out
    # a directory under that file cannot be created
    rc, out = run('-e', 'health_report_page_dir=%s/reports/x.html/pages' % tmp_path)
    assert rc != 0
    assert ('host gpu-master: health_report_page_dir %s/reports/x.html/pages cannot be created on the controller: '
            '%s/reports/x.html is a file; name a directory (it is created when missing). No check was run.'
            % (tmp_path, tmp_path)) in one_line(out), out[-3000:]
    assert no_check_ran(out) and 'Check that the head can keep the reports' not in out
