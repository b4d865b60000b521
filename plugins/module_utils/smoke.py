# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""One node's part of the distributed smoke test (the ``smoke`` module): check the input,
run the ``smoke.py`` script of the cluster_tests role with this node's ranks, and read
its one result; when the node did not get through, the likelier cause found on the node (its
socket interface does not hold its cluster address) replaces what the library said.
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpucluster.multinode.plugins.module_utils import interfaces
from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes
from ansible_collections.gpucluster.multinode.plugins.module_utils.node_commands import (
    json_lines,
    node_environment,
    tail,
)

MARKER = 'GPUCLUSTER_DIST_CHECK '
MAX_SLOTS = cluster_defaults.MAX_SLOTS


class SmokeError(ValueError):
    """Bad input or a node that cannot run the check; the message names the host."""


def check_input(p):
    """The node's place: {'index', 'slots', 'world', 'first_rank'}; raises SmokeError."""
    node, nodes = p['node'], p['nodes']
    if node not in nodes:
        raise SmokeError('host %s: node %s is not in nodes (%s)' % (node, node, ', '.join(nodes)))
    if len(set(nodes)) != len(nodes):
        raise SmokeError('host %s: nodes lists a node twice: %s' % (node, ', '.join(nodes)))
    slots = p.get('slots') or [1] * len(nodes)
    if len(slots) != len(nodes):
        raise SmokeError('host %s: slots gives %d count(s) for %d node(s); give one per node, in the order of nodes'
                         % (node, len(slots), len(nodes)))
    for name, count in zip(nodes, slots):
        if not 1 <= count <= MAX_SLOTS:
            raise SmokeError('host %s: slots of node %s must be from 1 to %d, got %d' % (node, name, MAX_SLOTS, count))
    if not 1 <= p['master_port'] <= 65535:
        raise SmokeError('host %s: master_port must be from 1 to 65535, got %d' % (node, p['master_port']))
    if not 5 <= p['timeout'] <= 3600:
        raise SmokeError('host %s: timeout must be from 5 to 3600 seconds, got %d' % (node, p['timeout']))
    index = nodes.index(node)
    return {'index': index, 'slots': list(slots), 'world': sum(slots), 'first_rank': sum(slots[:index])}


def script_command(p, place, timeout_bin=None):
    """The script's command line, bounded by timeout(1) when there is one (2 min over its own)."""
    command = [p['python'], p['script'], '--nodes', json.dumps(p['nodes']), '--slots', json.dumps(place['slots']),
               '--node-index', str(place['index']), '--master-addr', p['master_addr'],
               '--master-port', str(p['master_port']), '--backend', p['backend'], '--timeout', str(p['timeout'])]
    if timeout_bin:
        command = [timeout_bin, '-k', '10', str(p['timeout'] + 120)] + command
    return command


def read_result(base, rc, out, err, iface_problem=None):
    """The node's result from the script's output (its last JSON line), or why there is none."""
    found = json_lines(out, MARKER)
    result = dict(base, ok=False, stage='start', cause=None, error=None)
    if found:
        result.update(found[-1])
    else:
        result['cause'] = 'the check did not run (exit %d)' % rc
        result['error'] = tail(err or out, 3)
    if iface_problem and not result.get('ok'):
        result['cause'] = iface_problem  # the likelier cause than what the library said
    if not result.get('ok'):
        result['output'] = tail(out + '\n' + err)
    return result


def run(module, p):
    """Check the input, run the script with this node's ranks, return the module's result."""
    place = check_input(p)
    node = p['node']
    base = {'node': node, 'rank': place['first_rank'], 'slots': place['slots'][place['index']],
            'world_size': place['world'], 'backend': p['backend'], 'joined_store': False,
            'rendezvous': '%s:%d' % (p['master_addr'], p['master_port'])}
    if module.check_mode:
        # the environment and the script may come with this same run: nothing to probe yet
        return dict(base, ok=True, stage='skipped', cause=None, error=None, socket_ifname=None)
    if not os.access(p['python'], os.X_OK):
        raise SmokeError('host %s: python %s does not exist; install torch first (the python_env role)'
                         % (node, p['python']))
    if not os.path.isfile(p['script']):
        raise SmokeError('host %s: script %s does not exist (copied by roles/cluster_tests/tasks/smoke.yml)'
                         % (node, p['script']))
    if place['index'] == 0:
        users = processes.port_listeners(p['master_port'])
        if users:
            raise SmokeError('host %s: %s (the rendezvous port, master_port)'
                             % (node, processes.describe_listeners(p['master_port'], users)))
    env = node_environment(module, p['env_files'], p['env'])
    if p['socket_ifname']:
        env['GLOO_SOCKET_IFNAME'] = p['socket_ifname']
        env['NCCL_SOCKET_IFNAME'] = p['socket_ifname']
    ifname = env.get('GLOO_SOCKET_IFNAME' if p['backend'] == 'gloo' else 'NCCL_SOCKET_IFNAME', '')
    iface_problem = None
    if ifname:
        iface_problem = interfaces.socket_interface_problem(ifname, p['address'], interfaces.read_interfaces(module))
    rc, out, err = module.run_command(script_command(p, place, module.get_bin_path('timeout')), environ_update=env)
    result = read_result(base, rc, out, err, iface_problem)
    result.update(node=node, socket_ifname=ifname)
    return result
