#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: training_report
short_description: Write a training job's report page, one self-contained HTML file
version_added: 0.1.0
description:
  - Reads the job directory (the ranks' progress files C(progress/rank-<N>.log), the supervisor's
    C(events.jsonl), C(summary.json) and C(layout.json)) and writes one HTML page of how the job went,
    by default C(<job_dir>/report.html).
  - "The page shows rank 0's loss per step, every node's steps per second over time, each node's
    median seconds per step (computing and waiting for the others), the slowest node, the supervisor's
    events on a time line (or that the job was not supervised) and the job's summary (state, steps,
    mean steps per second, world size, nodes, start and end)."
  - The page needs no server and no network; its plots are inline SVG, its style inline, and it runs
    no script. The data the plots were drawn from is embedded as JSON, in
    C(<script type="application/json" id="gpucluster-report-data">).
  - A series longer than O(max_points) is downsampled evenly (the first and the last step kept), and
    the page says so.
  - The page is written to a temporary file in its directory and moved into place (mode C(0644)); it
    is rewritten only when it changed.
author: gpucluster.multinode contributors (!UNKNOWN)
options:
  job_id:
    description: Id of the job.
    type: str
    required: true
  job_dir:
    description: Directory of the job; it must exist.
    type: path
    required: true
  dest:
    description: The page to write; default C(<job_dir>/report.html).
    type: path
  max_points:
    description: Most points of each plotted series (at least 2).
    type: int
    default: 2000
  step_regex:
    description:
      - A script that writes no progress file - its steps from the logs C(<job_dir>/logs/<node>.log), the lines this
        Python regex matches (the training role's C(training_progress_regex); group C(step), else the first number,
        optional C(loss) and C(time)). Empty - progress files only.
    type: str
    default: ''
attributes:
  check_mode:
    support: full
    details: Reads the job directory and renders the page; says whether it would change, writes nothing.
    description: Can run in check mode and return changed status prediction without modifying the node.
  diff_mode:
    support: none
    description: Returns no diff (the page is rewritten whole).
'''

EXAMPLES = r'''
- name: Write the job's report page on the head, as the training account
  gpucluster.multinode.training_report:
    job_id: train_tiny-20261123-051500
    job_dir: /shared/jobs/train_tiny-20261123-051500
  become: true
  become_user: train
  register: report
'''

RETURN = r'''
page:
  description: The page.
  returned: always
  type: str
  sample: /shared/jobs/train_tiny-20261123-051500/report.html
ranks:
  description: Ranks with a progress file.
  returned: always
  type: int
steps:
  description: The job's last step (summary.json's, else the progress files' highest); null without any step.
  returned: always
  type: int
job_state:
  description: The job's state as the page gives it (summary.json's, else read from the progress files).
  returned: always
  type: str
loss_points:
  description: Points of the loss plot.
  returned: always
  type: int
loss_steps:
  description: Steps with a loss that rank 0 logged (more than RV(loss_points) when downsampled).
  returned: always
  type: int
downsampled:
  description: Whether the loss was downsampled to O(max_points).
  returned: always
  type: bool
supervised:
  description: Whether the job has an events.jsonl (a supervisor followed it).
  returned: always
  type: bool
events:
  description: Events on the time line.
  returned: always
  type: int
slowest_node:
  description: The node that held the job back over the run, null when none stands out.
  returned: always
  type: str
bytes:
  description: Size of the page.
  returned: always
  type: int
'''

import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import report as jr


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError, UnicodeDecodeError):
        return None


def write_page(module, path, text):
    fd, tmp = tempfile.mkstemp(prefix='.report-', suffix='.html', dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, 'w') as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        module.atomic_move(tmp, path)
        os.chmod(path, 0o644)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            job_id=dict(type='str', required=True),
            job_dir=dict(type='path', required=True),
            dest=dict(type='path'),
            max_points=dict(type='int', default=jr.MAX_POINTS),
            step_regex=dict(type='str', default=''),
        ),
        supports_check_mode=True,
    )
    p = module.params
    job_dir = p['job_dir']
    if not os.path.isdir(job_dir):
        module.fail_json(msg='job %s: its directory %s does not exist (the id is the one train.yml printed when it '
                             'started the job)' % (p['job_id'], job_dir))
    if p['max_points'] < 2:
        module.fail_json(msg='max_points must be at least 2 (the first and the last step), got %d' % p['max_points'])
    dest = p['dest'] or os.path.join(job_dir, jr.PAGE)
    if not os.path.isdir(os.path.dirname(dest) or '.'):
        module.fail_json(msg='dest %s: its directory does not exist' % dest)

    try:
        re.compile(p['step_regex'])
    except re.error as exc:
        module.fail_json(msg='step_regex %r is not a regular expression: %s' % (p['step_regex'], exc))
    progress, events, summary, layout, earlier = jr.read_job(job_dir, p['step_regex'])
    data = jr.job_data(p['job_id'], progress, events, summary, layout, max_points=p['max_points'], earlier=earlier)
    text = jr.render(data, job_dir)
    changed = read_text(dest) != text
    if changed and not module.check_mode:
        try:
            write_page(module, dest, text)
        except (IOError, OSError) as exc:
            module.fail_json(msg='cannot write the report page %s: %s' % (dest, exc))
    module.exit_json(changed=changed, page=dest, ranks=len(data['ranks']), steps=data['summary']['steps'],
                     job_state=data['summary']['state'], loss_points=data['loss']['shown'],
                     loss_steps=data['loss']['steps_logged'], downsampled=data['downsampled'],
                     supervised=events is not None, events=len(events or []), slowest_node=data['slowest']['node'],
                     attempts=len(data['attempts']),
                     bytes=len(text.encode('utf-8')))


if __name__ == '__main__':
    main()
