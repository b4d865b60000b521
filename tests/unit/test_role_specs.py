"""Each role's defaults are stated once: where meta/argument_specs.yml gives a default it is the one
defaults/main.yml sets, and a default that derives from another value (a template) is only described
there, never given as a fixed value a reader would take for the real one."""

from __future__ import annotations

import os
import re

import pytest
import yaml

ROOT = os.path.join(os.path.dirname(__file__), '..', '..')
ROLES = sorted(r for r in os.listdir(os.path.join(ROOT, 'roles'))
               if os.path.exists(os.path.join(ROOT, 'roles', r, 'meta', 'argument_specs.yml')))


def _templated(value):
    if isinstance(value, str):
        return '{{' in value
    if isinstance(value, list):
        return any(_templated(v) for v in value)
    if isinstance(value, dict):
        return any(_templated(v) for v in value.values())
    return False


@pytest.mark.parametrize('role', ROLES)
def test_the_spec_states_the_defaults_the_role_sets(role):
    with open(os.path.join(ROOT, 'roles', role, 'meta', 'argument_specs.yml')) as f:
        spec = yaml.safe_load(f)['argument_specs']['main']['options']
    path = os.path.join(ROOT, 'roles', role, 'defaults', 'main.yml')
    defaults = {}
    if os.path.exists(path):
        with open(path) as f:
            defaults = yaml.safe_load(f) or {}
    problems = []
    for name, value in defaults.items():
        if name not in spec:
            problems.append('%s: set in defaults/main.yml, missing from the spec' % name)
        elif _templated(value) and 'default' in spec[name]:
            problems.append('%s: derives from %r but the spec says default %r' % (name, value, spec[name]['default']))
        elif not _templated(value) and 'default' in spec[name] and spec[name]['default'] != value:
            problems.append('%s: defaults/main.yml sets %r, the spec says %r' % (name, value, spec[name]['default']))
    assert problems == []


def test_the_shared_storage_paths_derive_from_one_cluster_shared_dir():
    derived = {'nfs_client': ['nfs_client_path', 'nfs_client_export'], 'nfs_server': ['nfs_server_export_path'],
               'training': ['training_jobs_dir'], 'container': ['container_images_dir', 'container_mounts'],
               'health': ['health_shared_path'], 'nccl_env': ['nccl_env_hostfiles_dir']}
    for role, names in derived.items():
        with open(os.path.join(ROOT, 'roles', role, 'defaults', 'main.yml')) as f:
            defaults = yaml.safe_load(f)
        for name in names:
            value = str(defaults[name])
            assert re.search(r"cluster_value', '(shared_dir|container_mounts)'", value) and '/shared' not in value, (
                role, name)


def _code_text():
    """Every file of roles/, plugins/ and playbooks/ that code is read from: argument specs, READMEs
    and the names defaults/main.yml sets are left out, so a variable counts as read only where a task,
    template, var, filter or module uses it."""
    texts = []
    for top in ('roles', 'plugins', 'playbooks'):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                path = os.path.join(folder, name)
                if name.endswith('.md') or path.endswith(os.path.join('meta', 'argument_specs.yml')):
                    continue
                with open(path, errors='replace') as f:
                    text = f.read()
                if path.endswith(os.path.join('defaults', 'main.yml')):
                    text = re.sub(r'(?m)^[a-z0-9_]+:', '', text)
                texts.append(text)
    return '\n'.join(texts)


def test_every_variable_a_spec_describes_is_read_by_the_code():
    code = _code_text()
    unread = []
    for role in ROLES:
        with open(os.path.join(ROOT, 'roles', role, 'meta', 'argument_specs.yml')) as f:
            spec = yaml.safe_load(f)['argument_specs']['main']['options']
        unread += ['%s: %s' % (role, name) for name in spec if not re.search(r'\b%s\b' % name, code)]
    assert unread == []
