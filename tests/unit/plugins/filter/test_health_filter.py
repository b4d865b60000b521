"""The health filters turn the registered results of every node into records."""

from __future__ import annotations

import json
import os
import re

import pytest

from ansible_collections.gpucluster.multinode.plugins.filter import health as hf
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_page, health_reports

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'health', 'lab-healthy')


def load(name):
    with open(os.path.join(FIX, name)) as f:
        return json.load(f)


def lab():
    meta = load('nodes.json')
    names = [n for n, _ in meta['nodes']]
    groups = {'cluster': names, 'head': names[:1], 'workers': names[1:]}
    hostvars, probes = {}, {}
    for name, address in meta['nodes']:
        hostvars[name] = {'ansible_host': address, 'cluster_master_port': meta['port']}
        probes[name] = dict(load(name + '.json'), gpu={
            'gpu_count': 0, 'reason': 'no NVIDIA GPU on the PCI bus', 'gpus': []})
    return groups, hostvars, probes, {'listen': meta['listen']}, meta


def quick(groups, hostvars, probes, prepare, meta):
    return hf.health_quick_records(groups, hostvars, probes, prepare, None, meta['token'], {})


def test_records_of_the_recorded_lab():
    groups, hostvars, probes, prepare, meta = lab()
    recs = quick(groups, hostvars, probes, prepare, meta)
    assert not [r for r in recs if r['status'] == 'fail']
    assert {r['node'] for r in recs} == set(groups['cluster'])


def test_an_unreachable_worker_and_a_failed_probe():
    groups, hostvars, probes, prepare, meta = lab()
    w1, w2 = groups['workers'][0], groups['workers'][1]
    probes[w1] = {'unreachable': True, 'changed': False,
                  'msg': 'Failed to connect to the host via ssh: ssh: connect to host '
                  '10.213.50.11 port 22: Connection refused'}
    probes[w2] = {'failed': False, 'failed_when_result': False, 'changed': False,
                  'msg': 'MODULE FAILURE: /usr/bin/python3: not found'}
    recs = quick(groups, hostvars, probes, prepare, meta)
    bad = sorted((r['node'], r['check']) for r in recs if r['status'] == 'fail')
    assert bad == [(w1, 'reachable'), (w2, 'probe')]
    assert 'Connection refused' in [r for r in recs if r['node'] == w1][0]['detail']


def test_gpu_checks_switched_off_leave_no_gpu_record():
    groups, hostvars, probes, prepare, meta = lab()
    for probe in probes.values():
        del probe['gpu']   # the probe ran with gpus: false
    recs = quick(groups, hostvars, probes, prepare, meta)
    assert 'gpu' not in {r['check'] for r in recs}


def test_gpus_read_by_the_probe_are_judged():
    """The probe reads the GPUs in the same round trip (option gpus); no gpu_facts result needed."""
    groups, hostvars, probes, prepare, meta = lab()
    head = groups['head'][0]
    for name in probes:
        probes[name] = dict(probes[name], gpu={'gpu_count': 0, 'gpus': [], 'pci_gpu_count': 0,
                                               'reason': 'no NVIDIA GPU on the PCI bus'})
    probes[head]['gpu'] = {
        'gpu_count': 0, 'gpus': [], 'pci_gpu_count': 2,
        'reason': 'nvidia-smi not found: no NVIDIA driver is installed (2 NVIDIA GPU(s) on the PCI bus)'}
    recs = quick(groups, hostvars, probes, prepare, meta)
    gpu = dict((r['node'], r) for r in recs if r['check'] == 'gpu')
    assert set(gpu) == set(groups['cluster'])
    assert gpu[head]['status'] == 'fail' and 'no NVIDIA driver' in gpu[head]['detail']
    # the workers declare no GPU and show none: their GPU check does not apply
    assert {gpu[w]['status'] for w in groups['workers']} == {'n/a'}


def test_a_probe_past_its_task_timeout_names_the_node_and_the_others_are_checked():
    """A frozen node: its probe task ran past `timeout:` (Ansible's own result), the rest answered."""
    groups, hostvars, probes, prepare, meta = lab()
    frozen = groups['workers'][1]
    # as ansible-core 2.19 registers it (recorded on the lab with the node paused)
    probes[frozen] = {'failed': True, 'changed': False, 'msg': 'Task failed: Timed out after 60 second(s).',
                      'timedout': {'frame': 'Configure `DISPLAY_TRACEBACK` to see a traceback on timeout errors.',
                                   'period': 60}}
    recs = quick(groups, hostvars, probes, prepare, meta)
    bad = [r for r in recs if r['status'] == 'fail']
    assert [(r['node'], r['check']) for r in bad] == [(frozen, 'reachable')]
    assert bad[0]['value'] == 'timeout'
    assert bad[0]['detail'] == ('timeout: the node did not finish its probe within 60 s (health_probe_timeout): '
                                'frozen or hung')
    probes[frozen] = {'failed': True, 'msg': 'Task failed: Timed out after 30 second(s).'}
    recs = quick(groups, hostvars, probes, prepare, meta)
    assert [r['detail'] for r in recs if r['status'] == 'fail'] == [
        'timeout: Task failed: Timed out after 30 second(s).']
    others = [r for r in recs if r['node'] != frozen and r['check'] == 'shared_storage']
    assert len(others) == 3 and {r['status'] for r in others} == {'ok'}


def test_a_hung_mount_is_a_timeout_naming_node_and_path():
    groups, hostvars, probes, prepare, meta = lab()
    w1 = groups['workers'][0]
    why = 'no answer from /shared on %s within 15.0 s (a hung mount?)' % w1
    probes[w1]['shared'] = {'path': '/shared', 'exists': None, 'must_be_mount': True, 'timeout': True, 'mounted': None,
                            'fstype': None, 'writable': False, 'write_error': why, 'token_read': None}
    probes[w1]['clock'] = {'offset_s': None, 'reference': 'shared storage /shared', 'error': why}
    probes[w1]['disks'] = [d for d in probes[w1]['disks'] if d['path'] != '/shared'] + [
        {'path': '/shared', 'free_pct': None, 'inodes_free_pct': None, 'free_bytes': None, 'timeout': True,
         'error': why}]
    recs = quick(groups, hostvars, probes, prepare, meta)
    bad = dict((r['check'], r) for r in recs if r['status'] == 'fail')
    assert sorted(bad) == ['disk_free', 'inodes_free', 'shared_storage']
    assert {r['node'] for r in bad.values()} == {w1}
    assert bad['shared_storage']['value'] == 'timeout' and why in bad['shared_storage']['detail']
    assert bad['disk_free']['value'] == 'timeout' and '/shared' in bad['disk_free']['detail']


def test_two_ranks_on_a_node_without_gpus_is_not_a_gpu_fault():
    """node_slots (ranks the launchers start) is not a GPU count: a CPU lab's head with
    node_slots 2 and no gpu_slots stays clean; gpu_slots 2 without GPUs fails."""
    groups, hostvars, probes, prepare, meta = lab()
    head = groups['head'][0]
    hostvars[head]['node_slots'] = 2
    recs = quick(groups, hostvars, probes, prepare, meta)
    assert not [r for r in recs if r['status'] == 'fail']
    assert [r['status'] for r in recs if r['node'] == head and r['check'] == 'gpu'] == ['n/a']
    hostvars[head]['gpu_slots'] = 2
    recs = quick(groups, hostvars, probes, prepare, meta)
    assert [(r['node'], r['check']) for r in recs if r['status'] == 'fail'] == [(head, 'gpu')]


# What the probe reads on a node without nvidia-smi (nvidia_smi.read_gpu_facts' reasons).
NO_SMI = {'gpu_count': 0, 'gpus': [], 'pci_gpu_count': 0, 'reason': 'no NVIDIA GPU on the PCI bus and no nvidia-smi'}


def cpu_cluster(gpu_slots):
    """The recorded lab declared as a CPU cluster: 2 ranks on every node, gpu_slots as given (None: not set),
    and the probe's GPU read as on a node without nvidia-smi."""
    groups, hostvars, probes, prepare, meta = lab()
    for name in hostvars:
        hostvars[name]['node_slots'] = 2
        if gpu_slots is not None:
            hostvars[name]['gpu_slots'] = gpu_slots
        probes[name]['gpu'] = dict(NO_SMI)
    return groups, hostvars, probes, prepare, meta


def overall(recs):
    """The status the summary prints and the page's badge shows."""
    line = hf.health_summary(recs)[0]
    report = health_reports.make_report(recs, 'quick', '2026-11-25T05:00:00+00:00', '2026-11-25T05:00:41+00:00')
    badge = re.search(r'<span class="badge (\w+)">(\w+)</span>', health_page.render(report)).groups()
    return line.rsplit('; status ', 1)[1], badge


@pytest.mark.parametrize('gpu_slots, why', [
    (0, 'no GPU declared on this node (gpu_slots 0)'),
    (None, 'no GPU declared on this node (gpu_slots not set)')])
def test_a_cpu_cluster_is_ok_with_its_gpu_checks_n_a_and_why(gpu_slots, why):
    """A cluster that declares ranks and no GPU is fine for what it declares: ok, not unknown."""
    recs = quick(*cpu_cluster(gpu_slots))
    assert overall(recs) == ('OK', ('ok', 'OK'))
    assert {r['status'] for r in recs} == {'ok', 'n/a'}
    na = sorted({r['check'] for r in recs if r['status'] == 'n/a'})
    assert na == ['gpu', 'version.cuda', 'version.driver', 'version.nccl_wheel', 'version.torch_cuda']
    gpu = [r for r in recs if r['check'] == 'gpu']
    assert {r['detail'] for r in gpu} == {why + '; no NVIDIA GPU on the PCI bus and no nvidia-smi'}
    summary = hf.health_summary(recs)
    assert 'n/a (does not apply): gpu on every node: %s; no NVIDIA GPU on the PCI bus and no nvidia-smi' % why in summary
    assert not [line for line in summary if line.startswith('unknown')]


@pytest.mark.parametrize('reason, pci', [
    ('no NVIDIA GPU on the PCI bus and no nvidia-smi', 0),
    ('nvidia-smi not found: no NVIDIA driver is installed (2 NVIDIA GPU(s) on the PCI bus)', 2),
    ('nvidia-smi failed (rc 9): NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver', 2)])
def test_a_node_that_declares_gpus_it_cannot_show_is_still_not_ok(reason, pci):
    groups, hostvars, probes, prepare, meta = cpu_cluster(0)
    worker = groups['workers'][0]
    hostvars[worker]['gpu_slots'] = 2
    probes[worker]['gpu'] = {'gpu_count': 0, 'gpus': [], 'pci_gpu_count': pci, 'reason': reason}
    recs = quick(groups, hostvars, probes, prepare, meta)
    assert overall(recs) == ('FAIL', ('fail', 'FAIL'))
    mine = dict((r['check'], r) for r in recs if r['node'] == worker)
    assert mine['gpu']['status'] == 'fail' and reason in mine['gpu']['detail']
    assert mine['version.driver']['status'] == 'unknown'
    assert 'site.yml --tags nvidia_driver --limit %s' % worker in mine['version.driver']['remedy']
    # the other nodes still declare none
    assert {r['status'] for r in recs if r['node'] != worker and r['check'] == 'gpu'} == {'n/a'}


def test_results_come_as_arguments_not_from_register_names():
    groups, hostvars, probes, prepare, meta = lab()
    for name in hostvars:   # a register of the old name is not read
        hostvars[name]['__health_probe'] = {'unreachable': True, 'msg': 'stale'}
    assert not [r for r in quick(groups, hostvars, probes, prepare, meta) if r['status'] == 'fail']
    import pytest
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match='probes must be'):
        hf.health_nodes(groups, hostvars, None)


def test_summary_and_failed():
    groups, hostvars, probes, prepare, meta = lab()
    recs = quick(groups, hostvars, probes, prepare, meta)
    assert hf.health_summary(recs)[0].startswith('health: 4 node(s)')
    assert hf.health_failed(recs) == []


def test_the_slurm_line_of_the_summary():
    assert hf.health_slurm_lines({'skipped': True}) == []
    done = {'drained': {'n3': 'gpucluster-health: gpu'}, 'resumed': [], 'kept': ['n4'], 'foreign': ['n1'],
            'not_in_slurm': [], 'held': ''}
    assert hf.health_slurm_lines(done) == [
        'slurm: drained n3; resumed none; still drained n4; drained by someone else, left alone: n1']
    assert hf.health_slurm_lines(dict(done, drained={}, held='3 of 4 node(s) failed'), True) == [
        'slurm (check mode, nothing changed): 3 of 4 node(s) failed']


def test_failing_nodes_and_their_checks_for_a_drain_reason():
    recs = [{'node': 'a', 'check': 'gpu', 'status': 'fail'}, {'node': 'a', 'check': 'mtu', 'status': 'warn'},
            {'node': 'a', 'check': 'gpu', 'status': 'fail'}, {'node': 'b', 'check': 'disk_free', 'status': 'ok'}]
    assert hf.health_failing(recs) == {'a': 'gpu'}
    assert hf.health_failing(recs, True) == {'a': 'gpu, mtu'}
    long = [{'node': 'a', 'check': 'check_%02d' % i, 'status': 'fail'} for i in range(30)]
    assert len(hf.health_failing(long)['a']) <= 120 and hf.health_failing(long)['a'].endswith('...')


def test_a_failed_first_probe_on_the_head_is_the_head_s_probe_error():
    groups, hostvars, probes, prepare, meta = lab()
    head = groups['head'][0]
    probes[head] = {'skipped': True, 'changed': False}
    prepare = {'failed': True, 'msg': 'MODULE FAILURE: /usr/bin/python3: not found'}
    recs = quick(groups, hostvars, probes, prepare, meta)
    bad = [(r['node'], r['check'], r['detail']) for r in recs if r['status'] == 'fail']
    assert bad == [(head, 'probe', 'MODULE FAILURE: /usr/bin/python3: not found')]
