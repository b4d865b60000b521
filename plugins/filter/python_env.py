# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filters over the versions python_env_info reports on each node."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.module_utils import python_env


def _infos(hosts, hostvars, var):
    return dict((h, (hostvars[h].get(var) or {})) for h in hosts)


def python_env_lines(hosts, hostvars, var='__python_env_info'):
    """One line per node with its versions."""
    width = max([len(str(h)) for h in hosts] or [0])
    return [python_env.versions_line(h, i, width) for h, i in _infos(hosts, hostvars, var).items()]


def python_env_mismatches(hosts, hostvars, var='__python_env_info'):
    """One line per version that differs between the nodes, naming the nodes."""
    return python_env.version_mismatches(_infos(hosts, hostvars, var))


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


class FilterModule:
    def filters(self):
        return {
            'python_env_lines': python_env_lines,
            'python_env_mismatches': python_env_mismatches,
            'python_env_index_versions': python_env_index_versions,
            'python_env_version_offered': python_env_version_offered,
            'python_env_setting_errors': python_env_setting_errors,
            'python_env_install_changed': python_env_install_changed,
        }
