"""The ray filters: the service's command line, the preflight's problems, the nodes that are not
in the cluster, and the health records of the check 'ray'."""

from __future__ import annotations

import os

from ansible_collections.gpucluster.multinode.plugins.filter import ray as rf
from ansible_collections.gpucluster.multinode.plugins.module_utils import ray_cluster as rc

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'ray')
RECORD_KEYS = ['node', 'check', 'status', 'value', 'threshold', 'detail', 'remedy']


def test_systemd_args_quote_json_and_escape_specifiers():
    line = rf.ray_systemd_args(['/opt/env/bin/ray', 'start', '--resources={"nvme":1}', '--labels={"a":"50%"}',
                                '--block'])
    assert line == ("/opt/env/bin/ray start '--resources={\"nvme\":1}' '--labels={\"a\":\"50%%\"}' --block")
    assert rf.ray_systemd_args(['X=$HOME']) == 'X=$$HOME'


def test_node_spec_from_settings():
    s = {'ray_num_cpus': 'auto', 'ray_num_gpus': 'auto', 'gpu_slots': None, 'ray_memory': 0,
         'ray_resources': {'nvme': 1}, 'ray_labels': {'rack': 'a'}}
    spec = rf.ray_node_spec(s, 'w1', '10.0.0.2', False, '16', 0)
    assert spec == {'name': 'w1', 'address': '10.0.0.2', 'head': False, 'cpus': 16, 'gpus': 0, 'memory': 0,
                    'resources': {'nvme': 1}, 'labels': {'rack': 'a'}}
    assert rf.ray_node_spec(dict(s, ray_num_cpus=4, gpu_slots=2), 'w1', '10.0.0.2', False, '16', 8)['cpus'] == 4
    assert rf.ray_node_spec(dict(s, gpu_slots=2), 'w1', '10.0.0.2', False, '16', 8)['gpus'] == 2


def test_preflight_problems_name_host_and_variable():
    hostvars = {
        'h': {'__ray_head_ports': {'ports': [
            {'port': 6379, 'free': False, 'text': 'port 6379 is in use by pid 77 (redis-server *:6379)'},
            {'port': 8265, 'free': True, 'text': ''}, {'port': 10001, 'free': True, 'text': ''}]},
            '__ray_env_python': {'stat': {'exists': True}}},
        'w1': {'__ray_reach': {'connect': 'no answer within 5s (a firewall drops it, or the head is down)'},
               '__ray_env_python': {'stat': {'exists': True}}},
        'w2': {'__ray_reach': {'connect': 'connected'}, '__ray_env_python': {'stat': {'exists': False}}},
    }
    got = rf.ray_preflight_problems(hostvars, ['h', 'w1', 'w2'], 'h', '10.0.0.1', 6379, '/opt/gpucluster/env')
    assert got == [
        'host h: cluster_ray_port: port 6379 is in use by pid 77 (redis-server *:6379)',
        'host w1: cannot reach the head 10.0.0.1 on cluster_ray_port 6379: no answer within 5s (a firewall drops it, or the head is down)',
        'host w2: ray_env_path /opt/gpucluster/env holds no Python environment (site.yml --tags python_env makes it)',
    ]
    assert len(rf.ray_preflight_problems(hostvars, ['h', 'w1', 'w2'], 'h', '10.0.0.1', 6379, '/e', True)) == 2


def test_a_refusal_by_the_heads_own_restarting_ray_is_no_problem_a_timeout_is():
    ports = {'ports': [{'port': 6379, 'free': True, 'ours': True, 'text': ''}]}
    refused = 'connection refused (nothing listens there, or a firewall rejects it)'
    hostvars = {'h': {'__ray_head_ports': ports}, 'w1': {'__ray_reach': {'connect': refused}},
                'w2': {'__ray_reach': {'connect': 'no answer within 5s (a firewall drops it, or the head is down)'}}}
    got = rf.ray_preflight_problems(hostvars, ['h', 'w1', 'w2'], 'h', '10.0.0.1', 6379, '/e')
    assert [line.split(':')[0] for line in got] == ['host w2']
    ports['ports'][0]['ours'] = False
    got = rf.ray_preflight_problems(hostvars, ['h', 'w1', 'w2'], 'h', '10.0.0.1', 6379, '/e')
    assert [line.split(':')[0] for line in got] == ['host w1', 'host w2']


def _inspection(state, address, log=(), **spec):
    return {'active_state': state, 'sub_state': 'running' if state == 'active' else 'dead', 'processes': [],
            'log_tail': list(log), 'manifest': rc.node_spec('x', address, address.endswith('.1'),
                                                            spec.get('cpus', 2), spec.get('gpus', 0))}


def _alive(ip, cpus=2.0):
    return {'node_id': ip, 'node_ip': ip, 'state': 'ALIVE', 'is_head': ip.endswith('.1'),
            'resources': {'CPU': cpus, 'memory': 2.0 * 1024 ** 3, 'node:' + ip: 1.0}, 'labels': {}}


def test_a_stopped_worker_is_named_with_its_service_and_log():
    status = {'error': '', 'nodes': [_alive('10.0.0.1'), _alive('10.0.0.2')]}
    ins = {'h': _inspection('active', '10.0.0.1'), 'w1': _inspection('active', '10.0.0.2'),
           'w2': _inspection('inactive', '10.0.0.3', log=['Stopping gpucluster-ray.service', 'Stopped Ray'])}
    members = rf.ray_membership(status, ins, ['h', 'w1', 'w2'])
    assert [m['ok'] for m in members] == [True, True, False]
    assert members[0]['resources'] == 'CPU 2, GPU 0, memory 2.0GiB'
    lines = rf.ray_problem_lines(members, 1)
    assert lines == ['host w2 (10.0.0.3): not in the Ray cluster; service inactive (dead), 0 process(es)',
                     '    Stopped Ray']
    records = rf.ray_health_records(members, status, ['h', 'w1', 'w2'])
    assert [list(r) for r in records] == [RECORD_KEYS] * 3
    assert [r['status'] for r in records] == ['ok', 'ok', 'fail']
    assert records[2]['detail'] == ('not in the Ray cluster; service inactive (dead), 0 process(es); '
                                    'last log line: Stopped Ray')
    assert 'w2' in records[2]['remedy'] and records[0]['remedy'] == ''


def test_a_head_that_does_not_answer_fails_every_node():
    status = {'error': 'ray status exited 1: ConnectionError: Could not find any running Ray instance.', 'nodes': []}
    ins = {'h': _inspection('failed', '10.0.0.1'), 'w1': _inspection('active', '10.0.0.2')}
    records = rf.ray_health_records(rf.ray_membership(status, ins, ['h', 'w1']), status, ['h', 'w1'])
    assert [r['status'] for r in records] == ['fail', 'fail']
    assert records[0]['detail'].startswith('the head cannot read the Ray cluster: ray status exited 1')


def test_an_unreachable_node_is_unknown_and_a_node_never_started_fails():
    status = {'error': '', 'nodes': [_alive('10.0.0.1')]}
    ins = {'h': _inspection('active', '10.0.0.1'),
           'w1': {'unreachable': True, 'msg': 'Failed to connect to the host via ssh'},
           'w2': {'active_state': 'inactive', 'sub_state': 'dead', 'processes': [], 'log_tail': [], 'manifest': {}}}
    members = rf.ray_membership(status, ins, ['h', 'w1', 'w2'])
    records = rf.ray_health_records(members, status, ['h', 'w1', 'w2'])
    assert [r['status'] for r in records] == ['ok', 'unknown', 'fail']
    assert records[1]['detail'] == 'Failed to connect to the host via ssh'
    assert 'no Ray manifest' in records[2]['detail']
