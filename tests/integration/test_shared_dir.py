"""One cluster_shared_dir: the NFS export and mount, the jobs, images and hostfiles directories, the
containers' mounts and the health check follow it, rendered by ansible-playbook from the roles' own
defaults; a role's own variable still wins."""

from __future__ import annotations

import shutil

import pytest
from play_output import role_defaults

ROLES = ['nfs_server', 'nfs_client', 'training', 'container', 'health', 'nccl_env']
NAMES = ['nfs_server_export_path', 'nfs_client_path', 'nfs_client_export', 'training_jobs_dir', 'container_images_dir',
         'container_mounts', 'training_container_mounts', 'health_shared_path', 'nccl_env_hostfiles_dir']

pytestmark = pytest.mark.skipif(shutil.which('ansible-playbook') is None, reason='needs ansible-playbook (make setup)')


def paths(tmp_path, extra=None):
    return role_defaults(tmp_path, ROLES, NAMES, extra)


def test_the_default_is_slash_shared(tmp_path):
    got = paths(tmp_path)
    assert got == {'nfs_server_export_path': '/shared', 'nfs_client_path': '/shared', 'nfs_client_export': '/shared',
                   'training_jobs_dir': '/shared/jobs', 'container_images_dir': '/shared/images',
                   'container_mounts': ['/shared'], 'training_container_mounts': ['/shared'],
                   'health_shared_path': '/shared', 'nccl_env_hostfiles_dir': '/shared/cluster'}


def test_a_filer_at_data_moves_every_path_with_one_variable(tmp_path):
    got = paths(tmp_path, {'cluster_shared_dir': '/data'})
    assert got == {'nfs_server_export_path': '/data', 'nfs_client_path': '/data', 'nfs_client_export': '/data',
                   'training_jobs_dir': '/data/jobs', 'container_images_dir': '/data/images',
                   'container_mounts': ['/data'], 'training_container_mounts': ['/data'],
                   'health_shared_path': '/data', 'nccl_env_hostfiles_dir': '/data/cluster'}


def test_a_roles_own_variable_still_wins(tmp_path):
    got = paths(tmp_path, {'cluster_shared_dir': '/data', 'training_jobs_dir': '/scratch/jobs'})
    assert got['training_jobs_dir'] == '/scratch/jobs' and got['nfs_client_path'] == '/data'
