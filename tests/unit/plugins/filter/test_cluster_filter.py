"""Job nodes and the preflight summary read the GPU count that gpu_facts found."""

import os

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.filter import cluster
from ansible_collections.gpucluster.multinode.plugins.filter.cluster import cluster_job_nodes, summary_rows

GROUPS = {'cluster': ['gpu-master', 'gpu-worker-1', 'cpu-node'], 'head': ['gpu-master'],
          'workers': ['gpu-worker-1', 'cpu-node']}


def hostvars():
    return {
        'gpu-master': {'ansible_host': '10.0.0.1', 'gpu_slots': 2,
                       'ansible_facts': {'gpu_facts': {'gpu_count': 8, 'reason': ''}}},
        'gpu-worker-1': {'ansible_host': '10.0.0.2',
                         'ansible_facts': {'gpu_facts': {'gpu_count': 8, 'reason': ''}}},
        'cpu-node': {'ansible_host': '10.0.0.3',
                     'ansible_facts': {'gpu_facts': {'gpu_count': 0, 'reason': 'no NVIDIA device on the PCI bus'}}},
    }


def test_job_slots_come_from_gpu_slots_then_the_detected_gpus_then_one():
    nodes = cluster_job_nodes(GROUPS, hostvars())
    assert [(n['name'], n['slots']) for n in nodes] == [('gpu-master', 2), ('cpu-node', 1), ('gpu-worker-1', 8)]


def test_job_nodes_by_address():
    assert [n['name'] for n in cluster_job_nodes(GROUPS, hostvars(), by='address')] == [
        '10.0.0.1', '10.0.0.3', '10.0.0.2']


def test_summary_shows_detected_gpus_and_a_dash_where_there_are_none():
    rows = summary_rows(GROUPS, hostvars())
    assert [(r['name'], r['gpus']) for r in rows] == [('gpu-master', 8), ('cpu-node', '-'), ('gpu-worker-1', 8)]


def test_job_nodes_take_node_slots_and_refuse_a_bad_value_naming_host_and_variable():
    import pytest
    from ansible.errors import AnsibleFilterError
    hv = hostvars()
    hv['cpu-node']['node_slots'] = 2
    assert [(n['name'], n['slots']) for n in cluster_job_nodes(GROUPS, hv)][1] == ('cpu-node', 2)
    hv['gpu-worker-1']['gpu_slots'] = 'two'
    with pytest.raises(AnsibleFilterError, match="host gpu-worker-1: gpu_slots must be a whole number"):
        cluster_job_nodes(GROUPS, hv)


STEPS = [{'step': 'network', 'role': 'network', 'tags': ['network']},
         {'step': 'shared_storage', 'role': 'nfs_client', 'tags': ['shared_storage', 'nfs']},
         {'step': 'nccl_env', 'role': 'nccl_env', 'tags': ['nccl_env']}]


def _names(steps):
    return [s['role'] for s in steps]


def test_a_plain_run_checks_every_step():
    assert _names(cluster.preflight_selected_steps(STEPS, ['all'], [])) == ['network', 'nfs_client', 'nccl_env']


def test_tags_select_and_skip_tags_leave_out_steps():
    assert _names(cluster.preflight_selected_steps(STEPS, ['nfs'], [])) == ['nfs_client']
    assert _names(cluster.preflight_selected_steps(STEPS, ['preflight'], [])) == []
    assert _names(cluster.preflight_selected_steps(STEPS, ['all'], ['shared_storage'])) == ['network', 'nccl_env']
    assert _names(cluster.preflight_selected_steps(STEPS, ['network', 'nccl_env'], ['nccl_env'])) == ['network']


def test_a_refused_step_names_host_variable_and_step():
    lines = cluster.preflight_step_lines(
        ["host w1: argument 'ssh_trust_uid' is of type str and we were unable to convert to int"], 'w1', 'ssh_trust',
        'ssh_trust')
    assert lines == ['preflight: step ssh_trust (role ssh_trust) refuses its settings on host w1; nothing was changed',
                     "host w1: argument 'ssh_trust_uid' is of type str and we were unable to convert to int "
                     "(step ssh_trust)"]
    lines = cluster.preflight_step_lines('host h: firewall_rendezvous_ports entry\n  x', 'h', 'firewall', 'firewall')
    assert lines[1] == 'host h: firewall_rendezvous_ports entry x (step firewall)'


def test_unreachable_line_reads_the_result_it_is_given():
    hostvars = {'w1': {'ansible_host': '10.0.0.2'}}
    results = {'w1': {'unreachable': True, 'msg': 'Failed to connect\n  to the host'}}
    assert cluster.unreachable_line('w1', hostvars, results) == 'host w1 (10.0.0.2): Failed to connect to the host'
    assert cluster.unreachable_line('w1', hostvars, {}) == 'host w1 (10.0.0.2): no answer'


def _site_plays():
    import yaml
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    with open(os.path.join(root, 'playbooks', 'site.yml')) as f:
        return yaml.safe_load(f)


def test_site_steps_are_read_from_the_plays_in_their_order():
    from ansible_collections.gpucluster.multinode.plugins.filter.cluster import site_steps
    plays = _site_plays()
    steps = site_steps(plays, {})

    def roles(play):
        return [r['role'] for r in play.get('roles') or []] + [
            t['ansible.builtin.include_role']['name'] for t in play.get('tasks') or [] if 'ansible.builtin.include_role' in t]
    assert [(s['step'], s['role']) for s in steps] == [
        (p['tags'][0], r.split('.')[-1]) for p in plays[1:] for r in roles(p)]
    nfs_server = [s for s in steps if s['role'] == 'nfs_server'][0]
    assert nfs_server['group'] == 'head' and nfs_server['tags'] == ['shared_storage', 'nfs']
    # Containers and Ray are steps only where the inventory enables them (the roles' own defaults are not read).
    assert [s['role'] for s in steps if not s['enabled']] == ['container', 'ray']
    assert [s['enabled'] for s in site_steps(plays, {'cluster_ray_enabled': True}) if s['role'] == 'ray'] == [True]


def test_site_steps_read_the_on_off_switches_with_the_variables():
    from ansible_collections.gpucluster.multinode.plugins.filter.cluster import site_steps
    steps = site_steps(_site_plays(), {'node_tools_enabled': 'false', 'nfs_client_mode': 'check'})
    off = sorted(s['role'] for s in steps if not s['enabled'])
    assert off == ['container', 'nfs_server', 'node_tools', 'ray']
    on = site_steps(_site_plays(), {'cluster_container_runtime': 'podman'})
    assert [s['enabled'] for s in on if s['role'] == 'container'] == [True]


def test_site_steps_refuse_a_condition_they_cannot_read():
    from ansible_collections.gpucluster.multinode.plugins.filter.cluster import site_steps
    plays = [{'name': 'Odd', 'hosts': 'cluster', 'tags': ['odd'],
              'roles': [{'role': 'gpucluster.multinode.network', 'when': 'a or b'}]}]
    with pytest.raises(AnsibleFilterError, match="play 'Odd' has a role condition the preflight cannot read: a or b"):
        site_steps(plays, {})


def test_job_nodes_are_the_cluster_nodes_that_limit_kept_with_the_world_recomputed():
    from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf
    nodes = cluster_job_nodes(GROUPS, hostvars(), hosts=['gpu-master', 'gpu-worker-1'])
    assert [(n['name'], n['host'], n['slots']) for n in nodes] == [
        ('gpu-master', 'gpu-master', 2), ('gpu-worker-1', 'gpu-worker-1', 8)]
    assert hf.world_size(nodes) == 10
    # a limit that keeps the head alone is a one-node job
    assert [n['name'] for n in cluster_job_nodes(GROUPS, hostvars(), hosts=['gpu-master'])] == ['gpu-master']
    assert cluster.cluster_left_out(GROUPS, ['gpu-master']) == ['cpu-node', 'gpu-worker-1']


def test_a_limit_without_the_head_is_refused_naming_it():
    with pytest.raises(AnsibleFilterError, match='--limit leaves out the head gpu-master'):
        cluster_job_nodes(GROUPS, hostvars(), hosts=['gpu-worker-1', 'cpu-node'])
    with pytest.raises(AnsibleFilterError, match='hosts must be a list'):
        cluster_job_nodes(GROUPS, hostvars(), hosts='gpu-master')


def test_a_spare_joins_a_job_only_when_named_after_the_workers_and_an_unknown_one_is_refused():
    groups = dict(GROUPS, cluster=GROUPS['cluster'] + ['spare-1'], spares=['spare-1'])
    hv = dict(hostvars(), **{'spare-1': {'ansible_host': '10.0.0.9', 'gpu_slots': 8}})
    assert [n['name'] for n in cluster_job_nodes(groups, hv)] == ['gpu-master', 'cpu-node', 'gpu-worker-1']
    nodes = cluster_job_nodes(groups, hv, hosts=['gpu-master', 'gpu-worker-1', 'spare-1'], spares=['spare-1'])
    assert [(n['name'], n['slots']) for n in nodes] == [('gpu-master', 2), ('gpu-worker-1', 8), ('spare-1', 8)]
    with pytest.raises(AnsibleFilterError, match="training_spares names gpu-worker-1, not in the inventory's spares group"):
        cluster_job_nodes(groups, hv, spares=['gpu-worker-1'])
