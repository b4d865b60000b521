"""Job nodes and the preflight summary read the GPU count that gpu_facts found."""

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
