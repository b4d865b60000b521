# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The first failing rank's own error, from the tracebacks every node's log shows (the ``errors`` that
training_job state=status and training_progress with logs return, module_utils/training/rank_errors.py), and the
lines that put it first in status, watch and logs. Controller only: the training filters use it."""

from __future__ import annotations

TAIL_LINES = 8


def node_errors(results, hosts=None):
    """[(node, error)] of every node's results in their order: an error read from the head's pdsh lines
    belongs to the node it names (its 'node'), any other to the node whose log showed it."""
    out = []
    for index, result in enumerate(results or []):
        if not isinstance(result, dict):
            continue
        node = result.get('node') or (hosts[index] if hosts and index < len(hosts) else None)
        for error in result.get('errors') or []:
            if isinstance(error, dict) and error.get('error'):
                out.append((error.get('node') or node, error))
    return out


def first_error(errors, failed, order=None, rank_failure=None):
    """The first failing rank's own error: {node, error, rank, lines, ...} or None.

    errors: [(node, error)] (node_errors); failed: the failed nodes, the culprit first (training_verdict's
    failed_nodes). The culprit's root error (the one torchrun's report names first, else its earliest);
    when the culprit's log shows only follow-on errors (a peer's connection closed, ...), the earliest root
    error of any node (failed nodes first, in their order); else the culprit's last traceback.
    rank_failure: the launcher's report of the first failed rank (its rank fills an error that names none)."""
    if not errors:
        return None
    failed = list(failed or [])
    ranked = failed + [n for n in (order or []) if n not in failed]
    ranked += [n for n, _ in errors if n not in ranked]
    order_of = dict((n, i) for i, n in enumerate(ranked))
    indexed = [(order_of.get(node, len(ranked)), i, node, e) for i, (node, e) in enumerate(errors)]
    culprit = failed[0] if failed else None
    mine = [item for item in indexed if item[2] == culprit]
    roots = [item for item in mine if not item[3].get('follow_on')]
    if rank_failure and rank_failure.get('rank') is not None:
        # the rank the launcher's report names first: its own error before another rank's of the same node
        roots = sorted(roots, key=lambda item: item[3].get('rank') not in (None, rank_failure['rank']))
    roots = sorted(roots, key=lambda item: not item[3].get('root_cause'))
    if roots:
        chosen = roots[0]
    else:
        others = sorted((item for item in indexed if not item[3].get('follow_on')),
                        key=lambda item: (item[0], item[3].get('line') or 0, item[1]))
        chosen = others[0] if others else (mine[-1] if mine else None)
    if chosen is None:
        return None
    error = dict(chosen[3], node=chosen[2])
    if error.get('rank') is None and rank_failure and rank_failure.get('rank') is not None \
            and chosen[2] == culprit and not error.get('follow_on'):
        error['rank'] = rank_failure['rank']
    return error


def failure_lines(error, exit_codes=None, culprit=None):
    """'first failure: <node> rank <r> (exit N): <Type: message>' and the traceback's last lines; a
    culprit without any traceback is named as such."""
    codes = exit_codes or {}
    if not error:
        if not culprit:
            return []
        return ['first failure: %s (exit %s): no Python traceback in its log' % (culprit, codes.get(culprit, '?'))]
    node = error.get('node')
    who = node if error.get('rank') is None else '%s rank %s' % (node, error['rank'])
    head = 'first failure: %s (exit %s): %s' % (who, codes.get(node, '?'), error['error'])
    if error.get('follow_on'):
        head += ' (a follow-on: %s; no rank logged an error of its own)' % error.get('why', 'another rank failed')
    lines = [head]
    tail = [line for line in error.get('lines') or [] if line.strip()]
    lines.extend('  ! ' + line for line in tail[-TAIL_LINES:])
    return lines
