# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A Ray cluster on the nodes: parsers of `ray status` and `ray list nodes`, the checks of the
role's inputs, what each node should bring to the cluster, and the processes of a systemd unit
(read from its cgroup, never by name)."""

from __future__ import annotations

import json
import os
import re

# Ray picks its worker ports in this range unless told otherwise; its own ports may not lie there
# (ray start refuses: "is trying to use a port number ... that is used by other components").
RAY_WORKER_PORTS = (10002, 19999)
PORT_VARS = ('ray_port', 'ray_dashboard_port', 'ray_client_server_port')
_UNITS = {'B': 1, 'KiB': 1024, 'MiB': 1024 ** 2, 'GiB': 1024 ** 3, 'TiB': 1024 ** 4,
          'KB': 1000, 'MB': 1000 ** 2, 'GB': 1000 ** 3, 'TB': 1000 ** 4}
_SIZE_RE = re.compile(r'^\s*([0-9.]+)\s*([KMGT]i?B|B)?\s*$')
_USAGE_RE = re.compile(r'^\s*(\S+)/(\S+)\s+(\S+)\s*$')
# Resources Ray adds by itself: not compared with what the inventory asks for.
_IMPLICIT = re.compile(r'^(node:.*|accelerator_type:.*|memory|object_store_memory)$')


def parse_size(text):
    """Bytes from Ray's "16.17GiB", "16.165 GiB", "0B" or a plain number."""
    if isinstance(text, (int, float)):
        return float(text)
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError('not a size: %r' % (text,))
    return float(m.group(1)) * _UNITS[m.group(2) or 'B']


def _usage_line(line):
    """'0.0/2.0 CPU' -> ('CPU', 0.0, 2.0); sizes ('0B/16.17GiB memory') in bytes."""
    m = _USAGE_RE.match(line)
    if not m:
        return None
    try:
        return m.group(3), parse_size(m.group(1)), parse_size(m.group(2))
    except ValueError:
        return None


def parse_ray_status(text):
    """The parts of `ray status [-v]` a cluster check needs.

    Returns {'active': [node ids], 'pending': [lines], 'failures': [lines],
    'usage': {resource: {'used', 'total'}}, 'nodes': {node id: {resource: {'used', 'total'}}}}.
    Node ids are written without Ray's 'node_' prefix. Raises ValueError when the text is not
    the output of `ray status` (no 'Node status' section)."""
    if 'Node status' not in text:
        raise ValueError('no "Node status" section in the output of ray status')
    out = {'active': [], 'idle': [], 'pending': [], 'failures': [], 'usage': {}, 'nodes': {}}
    section = None
    node = None
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or set(stripped) == {'-'} or stripped.startswith('='):
            continue
        if stripped in ('Active:', 'Idle:', 'Pending:', 'Recent failures:', 'Total Usage:',
                        'From request_resources:', 'Pending Demands:', 'Usage:', 'Activity:',
                        'Total Constraints:', 'Total Demands:'):
            section = stripped[:-1]
            continue
        if stripped.startswith('Node: '):
            node = stripped.split()[1]
            if node.startswith('node_'):
                node = node[5:]
            out['nodes'][node] = {}
            section = 'Node'
            continue
        if stripped in ('Node status', 'Resources'):
            section = None
            continue
        if stripped.startswith('(') and stripped.endswith(')'):
            continue   # "(no pending nodes)", "(no failures)", "(none)"
        if section in ('Active', 'Idle'):
            fields = stripped.split()
            if len(fields) == 2 and fields[1].startswith('node_'):
                out['active'].append(fields[1][5:])
                if section == 'Idle':
                    out['idle'].append(fields[1][5:])
        elif section == 'Pending':
            out['pending'].append(stripped)
        elif section == 'Recent failures':
            out['failures'].append(stripped)
        elif section == 'Total Usage':
            parsed = _usage_line(stripped)
            if parsed:
                out['usage'][parsed[0]] = {'used': parsed[1], 'total': parsed[2]}
        elif section == 'Usage' and node is not None:
            parsed = _usage_line(stripped)
            if parsed:
                out['nodes'][node][parsed[0]] = {'used': parsed[1], 'total': parsed[2]}
    return out


def parse_ray_nodes(text):
    """`ray list nodes --format json` -> [{'node_id', 'node_ip', 'state', 'is_head', 'resources',
    'labels'}] with memory sizes in bytes. Raises ValueError on anything but a JSON list."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError('ray list nodes did not print a JSON list')
    nodes = []
    for item in data:
        resources = {}
        for name, value in (item.get('resources_total') or {}).items():
            try:
                resources[name] = parse_size(value)
            except ValueError:
                resources[name] = value
        nodes.append({'node_id': item.get('node_id'), 'node_ip': item.get('node_ip'),
                      'state': item.get('state'), 'is_head': bool(item.get('is_head_node')),
                      'resources': resources, 'labels': dict(item.get('labels') or {}),
                      'state_message': item.get('state_message')})
    return nodes


def _int_or_none(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def input_errors(hosts, hostvars, head, names=None):
    """Problems with the Ray settings of the play's hosts, one line each, naming host and variable.

    hostvars: host -> its variables (ray_version, ray_port, ... as the role resolves them). names: {role
    variable: the variable the user sets} (plugin_utils/replaced_vars.py's SET_AS, on the controller: the ports are set as cluster_ray_*);
    a variable it does not name is named as it is."""
    names = names or {}
    shown = dict((var, names.get(var, var)) for var in PORT_VARS)
    errors = []
    versions = {}
    for h in hosts:
        v = str(hostvars[h].get('ray_version', ''))
        if not re.match(r'^[0-9]+(\.[0-9]+)*([a-z0-9.+-]*)$', v):
            errors.append('host %s: ray_version must be a version such as 2.60.0, got %r' % (h, v))
        versions.setdefault(v, []).append(h)
    if len(versions) > 1 and head in hosts:
        want = str(hostvars[head].get('ray_version', ''))
        for v, names in sorted(versions.items()):
            if v != want:
                for h in names:
                    errors.append('host %s: ray_version %s differs from the head %s (%s): every node '
                                  'must run the same Ray' % (h, v, head, want))
    if head in hosts:
        hv = hostvars[head]
        ports = {}
        for var in PORT_VARS:
            port = _int_or_none(hv.get(var))
            if port is None or not 1 <= port <= 65535:
                errors.append('host %s: %s must be a port number 1-65535, got %r' % (head, shown[var], hv.get(var)))
                continue
            low, high = RAY_WORKER_PORTS
            if low <= port <= high:
                errors.append('host %s: %s %d lies in the range Ray keeps for its workers (%d-%d)'
                              % (head, shown[var], port, low, high))
            if port in ports:
                errors.append('host %s: %s and %s are both %d' % (head, shown[ports[port]], shown[var], port))
            ports[port] = var
        for h in hosts:
            if h != head:
                for var in PORT_VARS[:1]:
                    if str(hostvars[h].get(var)) != str(hv.get(var)):
                        errors.append('host %s: %s %s differs from the head %s (%s): the head\'s port '
                                      'is the one the workers join' % (h, shown[var], hostvars[h].get(var), head, hv.get(var)))
    for h in hosts:
        hv = hostvars[h]
        for var in ('ray_num_cpus', 'ray_num_gpus'):
            value = hv.get(var, 'auto')
            if value != 'auto' and (_int_or_none(value) is None or _int_or_none(value) < 0):
                errors.append('host %s: %s must be auto or a whole number >= 0, got %r' % (h, var, value))
        errors.extend(_mapping_errors(h, 'ray_resources', hv.get('ray_resources'), 'name to amount', _resource_error))
        errors.extend(_mapping_errors(h, 'ray_labels', hv.get('ray_labels'), 'name to text', _label_error))
    return errors


def _resource_error(var, name, amount):
    if name in ('CPU', 'GPU', 'memory', 'object_store_memory'):
        return '%s may not set %s (use ray_num_cpus, ray_num_gpus, ray_memory)' % (var, name)
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
        return '%s.%s must be a number >= 0, got %r' % (var, name, amount)
    return None


def _label_error(var, name, value):
    if str(name).startswith('ray.io/'):
        return "%s.%s: the ray.io/ prefix is Ray's own" % (var, name)
    if not isinstance(value, str):
        return '%s.%s must be text, got %r' % (var, name, value)
    return None


def _mapping_errors(host, var, value, shape, item_error):
    """Lines for a per-host mapping variable: not a mapping, or the entries item_error refuses."""
    value = value or {}
    if not isinstance(value, dict):
        return ['host %s: %s must be a mapping of %s, got %r' % (host, var, shape, value)]
    problems = (item_error(var, name, item) for name, item in value.items())
    return ['host %s: %s' % (host, problem) for problem in problems if problem]


def gpus_of(hostvars_of_host, detected_gpus=None):
    """GPUs Ray may use on a node: ray_num_gpus, else gpu_slots, else the detected GPUs, else 0.

    A node without GPUs never claims one."""
    value = hostvars_of_host.get('ray_num_gpus', 'auto')
    if value not in (None, '', 'auto'):
        return int(value)
    slots = _int_or_none(hostvars_of_host.get('gpu_slots'))
    if slots is not None:
        return slots
    detected = _int_or_none(detected_gpus)
    return detected if detected is not None else 0


def node_spec(name, address, is_head, cpus, gpus, memory=0, resources=None, labels=None):
    """What a node brings to the Ray cluster: written to the node's manifest, compared by status
    and health with what Ray reports."""
    return {'name': name, 'address': address, 'head': bool(is_head), 'cpus': int(cpus),
            'gpus': int(gpus), 'memory': int(memory or 0),
            'resources': dict(resources or {}), 'labels': dict(labels or {})}


def start_args(spec, head_address, port, dashboard_host, dashboard_port, client_server_port,
               object_store_memory=0, extra=()):
    """The arguments of `ray start` (after 'start') for a node spec."""
    args = ['--node-ip-address=%s' % spec['address'],
            '--num-cpus=%d' % spec['cpus'], '--num-gpus=%d' % spec['gpus']]
    if spec['head']:
        args = ['--head', '--port=%d' % int(port), '--include-dashboard=true',
                '--dashboard-host=%s' % dashboard_host, '--dashboard-port=%d' % int(dashboard_port),
                '--ray-client-server-port=%d' % int(client_server_port)] + args
    else:
        args = ['--address=%s:%d' % (head_address, int(port))] + args
    if spec['memory']:
        args.append('--memory=%d' % spec['memory'])
    if object_store_memory:
        args.append('--object-store-memory=%d' % int(object_store_memory))
    if spec['resources']:
        args.append('--resources=%s' % json.dumps(spec['resources'], sort_keys=True, separators=(',', ':')))
    if spec['labels']:
        args.append('--labels=%s' % json.dumps(spec['labels'], sort_keys=True, separators=(',', ':')))
    args.extend(extra)
    args.extend(['--disable-usage-stats', '--block'])
    return args


def compare_node(spec, listed):
    """Problems of one node as Ray lists it against its spec ([] when it is as it should be).

    listed: the entry of parse_ray_nodes for the node's address (None when absent)."""
    if listed is None:
        return ['not in the Ray cluster']
    if listed['state'] != 'ALIVE':
        return ['in the Ray cluster but %s%s' % (listed['state'], (': %s' % listed['state_message'])
                                                 if listed.get('state_message') else '')]
    problems = []
    res = listed['resources']
    want = {'CPU': spec['cpus'], 'GPU': spec['gpus']}
    want.update(spec['resources'])
    for name in sorted(want):
        have = res.get(name, 0)
        if abs(float(have) - float(want[name])) > 1e-6:
            problems.append('%s %g, should be %g' % (name, have, want[name]))
    for name in sorted(res):
        if name not in want and not _IMPLICIT.match(name):
            problems.append('%s %g, should be absent' % (name, res[name]))
    if spec['memory'] and abs(res.get('memory', 0) - spec['memory']) > max(1 << 20, spec['memory'] * 0.01):
        problems.append('memory %d bytes, should be %d' % (res.get('memory', 0), spec['memory']))
    for name, value in sorted(spec['labels'].items()):
        if listed['labels'].get(name) != value:
            problems.append('label %s=%s, should be %s' % (name, listed['labels'].get(name), value))
    return problems


def membership(specs, listed_nodes):
    """[(spec, listed or None, problems)] in the order of the specs; the listed node of a spec is
    the one on its address, the alive one first when a node joined more than once."""
    by_ip = {}
    for n in listed_nodes:
        cur = by_ip.get(n['node_ip'])
        if cur is None or (cur['state'] != 'ALIVE' and n['state'] == 'ALIVE'):
            by_ip[n['node_ip']] = n
    return [(s, by_ip.get(s['address']), compare_node(s, by_ip.get(s['address']))) for s in specs]


def describe_resources(resources):
    """'CPU 2, GPU 0, memory 3.1GiB' from a listed node's resources."""
    parts = []
    for name in ['CPU', 'GPU'] + sorted(k for k in resources if k not in ('CPU', 'GPU') and not _IMPLICIT.match(k)):
        parts.append('%s %g' % (name, resources.get(name, 0)))
    if 'memory' in resources:
        parts.append('memory %.1fGiB' % (resources['memory'] / 1024.0 ** 3))
    return ', '.join(parts)


# ----------------------------------------------------------------- the service's processes

CGROUP_ROOTS = ('/sys/fs/cgroup', '/sys/fs/cgroup/unified', '/sys/fs/cgroup/systemd')


def cgroup_pids(control_group, roots=CGROUP_ROOTS):
    """Pids in a systemd unit's cgroup and its sub-groups (its ControlGroup property).

    The first root that holds the group is read (cgroup v2, or the hybrid layouts' unified or
    name=systemd hierarchy). [] when the group does not exist (the unit runs nothing)."""
    if not control_group or control_group == '/':
        return []
    for root in roots:
        base = os.path.join(root, control_group.lstrip('/'))
        if not os.path.isdir(base):
            continue
        pids = []
        for dirpath, _dirs, files in os.walk(base):
            if 'cgroup.procs' in files:
                try:
                    with open(os.path.join(dirpath, 'cgroup.procs')) as f:
                        pids.extend(int(x) for x in f.read().split())
                except (IOError, OSError, ValueError):
                    continue
        return sorted(set(pids))
    return []


def parse_systemctl_show(text):
    """'Key=value' lines of `systemctl show -p ...` into a dict."""
    out = {}
    for line in text.splitlines():
        if '=' in line:
            key, value = line.split('=', 1)
            out[key.strip()] = value.strip()
    return out
