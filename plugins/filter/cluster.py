# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filters over the inventory contract: errors, the cluster manifest and the preflight summary."""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults
from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import inventory_contract as contract
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import inventory


def cluster_contract_errors(groups, hostvars):
    """List of contract violations (empty when the inventory is sound)."""
    return contract.contract_errors(groups, hostvars)


def cluster_manifest(groups, hostvars):
    """Head, master address and port, and the ranked node list."""
    return contract.cluster_manifest(groups, hostvars)


def cluster_nodes(groups):
    """Cluster nodes, head first then workers in natural order."""
    return contract.ordered_nodes(groups)


def cluster_job_nodes(groups, hostvars, by='name', hosts=None, spares=None):
    """Nodes of a job, head first: name, address, slots (plugin_utils/inventory.slots_of:
    node_slots, else gpu_slots, else detected GPUs, else 1) and host (the inventory name).

    With by='address' the name is the cluster address (for hostfiles on clusters without names).
    With hosts (the play's hosts, ansible_play_hosts_all: what --limit kept), only the cluster
    nodes among them; the head must be one of them (a job is launched from it, as rank 0).
    With spares (hosts of the spares group a supervisor's restart takes), those after the workers."""
    names = contract.ordered_nodes(groups)
    if spares:
        if isinstance(spares, str) or not isinstance(spares, (list, tuple, set)):
            raise AnsibleFilterError('cluster_job_nodes: spares must be a list of inventory names, got %r' % (spares,))
        known = list(groups.get('spares') or [])
        unknown = [s for s in spares if s not in known]
        if unknown:
            raise AnsibleFilterError('training_spares names %s, not in the inventory\'s spares group (%s)'
                                     % (', '.join(map(str, unknown)), ', '.join(known) or 'empty'))
        names = names + sorted((s for s in spares if s not in names), key=contract.natural_key)
    if hosts is not None:
        if isinstance(hosts, str) or not isinstance(hosts, (list, tuple, set)):
            raise AnsibleFilterError('cluster_job_nodes: hosts must be a list of inventory names, got %r' % (hosts,))
        head = (groups.get('head') or [None])[0]
        if head is not None and head not in hosts:
            raise AnsibleFilterError('--limit leaves out the head %s; a job is launched from the head (rank 0, '
                                     'the master address): keep it in the limit' % head)
        names = [n for n in names if n in hosts]
    try:
        nodes = inventory.hosts_from_inventory(names, hostvars)
    except hostfile.HostfileError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return [dict(n, host=n['name'], name=n['address'] if by == 'address' else n['name']) for n in nodes]


def cluster_left_out(groups, hosts):
    """The cluster nodes (head first, natural order) that are not among hosts (what --limit left out)."""
    return [n for n in contract.ordered_nodes(groups) if n not in (hosts or [])]


def _gpu_count(facts):
    """GPUs the gpu_facts module found on a node (ansible_facts.gpu_facts; .gpu of older runs), else 0."""
    for key in ('gpu_facts', 'gpu'):
        count = (facts.get(key) or {}).get('gpu_count')
        if count:
            return int(count)
    return 0


def _size(num_bytes):
    if num_bytes is None:
        return '-'
    return '%.1fG' % (float(num_bytes) / 2 ** 30)


def summary_rows(groups, hostvars, hosts=None):
    """One dict per node (head first) from the inventory and the gathered facts."""
    rows = []
    heads = groups.get('head') or []
    for host in contract.ordered_nodes(groups):
        if hosts is not None and host not in hosts:
            continue
        facts = hostvars[host].get('ansible_facts') or {}
        rows.append({
            'name': host,
            'role': 'head' if host in heads else 'worker',
            'address': contract.cluster_address(hostvars, host),
            'os': ('%s %s' % (facts.get('distribution', '?'), facts.get('distribution_version', ''))).strip(),
            'kernel': facts.get('kernel', '?'),
            'cpus': facts.get('processor_vcpus') or facts.get('processor_count') or '-',
            'mem_mb': facts.get('memtotal_mb'),
            'gpus': _gpu_count(facts) or '-',
        })
    return rows


def cluster_summary(groups, hostvars, hosts=None):
    """A fixed-width table, one line per node: name, role, address, OS, kernel, CPUs, memory, GPUs."""
    header = ('NODE', 'ROLE', 'ADDRESS', 'OS', 'KERNEL', 'CPUS', 'MEMORY', 'GPUS')
    table = [header]
    for r in summary_rows(groups, hostvars, hosts):
        mem = r.get('mem_mb')
        table.append((
            str(r['name']), str(r['role']), str(r['address']), str(r['os']), str(r['kernel']),
            str(r['cpus']), _size(mem * 2 ** 20) if mem is not None else '-', str(r['gpus']),
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return ['  '.join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]


def unreachable_line(host, hostvars, results):
    """'host NAME (ADDRESS): why' for a node whose ping result (results[host]) says unreachable."""
    hv = hostvars[host]
    result = (results or {}).get(host) or {}
    why = ' '.join(str(result.get('msg', 'no answer')).split())
    return 'host %s (%s): %s' % (host, hv.get('ansible_host', host), why)


def _tags(value):
    return set([value] if isinstance(value, str) else value or [])


def preflight_selected_steps(steps, run_tags=None, skip_tags=None):
    """The steps a run with these --tags / --skip-tags executes (Ansible's rules for plays tagged with them)."""
    run, skip = _tags(run_tags) or {'all'}, _tags(skip_tags)
    selected = []
    for step in steps or []:
        tags = _tags(step.get('tags')) or {step.get('step')}
        if 'all' in skip or tags & skip:
            continue
        if 'all' in run or 'tagged' in run or tags & run:
            selected.append(step)
    return selected


def preflight_step_lines(lines, host, step, role):
    """A refused step's problems: a first line naming the step, then each problem naming the host and the step."""
    lines = [' '.join(str(line).split()) for line in ([lines] if isinstance(lines, str) else lines or [])]
    out = ['preflight: step %s (role %s) refuses its settings on host %s; nothing was changed' % (step, role, host)]
    for line in lines:
        out.append(line + (' (step %s)' % step if line.startswith('host ') else ''))
    return out


# The forms of a role's when: in site.yml that site_steps reads (on/off switches of a step):
#   <var> | default(<true|false>) | bool       and       <var> | default('<text>') ==|!= '<text>'
_WHEN_BOOL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\|\s*default\((true|false|True|False)\)\s*\|\s*bool\s*$")
_WHEN_EQ = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\|\s*default\('([^']*)'\)\s*(==|!=)\s*'([^']*)'\s*$")
# and a cluster-wide value read as the roles read it (the inventory's cluster_<name>, else the collection's
# default): lookup('gpucluster.multinode.cluster_value', '<name>') | bool   and   ... ==|!= '<text>'
_LOOKUP = r"lookup\(\s*'gpucluster\.multinode\.cluster_value'\s*,\s*'([a-z0-9_]+)'\s*\)"
_WHEN_VALUE_BOOL = re.compile(r"^\s*%s\s*\|\s*bool\s*$" % _LOOKUP)
_WHEN_VALUE_EQ = re.compile(r"^\s*%s\s*(==|!=)\s*'([^']*)'\s*$" % _LOOKUP)


def _cluster_value(name, variables, play):
    try:
        return cluster_defaults.cluster_value(name, lambda var: variables.get(var, cluster_defaults.UNSET))
    except KeyError as exc:
        raise AnsibleFilterError("site_steps: play '%s' reads %s" % (play, exc.args[0])) from exc


def _step_enabled(when, variables, play):
    if when is None:
        return True
    found = _WHEN_BOOL.match(str(when))
    if found:
        value = variables.get(found.group(1), found.group(2).lower() == 'true')
        return boolean(value, strict=False)
    found = _WHEN_EQ.match(str(when))
    if found:
        equal = str(variables.get(found.group(1), found.group(2))) == found.group(4)
        return equal if found.group(3) == '==' else not equal
    found = _WHEN_VALUE_BOOL.match(str(when))
    if found:
        return boolean(_cluster_value(found.group(1), variables, play), strict=False)
    found = _WHEN_VALUE_EQ.match(str(when))
    if found:
        equal = str(_cluster_value(found.group(1), variables, play)) == found.group(3)
        return equal if found.group(2) == '==' else not equal
    raise AnsibleFilterError("site_steps: play '%s' has a role condition the preflight cannot read: %s "
                             "(use '<var> | default(true) | bool', \"<var> | default('x') == 'y'\" (or !=), or "
                             "lookup('gpucluster.multinode.cluster_value', '<name>') with | bool or == 'y'" % (play, when))


def site_steps(plays, variables=None):
    """The steps of a playbook, read from its plays (the one list): for each role of this
    collection in a play after the preflight, {step (the play's first tag), role, tags, group
    (the play's hosts when not cluster), enabled (the role's when, read with variables)}."""
    variables = variables or {}
    steps = []
    for play in plays or []:
        roles = [r if isinstance(r, dict) else {'role': r} for r in play.get('roles') or []]
        # A play whose role is included by a task (its when then reads the inventory, not the role's defaults).
        for task in play.get('tasks') or []:
            included = task.get('ansible.builtin.include_role') or task.get('include_role')
            if isinstance(included, dict) and included.get('name'):
                roles.append({'role': included['name'], 'when': task.get('when')})
        names = [str(r.get('role') or r.get('name') or '') for r in roles]
        if not roles or any(n.split('.')[-1] == 'preflight' for n in names):
            continue
        tags = [str(t) for t in ([play['tags']] if isinstance(play.get('tags'), str) else play.get('tags') or [])]
        if not tags:
            raise AnsibleFilterError("site_steps: play '%s' has no tags; its first tag names its step" % play.get('name'))
        for role, name in zip(roles, names):
            step = {'step': tags[0], 'role': name.split('.')[-1], 'tags': tags,
                    'enabled': _step_enabled(role.get('when'), variables, play.get('name'))}
            if str(play.get('hosts', 'cluster')) != 'cluster':
                step['group'] = str(play['hosts'])
            steps.append(step)
    return steps


class FilterModule:
    def filters(self):
        return {
            'cluster_contract_errors': cluster_contract_errors,
            'cluster_manifest': cluster_manifest,
            'cluster_nodes': cluster_nodes,
            'cluster_job_nodes': cluster_job_nodes,
            'cluster_left_out': cluster_left_out,
            'cluster_summary': cluster_summary,
            'unreachable_line': unreachable_line,
            'preflight_selected_steps': preflight_selected_steps,
            'preflight_step_lines': preflight_step_lines,
            'site_steps': site_steps,
        }
