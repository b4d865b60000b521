# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""What an offline wheelhouse lacks for a step, from its file names (plugin_utils/wheelhouse.py)."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import wheelhouse

DOCUMENTATION = r'''
name: wheelhouse_missing
short_description: The requirements an offline wheelhouse holds no wheel of
version_added: "0.1.0"
description:
  - Reads each file name as the wheel file name format has it (C(name-version[-build]-python-abi-platform.whl),
    a source archive C(name-version.tar.gz) or C(.zip)), names compared as pip compares them (C(-), C(_) and
    C(.) alike, case ignored), and returns the requirements none satisfies.
  - A requirement C(name==version) needs that version (a local label such as C(+cpu) on the file is taken for
    C(==2.13.0)); C(name) alone, or with another specifier, any version.
  - Companion filter C(wheelhouse_refusal) makes the one line a role fails with.
positional: _input, requirements
options:
  _input:
    description: The file names (or paths) in the wheelhouse directories.
    type: list
    elements: str
    required: true
  requirements:
    description: What the step installs from there, e.g. C(ansible-core==2.19.14), C(jinja2).
    type: list
    elements: str
    required: true
'''

EXAMPLES = r'''
- name: Refuse an offline wheelhouse without the pinned ansible-core
  vars:
    __missing: "{{ listing.files | map(attribute='path') | gpucluster.multinode.wheelhouse_missing(['ansible-core==2.19.14']) }}"
  ansible.builtin.assert:
    that: __missing | length == 0
    fail_msg: "{{ __missing | gpucluster.multinode.wheelhouse_refusal(inventory_hostname, ['/opt/wheelhouse'], 'supervisor') }}"
'''

RETURN = r'''
_value:
  description: The requirements, as given, that no file satisfies; empty when the wheelhouse holds them all.
  type: list
  elements: str
'''


def wheelhouse_missing(filenames, requirements):
    return wheelhouse.missing(filenames, requirements)


def wheelhouse_refusal(lacking, host, directories, step, download=None):
    """One line naming the host, cluster_pip_find_links, its directories, what they lack and how to add it."""
    return wheelhouse.refusal(lacking, host, directories, step, download)


class FilterModule:
    def filters(self):
        return {'wheelhouse_missing': wheelhouse_missing, 'wheelhouse_refusal': wheelhouse_refusal}
