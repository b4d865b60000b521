# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The host that supervises training jobs, decided once for site.yml's supervisor step (roles/supervisor,
which prepares it) and train.yml (roles/training, which checks it and starts supervisors there)."""

from __future__ import annotations


class SupervisorHostError(ValueError):
    """The inventory names no host that could supervise the jobs."""


def supervisor_host(groups, setting=None):
    """``supervisor_host`` where the inventory (or -e) sets it, else the first host of the ``supervisor``
    group, else the head. Whether the host is in the inventory is for the caller to check (it names the
    variable in its refusal)."""
    if setting not in (None, ''):
        return str(setting)
    for group in ('supervisor', 'head'):
        hosts = list((groups or {}).get(group) or [])
        if hosts:
            return hosts[0]
    raise SupervisorHostError('the inventory has no head group (and no supervisor group, nor supervisor_host)')
