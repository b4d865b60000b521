# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Health records: one check on one node, its status, and the order of the statuses.

A record::

    {'node': 'gpu-worker-2', 'check': 'version.torch', 'status': 'fail',
     'value': '2.12.0', 'threshold': '== 2.13.0 (3 of 4 nodes)',
     'detail': 'torch 2.12.0 here, 2.13.0 on gpu-master, gpu-worker-1, gpu-worker-3',
     'remedy': 'reinstall the environment on gpu-worker-2: site.yml --tags python_env --limit gpu-worker-2'}

Status is one of ok, warn, fail, unknown (unknown: could not be measured, e.g. no GPU)."""

from __future__ import annotations

STATUSES = ('ok', 'warn', 'fail', 'unknown')
# Worst first when several findings make one record.
_SEVERITY = {'ok': 0, 'unknown': 1, 'warn': 2, 'fail': 3}
# Prometheus gauge value of a status (documented in the README).
PROM_STATUS_VALUE = {'ok': 0, 'warn': 1, 'fail': 2, 'unknown': 3}

TIERS = ('quick', 'deep')


def record(node, check, status, value=None, threshold=None, detail='', remedy=''):
    """One record; the remedy is kept only when the status is not ok."""
    if status not in STATUSES:
        raise ValueError('unknown status %r' % status)
    return dict([('node', node), ('check', check), ('status', status), ('value', value),
                 ('threshold', threshold), ('detail', detail),
                 ('remedy', remedy if status != 'ok' else '')])


def worst(statuses):
    """The most severe of statuses (ok for none)."""
    statuses = list(statuses)
    return max(statuses, key=lambda s: _SEVERITY[s]) if statuses else 'ok'


def fmt(v):
    """A value as the summary and the details show it: '-' for none, a float to 3 decimals."""
    if v is None:
        return '-'
    if isinstance(v, float):
        return ('%.3f' % v).rstrip('0').rstrip('.')
    return str(v)
