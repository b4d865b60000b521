"""Ray: the parsers on recorded outputs of ray 2.60.0, the input checks, the node specs and the
arguments of ray start."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import ray_cluster as rc
SET_AS = {'ray_port': 'cluster_ray_port', 'ray_dashboard_port': 'cluster_ray_dashboard_port',
          'ray_client_server_port': 'cluster_ray_client_server_port'}  # the filter passes plugin_utils' table

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'ray')
GIB = 1024.0 ** 3


def read(name):
    with open(os.path.join(FIX, name)) as f:
        return f.read()


# ------------------------------------------------------------------ parsers

def test_parse_size():
    assert rc.parse_size('0B') == 0
    assert rc.parse_size('16.17GiB') == pytest.approx(16.17 * GIB)
    assert rc.parse_size('6.928 GiB') == pytest.approx(6.928 * GIB)
    assert rc.parse_size(2.0) == 2.0
    with pytest.raises(ValueError):
        rc.parse_size('lots')


def test_status_of_a_single_head():
    st = rc.parse_ray_status(read('status-v-single-node.txt'))
    assert st['active'] == ['689e435fb5c2a9ad7f9c2b4d231ff691aaa58da68b273a1eca897da4']
    assert st['pending'] == [] and st['failures'] == []
    assert st['usage']['CPU'] == {'used': 0.0, 'total': 2.0}
    assert st['usage']['lab'] == {'used': 0.0, 'total': 1.0}
    assert st['usage']['memory']['total'] == pytest.approx(16.17 * GIB)
    assert 'GPU' not in st['usage']
    node = st['nodes']['689e435fb5c2a9ad7f9c2b4d231ff691aaa58da68b273a1eca897da4']
    assert node['CPU']['total'] == 2.0 and node['lab']['total'] == 1.0


def test_status_refuses_other_text():
    with pytest.raises(ValueError):
        rc.parse_ray_status('ConnectionError: Could not find any running Ray instance.\n')


def test_list_nodes_of_a_single_head():
    nodes = rc.parse_ray_nodes(read('list-nodes-single-node.json'))
    assert len(nodes) == 1
    n = nodes[0]
    assert n['node_ip'] == '192.0.2.2' and n['state'] == 'ALIVE' and n['is_head']
    assert n['resources']['CPU'] == 2.0 and n['resources']['lab'] == 1.0
    assert n['resources']['memory'] == pytest.approx(16.165 * GIB)
    assert n['labels']['zone'] == 'a'


def test_status_and_nodes_of_the_three_node_scenario():
    st = rc.parse_ray_status(read('status-v-three-nodes.txt'))
    assert len(st['active']) == 3 and st['pending'] == [] and st['failures'] == []
    assert st['usage']['CPU'] == {'used': 0.0, 'total': 5.0}
    assert st['usage']['trainer'] == {'used': 0.0, 'total': 2.0}
    assert 'GPU' not in st['usage']
    nodes = rc.parse_ray_nodes(read('list-nodes-three-nodes.json'))
    by_ip = dict((n['node_ip'], n) for n in nodes)
    assert sorted(by_ip) == ['10.236.0.10', '10.236.0.11', '10.236.0.12']
    assert all(n['state'] == 'ALIVE' for n in nodes)
    assert by_ip['10.236.0.10']['is_head'] and not by_ip['10.236.0.11']['is_head']
    assert by_ip['10.236.0.10']['resources']['trainer'] == 2.0 and by_ip['10.236.0.10']['labels']['rack'] == 'lab-a'
    assert by_ip['10.236.0.12']['resources']['CPU'] == 1.0
    specs = [rc.node_spec('mol-ray-head', '10.236.0.10', True, 2, 0, resources={'trainer': 2}),
             rc.node_spec('mol-ray-worker-1', '10.236.0.11', False, 2, 0),
             rc.node_spec('mol-ray-worker-2', '10.236.0.12', False, 1, 0)]
    assert [problems for _s, _n, problems in rc.membership(specs, nodes)] == [[], [], []]


def test_a_stopped_worker_is_dead_in_the_nodes_and_gone_from_the_status():
    st = rc.parse_ray_status(read('status-v-worker-stopped.txt'))
    assert len(st['active']) == 2 and st['usage']['CPU']['total'] == 4.0
    nodes = rc.parse_ray_nodes(read('list-nodes-worker-stopped.json'))
    specs = [rc.node_spec('mol-ray-worker-1', '10.236.0.11', False, 2, 0),
             rc.node_spec('mol-ray-worker-2', '10.236.0.12', False, 1, 0)]
    assert [(s['name'], problems) for s, _n, problems in rc.membership(specs, nodes)] == [
        ('mol-ray-worker-1', []),
        ('mol-ray-worker-2', ['in the Ray cluster but DEAD: Expected termination: received SIGTERM'])]


# ------------------------------------------------------------------ input checks

def settings(**over):
    base = {'ray_version': '2.60.0', 'ray_port': 6379, 'ray_dashboard_port': 8265,
            'ray_client_server_port': 10001, 'ray_num_cpus': 'auto', 'ray_num_gpus': 'auto',
            'gpu_slots': None, 'ray_memory': 0, 'ray_resources': {}, 'ray_labels': {}}
    base.update(over)
    return base


def errors(everywhere=None, **per_host):
    hv = {'head': settings(**(everywhere or {})), 'w1': settings(**(everywhere or {})), 'w2': settings(**(everywhere or {}))}
    for host, over in per_host.items():
        hv[host].update(over)
    return rc.input_errors(['head', 'w1', 'w2'], hv, 'head', names=SET_AS)


def test_good_settings_pass():
    assert errors() == []


def test_a_version_that_differs_names_the_host_and_the_variable():
    errs = errors(w2={'ray_version': '2.59.0'})
    assert errs == ['host w2: ray_version 2.59.0 differs from the head head (2.60.0): every node must run the same Ray']


def test_ports_out_of_range_in_the_worker_range_or_twice():
    assert errors({'ray_port': 70000}) == ['host head: cluster_ray_port must be a port number 1-65535, got 70000']
    assert errors({'ray_dashboard_port': 'http'})[0].startswith('host head: cluster_ray_dashboard_port must be a port')
    assert errors({'ray_port': 16379}) == [
        'host head: cluster_ray_port 16379 lies in the range Ray keeps for its workers (10002-19999)']
    assert errors({'ray_client_server_port': 8265}) == [
        'host head: cluster_ray_dashboard_port and cluster_ray_client_server_port are both 8265']
    assert errors(w1={'ray_port': 6380}) == [
        "host w1: cluster_ray_port 6380 differs from the head head (6379): the head's port is the one the workers join"]


def test_resources_and_labels():
    assert errors(w1={'ray_num_gpus': -1}) == ['host w1: ray_num_gpus must be auto or a whole number >= 0, got -1']
    assert errors(w1={'ray_resources': {'GPU': 2}})[0].startswith('host w1: ray_resources may not set GPU')
    assert errors(w1={'ray_resources': {'nvme': 'x'}}) == ["host w1: ray_resources.nvme must be a number >= 0, got 'x'"]
    assert errors(w1={'ray_labels': {'ray.io/node-id': 'x'}})[0].startswith('host w1: ray_labels.ray.io/node-id')
    assert errors(w1={'ray_labels': {'zone': 3}}) == ['host w1: ray_labels.zone must be text, got 3']


# ------------------------------------------------------------------ what a node brings

def test_gpus_never_claimed_on_a_cpu_node():
    assert rc.gpus_of({}, detected_gpus=0) == 0
    assert rc.gpus_of({}, detected_gpus=None) == 0
    assert rc.gpus_of({}, detected_gpus=8) == 8
    assert rc.gpus_of({'gpu_slots': 1}, detected_gpus=2) == 1       # gpu_slots wins over detection
    assert rc.gpus_of({'gpu_slots': '2'}) == 2
    assert rc.gpus_of({'ray_num_gpus': 4, 'gpu_slots': 1}) == 4     # Ray's own setting wins


def test_start_args_of_head_and_worker():
    head = rc.node_spec('h', '10.0.0.1', True, cpus=16, gpus=2, resources={'nvme': 1}, labels={'rack': 'a'})
    args = rc.start_args(head, '10.0.0.1', 6379, '10.0.0.1', 8265, 10001, object_store_memory=10 ** 9)
    assert args[:6] == ['--head', '--port=6379', '--include-dashboard=true', '--dashboard-host=10.0.0.1',
                        '--dashboard-port=8265', '--ray-client-server-port=10001']
    assert '--node-ip-address=10.0.0.1' in args and '--num-cpus=16' in args and '--num-gpus=2' in args
    assert '--resources={"nvme":1}' in args and '--labels={"rack":"a"}' in args
    assert '--object-store-memory=1000000000' in args
    assert args[-1] == '--block'
    worker = rc.node_spec('w', '10.0.0.2', False, cpus=8, gpus=0)
    args = rc.start_args(worker, '10.0.0.1', 6379, '10.0.0.1', 8265, 10001)
    assert args[0] == '--address=10.0.0.1:6379' and '--num-gpus=0' in args
    assert not [a for a in args if a.startswith(('--head', '--dashboard', '--resources', '--memory'))]


# ------------------------------------------------------------------ membership

def listed(ip, state='ALIVE', **res):
    resources = {'CPU': 2.0, 'memory': 3 * GIB, 'object_store_memory': GIB, 'node:' + ip: 1.0}
    resources.update(res)
    return {'node_id': ip, 'node_ip': ip, 'state': state, 'is_head': False, 'resources': resources,
            'labels': {}, 'state_message': 'unexpected termination' if state == 'DEAD' else None}


def test_membership_names_absent_dead_and_wrong_nodes():
    specs = [rc.node_spec('h', '10.0.0.1', True, 2, 0), rc.node_spec('w1', '10.0.0.2', False, 2, 0),
             rc.node_spec('w2', '10.0.0.3', False, 2, 0), rc.node_spec('w3', '10.0.0.4', False, 2, 1)]
    nodes = [listed('10.0.0.1'), listed('10.0.0.3', 'DEAD'), listed('10.0.0.4', GPU=0.0, extra=1.0)]
    got = [(s['name'], problems) for s, _n, problems in rc.membership(specs, nodes)]
    assert got == [('h', []), ('w1', ['not in the Ray cluster']),
                   ('w2', ['in the Ray cluster but DEAD: unexpected termination']),
                   ('w3', ['GPU 0, should be 1', 'extra 1, should be absent'])]


def test_membership_prefers_the_alive_entry_of_a_node_that_rejoined():
    specs = [rc.node_spec('w1', '10.0.0.2', False, 2, 0)]
    nodes = [listed('10.0.0.2', 'DEAD'), listed('10.0.0.2')]
    assert rc.membership(specs, nodes)[0][2] == []


def test_memory_and_labels_compared_when_asked():
    spec = rc.node_spec('w1', '10.0.0.2', False, 2, 0, memory=int(4 * GIB), labels={'rack': 'b'})
    problems = rc.compare_node(spec, listed('10.0.0.2'))
    assert problems == ['memory %d bytes, should be %d' % (3 * GIB, 4 * GIB), 'label rack=None, should be b']


# ------------------------------------------------------------------ the service's cgroup

def test_cgroup_pids_reads_the_unit_and_its_subgroups(tmp_path):
    unit = tmp_path / 'unified' / 'system.slice' / 'gpucluster-ray.service'
    (unit / 'sub').mkdir(parents=True)
    (unit / 'cgroup.procs').write_text('12\n40\n')
    (unit / 'sub' / 'cgroup.procs').write_text('41\n')
    roots = (str(tmp_path / 'v2'), str(tmp_path / 'unified'))
    assert rc.cgroup_pids('/system.slice/gpucluster-ray.service', roots) == [12, 40, 41]
    assert rc.cgroup_pids('/system.slice/other.service', roots) == []
    assert rc.cgroup_pids('', roots) == []


def test_systemctl_show():
    props = rc.parse_systemctl_show('ActiveState=failed\nSubState=failed\nControlGroup=\nMainPID=0\n')
    assert props == {'ActiveState': 'failed', 'SubState': 'failed', 'ControlGroup': '', 'MainPID': '0'}
