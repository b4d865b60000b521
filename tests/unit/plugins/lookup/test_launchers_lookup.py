"""The launchers, declared once (module_utils/training/launchers.py): the module's choices, the role's argument
spec, the role's validation and node_tools all take them from there."""

from __future__ import annotations

import os

import pytest
import yaml
from ansible.errors import AnsibleLookupError

from ansible_collections.gpucluster.multinode.plugins.lookup.launchers import LookupModule
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import launchers
from ansible_collections.gpucluster.multinode.plugins.modules import training_job

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')


def _spec(role):
    with open(os.path.join(ROOT, 'roles', role, 'meta', 'argument_specs.yml')) as f:
        return yaml.safe_load(f)['argument_specs']['main']['options']


def test_every_launcher_is_declared_with_what_it_needs_on_the_nodes():
    found = {d['name']: d for d in LookupModule().run([], {})}
    assert list(found) == ['deepspeed', 'torchrun', 'mpirun', 'slurm']
    assert found['deepspeed']['tools'] == ['pdsh'] and found['deepspeed']['uses_ssh']
    assert found['mpirun']['tools'] == ['openmpi'] and found['mpirun']['uses_ssh']
    assert found['torchrun']['tools'] == [] and found['torchrun']['per_node']
    assert found['slurm']['options'] == ['slurm_partition', 'slurm_time', 'slurm_gpus_per_node', 'slurm_cpus_per_task']


def test_deepspeed_over_open_mpi_needs_open_mpi_instead_of_pdsh():
    assert LookupModule().run(['deepspeed'], {}, deepspeed_launcher='openmpi')[0]['tools'] == ['openmpi']


def test_an_unknown_launcher_fails_naming_the_known_ones():
    with pytest.raises(AnsibleLookupError, match=r"training_launcher must be deepspeed, torchrun, mpirun, slurm \(got 'srun'\)"):
        LookupModule().run(['srun'], {})


def test_the_role_spec_and_the_module_documentation_offer_the_declared_launchers():
    spec = _spec('training')
    doc = yaml.safe_load(training_job.DOCUMENTATION)['options']
    assert sorted(spec['training_launcher']['choices']) == sorted(launchers.LAUNCHERS)
    assert sorted(doc['launcher']['choices']) == sorted(launchers.LAUNCHERS)
    assert spec['training_deepspeed_launcher']['choices'] == list(launchers.DEEPSPEED_LAUNCHERS)
    assert doc['deepspeed_launcher']['choices'] == list(launchers.DEEPSPEED_LAUNCHERS)


def test_every_option_a_launcher_reads_alone_is_a_module_option():
    doc = yaml.safe_load(training_job.DOCUMENTATION)['options']
    for name, cls in launchers.LAUNCHERS.items():
        assert set(cls.options) <= set(doc), name
