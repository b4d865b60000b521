# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The NCCL / gloo / launcher variables of a node, in order: shared by the nccl_environment filter and the
k8s_manifests action (the ConfigMap of the pods)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


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
