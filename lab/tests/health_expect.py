#!/usr/bin/env python3
"""Assert what a health report says about one planted fault (used by health_faults.sh).

    health_expect.py REPORT.json RC healthy
    health_expect.py REPORT.json RC NODE CHECK STATUS REMEDY_SUBSTRING

healthy: the play exited 0 and no record is a failure.
A fault: the play exited non-zero, NODE's CHECK record has STATUS and a remedy containing
REMEDY_SUBSTRING, and no other node fails that check (the culprit is named, not the bystanders).
"""

from __future__ import annotations

import json
import sys


def main(argv):
    report_file, rc = argv[1], int(argv[2])
    with open(report_file) as f:
        report = json.load(f)
    records = report['records']
    fails = [r for r in records if r['status'] == 'fail']
    if argv[3] == 'healthy':
        problems = []
        if rc != 0:
            problems.append('the play exited %d' % rc)
        problems.extend('unexpected failure: %s %s: %s' % (r['node'], r['check'], r['detail']) for r in fails)
        return problems
    node, check, status, remedy = argv[3:7]
    problems = []
    if rc == 0:
        problems.append('the play exited 0 although %s %s should be %s' % (node, check, status))
    mine = [r for r in records if r['node'] == node and r['check'] == check]
    if not mine:
        problems.append('no %s record for %s (records: %s)' % (check, node, sorted(set((r['node'], r['check']) for r in records if r['node'] == node))))
    for r in mine:
        if r['status'] != status:
            problems.append('%s %s is %s, not %s: %s' % (node, check, r['status'], status, r['detail']))
        if remedy not in (r['remedy'] or ''):
            problems.append('%s %s remedy %r does not say %r' % (node, check, r['remedy'], remedy))
        print('found: %s %s %s value=%s threshold=%s | %s | remedy: %s'
              % (r['status'].upper(), node, check, r['value'], r['threshold'], r['detail'], r['remedy']))
    others = [r for r in fails if r['node'] != node and r['check'] == check]
    problems.extend('bystander %s also fails %s: %s' % (r['node'], check, r['detail']) for r in others)
    return problems


if __name__ == '__main__':
    found = main(sys.argv)
    for p in found:
        print('PROBLEM: ' + p)
    sys.exit(1 if found else 0)
