# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The NCCL / gloo / launcher environment of a node: which interface, which variables, how written."""

from __future__ import annotations

import shlex

from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.module_utils import interfaces

DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'


def nccl_interface_for_address(facts, address):
    """Name of the interface holding `address` (IPv4, primary or secondary, or IPv6) in the node's
    facts, or '' when none does. `facts` is ansible_facts (interfaces + one entry per interface)."""
    return interfaces.interface_for_address(address, interfaces.from_facts(facts)) or ''


def nccl_environment(mode, ifname, debug='WARN', ib_hca='', ib_gid_index=3, net_gdr_level='PHB',
                     ib_timeout=22, socket_nthreads=4, nsocks_perthread=4, async_error_handling=True,
                     master_addr=None, master_port=None, ds_accelerator='', extra=None):
    """Ordered variables of one node: NCCL transport, gloo, error handling, rendezvous, extras last."""
    if mode not in ('tcp', 'rdma'):
        raise AnsibleFilterError('nccl_environment: mode must be tcp or rdma, not %r' % (mode,))
    if not ifname:
        raise AnsibleFilterError('nccl_environment: no socket interface name given')
    env = {}  # insertion-ordered: the profile lists the variables in this order
    env['NCCL_DEBUG'] = str(debug)
    env['NCCL_SOCKET_IFNAME'] = str(ifname)
    env['GLOO_SOCKET_IFNAME'] = str(ifname)
    if mode == 'tcp':
        env['NCCL_IB_DISABLE'] = '1'
    else:
        if not ib_hca:
            raise AnsibleFilterError('nccl_environment: rdma mode needs the RDMA devices (ib_hca)')
        env['NCCL_IB_DISABLE'] = '0'
        env['NCCL_IB_HCA'] = ','.join(ib_hca) if isinstance(ib_hca, (list, tuple)) else str(ib_hca)
        if ib_gid_index not in (None, ''):  # None: NCCL chooses the GID (the k8s role's default)
            env['NCCL_IB_GID_INDEX'] = str(ib_gid_index)
        env['NCCL_NET_GDR_LEVEL'] = str(net_gdr_level)
        env['NCCL_IB_TIMEOUT'] = str(ib_timeout)
    env['NCCL_SOCKET_NTHREADS'] = str(socket_nthreads)
    env['NCCL_NSOCKS_PERTHREAD'] = str(nsocks_perthread)
    env['TORCH_NCCL_ASYNC_ERROR_HANDLING'] = '1' if async_error_handling in (True, 1, '1', 'true', 'True') else '0'
    if master_addr:
        env['MASTER_ADDR'] = str(master_addr)
    if master_port:
        env['MASTER_PORT'] = str(master_port)
    if ds_accelerator:
        env['DS_ACCELERATOR'] = str(ds_accelerator)
    for key, value in (extra or {}).items():
        env[str(key)] = str(value)
    return env


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
