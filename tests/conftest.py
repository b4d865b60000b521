"""Make the repository importable as ansible_collections.gpucluster.multinode for the tests."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')
LINK = os.path.join(COLLECTIONS, 'ansible_collections', 'gpucluster', 'multinode')

if not os.path.islink(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(ROOT, LINK)
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)

# ansible-core ships a namespace package of the same name; let both portions be found.
import ansible_collections  # noqa: E402

_portion = os.path.join(COLLECTIONS, 'ansible_collections')
if _portion not in list(ansible_collections.__path__):
    ansible_collections.__path__.append(_portion)
