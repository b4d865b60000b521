# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""NFS export filters: check the cluster export settings, render the exports line."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import nfs_exports

DOCUMENTATION = r'''
---
name: nfs_export_errors
short_description: Problems of the cluster's NFS export settings, one line each naming the variable
version_added: "0.1.0"
description:
  - Checks the export path, the client networks and the options the C(nfs_server) role renders,
    with the syntax rules of C(exportfs) (nfs-utils 2.6) and the cluster's own rules.
  - "Refused: a relative path or C(/); C(*), wildcards, netgroups or host names as clients; a
    network outside or wider than O(cluster_cidr) (unless O(allow_outside)); unknown or
    contradicting options; C(no_root_squash) or C(async) in the options list."
  - The rendered line is parsed back, so what is checked is what is written.
  - Companion filters C(nfs_export_options) (the final option list) and C(nfs_exports_line)
    (the exports(5) line).
positional: _input, clients, options, cluster_cidr
options:
  _input:
    description: The export path.
    type: str
    required: true
  clients:
    description: Client addresses or networks.
    type: list
    elements: str
    required: true
  options:
    description: Extra export options (C(rw), C(insecure), ...).
    type: list
    elements: str
    required: true
  cluster_cidr:
    description: The cluster network every client must lie in.
    type: str
    required: true
  no_root_squash:
    description: Render C(no_root_squash) instead of C(root_squash).
    type: bool
    default: false
  allow_outside:
    description: Allow client networks outside O(cluster_cidr).
    type: bool
    default: false
'''

EXAMPLES = r'''
- name: Fail on a bad export before anything changes
  ansible.builtin.assert:
    that: errors | length == 0
    fail_msg: "{{ errors }}"
  vars:
    errors: "{{ '/shared' | gpucluster.multinode.nfs_export_errors(['192.168.1.0/24'], ['rw'], '192.168.1.0/24') }}"
'''

RETURN = r'''
_value:
  description: One line per problem, starting with the variable at fault; empty when the export is fine.
  type: list
  elements: str
'''


def nfs_export_errors(path, clients, options, cluster_cidr, no_root_squash=False, allow_outside=False):
    try:
        return nfs_exports.export_errors(path, list(clients or []), list(options or []), cluster_cidr,
                                         no_root_squash=bool(no_root_squash), allow_outside=bool(allow_outside))
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError('nfs_export_errors: %s' % exc) from exc


def nfs_export_options(options, no_root_squash=False):
    return nfs_exports.export_options(list(options or []), no_root_squash=bool(no_root_squash))


def nfs_exports_line(path, clients, options):
    return nfs_exports.render_line(path, [str(c) for c in clients], list(options))


class FilterModule:
    def filters(self):
        return {
            'nfs_export_errors': nfs_export_errors,
            'nfs_export_options': nfs_export_options,
            'nfs_exports_line': nfs_exports_line,
        }
