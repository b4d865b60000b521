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


def run(*extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'))
    cmd = ['ansible-playbook', PLAYBOOK, '-i', INVENTORY, '-e', 'ansible_connection=local',
           '-e', 'ansible_python_interpreter=' + shutil.which('python3')] + list(extra)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
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


def test_thresholds_out_of_order_are_refused():
    rc, out = run('-e', 'health_disk_free_fail_pct=20', '-e', 'health_disk_free_warn_pct=10')
    assert rc != 0
    assert 'health: thresholds out of order: health_disk_free_fail_pct (20) must be at most' in out, out[-3000:]
    assert no_check_ran(out)


def test_a_report_directory_that_cannot_be_written_is_refused(tmp_path):
    blocked = tmp_path / 'file'
    blocked.write_text('not a directory')
    rc, out = run('-e', 'health_report_dir=%s/reports' % blocked)
    assert rc != 0
    assert ('host gpu-master: health_report_dir %s/reports cannot be written: ' % blocked) in out, out[-3000:]
    assert 'No check was run.' in out
    assert no_check_ran(out)
