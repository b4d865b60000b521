"""The health checks: the quick tier on recorded lab probes, GPUs on real nvidia-smi output, the deep tier."""

from __future__ import annotations

import glob
import json
import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import health_checks
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_parsers
from ansible_collections.gpucluster.multinode.plugins.module_utils import nvidia_smi

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures')
HEALTH = os.path.join(FIX, 'health')


def read(*parts):
    with open(os.path.join(FIX, *parts)) as f:
        return f.read()


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
    recs = health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    assert [r for r in recs if r['status'] == 'fail'] == []
    for n in nodes:
        assert by(recs, n['name'], 'reachable')['status'] == 'ok'
        assert by(recs, n['name'], 'version.torch')['status'] == 'ok'
        assert by(recs, n['name'], 'rendezvous_port')['status'] == 'ok'
        assert by(recs, n['name'], 'shared_storage')['status'] == 'ok'
        assert by(recs, n['name'], 'clock_offset')['status'] == 'ok'
        # no GPU declared and none anywhere: the GPU checks do not apply, and say why
        gpu = by(recs, n['name'], 'gpu')
        assert gpu['status'] == 'n/a'
        assert gpu['detail'] == 'no GPU declared on this node (gpu_slots not set); no NVIDIA GPU on the PCI bus'
        assert by(recs, n['name'], 'version.driver')['status'] == 'n/a'
    assert {r['status'] for r in recs} == {'ok', 'n/a'}


def test_a_different_torch_on_one_node_names_that_node():
    nodes, meta = lab_nodes('lab-healthy')
    odd = nodes[2]
    odd['versions']['torch'] = '2.12.0+cpu'
    recs = health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    bad = [r for r in recs if r['status'] == 'fail']
    assert [(r['node'], r['check']) for r in bad] == [(odd['name'], 'version.torch')]
    assert '--limit %s' % odd['name'] in bad[0]['remedy']
    assert bad[0]['threshold'].startswith('== %s (3 of 4 nodes)' % nodes[0]['versions']['torch'])


def test_a_tie_goes_to_the_head():
    nodes, meta = lab_nodes('lab-healthy')
    nodes = nodes[:2]
    nodes[1]['versions']['deepspeed'] = '0.18.0'
    recs = health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    assert by(recs, nodes[1]['name'], 'version.deepspeed')['status'] == 'fail'
    assert by(recs, nodes[0]['name'], 'version.deepspeed')['status'] == 'ok'


def test_a_kernel_mismatch_only_warns():
    nodes, meta = lab_nodes('lab-healthy')
    nodes[3]['versions']['kernel'] = '6.1.0-99-amd64'
    recs = health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    assert by(recs, nodes[3]['name'], 'version.kernel')['status'] == 'warn'


def test_an_unreachable_node_is_reported_and_the_others_checked():
    nodes, meta = lab_nodes('lab-healthy')
    nodes[1].update(unreachable='Failed to connect to the host via ssh: connect to host 10.213.50.11 port 22: '
                                'Connection refused', probe=None, versions={})
    recs = health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
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
    recs = health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    bad = [r for r in recs if r['status'] == 'fail']
    assert [(r['node'], r['check']) for r in bad] == [(meta['fault_node'], check)], bad
    assert remedy in bad[0]['remedy']


def test_a_port_held_on_the_head_warns_naming_the_process():
    nodes, meta = lab_nodes('lab-healthy')
    nodes[0]['listen'] = {'port': 29500, 'in_use': True, 'listener_pid': None,
                          'holders': [{'pid': 4242, 'cmdline': '/opt/gpucluster/env/bin/python -m torch.distributed.run'}]}
    recs = health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    r = by(recs, nodes[0]['name'], 'port_free')
    assert r['status'] == 'warn' and 'pid 4242' in r['detail'] and 'training_state=stopped' in r['remedy']


def test_disk_thresholds():
    nodes, meta = lab_nodes('lab-healthy')
    nodes[1]['probe']['disks'][0]['free_pct'] = 3.2
    nodes[2]['probe']['disks'][0]['inodes_free_pct'] = 12.0
    recs = health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'])
    assert by(recs, nodes[1]['name'], 'disk_free')['status'] == 'fail'
    assert by(recs, nodes[1]['name'], 'disk_free')['value'] == 3.2
    assert by(recs, nodes[2]['name'], 'inodes_free')['status'] == 'warn'
    looser = health_checks.evaluate_quick(nodes, nodes[0]['name'], meta['port'], meta['token'],
                                          {'disk_free_fail_pct': 2, 'disk_free_warn_pct': 4})
    assert by(looser, nodes[1]['name'], 'disk_free')['status'] == 'warn'


# ------------------------------------------------------------------ GPUs (real nvidia-smi output)

def h100_facts():
    gpus = nvidia_smi.gpus_from_rows(nvidia_smi.parse_query_csv(
        read('nvidia_smi', 'h100-sxm-x1-driver580', 'query-gpu.csv')))
    return {'gpu_count': len(gpus), 'pci_gpu_count': len(gpus), 'reason': '',
            'driver_version': '580.159.04', 'cuda_version': '13.0', 'gpus': gpus}


def gpu_record(gpu, any_gpus=True, slots=None, xid=None, **thr):
    t = dict(health_checks.DEFAULT_THRESHOLDS, **thr)
    return health_checks.check_gpu({'name': 'gpu-1', 'gpu': gpu, 'gpu_slots': slots, 'xid': xid}, any_gpus, t)


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
    xids = health_parsers.parse_xid_lines(read('health', 'xid_gpu_operator_1146.log'))
    r = gpu_record(h100_facts(), xid=xids)
    assert r['status'] == 'fail' and 'Xid 48,64' in r['detail']
    xids = health_parsers.parse_xid_lines(read('health', 'xid_gpud_46.log'))
    assert gpu_record(h100_facts(), xid=xids)['status'] == 'warn'  # 13 and 109 are not in the fail list


@pytest.mark.parametrize('expect, any_gpus, slots, status', [
    ('auto', False, None, 'n/a'), ('auto', True, None, 'fail'), ('auto', True, 0, 'n/a'), ('auto', False, 2, 'fail'),
    ('required', False, None, 'fail'), ('required', False, 0, 'fail'),
    ('optional', True, None, 'n/a'), ('optional', False, 2, 'fail')])
def test_a_node_without_gpus(expect, any_gpus, slots, status):
    """n/a only where the node declares no GPU (gpu_slots 0, or none where no node has one); a node
    that declares GPUs and shows none fails."""
    no_gpu = {'gpu_count': 0, 'reason': 'no NVIDIA GPU on the PCI bus and no nvidia-smi', 'gpus': [], 'pci_gpu_count': 0}
    r = gpu_record(no_gpu, any_gpus=any_gpus, slots=slots, expect_gpus=expect)
    assert r['status'] == status
    if status == 'n/a':
        assert r['detail'].startswith('no GPU declared on this node (gpu_slots %s)' % ('0' if slots == 0 else 'not set'))
        assert r['remedy'] == ''


def test_gpus_on_the_bus_that_the_driver_cannot_read_are_never_n_a():
    on_bus = {'gpu_count': 0, 'pci_gpu_count': 2, 'gpus': [],
              'reason': 'nvidia-smi not found: no NVIDIA driver is installed (2 NVIDIA GPU(s) on the PCI bus)'}
    assert gpu_record(on_bus, any_gpus=False, slots=0)['status'] == 'fail'
    assert gpu_record(on_bus, any_gpus=False, slots=None, expect_gpus='optional')['status'] == 'unknown'


def test_a_cpu_head_with_gpu_slots_0_beside_gpu_workers():
    """A head that declares no GPU (gpu_slots 0) in a GPU cluster: its GPU checks are n/a and the
    workers' driver and CUDA are compared among themselves; a worker without its GPU still fails."""
    nodes, meta = lab_nodes('lab-healthy')
    head = nodes[0]
    head['gpu_slots'] = 0
    for n in nodes[1:]:
        n['gpu'], n['gpu_slots'] = h100_facts(), 1
        n['versions'].update(driver='580.159.04', cuda='13.0', torch_cuda='12.8', nccl_wheel='2.27.3')
    recs = health_checks.evaluate_quick(nodes, head['name'], meta['port'], meta['token'])
    assert by(recs, head['name'], 'gpu')['status'] == 'n/a'
    assert by(recs, head['name'], 'version.driver') == {
        'node': head['name'], 'check': 'version.driver', 'status': 'n/a', 'value': None, 'threshold': None,
        'detail': 'no GPU declared on this node (gpu_slots 0)', 'remedy': ''}
    for n in nodes[1:]:
        assert by(recs, n['name'], 'version.driver')['threshold'] == '== 580.159.04 (3 of 3 nodes)'
        assert by(recs, n['name'], 'version.driver')['status'] == 'ok'
    assert not [r for r in recs if r['status'] in ('fail', 'unknown')]
    lost = nodes[2]
    lost['gpu'] = {'gpu_count': 0, 'pci_gpu_count': 0, 'gpus': [], 'reason': 'no NVIDIA GPU on the PCI bus and no nvidia-smi'}
    del lost['versions']['driver'], lost['versions']['cuda']
    recs = health_checks.evaluate_quick(nodes, head['name'], meta['port'], meta['token'])
    assert sorted(r['check'] for r in recs if r['node'] == lost['name'] and r['status'] == 'fail') == [
        'gpu', 'version.cuda', 'version.driver']


# ------------------------------------------------------------------ deep tier

def test_bandwidth_culprit_from_the_cluster_tests_report():
    rep = {'node_summary': {'a': {'links': 6, 'median': 20.1}, 'b': {'links': 6, 'median': 19.7},
                            'c': {'links': 6, 'median': 0.49}},
           'slow_links': [{'a': 'c', 'b': 'a', 'gbps': 0.49, 'reason': 'slow'},
                          {'a': 'c', 'b': 'b', 'gbps': 0.48, 'reason': 'slow'}],
           'culprits': ['c'], 'median_gbps': 19.9, 'threshold_gbps': 9.95}
    recs = health_checks.evaluate_deep(['a', 'b', 'c'], bandwidth=rep, tests=['bandwidth'])
    # a and b are slow only towards c, the node on every flagged link: c is named, a and b pass
    assert [(r['node'], r['status']) for r in recs] == [('a', 'ok'), ('b', 'ok'), ('c', 'fail')]
    assert 'check the NIC of c' in recs[2]['remedy']
    assert recs[0]['detail'].startswith('its flagged link(s) end at the slow node c')


def test_a_slow_link_without_a_culprit_warns_both_ends():
    rep = {'node_summary': {'a': {'links': 2, 'median': 20.1}, 'b': {'links': 2, 'median': 12.0},
                            'c': {'links': 2, 'median': 12.0}},
           'slow_links': [{'a': 'b', 'b': 'c', 'gbps': 3.9, 'reason': 'slow'}],
           'culprits': [], 'median_gbps': 19.9, 'threshold_gbps': 9.95}
    recs = health_checks.evaluate_deep(['a', 'b', 'c'], bandwidth=rep, tests=['bandwidth'])
    assert [(r['node'], r['status']) for r in recs] == [('a', 'ok'), ('b', 'warn'), ('c', 'warn')]


def test_a_deep_test_that_did_not_finish_fails_every_node():
    recs = health_checks.evaluate_deep(['a', 'b'], errors={'smoke': 'host b: did not answer'}, tests=['smoke'])
    assert [r['status'] for r in recs] == ['fail', 'fail'] and 'did not answer' in recs[0]['detail']


def test_smoke_names_the_node_that_did_not_join():
    rep = {'ok': False, 'missing': ['b'], 'problems': [{'node': 'b', 'stage': 'rendezvous', 'cause': 'timed out',
                                                        'error': None}]}
    recs = health_checks.evaluate_deep(['a', 'b'], smoke=rep, tests=['smoke'])
    assert [(r['node'], r['status']) for r in recs] == [('a', 'ok'), ('b', 'fail')]


def lab_args():
    nodes, meta = lab_nodes('lab-healthy')
    return nodes, nodes[0]['name'], meta['port'], meta['token']


def test_every_recorded_scenario_has_its_nodes():
    for d in glob.glob(os.path.join(HEALTH, 'lab-*')):
        meta = json.loads(open(os.path.join(d, 'nodes.json')).read())
        for name, _ in meta['nodes']:
            assert os.path.exists(os.path.join(d, name + '.json'))


# ------------------------------------------------------------------ settings

SETTINGS = {'health_disk_free_warn_pct': 15, 'health_disk_free_fail_pct': 5, 'health_inodes_free_warn_pct': 15,
            'health_inodes_free_fail_pct': 5, 'health_clock_offset_warn_s': 1.0, 'health_clock_offset_fail_s': 10.0,
            'health_ecc_uncorrected_max': 0, 'health_bandwidth_min_ratio': 0.7, 'health_change_drop_pct': 20,
            'health_slurm_drain_max_pct': 50, 'health_report_keep': 50, 'health_connect_timeout': 3,
            'health_port_listen_seconds': 120, 'health_probe_timeout': 60, 'health_storage_timeout': 15,
            'health_task_timeout': 120}


def test_the_default_settings_are_accepted():
    assert health_checks.setting_errors(SETTINGS) == []


@pytest.mark.parametrize('change, message', [
    ({'health_disk_free_fail_pct': -5}, "health_disk_free_fail_pct must be a percentage from 0 to 100 (got -5)"),
    ({'health_inodes_free_warn_pct': 150}, 'health_inodes_free_warn_pct must be a percentage from 0 to 100'),
    ({'health_disk_free_warn_pct': 3}, 'health_disk_free_warn_pct (3) must be above or equal to '
                                       'health_disk_free_fail_pct (5): a node warns before it fails'),
    ({'health_clock_offset_warn_s': 20}, 'health_clock_offset_warn_s (20) must be below or equal to '
                                         'health_clock_offset_fail_s (10.0)'),
    ({'health_clock_offset_fail_s': 0}, 'health_clock_offset_fail_s must be a positive number of seconds (got 0)'),
    ({'health_connect_timeout': 'soon'}, "health_connect_timeout must be a positive number of seconds (got soon)"),
    ({'health_report_keep': 0}, 'health_report_keep must be a whole number of at least 1'),
    ({'health_bandwidth_min_ratio': 1.5}, 'health_bandwidth_min_ratio must be a ratio above 0 and at most 1'),
    ({'health_probe_timeout': 10}, 'health_storage_timeout (15) must be below health_probe_timeout (10)'),
    ({'health_task_timeout': -1}, 'health_task_timeout must be a positive number of seconds'),
])
def test_a_bad_setting_is_named(change, message):
    errors = health_checks.setting_errors(dict(SETTINGS, **change))
    assert len(errors) == 1, errors
    assert message in errors[0]


# ----- container.image ---------------------------------------------------------------------------
def test_container_image_names_the_node_with_another_image_and_the_remedy():
    from ansible_collections.gpucluster.multinode.plugins.plugin_utils import health_checks as hc
    a, b = 'sha256:' + 'a' * 64, 'sha256:' + 'b' * 64
    recs = hc.check_container_image({'head': a, 'w1': a, 'w2': b, 'w3': '', 'w4': None}, 'head', 'train:1')
    by = {r['node']: r for r in recs}
    assert [by[n]['status'] for n in ('head', 'w1', 'w2', 'w3', 'w4')] == ['ok', 'ok', 'fail', 'fail', 'unknown']
    assert by['w2']['detail'] == 'image train:1 is %s here, %s on head, w1' % (b, a)
    assert by['w2']['remedy'] == ('load the image of head on w2: ansible-playbook playbooks/site.yml --tags container '
                                  '--limit head,w2')
    assert by['w3']['value'] == 'missing' and by['head']['threshold'] == '== %s (2 of 5 nodes)' % a


def test_container_image_without_the_heads_image_takes_the_most_common_and_none_anywhere_fails():
    from ansible_collections.gpucluster.multinode.plugins.plugin_utils import health_checks as hc
    a, b = 'sha256:' + 'a' * 64, 'sha256:' + 'b' * 64
    by = {r['node']: r for r in hc.check_container_image({'head': '', 'w1': b, 'w2': b, 'w3': a}, 'head', 'i')}
    assert by['head']['status'] == 'fail' and by['w1']['status'] == 'ok' and by['w3']['status'] == 'fail'
    assert all(r['status'] == 'fail' for r in hc.check_container_image({'head': '', 'w1': ''}, 'head', 'i'))


def test_the_controller_page_directory(tmp_path, monkeypatch):
    """health_report_page_dir: a directory, existing or to be created, is taken; a file, or a path under
    one, is refused with what to do (relative paths from the directory ansible-playbook runs in)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'reports').mkdir()
    (tmp_path / 'reports' / 'x.html').write_text('')
    assert health_checks.page_dir_error('reports') == ''
    assert health_checks.page_dir_error('reports/new/pages') == ''
    assert health_checks.page_dir_error('reports/x.html') == (
        'is a file on the controller; name a directory (it is created when missing)')
    assert health_checks.page_dir_error('reports/x.html/pages/more') == (
        'cannot be created on the controller: %s is a file; name a directory (it is created when missing)'
        % (tmp_path / 'reports' / 'x.html'))
    assert not (tmp_path / 'reports' / 'new').exists()   # only looked at
