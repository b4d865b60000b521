# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A failure policy, read and checked: which kinds of failure restart a supervised job (counted against its
restarts or not) and which fail it at once, as JobSet's failurePolicy rules say it. The same rules on every
platform: the training role's training_failure_policy (the supervisor over SSH and Slurm) and the k8s cluster
file's train.failure_policy (pod 0's agent); the supervision core applies them (supervision.policy_action).

A rule: {on: [kinds], exit_codes: [codes] (with on: [exit] only), action: restart, restart_uncounted or fail};
the first rule whose `on` names a failure's kind (and whose exit_codes, where given, hold its code) decides; no
rule: restart, counted."""

from __future__ import annotations

# what a supervisor names a failure (supervision.failure_kind), and a stall (supervision.stall): every platform's
KINDS = ('exit', 'signal', 'unreachable', 'restarted', 'stalled')
ACTIONS = ('restart', 'restart_uncounted', 'fail')
RULE = ('on', 'exit_codes', 'action')


class PolicyError(ValueError):
    """A bad rule: field (the variable and the rule's place in it) and what is wrong."""

    def __init__(self, field, text):
        super().__init__('%s %s' % (field, text))
        self.field, self.text = field, text


def _kind(value):
    return 'null' if value is None else type(value).__name__


def read(value, field, kinds=KINDS):
    """The rules of a policy in order ({on, exit_codes, action} each), or PolicyError naming the field."""
    if not isinstance(value, list):
        raise PolicyError(field, 'must be a list of rules, got %r (%s)' % (value, _kind(value)))
    rules = []
    for index, item in enumerate(value):
        where = '%s[%d]' % (field, index)
        if isinstance(item, dict) and True in item and 'on' not in item:
            # YAML 1.1 (PyYAML, Ansible's from_yaml) reads a bare key `on` as the boolean true
            item = {('on' if k is True else k): v for k, v in item.items()}
        if not isinstance(item, dict):
            raise PolicyError(where, 'must be a mapping, got %r (%s)' % (item, _kind(item)))
        unknown = sorted(str(k) for k in item if k not in RULE)
        if unknown:
            raise PolicyError('%s.%s' % (where, unknown[0]), 'is not a field of a rule (known: %s)'
                              % ', '.join(sorted(RULE)))
        if 'on' not in item or 'action' not in item:
            raise PolicyError(where, 'needs on (%s) and action (%s)' % (', '.join(kinds), ', '.join(ACTIONS)))
        on = item['on'] if isinstance(item['on'], list) else [item['on']]
        if not on:
            raise PolicyError(where + '.on', 'is empty')
        for kind in on:
            if kind not in kinds:
                raise PolicyError(where + '.on', 'must be %s, got %r' % (' or '.join(kinds), kind))
        codes = item.get('exit_codes', [])
        if not isinstance(codes, list):
            raise PolicyError(where + '.exit_codes', 'must be a list of exit codes, got %r (%s)' % (codes, _kind(codes)))
        for i, code in enumerate(codes):
            if isinstance(code, bool) or not isinstance(code, int):
                raise PolicyError('%s.exit_codes[%d]' % (where, i), 'must be a whole number from 1 to 255, got %r (%s)'
                                  % (code, _kind(code)))
            if not 1 <= code <= 255:
                raise PolicyError('%s.exit_codes[%d]' % (where, i), 'must be from 1 to 255, got %d' % code)
        if codes and on != ['exit']:
            raise PolicyError(where + '.exit_codes', 'apply to exit failures only: set on: [exit]')
        if item['action'] not in ACTIONS:
            raise PolicyError(where + '.action', 'must be %s, got %r' % (' or '.join(ACTIONS), item['action']))
        rules.append({'on': on, 'exit_codes': list(codes), 'action': item['action']})
    return rules
