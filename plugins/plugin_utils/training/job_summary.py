# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The lines train.yml ends a start with: the job, where its logs and events are, and the commands to
go on (status, watch, logs, report, TensorBoard, stop). Controller only: the training_summary filter."""

from __future__ import annotations

import os
import shlex

from ansible_collections.gpucluster.multinode.plugins.module_utils.training.launchers import LAUNCHERS

PLAYBOOK = 'playbooks/train.yml'
STATE_WORDS = {'running': 'runs', 'succeeded': 'finished', 'finished': 'finished', 'failed': 'failed',
               'stalled': 'is stalled', 'stopped': 'was stopped', 'unknown': 'could not be read'}


def command(job_id, state, inventory=None, playbook=PLAYBOOK):
    """The train.yml command line of a state for the job (the inventory given with -i, when known)."""
    argv = ['ansible-playbook', playbook]
    if inventory:
        argv += ['-i', inventory]
    argv += ['-e', 'training_state=%s' % state, '-e', 'training_job_id=%s' % job_id]
    return ' '.join(shlex.quote(a) for a in argv)


def summary_lines(job_id, job_dir, nodes, state=None, inventory=None, local_jobs_dir='', supervised=False,
                  launcher=''):
    """The end of a start: what the job is and does, where its files are (on the nodes and, where the
    shared storage is seen on this machine, here) and the commands for what comes next."""
    nodes = [n if isinstance(n, str) else n.get('name') for n in nodes or []]
    state = state or 'running'
    lines = ['job %s %s (%s on %s)' % (job_id, STATE_WORDS.get(state, state), launcher or 'launcher',
                                       ', '.join(nodes) or '?')]
    here = os.path.join(local_jobs_dir, job_id) if local_jobs_dir else ''
    lines.append('job directory: %s on every node%s' % (job_dir, ', %s on this machine' % here if here else ''))
    where = here or job_dir
    launcher_cls = LAUNCHERS.get(launcher)
    if launcher_cls is not None and launcher_cls.one_log:
        logs = "logs: %s/logs/%s-<%s job id>.out, every node's lines" % (where, job_id, launcher)
    else:
        logs = 'logs: %s/logs/<node>.log, one per node' % where
    lines.append("%s; each rank's progress: %s/progress/" % (logs, where))
    if supervised:
        # supervised: True (the events are in the job directory) or where the supervisor keeps them
        lines.append('supervisor events: %s' % (supervised if isinstance(supervised, str)
                                                else '%s/events.jsonl' % (here or job_dir)))
    verbs = [('status', 'status'), ('watch', 'watch'), ('logs', 'logs'), ('report', 'report'),
             ('tensorboard', 'tensorboard')]
    if state in ('running', 'stalled', 'unknown'):
        verbs.append(('stop', 'stopped'))
    width = max(len(v) for v, _ in verbs) + 1
    for verb, st in verbs:
        lines.append('%s %s' % ((verb + ':').ljust(width), command(job_id, st, inventory)))
    return lines
