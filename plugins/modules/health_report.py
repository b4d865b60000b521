#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: health_report
short_description: Write a health report (JSON, JUnit XML, Prometheus textfile) and keep its history
description:
  - With O(state=validated), only makes sure O(report_dir) exists and can be written, so a bad
    directory is refused before any check runs.
  - With O(state=present), writes the run's records as a JSON report under
    O(report_dir)/history (the last O(keep) of each tier are kept), C(latest-<tier>.json), a JUnit
    XML file C(junit-<tier>.xml) and a Prometheus textfile for node_exporter's textfile collector,
    and says what changed since the previous report of the same tier.
  - With O(html), also C(latest-<tier>.html), the report as one self-contained page (no server, no
    network, no script) - every check of every node coloured by status, what failed with its remedy,
    and what changed since the previous report.
  - Every file is written to a temporary file in its directory and moved into place.
version_added: 0.1.0
author: gpucluster.multinode contributors (!UNKNOWN)
extends_documentation_fragment: [gpucluster.multinode.attributes.no_diff]
options:
  state:
    description: C(validated) checks the directory only; C(present) writes the report.
    type: str
    choices: [validated, present]
    default: present
  report_dir:
    description: Directory of the reports and their history.
    type: path
    required: true
  records:
    description:
      - The records (node, check, status, value, threshold, detail, remedy).
      - The status is C(ok), C(warn), C(fail), C(unknown) (could not be measured) or C(n/a) (does not
        apply to what the inventory declares for the node; the detail says why). A run whose checks
        are all C(ok) or C(n/a) is ok.
    type: list
    elements: dict
    default: []
  tier:
    description: The tier the records belong to.
    type: str
    choices: [quick, deep]
    default: quick
  keep:
    description: Reports of this tier kept in the history.
    type: int
    default: 50
  started:
    description: When the run started (ISO 8601); default now.
    type: str
    default: ""
  cluster:
    description: A name for the cluster in the report.
    type: str
    default: ""
  prometheus_file:
    description: The Prometheus textfile; default O(report_dir)/gpucluster_health_<tier>.prom; C(none) writes none.
    type: str
    default: ""
  junit:
    description: Write C(junit-<tier>.xml).
    type: bool
    default: true
  html:
    description: Write C(latest-<tier>.html), the report as a page to open in a browser.
    type: bool
    default: true
  change_drop_pct:
    description: A bandwidth that fell by more than this percent since the last run is listed as a change.
    type: float
    default: 20
attributes:
  check_mode:
    support: full
    details: In check mode nothing is written; the summary and the changes are still returned.
    description: Can run in check mode and return changed status prediction without modifying the node.
'''

EXAMPLES = r'''
- name: Refuse an unwritable report directory before any check
  gpucluster.multinode.health_report:
    state: validated
    report_dir: /var/lib/gpucluster/health

- name: Write the report on the head
  gpucluster.multinode.health_report:
    report_dir: /var/lib/gpucluster/health
    tier: quick
    records: "{{ records }}"
    keep: 50
  register: report
'''

RETURN = r'''
report_file:
  description: The JSON report of this run in the history.
  returned: state is present
  type: str
  sample: /var/lib/gpucluster/health/history/quick-20261123T051500Z.json
files:
  description: Every file written.
  returned: state is present
  type: list
  elements: str
changes:
  description: What changed since the previous report of the tier (empty on the first run).
  returned: state is present
  type: list
  elements: str
  sample: ["gpu-worker-2 version.torch: ok -> fail (2.13.0 -> 2.12.0)"]
html_file:
  description: The page of this run (C(latest-<tier>.html)); empty when O(html) is false.
  returned: state is present
  type: str
  sample: /var/lib/gpucluster/health/latest-quick.html
previous_report:
  description: The previous report compared with, or null.
  returned: state is present
  type: str
summary:
  description: The human summary table, one line per element.
  returned: state is present
  type: list
  elements: str
counts:
  description: Records per status.
  returned: state is present
  type: dict
  sample: {ok: 60, warn: 1, fail: 1, unknown: 0, "n/a": 4}
removed:
  description: Old history files removed beyond O(keep).
  returned: state is present
  type: list
  elements: str
'''

import datetime
import glob
import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_page
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_records
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_reports


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


def _write(module, path, text):
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix='.health-', dir=directory)
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        module.atomic_move(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _ensure_dir(module, path):
    try:
        if not os.path.isdir(path):
            if module.check_mode:
                parent = os.path.dirname(path.rstrip('/')) or '/'
                while not os.path.isdir(parent):
                    parent = os.path.dirname(parent.rstrip('/')) or '/'
                if not os.access(parent, os.W_OK):
                    raise OSError(13, 'Permission denied (cannot create it under %s)' % parent)
                return
            os.makedirs(path, 0o755)
        fd, tmp = tempfile.mkstemp(prefix='.health-write-test-', dir=path)
        os.close(fd)
        os.unlink(tmp)
    except (IOError, OSError) as exc:
        module.fail_json(msg='report directory %s cannot be written: %s' % (path, exc.strerror or exc), report_dir=path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type='str', choices=['validated', 'present'], default='present'),
            report_dir=dict(type='path', required=True),
            records=dict(type='list', elements='dict', default=[]),
            tier=dict(type='str', choices=list(health_records.TIERS), default='quick'),
            keep=dict(type='int', default=50),
            started=dict(type='str', default=''),
            cluster=dict(type='str', default=''),
            prometheus_file=dict(type='str', default=''),
            junit=dict(type='bool', default=True),
            html=dict(type='bool', default=True),
            change_drop_pct=dict(type='float', default=20),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p['keep'] < 1:
        module.fail_json(msg='keep must be at least 1, got %d' % p['keep'])
    rdir = p['report_dir']
    _ensure_dir(module, rdir)
    if p['state'] == 'validated':
        module.exit_json(changed=False, report_dir=rdir)

    for r in p['records']:
        if r.get('status') not in health_records.STATUSES:
            module.fail_json(msg='record %s/%s has status %r, not one of %s'
                             % (r.get('node'), r.get('check'), r.get('status'), ', '.join(health_records.STATUSES)))
    now = _now()
    stamp = now.strftime('%Y%m%dT%H%M%S') + '%03dZ' % (now.microsecond // 1000)
    report = health_reports.make_report(p['records'], p['tier'], p['started'] or now.isoformat(), now.isoformat(), p['cluster'])

    hdir = os.path.join(rdir, 'history')
    old = sorted(glob.glob(os.path.join(hdir, '%s-*.json' % p['tier'])))
    previous, previous_file = None, None
    for cand in reversed(old):
        try:
            with open(cand) as f:
                previous = json.load(f)
            previous_file = cand
            break
        except (IOError, OSError, ValueError):
            continue
    changes = health_reports.changes_since(previous, report, p['change_drop_pct'])
    report['changes'] = changes
    report['previous_report'] = previous_file
    summary = health_reports.summary_lines(p['records'], changes if previous is not None else None)

    report_file = os.path.join(hdir, '%s-%s.json' % (p['tier'], stamp))
    files = [report_file, os.path.join(rdir, 'latest-%s.json' % p['tier'])]
    junit_file = os.path.join(rdir, 'junit-%s.xml' % p['tier']) if p['junit'] else None
    prom = p['prometheus_file'] or os.path.join(rdir, 'gpucluster_health_%s.prom' % p['tier'])
    prom = None if prom == 'none' else prom
    html_file = os.path.join(rdir, health_page.page_name(p['tier'])) if p['html'] else ''
    removed = []
    if not module.check_mode:
        try:
            if not os.path.isdir(hdir):
                os.makedirs(hdir, 0o755)
            text = health_reports.dumps(report)
            _write(module, report_file, text)
            _write(module, files[1], text)
            if junit_file:
                _write(module, junit_file, health_reports.junit_xml(p['records'], p['tier'], now.isoformat()))
                files.append(junit_file)
            if prom:
                if not os.path.isdir(os.path.dirname(prom)):
                    os.makedirs(os.path.dirname(prom), 0o755)
                _write(module, prom, health_reports.prometheus_text(p['records'], p['tier'], now.timestamp()))
                files.append(prom)
            if html_file:
                _write(module, html_file, health_page.render(report))
                files.append(html_file)
            kept = sorted(glob.glob(os.path.join(hdir, '%s-*.json' % p['tier'])))
            for stale in kept[:-p['keep']]:
                os.unlink(stale)
                removed.append(stale)
        except (IOError, OSError) as exc:
            module.fail_json(msg='cannot write the health report under %s: %s' % (rdir, exc))
    module.exit_json(changed=not module.check_mode, report_file=report_file, files=files, changes=changes,
                     html_file=html_file, previous_report=previous_file, summary=summary, counts=report['counts'],
                     removed=removed)


if __name__ == '__main__':
    main()
