# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The summary train.yml prints at the end of a start (plugin_utils/training/job_summary.py)."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_summary


def training_summary(job_id, job_dir, nodes, state=None, inventory=None, local_jobs_dir='', supervised=False,
                     launcher=''):
    """Lines: the job and its state, where its logs and events are, the commands to go on."""
    return job_summary.summary_lines(job_id, job_dir, nodes, state=state, inventory=inventory,
                                     local_jobs_dir=local_jobs_dir, supervised=supervised, launcher=launcher)


class FilterModule:
    def filters(self):
        return {'training_summary': training_summary}
