# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""What the API server says about a training StatefulSet and its pods, read for the user.

pod_rows() turns the Pod objects of ``kubernetes.core.k8s_info`` into one row per expected pod (phase,
ready, node, restarts, the reason of a waiting or terminated container such as CrashLoopBackOff or
ImagePullBackOff, the scheduler's message of a Pending pod); a pod the StatefulSet should have but the
API does not list is a row too (``missing``). report() adds the StatefulSet's status and one verdict.
job_report() reads the JSON that ``k8s_pod.py status`` prints in pod 0.
"""

from __future__ import annotations

import json

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s.cluster import get_path


def _condition(pod, kind):
    for cond in get_path(pod, 'status', 'conditions', default=[]):
        if cond.get('type') == kind:
            return cond
    return {}


def pod_row(pod):
    """One row of a Pod object."""
    statuses = get_path(pod, 'status', 'containerStatuses', default=[]) + \
        get_path(pod, 'status', 'initContainerStatuses', default=[])
    restarts = sum(int(s.get('restartCount') or 0) for s in statuses)
    reason, message = '', ''
    for s in statuses:
        waiting = get_path(s, 'state', 'waiting')
        terminated = get_path(s, 'state', 'terminated') or get_path(s, 'lastState', 'terminated')
        if waiting and waiting.get('reason') not in (None, 'ContainerCreating', 'PodInitializing'):
            reason, message = waiting.get('reason', ''), waiting.get('message', '')
            if terminated and not message:
                message = 'last exit %s (%s)' % (terminated.get('exitCode'), terminated.get('reason', ''))
            break
        if get_path(s, 'state', 'terminated'):
            reason = terminated.get('reason', 'Terminated')
            message = 'exit %s' % terminated.get('exitCode')
            break
    phase = get_path(pod, 'status', 'phase', default='Unknown')
    if not reason and phase == 'Pending':
        sched = _condition(pod, 'PodScheduled')
        if sched.get('status') == 'False':
            reason, message = sched.get('reason', 'Unschedulable'), sched.get('message', '')
    if get_path(pod, 'metadata', 'deletionTimestamp'):
        reason = reason or 'Terminating'
    ready = _condition(pod, 'Ready').get('status') == 'True'
    return {
        'name': get_path(pod, 'metadata', 'name', default='?'),
        'phase': phase,
        'ready': ready,
        'node': get_path(pod, 'spec', 'nodeName', default=''),
        'pod_ip': get_path(pod, 'status', 'podIP', default=''),
        'restarts': restarts,
        'reason': reason,
        'message': message,
    }


def pod_rows(pods, expected):
    """Rows for the expected pod names (in that order), then any other pod listed; a missing one is a row."""
    by_name = {}
    for pod in pods or []:
        row = pod_row(pod)
        by_name[row['name']] = row
    rows = []
    for name in expected:
        rows.append(by_name.pop(name, {'name': name, 'phase': 'Missing', 'ready': False, 'node': '', 'pod_ip': '',
                                       'restarts': 0, 'reason': 'missing',
                                       'message': 'the API lists no such pod'}))
    rows.extend(by_name[n] for n in sorted(by_name))
    return rows


def describe(row):
    text = '%s %s%s node=%s restarts=%d' % (
        row['name'], row['phase'], ' ready' if row['ready'] else ' not-ready', row['node'] or '-', row['restarts'])
    if row['reason']:
        text += ' %s' % row['reason']
    if row['message']:
        text += ': %s' % row['message']
    return text


def report(pods, statefulset, expected):
    """{rows, lines, not_ready, ready, replicas, ready_replicas, state, msg}: state is ready, progressing
    (pods starting, none failing), failing (a pod waits in an error state or restarts) or absent."""
    rows = pod_rows(pods, expected)
    not_ready = [r['name'] for r in rows if r['name'] in expected and not r['ready']]
    failing = [r['name'] for r in rows if r['name'] in expected and (
        r['reason'] in ('CrashLoopBackOff', 'ImagePullBackOff', 'ErrImagePull', 'CreateContainerConfigError',
                        'CreateContainerError', 'InvalidImageName', 'RunContainerError', 'Error', 'OOMKilled',
                        'Unschedulable')
        or r['restarts'] > 0 and not r['ready'])]
    sts_status = get_path(statefulset, 'status', default={}) if statefulset else {}
    if statefulset is None and not pods:
        state = 'absent'
    elif not not_ready:
        state = 'ready'
    elif failing:
        state = 'failing'
    else:
        state = 'progressing'
    if state == 'ready':
        msg = 'all %d pods ready' % len(expected)
    elif state == 'absent':
        msg = 'no StatefulSet and no pods'
    else:
        first = next(r for r in rows if r['name'] == (failing or not_ready)[0])
        msg = '%d of %d pods not ready; first: %s' % (len(not_ready), len(expected), describe(first))
    return {
        'rows': rows, 'lines': [describe(r) for r in rows], 'not_ready': not_ready, 'failing': failing,
        'replicas': sts_status.get('replicas', 0), 'ready_replicas': sts_status.get('readyReplicas', 0),
        'current_revision': sts_status.get('currentRevision', ''), 'update_revision': sts_status.get('updateRevision', ''),
        'state': state, 'msg': msg,
    }


def job_report(text):
    """The JSON line of ``k8s_pod.py status`` read into {job_id, state, failed_pod, pods, msg}."""
    lines = [line for line in (text or '').splitlines() if line.strip().startswith('{')]
    if not lines:
        raise ValueError('no status line in the output of k8s_pod.py status: %r' % (text or '')[-200:])
    data = json.loads(lines[-1])
    pods = data.get('pods') or []
    state = data.get('state', 'unknown')
    if state == 'failed' and data.get('failed_pod'):
        bad = next((p for p in pods if p.get('pod') == data['failed_pod']), {})
        reason = data.get('reason') or bad.get('reason') or '%s (exit %s)' % (bad.get('state'), bad.get('exit_code'))
        msg = 'job %s failed: pod %s %s' % (data.get('job_id'), data['failed_pod'], reason)
        if data.get('restarts'):
            msg += ' (attempt %d of %d)' % (data.get('attempt', 0) + 1, data['restarts'] + 1)
    elif state == 'restarting':
        msg = 'job %s restarting (attempt %d of %d) on %d pods' % (
            data.get('job_id'), data.get('attempt', 0) + 1, data.get('restarts', 0) + 1, len(pods))
    else:
        msg = 'job %s %s on %d pods' % (data.get('job_id'), state, len(pods))
    if data.get('unreachable'):
        msg += '; unreachable: %s' % ', '.join(data['unreachable'])
    data['msg'] = msg
    return data
