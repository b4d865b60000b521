"""The lab's tests use the same set-up as the collection's: the repository importable as
ansible_collections.gpucluster.multinode (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_load('gpucluster_tests_conftest', os.path.join(ROOT, 'tests', 'conftest.py'))
