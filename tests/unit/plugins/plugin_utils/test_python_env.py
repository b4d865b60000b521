"""Parsing what the environment probe and pip print, comparing nodes, checking settings."""

import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import python_env

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'python_env')


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


def versions(name):
    return env_versions.parse_probe_output(fixture(name))


def test_equal_nodes_have_no_mismatch_and_one_line_each():
    info = versions('cpu-deepspeed-0.19.8.txt')
    infos = {'lab-head': info, 'lab-worker-1': dict(info)}
    assert python_env.version_mismatches(infos) == []
    assert python_env.versions_line('lab-head', info) == (
        'lab-head  torch 2.13.0+cpu  torch_cuda -  torch_nccl -  nccl_wheel -  deepspeed 0.19.8  python 3.11.7')


def test_ray_is_shown_only_where_installed():
    info = dict(versions('cpu-deepspeed-0.19.8.txt'), ray='2.50.0')
    assert '  ray 2.50.0  python 3.11.7' in python_env.versions_line('n1', info)


def test_a_new_node_without_ray_is_no_python_env_mismatch_but_another_torch_is():
    """Ray comes from the ray role (site.yml's ray step): python_env compares what it installs."""
    info = versions('cpu-deepspeed-0.19.8.txt')
    grown = {'alpha': dict(info, ray='2.60.0'), 'bravo-2': dict(info, ray='2.60.0'), 'echo': dict(info)}
    assert python_env.version_mismatches(grown) == []
    grown['echo']['torch'] = '2.12.0+cpu'
    assert python_env.version_mismatches(grown) == ['torch differs: 2.12.0+cpu on echo; 2.13.0+cpu on alpha, bravo-2']


def test_differing_nodes_are_named():
    info = versions('cpu-deepspeed-0.19.8.txt')
    other = dict(info, deepspeed='0.18.0')
    cuda = versions('cuda-h100-torch-2.11.txt')
    problems = python_env.version_mismatches({'n1': info, 'n2': info, 'n3': other})
    assert problems == ['deepspeed differs: 0.18.0 on n3; 0.19.8 on n1, n2']
    problems = python_env.version_mismatches({'n1': info, 'n2': cuda})
    assert 'torch_cuda differs: 13.0 on n2; None on n1' in problems
    assert 'torch_nccl differs: 2.28.9 on n2; None on n1' in problems
    assert 'python differs: 3.11.7 on n1; 3.12.3 on n2' in problems


def test_pip_index_versions_output():
    offered = python_env.parse_index_versions(fixture('pip-index-versions-torch.txt'))
    assert offered == ['2.13.0+cpu']
    assert python_env.version_offered('2.13.0', offered)
    assert python_env.version_offered('2.13.0+cpu', offered)
    assert not python_env.version_offered('2.13.1', offered)
    assert not python_env.version_offered('2.1', offered)
    assert python_env.parse_index_versions(fixture('pip-index-versions-none.txt')) == []


@pytest.mark.parametrize('out, err, changed', [
    ('Requirement already satisfied: torch==2.13.0 in ./lib/python3.11/site-packages (2.13.0+cpu)\n', '', False),
    ('Processing /opt/wheelhouse/hjson-3.1.0-py3-none-any.whl\nSuccessfully installed deepspeed-0.19.8 hjson-3.1.0\n', '', True),
    ('Would install deepspeed-0.19.8 hjson-3.1.0\n', '', True),
    ('', 'Audited 3 packages in 4ms\n', False),
    ('', 'Resolved 3 packages in 10ms\nInstalled 3 packages in 40ms\n', True),
])
def test_install_change_detection(out, err, changed):
    assert python_env.install_changed(out, err) is changed


GOOD = {'python_env_backend': 'venv', 'python_env_installer': 'pip', 'python_env_path': '/opt/gpucluster/env',
        'python_env_torch_version': '2.13.0', 'python_env_deepspeed_version': '0.19.8',
        'python_env_ninja_version': '1.13.2', 'python_env_packages': ['transformers==4.57.1'],
        'python_env_offline': False, 'python_env_find_links': [], 'python_env_conda_installer_url': '',
        'python_env_conda_installer_file': '', 'python_env_conda_installer_sha256': '',
        'python_env_conda_prefix': '/opt/gpucluster/miniforge'}


def test_good_settings_have_no_errors():
    assert python_env.setting_errors(GOOD) == []


@pytest.mark.parametrize('change, message', [
    ({'python_env_path': 'env'}, 'cluster_env_path must be an absolute path'),
    ({'python_env_torch_version': 'latest'}, 'cluster_torch_version must be a version'),
    ({'python_env_packages': ['transformers']}, "cluster_python_packages entry 'transformers' is not pinned"),
    ({'python_env_offline': True}, 'cluster_pip_offline needs cluster_pip_find_links'),
    ({'python_env_backend': 'conda', 'python_env_conda_installer_url': 'https://x/Miniforge3.sh'},
     'python_env_conda_installer_sha256 must be the 64 hex digit sha256'),
    ({'python_env_backend': 'conda', 'python_env_conda_installer_sha256': 'a' * 64},
     'needs exactly one of python_env_conda_installer_url and python_env_conda_installer_file'),
])
def test_bad_settings_name_the_variable(change, message):
    errors = python_env.setting_errors(dict(GOOD, **change))
    assert len(errors) == 1 and message in errors[0]


def test_lines_of_several_nodes_line_up():
    from ansible_collections.gpucluster.multinode.plugins.filter.python_env import python_env_lines
    info = versions('cpu-deepspeed-0.19.8.txt')
    lines = python_env_lines({'lab-head': info, 'lab-worker-1': info})
    assert [line.index('torch') for line in lines] == [14, 14]
    assert lines[1].startswith('lab-worker-1  torch 2.13.0+cpu')


def test_filters_take_the_results_as_argument():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.gpucluster.multinode.plugins.filter.python_env import python_env_mismatches
    info = versions('cpu-deepspeed-0.19.8.txt')
    assert python_env_mismatches({'a': info, 'b': dict(info, torch='2.12.0+cpu')}) == [
        'torch differs: 2.12.0+cpu on b; 2.13.0+cpu on a']
    with pytest.raises(AnsibleFilterError, match='expected {host: versions}'):
        python_env_mismatches(['a', 'b'])
