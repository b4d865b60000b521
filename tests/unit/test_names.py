"""One name per concept: the old playbook and module names still work and point at the new ones."""

from __future__ import annotations

import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RENAMED_PLAYBOOKS = {'dist_check': 'smoke', 'network_test': 'bandwidth', 'nccl_test': 'collective'}
RENAMED_MODULES = {'dist_check': 'smoke', 'net_bandwidth': 'bandwidth', 'nccl_test': 'collective'}


@pytest.mark.parametrize('old,new', sorted(RENAMED_PLAYBOOKS.items()))
def test_an_old_playbook_name_imports_the_new_playbook(old, new):
    with open(os.path.join(ROOT, 'playbooks', old + '.yml')) as f:
        plays = yaml.safe_load(f)
    assert [play.get('ansible.builtin.import_playbook') for play in plays] == [new + '.yml']
    assert os.path.isfile(os.path.join(ROOT, 'playbooks', new + '.yml'))


@pytest.mark.parametrize('old,new', sorted(RENAMED_MODULES.items()))
def test_an_old_module_name_redirects_with_a_deprecation(old, new):
    with open(os.path.join(ROOT, 'meta', 'runtime.yml')) as f:
        routing = yaml.safe_load(f)['plugin_routing']['modules']
    assert routing[old]['redirect'] == 'gpucluster.multinode.' + new
    assert routing[old]['deprecation']['removal_version']
    assert os.path.isfile(os.path.join(ROOT, 'plugins', 'modules', new + '.py'))
    assert not os.path.exists(os.path.join(ROOT, 'plugins', 'modules', old + '.py'))


def test_no_plugin_file_is_named_like_a_test():
    found = [os.path.join(d, n) for d, _, names in os.walk(os.path.join(ROOT, 'plugins'))
             for n in names if n.endswith('_test.py') or n.startswith('test_')]
    assert found == []
