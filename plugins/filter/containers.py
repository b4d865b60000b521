# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Container filters: the nodes whose image differs from the reference node's; the extra arguments
of a job's container that conflict with what the collection's command line sets."""

from __future__ import annotations

DOCUMENTATION = r'''
---
name: container_digest_mismatches
short_description: One line per node whose container image differs from the reference node's
version_added: "0.1.0"
description:
  - "Takes C({node: image id or digest}) in node order (a node without the image maps to null) and
    returns one line per node whose image differs from the reference node's (the first node unless
    O(reference) names another), naming the node, the image and both digests, with the remedy."
  - An empty list means every node has the same image.
positional: _input, image
options:
  _input:
    description: Image id or digest per node, the reference node first.
    type: dict
    required: true
  image:
    description: The image reference the lines name.
    type: str
    required: true
  reference:
    description: The node whose image is the reference (default the first one).
    type: str
'''

EXAMPLES = r'''
- name: Show the nodes whose image differs from the head's
  ansible.builtin.debug:
    msg: "{{ {'head': 'sha256:aa..', 'w1': 'sha256:bb..', 'w2': none} | gpucluster.multinode.container_digest_mismatches('train:1') }}"
  # -> node w1: image train:1 is sha256:bb.. but head has sha256:aa..; load the same image ...
  #    node w2: image train:1 is missing (head has sha256:aa..); load it there ...
'''

RETURN = r'''
_value:
  description: One line per node whose image differs (or is missing), naming both digests and the remedy.
  type: list
  elements: str
'''

import json

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import containers as cn
from ansible_collections.gpucluster.multinode.plugins.module_utils import deepspeed_ops


def container_digest_mismatches(digests, image, reference=None):
    if not isinstance(digests, dict):
        raise AnsibleFilterError('container_digest_mismatches takes a dict {node: digest}, got %s'
                                 % type(digests).__name__)
    if reference is not None and reference not in digests:
        raise AnsibleFilterError('container_digest_mismatches: reference node %s is not among %s'
                                 % (reference, ', '.join(digests)))
    return cn.mismatch_lines(digests, image, reference)


def container_extra_args_conflicts(args, runtime, variable='training_container_extra_args', memlock=True):
    """One line per extra argument that conflicts with what the runtime's line sets (the list is
    EXTRA_ARG_CONFLICTS, next to the code that builds the line), naming the variable and why."""
    if args is None:
        return []
    if isinstance(args, str) or not isinstance(args, (list, tuple)):
        raise AnsibleFilterError('container_extra_args_conflicts: %s must be a list of arguments, got %s'
                                 % (variable, type(args).__name__))
    return cn.extra_args_conflicts(str(runtime), args, variable, memlock=bool(memlock))


def container_settings_mismatches(settings, reference):
    """One line per node and variable whose value differs from the reference node's: the cluster
    runs one container runtime and one image, so these are the same on every node. Takes
    {node: {variable: value}} (None: not set on that node)."""
    if not isinstance(settings, dict) or reference not in settings:
        raise AnsibleFilterError('container_settings_mismatches takes {node: {variable: value}} holding the '
                                 'reference node %s' % reference)

    def shown(value):
        return 'not set' if value is None or value == '' else str(value)

    lines = []
    wanted = settings[reference] or {}
    for node, values in settings.items():
        if node == reference:
            continue
        for name in sorted(set(wanted) | set(values or {})):
            mine, theirs = (values or {}).get(name), wanted.get(name)
            if shown(mine) != shown(theirs):
                lines.append('host %s: %s is %s, on %s %s; %s must be the same on every node of the cluster'
                             % (node, name, shown(mine), reference, shown(theirs), name))
    return lines


def container_ops_build_script(wanted):
    """The program the recipe runs to build DeepSpeed's ops into the image (wanted: {accelerator:
    [builder, ...]}, written in its header; the recipe passes the same on its command line)."""
    if not isinstance(wanted, dict):
        raise AnsibleFilterError('container_ops_build_script takes {accelerator: [op builder, ...]}, got %s'
                                 % type(wanted).__name__)
    return '# ops asked for: %s\n' % json.dumps(wanted, sort_keys=True) + deepspeed_ops.image_build_script()


class FilterModule:
    def filters(self):
        return {'container_digest_mismatches': container_digest_mismatches,
                'container_extra_args_conflicts': container_extra_args_conflicts,
                'container_settings_mismatches': container_settings_mismatches,
                'container_ops_build_script': container_ops_build_script}
