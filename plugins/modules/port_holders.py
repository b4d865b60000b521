#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: port_holders
short_description: Names the processes that hold the TCP ports the collection will listen on
description:
  - Reads C(/proc/net/tcp) and C(/proc/net/tcp6) and each process's sockets (as C(ss -ltnp) would)
    and says, for every port of O(ports), which processes listen on it.
  - A port held only by processes of one of the collection's jobs (their environment carries
    C(GPUCLUSTER_JOB_ID)) is a warning, not a refusal; that job is running and will free it.
  - Read-only; the preflight of C(site.yml) runs it on the head before any step changes a node.
version_added: 0.1.0
author: gpucluster.multinode contributors (!UNKNOWN)
options:
  ports:
    description: The ports to look at, each with the variable that sets it (named in the lines).
    type: list
    elements: dict
    required: true
    suboptions:
      port:
        description: The TCP port.
        type: int
        required: true
      variable:
        description: The variable that sets it.
        type: str
        required: true
  host:
    description: The node's inventory name, for the lines.
    type: str
    required: true
extends_documentation_fragment: [gpucluster.multinode.attributes.read_only]
notes:
  - Run it as root to see every process; a socket whose owner cannot be seen is named by its uid.
'''

EXAMPLES = r'''
- name: Name the holders of the ports training and the tests listen on
  gpucluster.multinode.port_holders:
    host: "{{ inventory_hostname }}"
    ports:
      - {port: "{{ cluster_master_port }}", variable: cluster_master_port}
      - {port: 5201, variable: cluster_bandwidth_port}
  register: held
'''

RETURN = r'''
ports:
  description: One entry per port asked, in order.
  returned: always
  type: list
  elements: dict
  sample: [{port: 22, variables: [cluster_master_port], free: false, own_job: false,
            holders: [{pid: 412, uid: 0, cmdline: "sshd: /usr/sbin/sshd -D", job_id: null, address: 0.0.0.0}]}]
refusals:
  description: One line per port held by a process that is not one of the collection's jobs.
  returned: always
  type: list
  elements: str
  sample:
    - "host alpha: cluster_master_port 22 is held on the head: port 22 is in use by pid 412 (sshd: /usr/sbin/sshd -D);
      stop that process or choose another port"
notices:
  description: One line per port held only by a running job of the collection (also given as warnings).
  returned: always
  type: list
  elements: str
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils.processes import port_listeners, describe_listeners


def survey(host, ports, listeners=port_listeners):
    """(entries, refusals, notices) for the ports; one entry per distinct port, naming every variable
    that sets it."""
    entries, order = {}, []
    for item in ports:
        port = int(item['port'])
        if port not in entries:
            order.append(port)
            entries[port] = {'port': port, 'variables': []}
        if item['variable'] not in entries[port]['variables']:
            entries[port]['variables'].append(item['variable'])
    refusals, notices = [], []
    for port in order:
        entry = entries[port]
        holders = listeners(port)
        own = bool(holders) and all(h.get('job_id') for h in holders)
        entry.update(free=not holders, holders=holders, own_job=own)
        if not holders:
            continue
        names = ' and '.join(entry['variables'])
        if own:
            jobs = ', '.join(sorted({h['job_id'] for h in holders}))
            notices.append('host %s: %s %d is held by the running job %s of the collection; it is free again when '
                           'that job ends (train.yml -e training_state=stopped -e training_job_id=%s stops it)'
                           % (host, names, port, jobs, jobs))
        else:
            refusals.append('host %s: %s %d is held on the head: %s; stop that process or choose another port'
                            % (host, names, port, describe_listeners(port, holders)))
    return [entries[p] for p in order], refusals, notices


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ports=dict(type='list', elements='dict', required=True,
                       options=dict(port=dict(type='int', required=True), variable=dict(type='str', required=True))),
            host=dict(type='str', required=True),
        ),
        supports_check_mode=True,
    )
    bad = [p for p in module.params['ports'] if not 1 <= p['port'] <= 65535]
    if bad:
        module.fail_json(msg='host %s: %s must be from 1 to 65535, got %d'
                         % (module.params['host'], bad[0]['variable'], bad[0]['port']))
    entries, refusals, notices = survey(module.params['host'], module.params['ports'])
    for line in notices:
        module.warn(line)
    module.exit_json(changed=False, ports=entries, refusals=refusals, notices=notices)


if __name__ == '__main__':
    main()
