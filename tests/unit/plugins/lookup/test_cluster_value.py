"""A cluster-wide value is read one way: the inventory's cluster_<name>, else the collection's default;
no role may fall back to a literal of its own (it could differ from the next role's)."""

from __future__ import annotations

import os
import re

import pytest
from ansible.errors import AnsibleLookupError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.gpucluster.multinode.plugins.lookup.cluster_value import LookupModule
from ansible_collections.gpucluster.multinode.plugins.module_utils.cluster_defaults import DEFAULTS

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..')


def _run(terms, variables, **kwargs):
    templar = Templar(loader=DataLoader(), variables=variables)
    return LookupModule(loader=DataLoader(), templar=templar).run(terms, variables, **kwargs)


def test_the_inventory_value_wins_and_the_collections_default_fills_in():
    variables = {'cluster_user': 'alice', 'cluster_pip_find_links': ['/srv/wheels']}
    assert _run(['user', 'pip_find_links', 'shared_dir', 'launcher'], variables) == [
        'alice', ['/srv/wheels'], '/shared', 'deepspeed']


def test_a_templated_inventory_value_is_read_templated():
    variables = {'site': 'lab', 'cluster_shared_dir': trust_as_template('/{{ site }}/shared')}
    assert _run(['shared_dir', 'container_mounts'], variables) == ['/lab/shared', ['/lab/shared']]


def test_a_derived_default_follows_the_value_it_derives_from():
    assert _run(['container_mounts'], {}) == [['/shared']]
    assert _run(['container_mounts'], {'cluster_container_mounts': ['/data']}) == [['/data']]


def test_an_opt_in_roles_own_default_and_an_empty_value_counted_unset():
    assert _run(['ray_enabled'], {}, unset=True) == [True]
    assert _run(['ray_enabled'], {'cluster_ray_enabled': False}, unset=True) == [False]
    assert _run(['container_image'], {'cluster_container_image': ''}) == ['']
    assert _run(['container_image'], {'cluster_container_image': ''}, empty_is_unset=True, unset='x') == ['x']


def test_another_hosts_value_is_read_from_its_hostvars():
    variables = {'cluster_master_port': 1, 'hostvars': {'head-1': {'cluster_master_port': 30000}, 'w': {}}}
    assert _run(['master_port'], variables, host='head-1') == [30000]
    assert _run(['master_port'], variables, host='w') == [29500]
    with pytest.raises(AnsibleLookupError, match="host 'nowhere' is not in the inventory"):
        _run(['master_port'], variables, host='nowhere')


def test_an_unknown_name_or_option_fails_naming_it():
    with pytest.raises(AnsibleLookupError, match="no cluster-wide value named 'usr'"):
        _run(['usr'], {})
    with pytest.raises(AnsibleLookupError, match='unknown option'):
        _run(['user'], {}, fallback='x')


def _role_files():
    for top in ('roles', 'playbooks'):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith(('.yml', '.yaml', '.j2')):
                    path = os.path.join(folder, name)
                    with open(path) as f:
                        yield os.path.relpath(path, ROOT), f.read()


# Not cluster-wide values with a default: cluster_cidr is required (a refusal prints what it got), and
# cluster_tests_* are the cluster_tests role's own variables.
NOT_VALUES = re.compile(r'^(cidr|tests_.*)$')


def test_no_role_falls_back_to_a_literal_for_a_cluster_wide_value():
    found = []
    for path, text in _role_files():
        for match in re.finditer(r'(?<![\w.\]])cluster_([a-z0-9_]+)\s*\|\s*default\(', text):
            if not NOT_VALUES.match(match.group(1)):
                found.append('%s: %s' % (path, match.group(0)))
        for match in re.finditer(r"[\w\]]\.cluster_([a-z0-9_]+)\s*\|\s*default\((?!lookup\('gpucluster)", text):
            if not NOT_VALUES.match(match.group(1)):
                found.append('%s: %s' % (path, match.group(0)))
    assert found == [], 'read these through lookup(\'gpucluster.multinode.cluster_value\', ...)'


def test_every_value_the_roles_read_has_a_default():
    names = set()
    for _, text in _role_files():
        names.update(re.findall(r"lookup\('gpucluster\.multinode\.cluster_value', '([a-z0-9_]+)'", text))
    assert names and names - set(DEFAULTS) <= {'container_mounts'}
