"""What the launch refuses when the nodes differ: the image in containers, the versions on hosts."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.filter.training import training_launch_mismatches

HEAD_ID = 'sha256:' + 'a' * 64
OTHER_ID = 'sha256:' + 'b' * 64


def test_a_worker_with_another_image_is_named_with_both_ids():
    lines = training_launch_mismatches(
        {'w-1': {'image': HEAD_ID}, 'head': {'image': HEAD_ID}, 'w-2': {'image': OTHER_ID}},
        'localhost/gpucluster-train:lab', 'head')
    assert lines == ['node w-2: image localhost/gpucluster-train:lab is %s but head has %s; load the same image '
                     'on every node (site.yml --tags container)' % (OTHER_ID, HEAD_ID)]


def test_a_worker_without_the_image_is_named():
    lines = training_launch_mismatches({'head': {'image': HEAD_ID}, 'w-1': {'image': None}}, 'img', 'head')
    assert lines == ['node w-1: image img is missing (head has %s); load it there (site.yml --tags container)' % HEAD_ID]


def test_the_same_image_everywhere_is_no_mismatch_and_host_versions_are_compared_between_nodes():
    assert training_launch_mismatches({'head': {'image': HEAD_ID}, 'w-1': {'image': HEAD_ID}}, 'img', 'head') == []
    host = {'head': {'torch': '2.13.0+cpu', 'python': '3.11.2'}, 'w-1': {'torch': '2.12.0+cpu', 'python': '3.11.2'}}
    assert training_launch_mismatches(host, '', 'head') == ['torch differs: 2.12.0+cpu on w-1; 2.13.0+cpu on head']


def test_wrong_input_is_refused_naming_it():
    with pytest.raises(AnsibleFilterError, match='takes {node: versions}, got list'):
        training_launch_mismatches([HEAD_ID], 'img', 'head')


def test_without_the_head_the_first_node_is_the_reference():
    lines = training_launch_mismatches({'w-1': {'image': HEAD_ID}, 'w-2': {'image': OTHER_ID}}, 'img', 'head')
    assert lines == ['node w-2: image img is %s but w-1 has %s; load the same image on every node '
                     '(site.yml --tags container)' % (OTHER_ID, HEAD_ID)]


def test_status_and_stop_read_the_nodes_the_job_was_started_on_not_the_inventory():
    from ansible_collections.gpucluster.multinode.plugins.filter.training import training_layout_nodes
    nodes = [{'name': 'head', 'host': 'head', 'address': '10.0.0.1', 'slots': 1},
             {'name': 'w1', 'host': 'w1', 'address': '10.0.0.2', 'slots': 1},
             {'name': 'w2', 'host': 'w2', 'address': '10.0.0.3', 'slots': 1}]
    # started with --limit '!w2': layout.json holds head and w1 only
    assert [n['host'] for n in training_layout_nodes(nodes, {'head': 1, 'w1': 1}, 'j1')] == ['head', 'w1']
    with pytest.raises(AnsibleFilterError, match='job j1 was started on w9, which is not a node of the inventory'):
        training_layout_nodes(nodes, {'head': 1, 'w9': 1}, 'j1')
    with pytest.raises(AnsibleFilterError, match='layout must be a JSON object'):
        training_layout_nodes(nodes, None, 'j1')


# ----- the view of a container job ---------------------------------------------------------------
from ansible_collections.gpucluster.multinode.plugins.filter.training import (  # noqa: E402
    training_stopped_lines, training_verdict)

BOX = {'id': 'c01e3f9f39f9', 'name': 'gpucluster-j1-head', 'image': 'localhost/train:1', 'image_id': '9dfd6d3a179a',
       'state': 'running', 'exit_code': None, 'node': 'head'}


def test_status_of_a_container_job_lists_each_nodes_containers():
    results = [dict(job_id='j1', node='head', role='agent', running=True, exit_code=None, containers=[BOX]),
               dict(job_id='j1', node='w1', role='agent', running=False, exit_code=1,
                    containers=[dict(BOX, name='gpucluster-j1-w1', state='exited', exit_code=1, node='w1')]),
               dict(job_id='j1', node='w2', role='agent', running=False, exit_code=None, containers=[])]
    lines = training_verdict(results)['lines']
    assert '  head                 container gpucluster-j1-head image 9dfd6d3a179a running exit=-' in lines
    assert '  w1                   container gpucluster-j1-w1 image 9dfd6d3a179a exited exit=1' in lines
    assert '  w2                   containers: none' in lines
    # a host job has no container lines
    assert not any('container' in line for line in training_verdict([dict(results[0], containers=None)][:0] + [
        {k: v for k, v in results[0].items() if k != 'containers'}])['lines'])


def test_stopped_lists_the_containers_it_removed_not_an_empty_pid_list():
    lines = training_stopped_lines([dict(node='head', removed_containers=['gpucluster-j1-head'], stopped_pids=[]),
                                    dict(node='w1', removed_containers=[], stopped_pids=[812, 813]),
                                    dict(node='w2', removed_containers=[], stopped_pids=[])], 'j1')
    assert lines == ['job j1 stopped; nothing of it runs on any node',
                     'head: removed container(s) gpucluster-j1-head',
                     'w1: signalled process(es) 812, 813',
                     'w2: nothing of the job was left there']


def test_a_deepspeed_job_names_the_node_whose_rank_was_killed_not_the_head_whatever_the_order_of_pdsh_lines():
    # as Ansible hands the head's result over: node_exit_codes in name order, the head first
    results = [dict(job_id='j1', node='lab-head', role='launcher', running=False, exit_code=247,
                    node_exit_codes={'lab-head': 1, 'lab-worker-1': 247, 'lab-worker-2': 1},
                    rank_failure={'time': '2026-11-25 22:52:37,123', 'host': 'lab-worker-1', 'node': 'lab-worker-1',
                                  'exit_code': -9, 'signal': 'SIGKILL'}),
               dict(job_id='j1', node='lab-worker-1', role='ranks', running=False, exit_code=None),
               dict(job_id='j1', node='lab-worker-2', role='ranks', running=False, exit_code=None)]
    verdict = training_verdict(results, ['lab-head', 'lab-worker-1', 'lab-worker-2'])
    assert verdict['state'] == 'failed'
    assert verdict['failed_nodes'][0] == 'lab-worker-1' and verdict['first_failure']['node'] == 'lab-worker-1'


def test_training_failure_policy_reads_the_rules_as_the_k8s_cluster_file_does_with_a_stall_besides():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.gpucluster.multinode.plugins.filter import training as tf
    # a bare YAML key `on` is read as true: it is on
    rules = tf.training_failure_policy([{True: ['exit'], 'exit_codes': [3], 'action': 'fail'},
                                        {'on': 'stalled', 'action': 'restart_uncounted'}])
    assert rules == [{'on': ['exit'], 'exit_codes': [3], 'action': 'fail'},
                     {'on': ['stalled'], 'exit_codes': [], 'action': 'restart_uncounted'}]
    assert tf.training_failure_policy([]) == [] and tf.training_failure_policy_problems([]) == []
    for value, problem in [
        ({'on': 'exit'}, 'training_failure_policy must be a list of rules, got'),
        ([{'on': ['oom'], 'action': 'fail'}], "training_failure_policy[0].on must be exit or signal or unreachable or "
                                              "restarted or stalled, got 'oom'"),
        ([{'on': ['exit'], 'action': 'retry'}], "training_failure_policy[0].action must be restart or "
                                                "restart_uncounted or fail, got 'retry'"),
        ([{'on': ['signal'], 'exit_codes': [9], 'action': 'fail'}],
         'training_failure_policy[0].exit_codes apply to exit failures only: set on: [exit]'),
        ([{'on': ['exit'], 'action': 'fail', 'when': 'always'}], 'training_failure_policy[0].when is not a field of a rule'),
    ]:
        assert tf.training_failure_policy_problems(value)[0].startswith(problem), value
        with pytest.raises(AnsibleFilterError, match=r'training_failure_policy'):
            tf.training_failure_policy(value)
