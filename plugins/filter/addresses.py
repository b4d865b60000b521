# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Address filter (cidr_network) over plugin_utils/addresses, on Python's ipaddress module."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import addresses


def _wrap(func):
    def inner(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ValueError as exc:
            raise AnsibleFilterError(str(exc)) from exc
    inner.__name__ = func.__name__
    inner.__doc__ = func.__doc__
    return inner


class FilterModule:
    def filters(self):
        return {
            'cidr_network': _wrap(addresses.cidr_network),
        }
