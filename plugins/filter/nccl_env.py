# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The NCCL / gloo / launcher environment of a node: which interface, which variables, how written."""

from __future__ import annotations

import shlex

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import interfaces
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.nccl_env import nccl_environment

DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'


def nccl_interface_for_address(facts, address):
    """Name of the interface holding `address` (IPv4, primary or secondary, or IPv6) in the node's
    facts, or '' when none does. `facts` is ansible_facts (interfaces + one entry per interface)."""
    return interfaces.interface_for_address(address, interfaces.from_facts(facts)) or ''


def nccl_profile_script(env, path_dir=''):
    """Body of /etc/profile.d/gpucluster-nccl.sh: the env's bin first on PATH, then the exports."""
    lines = []
    if path_dir:
        q = shlex.quote(str(path_dir))
        lines.append('case ":$PATH:" in *:%s:*) ;; *) PATH=%s:$PATH ;; esac' % (str(path_dir), q))
        lines.append('export PATH')
    for key, value in env.items():
        lines.append('export %s=%s' % (key, shlex.quote(str(value))))
    return '\n'.join(lines) + '\n'


def nccl_deepspeed_env(env, path_dir='', base_path=DEFAULT_PATH, leave_out=()):
    """Lines of ~/.deepspeed_env (KEY=VALUE; the launcher quotes them): PATH first, then env."""
    lines = []
    if path_dir:
        lines.append('PATH=%s:%s' % (path_dir, base_path))
    for key, value in env.items():
        if key in leave_out:
            continue
        if '\n' in str(value):
            raise AnsibleFilterError('nccl_deepspeed_env: %s holds a newline' % key)
        lines.append('%s=%s' % (key, value))
    return '\n'.join(lines) + '\n'


class FilterModule:
    def filters(self):
        return {
            'nccl_interface_for_address': nccl_interface_for_address,
            'nccl_environment': nccl_environment,
            'nccl_profile_script': nccl_profile_script,
            'nccl_deepspeed_env': nccl_deepspeed_env,
        }
