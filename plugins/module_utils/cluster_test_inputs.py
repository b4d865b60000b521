# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Inputs of the cluster tests, checked before anything starts: message sizes, thresholds and
the pairs of nodes of a bandwidth test.

Every check raises ClusterTestError with one message that names the variable (and the host
where there is one).
"""

from __future__ import annotations

import re

from ansible_collections.gpucluster.multinode.plugins.module_utils import netbench
from ansible_collections.gpucluster.multinode.plugins.module_utils.hostfile import type_name

_SIZE_RE = re.compile(r'^\s*(?P<number>\d+)\s*(?P<unit>[KMGkmg])?(?:i?B)?\s*$')
_UNITS = {None: 1, 'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}


class ClusterTestError(ValueError):
    """Bad input for a cluster test; the message names the variable (and the host)."""


def _where(label, host=None):
    return 'host %s: %s' % (host, label) if host else label


def parse_size(value, label='size', host=None):
    """Bytes from 1048576, '1048576', '1M', '64K', '1GiB' (K/M/G are powers of 1024, as in nccl-tests)."""
    where = _where(label, host)
    if isinstance(value, bool):
        raise ClusterTestError('%s must be a size in bytes (like 1048576 or 1M), got %r (bool)' % (where, value))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and _SIZE_RE.match(value):
        m = _SIZE_RE.match(value)
        number = int(m.group('number')) * _UNITS[(m.group('unit') or '').upper() or None]
    else:
        raise ClusterTestError('%s must be a size in bytes (like 1048576 or 1M), got %r (%s)'
                               % (where, value, type_name(value)))
    if number <= 0:
        raise ClusterTestError('%s must be above 0 bytes, got %r' % (where, value))
    return number


def check_sizes(values, label='sizes', host=None, multiple_of=1):
    """A non-empty, strictly increasing list of sizes in bytes (each a multiple of multiple_of)."""
    where = _where(label, host)
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise ClusterTestError('%s must be a list of message sizes, got %r (%s)' % (where, values, type_name(values)))
    if not values:
        raise ClusterTestError('%s is empty; give at least one message size, e.g. [1M, 64M]' % where)
    sizes = []
    for index, value in enumerate(values):
        size = parse_size(value, '%s[%d]' % (label, index), host)
        if size % multiple_of:
            raise ClusterTestError('%s[%d] %r is not a multiple of %d bytes (one float32 element)'
                                   % (where, index, value, multiple_of))
        if sizes and size <= sizes[-1]:
            raise ClusterTestError('%s must be increasing: %s[%d] = %d bytes does not exceed %s[%d] = %d bytes'
                                   % (where, label, index, size, label, index - 1, sizes[-1]))
        sizes.append(size)
    return sizes


def check_positive(value, label, host=None, allow_none=True):
    """A number above 0 (int, float or a numeric string); None passes when allow_none."""
    where = _where(label, host)
    if value is None or (isinstance(value, str) and value.strip() == '' and allow_none):
        if allow_none:
            return None
        raise ClusterTestError('%s is required (a number above 0)' % where)
    number = None
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or number != number:
        raise ClusterTestError('%s must be a positive number, got %r (%s)' % (where, value, type_name(value)))
    if number <= 0:
        raise ClusterTestError('%s must be a positive number, got %r' % (where, value))
    return number


def check_thresholds(thresholds, sizes, label='thresholds', host=None):
    """{size_bytes: min busbw GB/s} from a dict keyed by sizes (1048576 or '1M'); keys must be tested sizes."""
    where = _where(label, host)
    if thresholds is None:
        return {}
    if not isinstance(thresholds, dict):
        raise ClusterTestError('%s must be a dict of message size to minimum busbw in GB/s, got %r (%s)'
                               % (where, thresholds, type_name(thresholds)))
    out = {}
    for key, value in thresholds.items():
        size = parse_size(key, '%s key' % label, host)
        if size not in sizes:
            raise ClusterTestError('%s: size %r (%d bytes) is not one of the sizes tested (%s)'
                                   % (where, key, size, ', '.join(str(s) for s in sizes)))
        out[size] = check_positive(value, '%s[%s]' % (label, key), host, allow_none=False)
    return out


def plan_pairs(nodes, pairs=None, schedule='round_robin'):
    """Rounds of disjoint pairs to test.

    nodes: the node names, head first. pairs: None (every pair) or a list of two-name lists;
    each name must be one of nodes. schedule: round_robin (disjoint pairs at the same time, N-1
    rounds for N even) or sequential (one pair per round, for comparison).
    Returns {'nodes': [...], 'rounds': [[[a, b], ...], ...], 'pairs': n}.
    """
    if schedule not in ('round_robin', 'sequential'):
        raise ClusterTestError("schedule must be round_robin or sequential, got %r" % (schedule,))
    nodes = list(nodes)
    if len(nodes) < 2:
        raise ClusterTestError('a bandwidth test needs at least 2 nodes, got %d (%s)'
                               % (len(nodes), ', '.join(nodes) or 'none'))
    if pairs is None or pairs == []:
        rounds = netbench.round_robin(nodes)
    else:
        if isinstance(pairs, (str, dict)) or not isinstance(pairs, (list, tuple)):
            raise ClusterTestError('pairs must be a list of [node, node] pairs, got %r (%s)'
                                   % (pairs, type_name(pairs)))
        wanted = []
        for index, pair in enumerate(pairs):
            if isinstance(pair, str) or not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ClusterTestError('pairs[%d] must be a list of two node names, got %r' % (index, pair))
            for name in pair:
                if name not in nodes:
                    raise ClusterTestError('pairs[%d] names %s, which is not a node of the inventory (%s)'
                                           % (index, name, ', '.join(nodes)))
            if pair[0] == pair[1]:
                raise ClusterTestError('pairs[%d] pairs %s with itself' % (index, pair[0]))
            key = frozenset(pair)
            if key in [frozenset(p) for p in wanted]:
                raise ClusterTestError('pairs[%d] %s-%s is listed twice' % (index, pair[0], pair[1]))
            wanted.append(list(pair))
        used = [n for n in nodes if any(n in p for p in wanted)]
        rounds = []
        for rnd in netbench.round_robin(used) if len(used) >= 2 else []:
            kept = [p for p in rnd if frozenset(p) in [frozenset(w) for w in wanted]]
            if kept:
                rounds.append(kept)
        nodes = used
    if schedule == 'sequential':
        rounds = [[pair] for rnd in rounds for pair in rnd]
    return {'nodes': nodes, 'rounds': rounds, 'pairs': sum(len(r) for r in rounds)}
