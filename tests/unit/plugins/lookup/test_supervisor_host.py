"""The supervisor host is decided once: supervisor_host where the inventory or -e sets it, else the supervisor
group's host, else the head; site.yml's supervisor step (its role default) and train.yml read the same."""

from __future__ import annotations

import os

import pytest
import yaml
from ansible.errors import AnsibleLookupError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.gpucluster.multinode.plugins.lookup.supervisor_host import LookupModule

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')
GROUPS = {'head': ['gpu-master'], 'workers': ['gpu-worker-1'], 'cluster': ['gpu-master', 'gpu-worker-1']}


def _run(groups, host_vars=None, host='gpu-master'):
    # the task's variables hold the host's (what the templar of a real run sees), and its hostvars
    variables = dict(host_vars or {}, groups=groups, inventory_hostname=host, hostvars={host: dict(host_vars or {})})
    templar = Templar(loader=DataLoader(), variables=variables)
    return LookupModule(loader=DataLoader(), templar=templar).run([], variables)


def test_the_supervisor_is_supervisor_host_else_the_supervisor_group_else_the_head():
    assert _run(GROUPS) == ['gpu-master']
    assert _run(dict(GROUPS, supervisor=[])) == ['gpu-master']
    assert _run(dict(GROUPS, supervisor=['admin-box'])) == ['admin-box']
    assert _run(dict(GROUPS, supervisor=['admin-box']), {'supervisor_host': 'gpu-worker-1'}) == ['gpu-worker-1']
    # templated in the inventory, read templated
    assert _run(GROUPS, {'site_admin': 'gpu-worker-1', 'supervisor_host': trust_as_template('{{ site_admin }}')}) == [
        'gpu-worker-1']
    with pytest.raises(AnsibleLookupError, match='no head group'):
        _run({'workers': ['w']})


def test_site_yml_and_train_yml_take_the_supervisor_host_from_it():
    with open(os.path.join(ROOT, 'roles', 'supervisor', 'defaults', 'main.yml')) as handle:
        assert yaml.safe_load(handle)['supervisor_host'] == "{{ lookup('gpucluster.multinode.supervisor_host') }}"
    with open(os.path.join(ROOT, 'roles', 'training', 'tasks', 'validate.yml')) as handle:
        facts = [t['ansible.builtin.set_fact'] for t in yaml.safe_load(handle) if 'ansible.builtin.set_fact' in t]
    assert [f['__training_supervisor_host'] for f in facts if '__training_supervisor_host' in f] == [
        "{{ lookup('gpucluster.multinode.supervisor_host') }}"]
