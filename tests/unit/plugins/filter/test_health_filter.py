"""The health filters turn the registered results of every node into records."""

from __future__ import annotations

import json
import os

from ansible_collections.gpucluster.multinode.plugins.filter import health as hf

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'health', 'lab-healthy')


def load(name):
    with open(os.path.join(FIX, name)) as f:
        return json.load(f)


def lab():
    meta = load('nodes.json')
    names = [n for n, _ in meta['nodes']]
    groups = {'cluster': names, 'head': names[:1], 'workers': names[1:]}
    hostvars = {}
    for name, address in meta['nodes']:
        hostvars[name] = {'ansible_host': address, 'cluster_master_port': meta['port'],
                          '__health_probe': dict(load(name + '.json'), gpu={
                              'gpu_count': 0, 'reason': 'no NVIDIA GPU on the PCI bus', 'gpus': []})}
    hostvars[names[0]]['__health_head_prepare'] = {'listen': meta['listen']}
    return groups, hostvars, meta


def test_records_of_the_recorded_lab():
    groups, hostvars, meta = lab()
    recs = hf.health_quick_records(groups, hostvars, None, meta['token'], {})
    assert not [r for r in recs if r['status'] == 'fail']
    assert {r['node'] for r in recs} == set(groups['cluster'])


def test_an_unreachable_worker_and_a_failed_probe():
    groups, hostvars, meta = lab()
    w1, w2 = groups['workers'][0], groups['workers'][1]
    hostvars[w1]['__health_probe'] = {'unreachable': True, 'changed': False,
                                      'msg': 'Failed to connect to the host via ssh: ssh: connect to host '
                                             '10.213.50.11 port 22: Connection refused'}
    hostvars[w2]['__health_probe'] = {'failed': False, 'failed_when_result': False, 'changed': False,
                                      'msg': 'MODULE FAILURE: /usr/bin/python3: not found'}
    recs = hf.health_quick_records(groups, hostvars, None, meta['token'], {})
    bad = sorted((r['node'], r['check']) for r in recs if r['status'] == 'fail')
    assert bad == [(w1, 'reachable'), (w2, 'probe')]
    assert 'Connection refused' in [r for r in recs if r['node'] == w1][0]['detail']


def test_gpu_checks_switched_off_leave_no_gpu_record():
    groups, hostvars, meta = lab()
    for hv in hostvars.values():
        del hv['__health_probe']['gpu']   # the probe ran with gpus: false
    recs = hf.health_quick_records(groups, hostvars, None, meta['token'], {})
    assert 'gpu' not in {r['check'] for r in recs}


def test_gpus_read_by_the_probe_are_judged():
    """The probe reads the GPUs in the same round trip (option gpus); no gpu_facts result needed."""
    groups, hostvars, meta = lab()
    head = groups['head'][0]
    for hv in hostvars.values():
        hv['__health_probe'] = dict(hv['__health_probe'], gpu={'gpu_count': 0, 'gpus': [], 'pci_gpu_count': 0,
                                                               'reason': 'no NVIDIA GPU on the PCI bus'})
    hostvars[head]['__health_probe']['gpu'] = {
        'gpu_count': 0, 'gpus': [], 'pci_gpu_count': 2,
        'reason': 'nvidia-smi not found: no NVIDIA driver is installed (2 NVIDIA GPU(s) on the PCI bus)'}
    recs = hf.health_quick_records(groups, hostvars, None, meta['token'], {})
    gpu = dict((r['node'], r) for r in recs if r['check'] == 'gpu')
    assert set(gpu) == set(groups['cluster'])
    assert gpu[head]['status'] == 'fail' and 'no NVIDIA driver' in gpu[head]['detail']
    assert {gpu[w]['status'] for w in groups['workers']} == {'unknown'}


def test_summary_and_failed():
    groups, hostvars, meta = lab()
    recs = hf.health_quick_records(groups, hostvars, None, meta['token'], {})
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

