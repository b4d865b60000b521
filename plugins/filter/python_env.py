# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filters over the versions python_env_info reports on each node."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import python_env


def _versions(by_host):
    if not hasattr(by_host, 'items'):
        raise AnsibleFilterError('expected {host: versions} (the python_env_info results\' versions), got %s'
                                 % type(by_host).__name__)
    return dict((str(h), dict(v or {})) for h, v in by_host.items())


def python_env_lines(by_host):
    """One line per node with its versions; by_host is {host: python_env_info's versions}."""
    infos = _versions(by_host)
    width = max([len(h) for h in infos] or [0])
    return [python_env.versions_line(h, v, width) for h, v in infos.items()]


def python_env_mismatches(by_host):
    """One line per version that differs between the nodes, naming the nodes; by_host as above."""
    return python_env.version_mismatches(_versions(by_host))


def python_env_index_versions(stdout):
    """Versions `pip index versions` lists."""
    return python_env.parse_index_versions(stdout)


def python_env_version_offered(offered, wanted):
    """True when the pinned version (local label allowed, e.g. +cpu) is among the offered ones."""
    return python_env.version_offered(wanted, offered)


def python_env_setting_errors(settings):
    """Problems with the python_env settings, one line each naming the variable."""
    return python_env.setting_errors(settings)


def python_env_install_changed(result):
    """Whether a pip/uv install (or its --dry-run) installed, or would install, anything."""
    return python_env.install_changed((result or {}).get('stdout', ''), (result or {}).get('stderr', ''))


def python_env_mask_credentials(value):
    """A text, or a list of texts, with the credentials of every URL in it masked."""
    mask = python_env.mask_credentials
    return [mask(v) for v in value] if isinstance(value, (list, tuple)) else mask(value)


class FilterModule:
    def filters(self):
        return {
            'python_env_lines': python_env_lines,
            'python_env_mismatches': python_env_mismatches,
            'python_env_index_versions': python_env_index_versions,
            'python_env_version_offered': python_env_version_offered,
            'python_env_setting_errors': python_env_setting_errors,
            'python_env_install_changed': python_env_install_changed,
            'python_env_mask_credentials': python_env_mask_credentials,
        }
