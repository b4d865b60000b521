# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The role variables a cluster-wide one replaced, defined once. Controller only: the inventory contract
refuses one set alone to another value, and the settings checks (python_env, the ray filter) name the
cluster_* variable the user sets instead of the role variable derived from it."""

from __future__ import annotations


# The role variables a cluster-wide one replaced: (role variable, the cluster_* variable the user sets,
# the readers that follow only the cluster-wide one). Each role's own default derives from the cluster_*
# one; the inventory contract refuses the role variable set alone to another value; a problem with one
# names the cluster_* variable (SET_AS).
REPLACED = (
    ('python_env_path', 'cluster_env_path', 'training, health, ray, container, cluster_tests and nccl_env'),
    ('python_env_torch_version', 'cluster_torch_version', 'the training image, training and health'),
    ('python_env_deepspeed_version', 'cluster_deepspeed_version', 'the training image, training and health'),
    ('python_env_ninja_version', 'cluster_ninja_version', 'the training image'),
    ('python_env_packages', 'cluster_python_packages', 'the training image'),
    ('python_env_index_url', 'cluster_pip_index_url', 'ray and the training image'),
    ('python_env_extra_index_urls', 'cluster_pip_extra_index_urls', 'ray and the training image'),
    ('python_env_find_links', 'cluster_pip_find_links', 'ray and the training image'),
    ('python_env_offline', 'cluster_pip_offline', 'ray and the training image'),
    ('python_env_deepspeed_ops', 'cluster_deepspeed_ops', 'the training image and the training preflight'),
    ('python_env_deepspeed_cpu_ops', 'cluster_deepspeed_cpu_ops', 'the training image and the training preflight'),
    ('nccl_env_profile_path', 'cluster_nccl_profile', 'training, health and cluster_tests'),
    ('ssh_trust_uid', 'cluster_user_uid', 'nfs_server and nfs_client'),
    ('ssh_trust_all_to_all', 'cluster_ssh_all_to_all', 'node_tools and the launchers'),
    ('container_runtime', 'cluster_container_runtime', 'site.yml, node_tools, training and health'),
    ('container_user', 'cluster_user', 'training and health'),
    ('ray_user', 'cluster_user', 'health'),
    ('container_image', 'cluster_container_image', 'training and health'),
    ('container_image_digest', 'cluster_container_image_digest', 'training and health'),
    ('container_mounts', 'cluster_container_mounts', 'training'),
    ('ray_enabled', 'cluster_ray_enabled', 'site.yml, the firewall and health'),
    ('ray_port', 'cluster_ray_port', 'the firewall and health'),
    ('ray_dashboard_port', 'cluster_ray_dashboard_port', 'the firewall and health'),
    ('ray_client_server_port', 'cluster_ray_client_server_port', 'the firewall and health'),
)
SET_AS = dict((role_var, cluster_var) for role_var, cluster_var, _readers in REPLACED)
