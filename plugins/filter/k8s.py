# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filters of the k8s role: the pods' report from the API objects, the job's report from pod 0, a job id,
the lines of a dry run without an API server."""

from __future__ import annotations

import time

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import pods as k8s_pods
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import render as k8s_render
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as training


def k8s_pod_report(pods, statefulset, expected):
    """pods: the resources of k8s_info (kind Pod); statefulset: the StatefulSet resource or None;
    expected: the pod names of the cluster file. See plugin_utils/k8s/pods.report."""
    if isinstance(statefulset, list):
        statefulset = statefulset[0] if statefulset else None
    return k8s_pods.report(pods or [], statefulset, list(expected or []))


def k8s_job_report(text):
    try:
        return k8s_pods.job_report(text)
    except ValueError as exc:
        raise AnsibleFilterError('k8s_job_report: %s' % exc) from exc


def k8s_job_id(job_id, cluster_name, now=None):
    """The given job id (checked as train.yml checks it), or <cluster name>-<date>-<time>."""
    if not job_id:
        job_id = '%s-%s' % (cluster_name, time.strftime('%Y%m%d-%H%M%S', time.gmtime(now)))
    try:
        return training.check_job_id(job_id)
    except training.TrainingError as exc:
        raise AnsibleFilterError('k8s_train_job_id: %s' % exc) from exc


def k8s_dry_run_lines(checked, api_error, admin_dir):
    """The lines of present's dry run without an API server (plugin_utils/k8s/render.dry_run_lines)."""
    return k8s_render.dry_run_lines(checked, api_error, admin_dir)


class FilterModule:
    def filters(self):
        return {
            'k8s_pod_report': k8s_pod_report,
            'k8s_job_report': k8s_job_report,
            'k8s_job_id': k8s_job_id,
            'k8s_dry_run_lines': k8s_dry_run_lines,
        }
