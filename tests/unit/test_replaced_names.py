"""A refusal names the variable the user sets. A role variable the inventory contract replaced by a
cluster-wide one (REPLACED in plugins/plugin_utils/inventory_contract.py) is derived from it, and
setting it alone is refused: so a message that a user reads on failure (an assert's or a fail's
message in roles/*/tasks, what its vars put together, the error lines of the settings checks)
and the description of an option in roles/*/meta/argument_specs.yml name the cluster_* variable,
never the role variable alone."""

from __future__ import annotations

import glob
import os
import re

import pytest
import yaml

from ansible_collections.gpucluster.multinode.plugins.filter import ray as ray_filter
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import replaced_vars
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import python_env
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.inventory_contract import REPLACED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER_NAME = {role_var: cluster_var for role_var, cluster_var, _readers in REPLACED}
NAMED = re.compile(r'(?<![A-Za-z0-9_])(%s)(?![A-Za-z0-9_])' % '|'.join(sorted(CLUSTER_NAME, key=len, reverse=True)))
JINJA = re.compile(r'\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}', re.S)
LITERAL = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")
IDENTIFIER = re.compile(r'^[A-Za-z_][A-Za-z0-9_.]*$')
# What a user reads: refusals, what they say besides (debug), and the problems a fact collects for a later refusal.
MESSAGE_MODULES = {'ansible.builtin.assert': ('fail_msg', 'msg'), 'ansible.builtin.fail': ('msg',),
                   'ansible.builtin.debug': ('msg',), 'ansible.builtin.set_fact': None}


def unnamed(text):
    """The REPLACED role variables a text names without naming the cluster_* variable the user sets."""
    return sorted({m.group(1) for m in NAMED.finditer(text or '') if CLUSTER_NAME[m.group(1)] not in text})


def texts(template):
    """What a template shows: its text outside Jinja, one piece per literal run, and the string
    literals inside its expressions that read as words (a bare name is a key or a test, not text)."""
    if not isinstance(template, str):
        if isinstance(template, dict):
            return [t for v in template.values() for t in texts(v)]
        if isinstance(template, list):
            return [t for v in template for t in texts(v)]
        return []
    out = [piece for piece in JINJA.split(template) if piece.strip()]
    for expr in JINJA.findall(template):
        for single, double in LITERAL.findall(expr):
            literal = single or double
            if literal.strip() and not IDENTIFIER.match(literal):
                out.append(literal)
    return out


def tasks_of(items):
    for task in items or []:
        if not isinstance(task, dict):
            continue
        yield task
        for key in ('block', 'rescue', 'always'):
            yield from tasks_of(task.get(key))


def refusal_texts():
    """(file, task name, text) of every assert's and fail's message and of the vars it reads."""
    for path in sorted(glob.glob(os.path.join(ROOT, 'roles', '*', 'tasks', '*.yml'))):
        with open(path, encoding='utf-8') as handle:
            data = yaml.safe_load(handle)
        for task in tasks_of(data):
            for module, keys in MESSAGE_MODULES.items():
                args = task.get(module)
                if not isinstance(args, dict):
                    continue
                where = (os.path.relpath(path, ROOT), task.get('name', '?'))
                for key in keys or args:
                    for text in texts(args.get(key)):
                        yield where + (text,)
                for text in texts(task.get('vars')):
                    yield where + (text,)


def spec_texts():
    """(file, option, description) of every option of every role's argument specs."""
    for path in sorted(glob.glob(os.path.join(ROOT, 'roles', '*', 'meta', 'argument_specs.yml'))):
        with open(path, encoding='utf-8') as handle:
            specs = yaml.safe_load(handle)['argument_specs']
        for entry, spec in specs.items():
            where = os.path.relpath(path, ROOT)
            described = [(entry, spec.get('description'))] + [
                (name, option.get('description')) for name, option in (spec.get('options') or {}).items()]
            for name, description in described:
                text = ' '.join(description) if isinstance(description, list) else str(description or '')
                yield where, name, text


def test_the_scan_finds_a_role_variable_named_alone_and_not_one_named_with_its_cluster_variable():
    assert unnamed('host h: ray_port must be a port number 1-65535') == ['ray_port']
    assert unnamed('host h: cluster_ray_port must be a port number 1-65535') == []
    assert unnamed('cluster_pip_offline (python_env_offline) needs cluster_pip_find_links') == []
    assert unnamed('training_container_image and container_image_source are not replaced') == []
    assert texts("{{ ['host ' ~ h ~ ': container_mounts entry ' ~ e] if x['container_mounts'] else [] }}") == \
        ['host ', ': container_mounts entry ']
    assert texts('host {{ h }}: python_env_find_links {{ x }} is missing') == ['host ', ': python_env_find_links ', ' is missing']
    assert texts("{{ {'python_env_path': python_env_path} | f }}") == []  # a key names no variable to the user


def test_every_refusal_names_the_cluster_variable_the_user_sets():
    found = ['%s: %s: %r names %s' % (path, name, text, ', '.join('%s (set %s)' % (v, CLUSTER_NAME[v]) for v in unnamed(text)))
             for path, name, text in refusal_texts() if unnamed(text)]
    assert found == []


def test_every_option_description_names_the_cluster_variable_the_user_sets():
    found = ['%s: %s: %s (set %s)' % (path, name, ', '.join(unnamed(text)), ', '.join(CLUSTER_NAME[v] for v in unnamed(text)))
             for path, name, text in spec_texts() if unnamed(text)]
    assert found == []


def test_a_replaced_option_says_which_cluster_variable_it_comes_from():
    found = ['%s: %s: its description does not name %s' % (path, name, CLUSTER_NAME[name])
             for path, name, text in spec_texts() if name in CLUSTER_NAME and CLUSTER_NAME[name] not in text]
    assert found == []


def test_the_names_the_settings_checks_show_are_the_contract_s():
    # one table: the contract's REPLACED, from which the settings checks take the names they show
    assert replaced_vars.SET_AS == CLUSTER_NAME and REPLACED is replaced_vars.REPLACED
    assert python_env.SET_AS is replaced_vars.SET_AS


RAY_SETTINGS = {'ray_version': '2.60.0', 'ray_port': 6379, 'ray_dashboard_port': 8265, 'ray_client_server_port': 10001}


@pytest.mark.parametrize('errors', [
    python_env.setting_errors({'python_env_path': 'env', 'python_env_torch_version': 'latest',
                               'python_env_deepspeed_version': 'x', 'python_env_ninja_version': '?',
                               'python_env_packages': ['numpy'], 'python_env_offline': True, 'python_env_find_links': []}),
    ray_filter.ray_input_errors({'h': dict(RAY_SETTINGS, ray_port=70000, ray_dashboard_port=10001,
                                           ray_client_server_port=10001),
                                 'w': dict(RAY_SETTINGS, ray_port=6380)}, 'h'),
    ray_filter.ray_input_errors({'h': dict(RAY_SETTINGS, ray_port=12000)}, 'h'),
], ids=['python_env', 'ray-ports', 'ray-worker-range'])
def test_the_settings_checks_name_the_cluster_variable_the_user_sets(errors):
    assert errors
    assert [line for line in errors if unnamed(line)] == []
