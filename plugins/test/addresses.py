# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Jinja tests: ``x is gpucluster.multinode.cidr``, ``ip_address``, ``cidr_overlaps(other)``."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import addresses


class TestModule:
    def tests(self):
        return {
            'cidr': addresses.is_cidr,
            'ip_address': addresses.is_ip,
            'cidr_overlaps': addresses.cidr_overlaps,
        }
