# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filters of the nvidia_driver role: settings checks, package choice, repository answers."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import nvidia_driver


def nvidia_driver_setting_errors(settings):
    """Problems with the nvidia_driver settings, one line each naming the variable."""
    return nvidia_driver.setting_errors(settings)


def nvidia_driver_plan(os_vars, settings, facts=None):
    """Packages (and where from) for this OS, these settings and this node's PCI devices."""
    return nvidia_driver.package_plan(os_vars or {}, settings or {}, facts or {})


def nvidia_driver_offered(stdout, family='apt'):
    """Driver versions (without packaging revision) a repository listing offers, newest first."""
    rows = nvidia_driver.parse_apt_madison(stdout) if family == 'apt' else nvidia_driver.parse_dnf_list(stdout)
    return nvidia_driver.upstream_versions([r[1] for r in rows])


def nvidia_driver_version_offered(offered, pin):
    """Whether the pinned version is among the offered ones."""
    return nvidia_driver.version_offered(pin, offered or [])


def nvidia_driver_reboot_reasons(state):
    """Why a reboot is due after the install (empty: none is)."""
    return nvidia_driver.reboot_reasons(state or {})


def nvidia_driver_mismatches(results):
    """Lines naming the nodes of each driver version, when the nodes do not all run one.

    results: {host: the node's gpu_facts result after the install}."""
    versions = {}
    for host, facts in (results or {}).items():
        facts = facts or {}
        if facts.get('gpu_count'):
            versions[host] = facts.get('driver_version')
    return nvidia_driver.version_mismatches(versions)


class FilterModule:
    def filters(self):
        return {
            'nvidia_driver_setting_errors': nvidia_driver_setting_errors,
            'nvidia_driver_plan': nvidia_driver_plan,
            'nvidia_driver_offered': nvidia_driver_offered,
            'nvidia_driver_version_offered': nvidia_driver_version_offered,
            'nvidia_driver_reboot_reasons': nvidia_driver_reboot_reasons,
            'nvidia_driver_mismatches': nvidia_driver_mismatches,
        }
