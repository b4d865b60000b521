"""The cluster-wide inputs several roles read (cluster_env_path, the pins, cluster_nccl_profile,
cluster_user_uid): every role's own default follows the one variable, rendered by ansible-playbook
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
