# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filters of the ray role and of the health check of a Ray cluster."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpucluster.multinode.plugins.module_utils import ray_cluster
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.replaced_vars import SET_AS


def _plain(value):
    """Ansible's lazy containers as plain dicts and lists."""
    if hasattr(value, 'items'):
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def ray_input_errors(settings, head):
    """Problems with the Ray settings: settings is {host: {ray_version, ray_port, ...}}."""
    settings = _plain(settings)
    return ray_cluster.input_errors(list(settings), settings, head, names=SET_AS)


def ray_node_spec(settings, name, address, is_head, nproc, detected_gpus=None):
    """What a node brings to the cluster, from its ray_* settings and what was read on it."""
    s = _plain(settings)
    cpus = s.get('ray_num_cpus', 'auto')
    try:
        return ray_cluster.node_spec(
            name, address, is_head,
            cpus=int(nproc) if cpus in (None, '', 'auto') else int(cpus),
            gpus=ray_cluster.gpus_of(s, detected_gpus),
            memory=int(s.get('ray_memory') or 0),
            resources=s.get('ray_resources') or {}, labels=s.get('ray_labels') or {})
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError('host %s: the Ray resources cannot be worked out: %s' % (name, exc))


def ray_start_args(spec, head_address, port, dashboard_host, dashboard_port, client_server_port,
                   object_store_memory=0, extra=()):
    return ray_cluster.start_args(_plain(spec), head_address, port, dashboard_host, dashboard_port,
                                  client_server_port, object_store_memory, list(extra or []))


def ray_systemd_args(args):
    """One ExecStart line from arguments: quoted where needed, systemd's % and $ escaped."""
    out = []
    for arg in args:
        text = str(arg).replace('%', '%%').replace('$', '$$')
        if any(c in text for c in ' \t"\'\\;'):
            text = "'" + text.replace('\\', '\\\\').replace("'", "\\'") + "'"
        out.append(text)
    return ' '.join(out)


def _inspect_line(inspection):
    if not inspection:
        return 'the node was not inspected'
    procs = len(inspection.get('processes') or [])
    return 'service %s (%s), %d process(es)' % (inspection.get('active_state') or '?',
                                                inspection.get('sub_state') or '?', procs)


def ray_preflight_problems(hostvars, hosts, head, head_address, port, env_path, check_mode=False):
    """Lines naming host and variable: a Ray port taken on the head (and by whom), a worker that
    cannot reach the head's GCS port, a node without the Python environment."""
    problems = []
    head_ports = _plain((hostvars[head] if head in hostvars else {}).get('__ray_head_ports') or {})
    names = dict(enumerate(SET_AS[var] for var in ray_cluster.PORT_VARS))
    for i, item in enumerate(head_ports.get('ports') or []):
        if not item.get('free'):
            problems.append('host %s: %s: %s' % (head, names.get(i, 'port'), item.get('text')))
    for h in hosts:
        hv = hostvars[h]
        reach = _plain(hv.get('__ray_reach') or {})
        # the head's own Ray held the port (restarting, say): a refusal proves the way is open
        restarting = ((head_ports.get('ports') or [{}])[0].get('ours')
                      and str(reach.get('connect', '')).startswith('connection refused'))
        if reach.get('connect') and reach['connect'] != 'connected' and not restarting:
            problems.append('host %s: cannot reach the head %s on cluster_ray_port %s: %s'
                            % (h, head_address, port, reach['connect']))
        env = _plain(hv.get('__ray_env_python') or {})
        if env and not (env.get('stat') or {}).get('exists') and not check_mode:
            problems.append('host %s: ray_env_path %s holds no Python environment (site.yml --tags python_env '
                            'makes it)' % (h, env_path))
    return problems


def ray_membership(status, inspections, hosts):
    """[{node, address, ok, problems, service, log_tail, resources}] for each host that should be in.

    status: the ray_status result on the head; inspections: {host: ray_node inspect result};
    a host's spec is its manifest (written by the role)."""
    status = _plain(status or {})
    inspections = _plain(inspections or {})
    specs = []
    for h in hosts:
        man = (inspections.get(h) or {}).get('manifest') or {}
        if man.get('address'):
            specs.append(dict(man, name=h))
    listed = status.get('nodes') or []
    out = []
    for spec, node, problems in ray_cluster.membership(specs, listed):
        ins = inspections.get(spec['name']) or {}
        out.append({'node': spec['name'], 'address': spec['address'], 'ok': not problems,
                    'problems': problems, 'service': _inspect_line(ins),
                    'log_tail': list(ins.get('log_tail') or []),
                    'resources': ray_cluster.describe_resources(node['resources']) if node else ''})
    for h in hosts:
        if h not in [s['name'] for s in specs]:
            ins = inspections.get(h) or {}
            if not ins or ins.get('skipped') or ins.get('unreachable') or 'active_state' not in ins:
                why = ' '.join(str(ins.get('msg') or 'the node was not inspected').split())
                out.append({'node': h, 'address': '', 'ok': None, 'problems': [why],
                            'service': 'unknown', 'log_tail': [], 'resources': ''})
                continue
            out.append({'node': h, 'address': '', 'ok': False,
                        'problems': ['no Ray manifest on the node (playbooks/ray.yml never started it there)'],
                        'service': _inspect_line(ins), 'log_tail': list(ins.get('log_tail') or []),
                        'resources': ''})
    return out


def ray_problem_lines(membership, log_lines=5):
    """Lines naming each node that is not as it should be, with its service and its log's end."""
    lines = []
    for m in _plain(membership):
        if m['ok']:
            continue
        if m['ok'] is None:
            lines.append('host %s: %s' % (m['node'], m['problems'][0]))
            continue
        lines.append('host %s (%s): %s; %s' % (m['node'], m['address'] or '?', '; '.join(m['problems']), m['service']))
        for line in m['log_tail'][-log_lines:]:
            lines.append('    %s' % line)
    return lines


def ray_health_records(membership, status, hosts, unit='gpucluster-ray.service'):
    """Health records (node, check, status, value, threshold, detail, remedy) of the check 'ray'."""
    status = _plain(status or {})
    by_node = dict((m['node'], m) for m in _plain(membership or []))
    records = []
    for h in hosts:
        rec = {'node': h, 'check': 'ray', 'status': 'ok', 'value': None,
               'threshold': 'alive in the Ray cluster with its resources', 'detail': '', 'remedy': ''}
        m = by_node.get(h)
        if status.get('error') or status.get('skipped') or status.get('unreachable'):
            rec.update(status='fail', value='no cluster',
                       detail='the head cannot read the Ray cluster: %s' % ' '.join(
                           str(status.get('error') or status.get('msg') or 'the head does not answer').split()),
                       remedy='journalctl -u %s on the head; playbooks/ray.yml -e ray_state=started' % unit)
        elif m is None or m['ok'] is None:
            rec.update(status='unknown', value=None,
                       detail=m['problems'][0] if m else 'the node was not inspected')
        elif m['ok']:
            rec.update(value='alive', detail=m['resources'])
        else:
            last = m['log_tail'][-1] if m['log_tail'] else ''
            rec.update(status='fail', value='absent' if 'not in the Ray cluster' in m['problems'][0] else 'wrong',
                       detail='%s; %s%s' % ('; '.join(m['problems']), m['service'],
                                            ('; last log line: %s' % last) if last else ''),
                       remedy='journalctl -u %s on %s; playbooks/ray.yml -e ray_state=started' % (unit, h))
        records.append(rec)
    return records


class FilterModule(object):
    def filters(self):
        return {
            'ray_input_errors': ray_input_errors,
            'ray_node_spec': ray_node_spec,
            'ray_start_args': ray_start_args,
            'ray_systemd_args': ray_systemd_args,
            'ray_preflight_problems': ray_preflight_problems,
            'ray_membership': ray_membership,
            'ray_problem_lines': ray_problem_lines,
            'ray_health_records': ray_health_records,
        }
