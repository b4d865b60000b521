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
