# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Health records: one check on one node, its status, and the order of the statuses.

A record::

    {'node': 'gpu-worker-2', 'check': 'version.torch', 'status': 'fail',
     'value': '2.12.0', 'threshold': '== 2.13.0 (3 of 4 nodes)',
     'detail': 'torch 2.12.0 here, 2.13.0 on gpu-master, gpu-worker-1, gpu-worker-3',
     'remedy': 'reinstall the environment on gpu-worker-2: site.yml --tags python_env --limit gpu-worker-2'}

Status is one of ok, warn, fail, unknown (could not be measured: GPUs declared but unreadable, a node
that reports no version) and n/a (does not apply to what the inventory declares for the node, e.g. the
GPU checks of a node with gpu_slots 0; its detail says why). A run whose checks are all ok or n/a is ok."""

from __future__ import annotations

STATUSES = ('ok', 'warn', 'fail', 'unknown', 'n/a')
# Worst first when several findings make one record; n/a weighs no more than ok.
_SEVERITY = {'n/a': 0, 'ok': 0, 'unknown': 1, 'warn': 2, 'fail': 3}
# Prometheus gauge value of a status (documented in docs/health.md).
PROM_STATUS_VALUE = {'ok': 0, 'warn': 1, 'fail': 2, 'unknown': 3, 'n/a': 4}

TIERS = ('quick', 'deep')


def record(node, check, status, value=None, threshold=None, detail='', remedy=''):
    """One record; the remedy is kept only when the status is neither ok nor n/a (its detail says why)."""
    if status not in STATUSES:
        raise ValueError('unknown status %r' % status)
    return dict([('node', node), ('check', check), ('status', status), ('value', value),
                 ('threshold', threshold), ('detail', detail),
                 ('remedy', remedy if status not in ('ok', 'n/a') else '')])


def worst(statuses):
    """The overall status: the most severe of statuses; ok for none, and when each is ok or n/a."""
    statuses = list(statuses)
    found = max(statuses, key=lambda s: _SEVERITY[s]) if statuses else 'ok'
    return 'ok' if found == 'n/a' else found


def fmt(v):
    """A value as the summary and the details show it: '-' for none, a float to 3 decimals."""
    if v is None:
        return '-'
    if isinstance(v, float):
        return ('%.3f' % v).rstrip('0').rstrip('.')
    return str(v)
