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

# The programs that supervise a job (roles/training/files/gpucluster_supervise.py, roles/k8s/files/k8s_pod.py)
# import modules of the training package by their file's name: on a node they are installed beside them (the
# training role's __training_supervisor_files, the pods' ConfigMap). Here they are the module_utils themselves,
# loaded under those names (only they: the rest of the package stays out of the programs' reach, as on a node).
import importlib.util  # noqa: E402

for _name in ('supervision', 'flight_recorder'):
    if _name not in sys.modules:
        _spec = importlib.util.spec_from_file_location(
            _name, os.path.join(ROOT, 'plugins', 'module_utils', 'training', _name + '.py'))
        sys.modules[_name] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules[_name])
