"""The health report formats: summary, JUnit XML, Prometheus textfile, changes since the last run."""

from __future__ import annotations

import copy
import os
import sys
import xml.etree.ElementTree as ET

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import health_checks
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_records
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_reports

# the recorded lab's nodes, as test_health_checks (beside health_checks, in plugin_utils) builds them
sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'plugin_utils'))
from test_health_checks import lab_args, lab_nodes  # noqa: E402

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures')
HEALTH = os.path.join(FIX, 'health')


def read(*parts):
    with open(os.path.join(FIX, *parts)) as f:
        return f.read()


# ------------------------------------------------------------------ report formats

def sample_records():
    nodes, meta = lab_nodes('lab-healthy')
    nodes[2]['versions']['torch'] = '2.12.0+cpu'
    return health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])


def test_summary_lists_failures_with_their_remedy():
    lines = health_reports.summary_lines(sample_records(), ['lab-worker-2 version.torch: ok -> fail (2.13.0+cpu -> 2.12.0+cpu)'])
    assert lines[0].startswith('health: 4 node(s)')
    assert any(l.startswith('FAIL lab-worker-2 version.torch: torch 2.12.0+cpu here') for l in lines)
    assert any(l.strip().startswith('remedy: reinstall the environment on lab-worker-2') for l in lines)
    assert lines[-1].startswith('  lab-worker-2 version.torch')


def test_junit_is_valid_xml_with_one_failure():
    recs = sample_records()
    root = ET.fromstring(health_reports.junit_xml(recs, 'quick', '2026-11-23T05:00:00+00:00'))
    assert root.tag == 'testsuites' and int(root.get('failures')) == 1
    assert int(root.get('tests')) == len(recs)
    failing = [tc for tc in root.iter('testcase') if tc.find('failure') is not None]
    assert [(tc.get('classname'), tc.get('name')) for tc in failing] == [('quick.lab-worker-2', 'version.torch')]
    assert 'reinstall' in failing[0].find('failure').get('message')
    skipped = [tc for tc in root.iter('testcase') if tc.find('skipped') is not None]
    assert skipped  # the GPU checks on a lab without GPUs


def test_prometheus_textfile_format():
    recs = sample_records()
    text = health_reports.prometheus_text(recs, 'quick', 1795408461.5)
    lines = text.splitlines()
    assert '# TYPE gpucluster_health_check_status gauge' in lines
    assert 'gpucluster_health_check_status{tier="quick",node="lab-worker-2",check="version.torch"} 2' in lines
    assert 'gpucluster_health_checks{tier="quick",status="fail"} 1' in lines
    assert lines[-1] == 'gpucluster_health_last_run_timestamp_seconds{tier="quick"} 1795408461.5'
    # every sample line: name{labels} value, and every metric has HELP and TYPE first
    names = set()
    for line in lines:
        if line.startswith('# TYPE'):
            names.add(line.split()[2])
        elif not line.startswith('#'):
            assert line.split('{')[0] in names
            float(line.rsplit(' ', 1)[1])


def test_prometheus_values_are_in_base_units_one_unit_per_metric():
    recs = [health_records.record('n1', 'disk_free', 'warn', 12.5, '>= 15'),
            health_records.record('n1', 'clock_offset', 'ok', -0.25, '< 1'),
            health_records.record('n1', 'bandwidth', 'ok', 9.4, 'x'),
            health_records.record('n1', 'version.torch', 'ok', '2.13.0', 'x'),
            health_records.record('n1', 'name_resolution', 'ok', 3, 'x')]
    lines = health_reports.prometheus_text(recs, 'quick', 1.0).splitlines()
    assert 'gpucluster_health_disk_free_ratio{tier="quick",node="n1"} 0.125' in lines
    assert 'gpucluster_health_clock_offset_seconds{tier="quick",node="n1"} -0.25' in lines
    assert 'gpucluster_health_bandwidth_bits_per_second{tier="quick",node="n1"} 9400000000.0' in lines
    # no metric mixes units or holds a percent
    assert not [x for x in lines if 'check_value' in x or 'percent' in x or 'pct' in x]


def test_checks_that_do_not_apply_are_n_a_in_every_format():
    """The lab declares no GPU: its GPU checks are n/a (4) in the textfile, skipped with why in JUnit, and
    counted apart in the summary; the run's status is that of the other checks."""
    recs = sample_records()
    na = [r for r in recs if r['status'] == 'n/a']
    assert len(na) == 20 and {r['check'] for r in na} == {'gpu', 'version.driver', 'version.cuda', 'version.torch_cuda',
                                                          'version.nccl_wheel'}
    lines = health_reports.prometheus_text(recs, 'quick', 1.0).splitlines()
    assert 'gpucluster_health_check_status{tier="quick",node="lab-head",check="gpu"} 4' in lines
    assert 'gpucluster_health_checks{tier="quick",status="n/a"} 20' in lines
    assert 'gpucluster_health_checks{tier="quick",status="unknown"} 0' in lines
    root = ET.fromstring(health_reports.junit_xml(recs, 'quick', '2026-11-23T05:00:00+00:00'))
    assert int(root.get('skipped')) == 20 and int(root.get('failures')) == 1
    gpu = [tc for tc in root.iter('testcase') if tc.get('name') == 'gpu'][0]
    assert gpu.find('skipped').get('message') == ('n/a: no GPU declared on this node (gpu_slots not set); '
                                                  'no NVIDIA GPU on the PCI bus')
    summary = health_reports.summary_lines(recs)
    assert summary[0] == 'health: 4 node(s), 73 check(s): 52 ok, 0 warn, 1 fail, 0 unknown, 20 n/a; status FAIL'
    assert summary[2].split() == ['lab-head', 'OK', '14', '0', '0', '0', '5']
    fixed = [r for r in recs if r['status'] != 'fail']
    assert health_reports.summary_lines(fixed)[0].endswith('0 unknown, 20 n/a; status OK')


def test_label_values_are_escaped():
    rec = health_records.record('n"1\\', 'c\nx', 'ok')
    assert 'node="n\\"1\\\\",check="c\\nx"' in health_reports.prometheus_text([rec], 'quick', 0)


def _collective(below=()):
    """A collective_summary as the cluster_tests role hands it to the deep tier."""
    from ansible_collections.gpucluster.multinode.plugins.plugin_utils import cluster_test_reports as ct
    rows = ct.allreduce_rows([{'size': 65536, 'count': 16384, 'time_us': 800.0, 'wrong': 0},
                              {'size': 1 << 20, 'count': 1 << 18, 'time_us': 5000.0, 'wrong': 0}], 3)
    head = {'reporter': True, 'method': 'torch', 'algorithm': 'torch.distributed all_reduce (gloo)', 'backend': 'gloo',
            'world_size': 3, 'nnodes': 3, 'rows': rows, 'correct': True, 'avg_busbw_gbs': 0.1,
            'max_busbw_gbs': rows[-1]['busbw_gbs'], 'below_threshold': list(below), 'ok': not below}
    return ct.collective_summary({'a': head, 'b': {'reporter': False, 'ok': True}}, ['a', 'b'])


def test_collective_records_carry_the_busbw_of_the_largest_size():
    rep = _collective()
    recs = health_checks.evaluate_deep(['a', 'b'], collective=rep, tests=['collective'])
    assert [r['status'] for r in recs] == ['ok', 'ok']
    assert recs[0]['value'] == rep['rows'][-1]['busbw_gbs'] and recs[0]['value'] > 0
    assert 'at 1048576 bytes' in recs[0]['detail'] and 'values correct' in recs[0]['detail']
    slow = health_checks.evaluate_deep(['a', 'b'], collective=_collective(
        [{'size': 1 << 20, 'busbw_gbs': 0.28, 'threshold_gbs': 1.0}]), tests=['collective'])
    assert [r['status'] for r in slow] == ['fail', 'fail']
    assert slow[0]['detail'] == 'size 1M: busbw 0.2800 GB/s is under its threshold 1.0000 GB/s'
    # a collective bandwidth that fell by more than the drop percent is listed as a change
    before, after = {'records': recs}, {'records': [dict(r, value=r['value'] / 3) for r in recs]}
    assert [c.split(':')[0] for c in health_reports.changes_since(before, after)] == ['a collective', 'b collective']


def test_changes_since_the_last_run():
    before = health_reports.make_report(health_checks.evaluate_quick(*lab_args()), 'quick', 't0', 't1')
    nodes, meta = lab_nodes('lab-healthy')
    nodes[2]['versions']['torch'] = '2.12.0+cpu'
    nodes[0]['versions']['kernel'] = '6.1.0-99-amd64'
    after = health_reports.make_report(health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token']),
                                       'quick', 't2', 't3')
    changes = health_reports.changes_since(before, after)
    assert any(c.startswith('lab-worker-2 version.torch: ok -> fail') for c in changes)
    assert health_reports.changes_since(None, after) == []
    assert health_reports.changes_since(after, copy.deepcopy(after)) == []


def test_a_slower_node_is_a_change():
    def rep(v):
        return {'records': [health_records.record('b', 'bandwidth', 'ok', v, 'x')]}

    assert health_reports.changes_since(rep(20.0), rep(19.0)) == []
    assert health_reports.changes_since(rep(20.0), rep(9.0)) == ['b bandwidth: 20 -> 9 (-55%, became slow)']
