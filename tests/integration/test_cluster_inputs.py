"""The cluster-wide inputs several roles read (cluster_env_path, the pins, cluster_nccl_profile,
cluster_user_uid, the package sources, the DeepSpeed ops, the launcher, containers, Ray, ports):
every role's own default follows the one variable, rendered by ansible-playbook
from the roles' own defaults; a role's own variable still wins."""

from __future__ import annotations

import shutil

import pytest
from play_output import role_defaults

ROLES = ['python_env', 'training', 'health', 'cluster_tests', 'ray', 'container', 'nccl_env', 'ssh_trust',
         'nfs_server', 'nfs_client']
ENV = ['python_env_path', 'training_env_path', 'health_python_env_path', 'cluster_tests_env_path', 'ray_env_path',
       'container_env_path', 'nccl_env_python_env_path']
PINS = ['python_env_torch_version', 'python_env_deepspeed_version', 'container_torch_version',
        'container_deepspeed_version', 'training_container_image', 'health_container_image']
PROFILE = ['nccl_env_profile_path', 'training_env_files', 'health_nccl_env_file', 'cluster_tests_env_files']
UID = ['ssh_trust_uid', 'nfs_server_owner_uid', 'nfs_client_owner_uid']

pytestmark = pytest.mark.skipif(shutil.which('ansible-playbook') is None, reason='needs ansible-playbook (make setup)')


def values(tmp_path, extra=None):
    return role_defaults(tmp_path, ROLES, ENV + PINS + PROFILE + UID, extra)


def test_the_defaults_are_the_collections(tmp_path):
    got = values(tmp_path)
    assert {got[n] for n in ENV} == {'/opt/gpucluster/env'}
    assert [got[n] for n in PINS] == ['2.13.0', '0.19.8', '2.13.0', '0.19.8',
                                      'localhost/gpucluster-train:torch2.13.0-ds0.19.8',
                                      'localhost/gpucluster-train:torch2.13.0-ds0.19.8']
    assert got['nccl_env_profile_path'] == got['health_nccl_env_file'] == '/etc/profile.d/gpucluster-nccl.sh'
    assert got['training_env_files'] == got['cluster_tests_env_files'] == ['/etc/profile.d/gpucluster-nccl.sh']
    assert {str(got[n]) for n in UID} == {'2000'}


def test_each_cluster_variable_moves_every_role_that_reads_it_each_role_alone(tmp_path):
    """Each role rendered on its own (train.yml has only the training role: python_env's defaults are
    not there to lean on), so a role that still read another role's variable would not follow."""
    extra = {'cluster_env_path': '/srv/env', 'cluster_torch_version': '2.12.1', 'cluster_deepspeed_version': '0.18.0',
             'cluster_nccl_profile': '/etc/profile.d/site.sh', 'cluster_user_uid': 3000}
    got = {}
    for role in ROLES:
        mine = [n for n in ENV + PINS + PROFILE + UID if n.startswith(role + '_')]
        (tmp_path / role).mkdir()
        got.update(role_defaults(tmp_path / role, [role], mine, extra))
    assert sorted(got) == sorted(ENV + PINS + PROFILE + UID)
    assert {got[n] for n in ENV} == {'/srv/env'}
    assert [got[n] for n in PINS] == ['2.12.1', '0.18.0', '2.12.1', '0.18.0',
                                      'localhost/gpucluster-train:torch2.12.1-ds0.18.0',
                                      'localhost/gpucluster-train:torch2.12.1-ds0.18.0']
    assert got['nccl_env_profile_path'] == got['health_nccl_env_file'] == '/etc/profile.d/site.sh'
    assert got['training_env_files'] == got['cluster_tests_env_files'] == ['/etc/profile.d/site.sh']
    assert {str(got[n]) for n in UID} == {'3000'}


def test_a_roles_own_variable_still_wins(tmp_path):
    got = values(tmp_path, {'cluster_env_path': '/srv/env', 'training_env_path': '/opt/other'})
    assert got['training_env_path'] == '/opt/other' and got['health_python_env_path'] == '/srv/env'


SETTINGS = {
    'cluster_pip_find_links': ['/w'], 'cluster_pip_index_url': 'https://pypi.example/simple',
    'cluster_pip_extra_index_urls': ['https://more.example/simple'], 'cluster_pip_offline': True,
    'cluster_ninja_version': '1.11.1', 'cluster_python_packages': ['transformers==4.57.1'],
    'cluster_deepspeed_ops': ['FusedAdamBuilder'], 'cluster_deepspeed_cpu_ops': ['CPUAdamBuilder'],
    'cluster_ray_enabled': True, 'cluster_ray_port': 7000, 'cluster_ray_dashboard_port': 8300,
    'cluster_ray_client_server_port': 11001, 'cluster_container_runtime': 'podman',
    'cluster_container_image': 'registry.example/train:1', 'cluster_container_image_digest': 'sha256:' + 'a' * 64,
    'cluster_container_mounts': ['/data'], 'cluster_launcher': 'mpirun', 'cluster_deepspeed_launcher': 'openmpi',
    'cluster_ssh_all_to_all': True, 'cluster_bandwidth_port': 5301, 'cluster_nccl_tests_dir': '/opt/nccl-tests',
}
EXPECTED = {
    'python_env': {'python_env_find_links': ['/w'], 'python_env_index_url': 'https://pypi.example/simple',
                   'python_env_extra_index_urls': ['https://more.example/simple'], 'python_env_offline': True,
                   'python_env_ninja_version': '1.11.1', 'python_env_packages': ['transformers==4.57.1'],
                   'python_env_deepspeed_ops': ['FusedAdamBuilder'], 'python_env_deepspeed_cpu_ops': ['CPUAdamBuilder']},
    'container': {'container_wheelhouse': '/w', 'container_pip_index_url': 'https://pypi.example/simple',
                  'container_ninja_version': '1.11.1', 'container_pip_packages': ['transformers==4.57.1'],
                  'container_deepspeed_ops': {'cpu': ['CPUAdamBuilder'], 'cuda': ['FusedAdamBuilder']},
                  'container_runtime': 'podman', 'container_image': 'registry.example/train:1',
                  'container_image_digest': 'sha256:' + 'a' * 64, 'container_mounts': ['/data']},
    'ray': {'ray_find_links': ['/w'], 'ray_index_url': 'https://pypi.example/simple',
            'ray_extra_index_urls': ['https://more.example/simple'], 'ray_offline': True, 'ray_enabled': True,
            'ray_port': 7000, 'ray_dashboard_port': 8300, 'ray_client_server_port': 11001},
    'training': {'training_launcher': 'mpirun', 'training_deepspeed_launcher': 'openmpi',
                 'training_deepspeed_ops': {'cpu': ['CPUAdamBuilder'], 'cuda': ['FusedAdamBuilder']},
                 'training_container_runtime': 'podman', 'training_container_image': 'registry.example/train:1',
                 'training_container_digest': 'sha256:' + 'a' * 64, 'training_container_mounts': ['/data']},
    'health': {'health_ray_enabled': True, 'health_ray_port': 7000, 'health_ray_dashboard_port': 8300,
               'health_container_runtime': 'podman', 'health_container_image': 'registry.example/train:1'},
    'firewall': {'firewall_ray_enabled': True, 'firewall_ray_ports': ['7000', '8300', '11001:11100']},
    'node_tools': {'node_tools_launcher': 'mpirun', 'node_tools_deepspeed_launcher': 'openmpi',
                   'node_tools_pdsh_everywhere': True, 'node_tools_nccl_tests_dir': '/opt/nccl-tests',
                   'node_tools_container_runtime': 'podman'},
    'ssh_trust': {'ssh_trust_all_to_all': True},
    'cluster_tests': {'cluster_tests_bandwidth_port': 5301, 'cluster_tests_nccl_tests_dir': '/opt/nccl-tests'},
    'preflight': {'preflight_head_ports': [{'variable': 'cluster_master_port', 'port': 29500},
                                           {'variable': 'cluster_bandwidth_port', 'port': 5301}]},
}


def test_the_other_cluster_settings_move_every_role_that_reads_them_each_role_alone(tmp_path):
    """Package sources, DeepSpeed ops, launcher, containers, Ray and ports: one cluster_* variable each."""
    for role, wanted in EXPECTED.items():
        (tmp_path / role).mkdir()
        got = role_defaults(tmp_path / role, [role], list(wanted), SETTINGS)
        assert {n: got[n] for n in wanted} == wanted, role


def test_unset_the_settings_are_the_collections(tmp_path):
    got = role_defaults(tmp_path, ['python_env', 'ray', 'training', 'firewall', 'node_tools'],
                        ['python_env_offline', 'python_env_deepspeed_cpu_ops', 'ray_enabled', 'ray_port',
                         'training_launcher', 'training_container_runtime', 'firewall_ray_enabled',
                         'node_tools_pdsh_everywhere'])
    assert got == {'python_env_offline': False, 'python_env_deepspeed_cpu_ops': ['ShareMemCommBuilder'],
                   'ray_enabled': True, 'ray_port': 6379, 'training_launcher': 'deepspeed',
                   'training_container_runtime': 'none', 'firewall_ray_enabled': False,
                   'node_tools_pdsh_everywhere': False}
