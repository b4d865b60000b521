#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: ray_preflight
short_description: Checks before a Ray cluster starts - ports free on the head, the head reachable from a worker
description:
  - On the head, O(ports) names the processes listening on each port, leaving out the node's own
    Ray service (the processes in the cgroup of O(unit)); a port held by anything else is a problem.
    Where the module cannot tie a socket to its process (root without CAP_SYS_PTRACE, as in a
    container), a socket of the unit's account while the unit has processes counts as the unit's.
  - On the head, O(hold_port) opens that port (when it is free) in a detached listener for at most
    O(hold_seconds), so that the workers can test that they reach it before Ray runs. Any number
    of connections may come (a worker's Ray that still tries to reach an earlier head counts for
    nothing); the listener leaves when O(release_port) is given in a later call on the head, or
    at the end of O(hold_seconds).
  - O(release_port) ends the listener this module holds on that port (it sends it a token over
    the port itself; nothing is signalled); a port nobody holds is no error.
  - On a worker, O(connect_host) and O(connect_port) make one TCP connection, bounded by
    O(connect_timeout), and say why it failed.
  - Changes nothing that stays; runs the same in check mode.
version_added: 0.2.0
author: gpucluster.multinode contributors (!UNKNOWN)
extends_documentation_fragment: [gpucluster.multinode.attributes.no_diff]
options:
  unit:
    description: The node's Ray unit; its processes may hold the ports.
    type: str
    default: gpucluster-ray.service
  ports:
    description: Ports that must be free (or held by the node's Ray service).
    type: list
    elements: int
    default: []
  hold_port:
    description: Port to hold open for the workers' test (0 holds none).
    type: int
    default: 0
  hold_address:
    description: Address the held port is bound to.
    type: str
    default: ''
  hold_seconds:
    description: At most this long.
    type: int
    default: 30
  release_port:
    description: End the listener held on this port at O(hold_address) (0 ends none).
    type: int
    default: 0
  connect_host:
    description: Address to connect to (the head's cluster address).
    type: str
    default: ''
  connect_port:
    description: Port to connect to.
    type: int
    default: 0
  connect_timeout:
    description: Seconds the connection may take.
    type: float
    default: 5
attributes:
  check_mode:
    support: full
    details: Runs the same in check mode (a held port is released by itself).
    description: Can run in check mode and return changed status prediction without modifying the node.
'''

EXAMPLES = r'''
- name: Ports free on the head
  gpucluster.multinode.ray_preflight:
    ports: [6379, 8265, 10001]
    hold_port: 6379
    hold_address: 10.0.0.1
    hold_seconds: 190

- name: After the workers' test, let the port go
  gpucluster.multinode.ray_preflight:
    release_port: 6379
    hold_address: 10.0.0.1
'''

RETURN = r'''
ports:
  description: Per port, who holds it besides the Ray service (C(ours) is true when the service holds it too), and a line saying so.
  returned: always
  type: list
  elements: dict
  sample: [{port: 6379, free: false, holders: [{pid: 77, cmdline: redis-server *:6379}], text: "port 6379 is in use by pid 77 (redis-server *:6379)"}]
held:
  description: Whether O(hold_port) is now held by the detached listener (false when Ray or another process holds it).
  returned: always
  type: bool
released:
  description: Whether a listener on O(release_port) took the release token (false when none listened).
  returned: when release_port is set
  type: bool
connect:
  description: The result of the connection, C(connected) or the reason it failed.
  returned: when connect_port is set
  type: str
'''

import errno
import os
import pwd
import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import port_hold
from ansible_collections.gpucluster.multinode.plugins.module_utils import ray_cluster
from ansible_collections.gpucluster.multinode.plugins.module_utils.processes import port_listeners, describe_listeners


def unit_processes(module, unit):
    """(pids in the unit's cgroup, uid of the unit's User= or None). Without CAP_SYS_PTRACE (root in
    a container) the sockets of another account's processes cannot be tied to a pid; a socket
    owned by the unit's account while the unit has processes is then taken for the unit's."""
    rc, out, _err = module.run_command(['systemctl', 'show', '-p', 'ControlGroup', '-p', 'User', unit])
    if rc != 0:
        return set(), None
    shown = ray_cluster.parse_systemctl_show(out)
    pids = set(ray_cluster.cgroup_pids(shown.get('ControlGroup', '')))
    uid = None
    if pids and shown.get('User'):
        try:
            uid = pwd.getpwnam(shown['User']).pw_uid
        except KeyError:
            uid = None
    return pids, uid


def is_ours(holder, pids, uid):
    if holder['pid'] is not None:
        return holder['pid'] in pids
    return uid is not None and holder.get('uid') == uid


def stable_listeners(port, tries=3, pause=1.0):
    """The listeners on a port seen in consecutive scans: a process that is exiting (a Ray that
    restarts) is not taken for a holder."""
    seen = port_listeners(port)
    for _ in range(tries - 1):
        if not seen:
            break
        time.sleep(pause)
        again = port_listeners(port)
        seen = [h for h in again if h['pid'] in [x['pid'] for x in seen]]
    return seen


def release(address, port, timeout=5.0):
    """Send the release token to the listener on the port; True when one took it."""
    return port_hold.release(port, address, timeout)


def hold(address, port, seconds):
    """Bind the port; when that works, a detached listener keeps it open for the workers' test
    and the module returns at once."""
    return port_hold.hold(port, seconds, address) is None


def connect(host, port, timeout):
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.close()
        return 'connected'
    except socket.timeout:
        return 'no answer within %gs (a firewall drops it, or the head is down)' % timeout
    except (OSError, socket.error) as exc:
        if exc.errno == errno.ECONNREFUSED:
            return 'connection refused (nothing listens there, or a firewall rejects it)'
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return 'no route to the head (%s)' % os.strerror(exc.errno)
        return str(exc)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type='str', default='gpucluster-ray.service'),
            ports=dict(type='list', elements='int', default=[]),
            hold_port=dict(type='int', default=0),
            hold_address=dict(type='str', default=''),
            hold_seconds=dict(type='int', default=30),
            release_port=dict(type='int', default=0),
            connect_host=dict(type='str', default=''),
            connect_port=dict(type='int', default=0),
            connect_timeout=dict(type='float', default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    result = {'ports': [], 'held': False}
    if p['ports']:
        pids, uid = unit_processes(module, p['unit'])
        for port in p['ports']:
            listeners = stable_listeners(port)
            holders = [h for h in listeners if not is_ours(h, pids, uid)]
            result['ports'].append({'port': port, 'free': not holders, 'holders': holders,
                                    'ours': len(listeners) > len(holders),
                                    'text': describe_listeners(port, holders) if holders else ''})
    if p['hold_port'] and all(x['free'] for x in result['ports'] if x['port'] == p['hold_port']):
        if not port_listeners(p['hold_port']):
            result['held'] = hold(p['hold_address'], p['hold_port'], p['hold_seconds'])
    if p['release_port']:
        result['released'] = release(p['hold_address'], p['release_port'])
    if p['connect_port']:
        result['connect'] = connect(p['connect_host'], p['connect_port'], p['connect_timeout'])
    module.exit_json(changed=False, **result)


if __name__ == '__main__':
    main()
