"""Health checks: parsers on real outputs, the judgements, and the report formats."""

from __future__ import annotations

import copy
import glob
import json
import os
import xml.etree.ElementTree as ET

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import health
from ansible_collections.gpucluster.multinode.plugins.module_utils import nvidia_smi

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures')
HEALTH = os.path.join(FIX, 'health')


def read(*parts):
    with open(os.path.join(FIX, *parts)) as f:
        return f.read()


# ------------------------------------------------------------------ parsers

def test_xid_lines_from_a_syslog_excerpt():
    found = health.parse_xid_lines(read('health', 'xid_gpu_operator_1146.log'))
    assert [x['code'] for x in found] == [48, 64]
    assert found[0]['pci'] == 'PCI:0000:07:00'
    assert 'double bit error' in found[0]['text']


def test_xid_lines_from_dmesg_ctime():
    found = health.parse_xid_lines(read('health', 'xid_gpud_46.log'))
    assert [x['code'] for x in found] == [13, 13, 13, 109]
    assert found[-1]['text'].startswith('pid=1797828, name=pt_main_thread')


def test_a_kernel_log_with_nvidia_lines_but_no_xid_has_none():
    assert health.parse_xid_lines(read('nvidia_smi', 'h100-sxm-x1-driver580', 'dmesg-nvrm.txt')) == []


def test_profile_env_of_the_nccl_env_role():
    env = health.parse_profile_env(read('health', 'gpucluster-nccl.sh'))
    assert env['NCCL_SOCKET_IFNAME'] == 'eth0'
    assert env['GLOO_SOCKET_IFNAME'] == 'eth0'


@pytest.mark.parametrize('spec, names, chosen', [
    ('eth0', ['eth0', 'eth01', 'lo'], ['eth0', 'eth01']),          # a prefix, as NCCL reads it
    ('=eth0', ['eth0', 'eth01', 'lo'], ['eth0']),                  # exact
    ('^docker,lo', ['docker0', 'lo', 'enp26s0np0'], ['enp26s0np0']),
    ('ib,enp', ['ib0', 'enp1s0', 'eth0'], ['enp1s0', 'ib0']),
    ('ens9f1', ['eth0', 'lo'], []),
])
def test_nccl_socket_ifname_rules(spec, names, chosen):
    assert health.ifname_matches(spec, names) == chosen


def test_listeners_in_proc_net_tcp():
    text = read('health', 'proc-net-tcp-listener.txt')
    assert len(health.parse_proc_net_tcp_listeners(text, 29500)) == 1
    assert health.parse_proc_net_tcp_listeners(text, 29501) == []


# ------------------------------------------------------------------ quick tier on recorded probes

def lab_nodes(scenario):
    """The nodes as the filter builds them, from the probe results recorded on the lab."""
    nodes = []
    meta = json.loads(read('health', scenario, 'nodes.json'))
    for name, address in meta['nodes']:
        probe = json.loads(read('health', scenario, name + '.json'))
        nodes.append({'name': name, 'address': address, 'unreachable': None, 'probe': probe,
                      'gpu': {'gpu_count': 0, 'reason': 'no NVIDIA GPU on the PCI bus', 'gpus': []},
                      'gpu_slots': None, 'versions': dict(probe['versions']), 'xid': probe['xid'],
                      'listen': meta.get('listen') if name == meta['nodes'][0][0] else None})
    return nodes, meta


def by(records, node, check):
    found = [r for r in records if r['node'] == node and r['check'] == check]
    assert len(found) == 1, (node, check, found)
    return found[0]


def test_the_healthy_lab_has_no_failure():
    nodes, meta = lab_nodes('lab-healthy')
    recs = health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    assert [r for r in recs if r['status'] == 'fail'] == []
    for n in nodes:
        assert by(recs, n['name'], 'reachable')['status'] == 'ok'
        assert by(recs, n['name'], 'version.torch')['status'] == 'ok'
        assert by(recs, n['name'], 'rendezvous_port')['status'] == 'ok'
        assert by(recs, n['name'], 'shared_storage')['status'] == 'ok'
        assert by(recs, n['name'], 'clock_offset')['status'] == 'ok'
        # no GPU anywhere: a clear "no GPU", never a failure
        gpu = by(recs, n['name'], 'gpu')
        assert gpu['status'] == 'unknown' and gpu['detail'].startswith('no GPU')


def test_a_different_torch_on_one_node_names_that_node():
    nodes, meta = lab_nodes('lab-healthy')
    odd = nodes[2]
    odd['versions']['torch'] = '2.12.0+cpu'
    recs = health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    bad = [r for r in recs if r['status'] == 'fail']
    assert [(r['node'], r['check']) for r in bad] == [(odd['name'], 'version.torch')]
    assert '--limit %s' % odd['name'] in bad[0]['remedy']
    assert bad[0]['threshold'].startswith('== %s (3 of 4 nodes)' % nodes[0]['versions']['torch'])


def test_a_tie_goes_to_the_head():
    nodes, meta = lab_nodes('lab-healthy')
    nodes = nodes[:2]
    nodes[1]['versions']['deepspeed'] = '0.18.0'
    recs = health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    assert by(recs, nodes[1]['name'], 'version.deepspeed')['status'] == 'fail'
    assert by(recs, nodes[0]['name'], 'version.deepspeed')['status'] == 'ok'


def test_a_kernel_mismatch_only_warns():
    nodes, meta = lab_nodes('lab-healthy')
    nodes[3]['versions']['kernel'] = '6.1.0-99-amd64'
    recs = health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    assert by(recs, nodes[3]['name'], 'version.kernel')['status'] == 'warn'


def test_an_unreachable_node_is_reported_and_the_others_checked():
    nodes, meta = lab_nodes('lab-healthy')
    nodes[1].update(unreachable='Failed to connect to the host via ssh: connect to host 10.213.50.11 port 22: '
                                'Connection refused', probe=None, versions={})
    recs = health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    r = by(recs, nodes[1]['name'], 'reachable')
    assert r['status'] == 'fail' and 'Connection refused' in r['detail'] and 'sshd' in r['remedy']
    assert [x for x in recs if x['node'] == nodes[1]['name']] == [r]
    assert by(recs, nodes[2]['name'], 'shared_storage')['status'] == 'ok'


@pytest.mark.parametrize('scenario, check, remedy', [
    ('lab-fault-port', 'rendezvous_port', 'to port 29500 on the head'),
    ('lab-fault-shared', 'shared_storage', 'remount /shared read-write'),
    ('lab-fault-hosts', 'name_resolution', 'correct /etc/hosts'),
    ('lab-fault-nccl-iface', 'nccl_interface', 'nccl_env --limit'),
    ('lab-fault-clock', 'clock_offset', 'synchronise the clock'),
])
def test_recorded_faults_name_the_node(scenario, check, remedy):
    nodes, meta = lab_nodes(scenario)
    recs = health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    bad = [r for r in recs if r['status'] == 'fail']
    assert [(r['node'], r['check']) for r in bad] == [(meta['fault_node'], check)], bad
    assert remedy in bad[0]['remedy']


def test_a_port_held_on_the_head_warns_naming_the_process():
    nodes, meta = lab_nodes('lab-healthy')
    nodes[0]['listen'] = {'port': 29500, 'in_use': True, 'listener_pid': None,
                          'holders': [{'pid': 4242, 'cmdline': '/opt/gpucluster/env/bin/python -m torch.distributed.run'}]}
    recs = health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    r = by(recs, nodes[0]['name'], 'port_free')
    assert r['status'] == 'warn' and 'pid 4242' in r['detail'] and 'training_state=stopped' in r['remedy']


def test_disk_thresholds():
    nodes, meta = lab_nodes('lab-healthy')
    nodes[1]['probe']['disks'][0]['free_pct'] = 3.2
    nodes[2]['probe']['disks'][0]['inodes_free_pct'] = 12.0
    recs = health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    assert by(recs, nodes[1]['name'], 'disk_free')['status'] == 'fail'
    assert by(recs, nodes[1]['name'], 'disk_free')['value'] == 3.2
    assert by(recs, nodes[2]['name'], 'inodes_free')['status'] == 'warn'
    looser = health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'],
                                   {'disk_free_fail_pct': 2, 'disk_free_warn_pct': 4})
    assert by(looser, nodes[1]['name'], 'disk_free')['status'] == 'warn'


# ------------------------------------------------------------------ GPUs (real nvidia-smi output)

def h100_facts():
    gpus = nvidia_smi.gpus_from_rows(nvidia_smi.parse_query_csv(
        read('nvidia_smi', 'h100-sxm-x1-driver580', 'query-gpu.csv')))
    return {'gpu_count': len(gpus), 'pci_gpu_count': len(gpus), 'reason': '',
            'driver_version': '580.159.04', 'cuda_version': '13.0', 'gpus': gpus}


def gpu_record(gpu, any_gpus=True, slots=None, xid=None, **thr):
    t = dict(health.DEFAULT_THRESHOLDS, **thr)
    return health.check_gpu({'name': 'gpu-1', 'gpu': gpu, 'gpu_slots': slots, 'xid': xid}, any_gpus, t)


def test_a_healthy_h100_is_ok():
    r = gpu_record(h100_facts())
    assert r['status'] == 'ok' and r['value'] == 1


def test_gpu_findings():
    # the recorded H100, changed field by field as a failing GPU would report it
    g = h100_facts()
    g['gpus'][0]['ecc_errors_uncorrected_volatile'] = 2
    assert gpu_record(g)['status'] == 'fail'
    g = h100_facts()
    g['gpus'][0]['remapped_rows_pending'] = True
    assert gpu_record(g)['status'] == 'warn'
    g = h100_facts()
    g['gpus'][0]['clock_event_reasons'] = ['hw_thermal_slowdown']
    r = gpu_record(g)
    assert r['status'] == 'warn' and 'hw_thermal_slowdown' in r['detail']
    g = h100_facts()
    g['gpus'][0]['persistence_mode'] = 'Disabled'
    assert 'nvidia-persistenced' in gpu_record(g)['remedy']
    assert gpu_record(g, persistence_mode_required=False)['status'] == 'ok'
    assert gpu_record(h100_facts(), slots=8)['status'] == 'fail'
    g = h100_facts()
    g['pci_gpu_count'] = 2
    assert 'PCI bus' in gpu_record(g)['detail']


def test_xid_in_the_kernel_log():
    xids = health.parse_xid_lines(read('health', 'xid_gpu_operator_1146.log'))
    r = gpu_record(h100_facts(), xid=xids)
    assert r['status'] == 'fail' and 'Xid 48,64' in r['detail']
    xids = health.parse_xid_lines(read('health', 'xid_gpud_46.log'))
    assert gpu_record(h100_facts(), xid=xids)['status'] == 'warn'  # 13 and 109 are not in the fail list


@pytest.mark.parametrize('expect, any_gpus, status', [
    ('auto', False, 'unknown'), ('auto', True, 'fail'), ('required', False, 'fail'), ('optional', True, 'unknown')])
def test_a_node_without_gpus(expect, any_gpus, status):
    no_gpu = {'gpu_count': 0, 'reason': 'no NVIDIA GPU on the PCI bus', 'gpus': []}
    assert gpu_record(no_gpu, any_gpus=any_gpus, expect_gpus=expect)['status'] == status


# ------------------------------------------------------------------ deep tier

def test_bandwidth_culprit_from_the_cluster_tests_report():
    rep = {'node_summary': {'a': {'links': 6, 'median': 20.1}, 'b': {'links': 6, 'median': 19.7},
                            'c': {'links': 6, 'median': 0.49}},
           'slow_links': [{'a': 'c', 'b': 'a', 'gbps': 0.49, 'reason': 'slow'},
                          {'a': 'c', 'b': 'b', 'gbps': 0.48, 'reason': 'slow'}],
           'culprits': ['c'], 'median_gbps': 19.9, 'threshold_gbps': 9.95}
    recs = health.evaluate_deep(['a', 'b', 'c'], bandwidth=rep, tests=['bandwidth'])
    # a and b are slow only towards c, the node on every flagged link: c is named, a and b pass
    assert [(r['node'], r['status']) for r in recs] == [('a', 'ok'), ('b', 'ok'), ('c', 'fail')]
    assert 'check the NIC of c' in recs[2]['remedy']
    assert recs[0]['detail'].startswith('its flagged link(s) end at the slow node c')


def test_a_slow_link_without_a_culprit_warns_both_ends():
    rep = {'node_summary': {'a': {'links': 2, 'median': 20.1}, 'b': {'links': 2, 'median': 12.0},
                            'c': {'links': 2, 'median': 12.0}},
           'slow_links': [{'a': 'b', 'b': 'c', 'gbps': 3.9, 'reason': 'slow'}],
           'culprits': [], 'median_gbps': 19.9, 'threshold_gbps': 9.95}
    recs = health.evaluate_deep(['a', 'b', 'c'], bandwidth=rep, tests=['bandwidth'])
    assert [(r['node'], r['status']) for r in recs] == [('a', 'ok'), ('b', 'warn'), ('c', 'warn')]


def test_a_deep_test_that_did_not_finish_fails_every_node():
    recs = health.evaluate_deep(['a', 'b'], errors={'smoke': 'host b: did not answer'}, tests=['smoke'])
    assert [r['status'] for r in recs] == ['fail', 'fail'] and 'did not answer' in recs[0]['detail']


def test_smoke_names_the_node_that_did_not_join():
    rep = {'ok': False, 'missing': ['b'], 'problems': [{'node': 'b', 'stage': 'rendezvous', 'cause': 'timed out',
                                                         'error': None}]}
    recs = health.evaluate_deep(['a', 'b'], smoke=rep, tests=['smoke'])
    assert [(r['node'], r['status']) for r in recs] == [('a', 'ok'), ('b', 'fail')]


# ------------------------------------------------------------------ report formats

def sample_records():
    nodes, meta = lab_nodes('lab-healthy')
    nodes[2]['versions']['torch'] = '2.12.0+cpu'
    return health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])


def test_summary_lists_failures_with_their_remedy():
    lines = health.summary_lines(sample_records(), ['lab-worker-2 version.torch: ok -> fail (2.13.0+cpu -> 2.12.0+cpu)'])
    assert lines[0].startswith('health: 4 node(s)')
    assert any(l.startswith('FAIL lab-worker-2 version.torch: torch 2.12.0+cpu here') for l in lines)
    assert any(l.strip().startswith('remedy: reinstall the environment on lab-worker-2') for l in lines)
    assert lines[-1].startswith('  lab-worker-2 version.torch')


def test_junit_is_valid_xml_with_one_failure():
    recs = sample_records()
    root = ET.fromstring(health.junit_xml(recs, 'quick', '2026-11-23T05:00:00+00:00'))
    assert root.tag == 'testsuites' and int(root.get('failures')) == 1
    assert int(root.get('tests')) == len(recs)
    failing = [tc for tc in root.iter('testcase') if tc.find('failure') is not None]
    assert [(tc.get('classname'), tc.get('name')) for tc in failing] == [('quick.lab-worker-2', 'version.torch')]
    assert 'reinstall' in failing[0].find('failure').get('message')
    skipped = [tc for tc in root.iter('testcase') if tc.find('skipped') is not None]
    assert skipped  # the GPU checks on a lab without GPUs


def test_prometheus_textfile_format():
    recs = sample_records()
    text = health.prometheus_text(recs, 'quick', 1795408461.5)
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


def test_label_values_are_escaped():
    rec = health.record('n"1\\', 'c\nx', 'ok')
    assert 'node="n\\"1\\\\",check="c\\nx"' in health.prometheus_text([rec], 'quick', 0)


def _collective(below=()):
    """A collective_summary as the cluster_tests role hands it to the deep tier."""
    from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_test_reports as ct
    rows = ct.allreduce_rows([{'size': 65536, 'count': 16384, 'time_us': 800.0, 'wrong': 0},
                              {'size': 1 << 20, 'count': 1 << 18, 'time_us': 5000.0, 'wrong': 0}], 3)
    head = {'reporter': True, 'method': 'torch', 'algorithm': 'torch.distributed all_reduce (gloo)', 'backend': 'gloo',
            'world_size': 3, 'nnodes': 3, 'rows': rows, 'correct': True, 'avg_busbw_gbs': 0.1,
            'max_busbw_gbs': rows[-1]['busbw_gbs'], 'below_threshold': list(below), 'ok': not below}
    return ct.collective_summary({'a': head, 'b': {'reporter': False, 'ok': True}}, ['a', 'b'])


def test_collective_records_carry_the_busbw_of_the_largest_size():
    rep = _collective()
    recs = health.evaluate_deep(['a', 'b'], collective=rep, tests=['collective'])
    assert [r['status'] for r in recs] == ['ok', 'ok']
    assert recs[0]['value'] == rep['rows'][-1]['busbw_gbs'] and recs[0]['value'] > 0
    assert 'at 1048576 bytes' in recs[0]['detail'] and 'values correct' in recs[0]['detail']
    slow = health.evaluate_deep(['a', 'b'], collective=_collective(
        [{'size': 1 << 20, 'busbw_gbs': 0.28, 'threshold_gbs': 1.0}]), tests=['collective'])
    assert [r['status'] for r in slow] == ['fail', 'fail']
    assert slow[0]['detail'] == 'size 1M: busbw 0.2800 GB/s is under its threshold 1.0000 GB/s'
    # a collective bandwidth that fell by more than the drop percent is listed as a change
    before, after = {'records': recs}, {'records': [dict(r, value=r['value'] / 3) for r in recs]}
    assert [c.split(':')[0] for c in health.changes_since(before, after)] == ['a collective', 'b collective']


def test_changes_since_the_last_run():
    before = health.make_report(health.evaluate_quick(*lab_args()), 'quick', 't0', 't1')
    nodes, meta = lab_nodes('lab-healthy')
    nodes[2]['versions']['torch'] = '2.12.0+cpu'
    nodes[0]['versions']['kernel'] = '6.1.0-99-amd64'
    after = health.make_report(health.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token']),
                               'quick', 't2', 't3')
    changes = health.changes_since(before, after)
    assert any(c.startswith('lab-worker-2 version.torch: ok -> fail') for c in changes)
    assert health.changes_since(None, after) == []
    assert health.changes_since(after, copy.deepcopy(after)) == []


def test_a_slower_node_is_a_change():
    rep = lambda v: {'records': [health.record('b', 'bandwidth', 'ok', v, 'x')]}  # noqa: E731
    assert health.changes_since(rep(20.0), rep(19.0)) == []
    assert health.changes_since(rep(20.0), rep(9.0)) == ['b bandwidth: 20 -> 9 (-55%, became slow)']


def lab_args():
    nodes, meta = lab_nodes('lab-healthy')
    return nodes, nodes[0]['name'], meta['port'], meta['token']


def test_every_recorded_scenario_has_its_nodes():
    for d in glob.glob(os.path.join(HEALTH, 'lab-*')):
        meta = json.loads(open(os.path.join(d, 'nodes.json')).read())
        for name, _ in meta['nodes']:
            assert os.path.exists(os.path.join(d, name + '.json'))
