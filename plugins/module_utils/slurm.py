# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Reading what Slurm's commands print: scontrol's one-line records, sinfo, sacct, srun's errors.

Pure functions, unit tested on outputs recorded from Slurm 22.05 (Debian 12's slurm-wlm).
"""

from __future__ import annotations

import re

# States in which a job still holds (or waits for) its nodes.
ACTIVE_STATES = ('PENDING', 'CONFIGURING', 'RUNNING', 'COMPLETING', 'SUSPENDED', 'REQUEUED', 'RESIZING', 'SIGNALING',
                 'STAGE_OUT', 'STOPPED')


def parse_oneline(text):
    """{key: value} of one `scontrol show <entity> -o` record (first line). Values that hold spaces
    (Reason=..., Command=...) keep them: a new key starts only at ' Key='."""
    line = (text or '').strip().splitlines()[0] if (text or '').strip() else ''
    out = {}
    for match in re.finditer(r'(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=(.*?)(?=\s[A-Za-z][A-Za-z0-9_/:]*=|\s*$)', line):
        out[match.group(1)] = match.group(2)
    return out


def exit_status(value):
    """(exit code, signal) from Slurm's 'code:signal' form; (None, None) when unreadable."""
    code, _, sig = str(value or '').partition(':')
    if not code.strip().isdigit():
        return None, None
    return int(code), int(sig) if sig.strip().isdigit() else 0


def job_state(record):
    """{state, exit_code, signal, nodes, reason} of a job from its `scontrol show job -o` record.

    exit_code is the batch script's; a job killed by a signal reports 128 + signal, as a shell would."""
    state = (record.get('JobState') or '').split()[0] or None
    code, sig = exit_status(record.get('ExitCode'))
    if code is not None and sig:
        code = 128 + sig if code == 0 else code
    return {'state': state, 'exit_code': code, 'signal': sig or None, 'nodes': record.get('NodeList'),
            'reason': record.get('Reason')}


def sacct_state(text):
    """{state, exit_code} from `sacct -n -P -X -o State,ExitCode` (first line); None when empty."""
    for line in (text or '').splitlines():
        if '|' in line:
            state, _, code = line.strip().partition('|')
            exit_code, sig = exit_status(code)
            if exit_code is not None and sig:
                exit_code = 128 + sig if exit_code == 0 else exit_code
            return {'state': state.split()[0], 'exit_code': exit_code}
    return None


def partitions(text):
    """Partition names from `sinfo -h -o %R` (one per line)."""
    return [line.strip().rstrip('*') for line in (text or '').splitlines() if line.strip()]


SRUN_ERROR_RE = re.compile(r'^srun: error: (?P<node>[^:\s]+): tasks? (?P<tasks>[0-9,\-]+): (?P<what>.+?)\s*$', re.M)


def srun_failures(text):
    """[(node, exit code, what)] in the order srun reported them ('srun: error: NODE: task N: Exited with
    exit code 1', '...: Killed', '...: Terminated'). A signal counts as 128 + its number."""
    signals = {'Killed': 137, 'Terminated': 143, 'Aborted': 134, 'Segmentation fault': 139}
    out = []
    for match in SRUN_ERROR_RE.finditer(text or ''):
        what = match.group('what')
        code = re.search(r'exit code (\d+)', what)
        value = int(code.group(1)) if code else signals.get(what.split(' (')[0], 1)
        out.append((match.group('node'), value, what))
    return out


# ---------------------------------------------------------------- a requeued job (supervision)
# Reasons a pending job shows once held: scontrol requeuehold (its own text, spaces or underscores), a
# user's hold, an administrator's.
HELD_REASONS = ('job requeued in held state', 'job_requeued_in_held_state', 'JobHeldUser', 'JobHeldAdmin')


def is_held(record):
    """A pending job that waits, held, for a release (`scontrol show job -o` record)."""
    state = (record.get('JobState') or '').split()[0] if record.get('JobState') else ''
    return state == 'PENDING' and (record.get('Reason') or '').strip() in HELD_REASONS


def restarts(record):
    """How many times Slurm requeued the job (Restarts=); 0 when absent."""
    value = str(record.get('Restarts') or '0').strip()
    return int(value) if value.isdigit() else 0


_RANGE_RE = re.compile(r'^(?P<prefix>[^\[\]]*)\[(?P<ranges>[^\]]+)\](?P<suffix>.*)$')


def hostlist(text):
    """Node names of a Slurm host list (`node[01-03,7],gpu-a`); [] for empty, '(null)' or 'None'."""
    text = (text or '').strip()
    if text in ('', '(null)', 'None'):
        return []
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char == '['
        depth -= char == ']'
        if char == ',' and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    out = []
    for part in (p.strip() for p in parts if p.strip()):
        match = _RANGE_RE.match(part)
        if not match:
            out.append(part)
            continue
        for item in match.group('ranges').split(','):
            low, _, high = item.partition('-')
            if not high:
                out.append(match.group('prefix') + low + match.group('suffix'))
                continue
            for number in range(int(low), int(high) + 1):
                out.append('%s%0*d%s' % (match.group('prefix'), len(low), number, match.group('suffix')))
    return out


def requeue_update(slurm_id, nodes, excluded):
    """The scontrol update that puts a held, requeued job on nodes (in full: NumNodes and ReqNodeList),
    with excluded kept out of it (ExcNodeList; a node cannot be both), eligible at once (StartTime=now: Slurm
    makes a requeued job wait about two minutes before it may start again, 121 s on the lab's Slurm 22.05)."""
    # NumNodes as min-max (a min alone leaves the max the job was submitted with), NumTasks with it (one task,
    # a torchrun agent, per node: the count sbatch derived at submission would not fit fewer nodes)
    argv = ['scontrol', 'update', 'JobId=%s' % slurm_id, 'NumNodes=%d-%d' % (len(nodes), len(nodes)),
            'NumTasks=%d' % len(nodes), 'ReqNodeList=%s' % ','.join(nodes), 'StartTime=now']
    excluded = [n for n in excluded if n not in nodes]
    if excluded:
        argv.append('ExcNodeList=%s' % ','.join(excluded))
    return argv


# ---------------------------------------------------------------- draining nodes (health playbook)

_REASON_STAMP = re.compile(r'\s*\[[^\]@]*@[^\]]*\]\s*$')


def node_records(text):
    """{node name: {'states': [...], 'reason': str}} from `scontrol show node -o` (one line per node).

    States are the parts of State= (IDLE+DRAIN -> ['IDLE', 'DRAIN']); the reason loses the
    '[user@time]' stamp Slurm adds and is '' when there is none ('Reason=(null)' or absent)."""
    nodes = {}
    for line in (text or '').splitlines():
        if 'NodeName=' not in line:
            continue
        rec = parse_oneline(line)
        name = rec.get('NodeName')
        if not name:
            continue
        reason = _REASON_STAMP.sub('', rec.get('Reason') or '').strip()
        if reason in ('(null)', 'none'):
            reason = ''
        nodes[name] = {'states': [st for st in (rec.get('State') or '').split('+') if st], 'reason': reason}
    return nodes


def is_drained(record):
    """Drained or draining (DRAIN among the states; sinfo calls these drng/drain)."""
    return 'DRAIN' in (record.get('states') or [])


def drain_plan(records, failing, checked, prefix, max_pct=50.0):
    """What to do with Slurm's nodes after a health run.

    records: node_records(); failing: {node: reason text} of the nodes with a failed check;
    checked: the nodes this run judged. A failing node is drained with the reason
    '<prefix> <reason>'; a checked node that is healthy again is resumed only if its drain reason
    starts with prefix (so nodes an administrator drained are never resumed). When more than
    max_pct percent of the checked nodes fail, nothing is drained (a fault of the cluster, not of
    its nodes, such as the head or the network) and 'held' says why.

    Returns {'drain': [(node, reason)], 'resume': [node], 'kept': [node], 'foreign': [node],
    'not_in_slurm': [node], 'held': str}."""
    plan = {'drain': [], 'resume': [], 'kept': [], 'foreign': [], 'not_in_slurm': [], 'held': ''}
    checked = list(checked)
    prefix = prefix.strip()

    def ours(rec):
        return rec['reason'].startswith(prefix)

    to_drain = []
    for node in checked:
        rec = records.get(node)
        if node in failing:
            if rec is None:
                plan['not_in_slurm'].append(node)
            elif not is_drained(rec):
                to_drain.append((node, ('%s %s' % (prefix, failing[node])).strip()))
            elif ours(rec):
                plan['kept'].append(node)
            else:
                plan['foreign'].append(node)
        elif rec is not None and is_drained(rec):
            if ours(rec):
                plan['resume'].append(node)
            else:
                plan['foreign'].append(node)
    failing_known = [n for n in checked if n in failing and n in records]
    if checked and 100.0 * len(failing_known) / len(checked) > float(max_pct):
        plan['held'] = ('%d of %d node(s) failed, more than %s%%: nothing drained (likely a fault of the cluster '
                        'rather than of these nodes)' % (len(failing_known), len(checked), _num(max_pct)))
    else:
        plan['drain'] = to_drain
    return plan


def _num(value):
    value = float(value)
    return ('%d' % value) if value == int(value) else ('%g' % value)
