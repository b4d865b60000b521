# -*- coding: utf-8 -*-
"""The summary train.yml ends a start with (plugin_utils/training/job_summary.py)."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_summary as js

NODES = [{'name': 'lab-head'}, {'name': 'lab-worker-1'}]


def test_a_running_job_names_its_files_and_every_command_to_go_on_with_the_inventory():
    lines = js.summary_lines('tiny-1', '/shared/jobs/tiny-1', NODES, 'running', inventory='/srv/inv/hosts.yml',
                             launcher='deepspeed')
    assert lines[0] == 'job tiny-1 runs (deepspeed on lab-head, lab-worker-1)'
    assert lines[1] == 'job directory: /shared/jobs/tiny-1 on every node'
    assert "logs: /shared/jobs/tiny-1/logs/<node>.log, one per node; each rank's progress: /shared/jobs/tiny-1/progress/" in lines
    assert ('status:      ansible-playbook playbooks/train.yml -i /srv/inv/hosts.yml -e training_state=status '
            '-e training_job_id=tiny-1') in lines
    assert [line.split(':')[0] for line in lines[3:]] == ['status', 'watch', 'logs', 'report', 'tensorboard', 'stop']


def test_a_finished_job_on_the_lab_names_its_directory_on_this_machine_and_has_nothing_to_stop():
    lines = js.summary_lines('tiny-1', '/shared/jobs/tiny-1', NODES, 'succeeded',
                             local_jobs_dir='/work/.lab/gpucluster-lab/shared/jobs',
                             supervised='lab-head:/var/lib/gpucluster/supervise/tiny-1/events.jsonl')
    assert lines[0].startswith('job tiny-1 finished')
    assert lines[1] == ('job directory: /shared/jobs/tiny-1 on every node, /work/.lab/gpucluster-lab/shared/jobs/tiny-1 '
                        'on this machine')
    assert 'supervisor events: lab-head:/var/lib/gpucluster/supervise/tiny-1/events.jsonl' in lines
    assert not any(line.startswith('stop:') for line in lines)
    assert 'logs: /work/.lab/gpucluster-lab/shared/jobs/tiny-1/logs/<node>.log' in lines[2]


def test_a_failed_job_says_so_and_quotes_what_the_shell_needs():
    lines = js.summary_lines('a b', '/shared/jobs/a b', ['h'], 'failed')
    assert lines[0] == 'job a b failed (launcher on h)'
    assert "-e 'training_job_id=a b'" in lines[-1]


def test_a_slurm_job_names_slurm_s_output_file_where_every_node_s_lines_are():
    lines = js.summary_lines('tiny-1', '/shared/jobs/tiny-1', NODES, 'running', launcher='slurm')
    assert ("logs: /shared/jobs/tiny-1/logs/tiny-1-<slurm job id>.out, every node's lines; each rank's progress: "
            "/shared/jobs/tiny-1/progress/") in lines
