# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations


class ModuleDocFragment:
    """Attributes shared by the modules (extends_documentation_fragment: gpucluster.multinode.attributes.X)."""

    DOCUMENTATION = r'''
options: {}
'''

    # A module that only reads the node: the same in check mode, nothing to show as a diff.
    READ_ONLY = r'''
options: {}
attributes:
  check_mode:
    support: full
    details: Only reads; runs the same in check mode.
    description: Can run in check mode and return changed status prediction without modifying the node.
  diff_mode:
    support: none
    description: Returns no diff (nothing it changes is a file to compare).
'''

    # A module that runs on POSIX nodes only (processes, sockets, /proc).
    POSIX = r'''
options: {}
attributes:
  platform:
    platforms: posix
    description: The nodes it runs on.
    support: full
'''

    # A module whose changes are no file to compare: no diff.
    NO_DIFF = r'''
options: {}
attributes:
  diff_mode:
    support: none
    description: Returns no diff (nothing it changes is a file to compare).
'''
