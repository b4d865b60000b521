"""Roles own their inputs: a role reads its own variables, the inventory contract's (cluster_*,
gpu_slots, node_slots, network_static) and the collection's defaults (the cluster_default lookup),
not another role's variables; only the results another role's entry point documents it sets
(OUTPUTS) are read across."""

from __future__ import annotations

import collections
import os
import re

import yaml

ROOT = os.path.join(os.path.dirname(__file__), '..', '..')
ROLES = sorted(os.listdir(os.path.join(ROOT, 'roles')))
BY_LENGTH = sorted(ROLES, key=len, reverse=True)
CONTRACT = {'network_static'}  # a per-host inventory variable named like a role's
EXPRESSION_KEYS = {'when', 'that', 'until', 'failed_when', 'changed_when'}
JINJA = re.compile(r'\{\{(.*?)\}\}|\{%(.*?)%\}', re.S)
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
NAME = re.compile(r'(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)')

# What a role's entry point sets for the roles that run it ({role: {variable}}): documented in its
# meta/argument_specs.yml as "Sets C(<variable>)", read by the role that includes that entry point.
OUTPUTS = {
    'cluster_tests': {'cluster_tests_bandwidth', 'cluster_tests_collective', 'cluster_tests_smoke'},
    'node_tools': {'node_tools_os_packages', 'node_tools_os_name'},
}


def expressions(node, key=None):
    """The Jinja expressions of a loaded YAML file: {{ }} and {% %} anywhere, and the bare ones of when,
    that, until, failed_when and changed_when. Keys (a module's options, include_role vars) are not reads."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from expressions(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from expressions(v, key)
    elif isinstance(node, str):
        if key in EXPRESSION_KEYS and '{{' not in node:
            yield node
        for m in JINJA.finditer(node):
            yield m.group(1) or m.group(2)


def names_in(expr):
    return [m.group(1) for m in NAME.finditer(QUOTED.sub("''", expr))]


def owner(name):
    bare = name.lstrip('_')
    return next((r for r in BY_LENGTH if bare.startswith(r + '_')), None)


def foreign_reads(role):
    """{variable of another role: {files of this role that read it}}."""
    found = collections.defaultdict(set)
    base = os.path.join(ROOT, 'roles', role)
    for directory, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d not in ('files', 'molecule', 'meta')]
        for f in files:
            path = os.path.join(directory, f)
            with open(path) as handle:
                if f.endswith(('.yml', '.yaml')):
                    exprs = list(expressions(yaml.safe_load(handle)))
                elif f.endswith('.j2'):
                    exprs = [m.group(1) or m.group(2) for m in JINJA.finditer(handle.read())]
                else:
                    continue
            for name in (n for e in exprs for n in names_in(e)):
                if name not in CONTRACT and owner(name) not in (None, role):
                    found[name].add(os.path.relpath(path, base))
    return found


def test_the_scan_sees_a_read_and_not_a_key_or_a_string():
    doc = {'when': 'python_env_path | length > 0', 'x': {'vars': {'node_tools_pdsh': True}},
           'msg': "{{ 'python_env_torch_version' ~ training_launcher }}"}
    names = [n for e in expressions(doc) for n in names_in(e)]
    assert 'python_env_path' in names and 'training_launcher' in names
    assert 'node_tools_pdsh' not in names and 'python_env_torch_version' not in names
    assert owner('__cluster_tests_nodes') == 'cluster_tests' and owner('cluster_cidr') is None


def test_no_role_reads_another_roles_variables():
    outputs = {name for names in OUTPUTS.values() for name in names}
    found = []
    for role in ROLES:
        reads = foreign_reads(role)
        for name in sorted(set(reads) - outputs):
            found.append('roles/%s reads %s (%s): take it from a cluster_* variable or the cluster_default lookup'
                         % (role, name, ', '.join(sorted(reads[name]))))
    assert not found, '\n'.join(found)


def test_every_output_read_across_roles_is_documented_by_the_role_that_sets_it():
    for role, names in OUTPUTS.items():
        with open(os.path.join(ROOT, 'roles', role, 'meta', 'argument_specs.yml')) as handle:
            spec = handle.read()
        for name in names:
            assert 'C(%s)' % name in spec, 'roles/%s/meta/argument_specs.yml does not say it sets %s' % (role, name)
