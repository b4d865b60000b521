"""The documentation a newcomer meets: a short README whose links lead somewhere, and one
skeleton for every role README."""

from __future__ import annotations

import glob
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKELETON = ['Requirements', 'Variables', 'Example', 'What it checks', 'Failure messages']
ROLES = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(ROOT, 'roles', '*', 'meta')))


@pytest.mark.parametrize('role', ROLES)
def test_every_role_readme_has_the_skeleton_in_order(role):
    with open(os.path.join(ROOT, 'roles', role, 'README.md')) as f:
        headings = re.findall(r'(?m)^## (.+)$', f.read())
    assert headings[:len(SKELETON)] == SKELETON, headings


def _links(path):
    with open(path) as f:
        return [(path, target) for target in re.findall(r'\]\(([^)#\s]+)', f.read()) if '://' not in target]


def test_the_readme_is_short_and_its_links_and_playbooks_exist():
    readme = os.path.join(ROOT, 'README.md')
    with open(readme) as f:
        text = f.read()
    assert len(text.splitlines()) <= 300
    for path, target in _links(readme):
        assert os.path.exists(os.path.join(ROOT, target)), target
    listed = set(re.findall(r'(?m)^\| `([a-z0-9_]+)\.yml` \|', text))
    current = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(ROOT, 'playbooks', '*.yml'))}
    old = {'dist_check', 'network_test', 'nccl_test'}
    assert listed == current - old


def test_the_links_of_the_docs_and_role_readmes_exist():
    paths = glob.glob(os.path.join(ROOT, 'docs', '*.md')) + glob.glob(os.path.join(ROOT, 'roles', '*', 'README.md'))
    missing = [(os.path.relpath(p, ROOT), t) for p in paths for p, t in _links(p)
               if not os.path.exists(os.path.join(os.path.dirname(p), t))]
    assert missing == []


def _variable_rows(text):
    """The first cells of the rows of every table whose header's first cell is `variable`: each a list of the
    names it lists (`a` / `_b` short for the name that ends in _b after a part of a's, e.g. `x_warn_pct` /
    `_fail_pct` for x_fail_pct)."""
    rows, in_table, is_variables = [], False, False
    for line in text.splitlines():
        if not line.startswith('|'):
            in_table = False
            continue
        if not in_table:
            in_table, is_variables = True, bool(re.match(r'(?i)\|\s*variable\s*\|', line))
            continue
        if is_variables:
            cell = line.split('|')[1]
            names = re.findall(r'`([a-z_][a-z0-9_]*)`', cell)
            if names:
                rows.append(names)
    return rows


def _named(rows, options):
    """The options the rows name: the full names, and each `_suffix` joined to a leading part of the row's
    first name that makes an option."""
    out = []
    for names in rows:
        first = names[0]
        out.append(first)
        parts = first.split('_')
        for short in names[1:]:
            if not short.startswith('_'):
                out.append(short)
                continue
            found = [p for p in ('_'.join(parts[:k]) + short for k in range(len(parts) - 1, 0, -1)) if p in options]
            out.append(found[0] if found else first + short)
    return out


def _spec_options(role):
    with open(os.path.join(ROOT, 'roles', role, 'meta', 'argument_specs.yml')) as handle:
        specs = yaml.safe_load(handle)['argument_specs']
    return specs, set(name for entry in specs.values() for name in (entry.get('options') or {}))


@pytest.mark.parametrize('role', ROLES)
def test_a_role_readme_lists_each_variable_once_as_its_argument_spec_names_it(role):
    with open(os.path.join(ROOT, 'roles', role, 'README.md')) as handle:
        text = handle.read()
    specs, options = _spec_options(role)
    named = _named(_variable_rows(text), options)
    assert named, 'roles/%s/README.md has no variable table' % role
    twice = sorted(n for n in set(named) if named.count(n) > 1)
    assert twice == [], 'listed more than once in roles/%s/README.md: %s' % (role, ', '.join(twice))
    unknown = [n for n in named if n not in options]
    assert unknown == [], 'roles/%s/README.md lists what meta/argument_specs.yml does not: %s' % (role, ', '.join(unknown))
    main = set((specs.get('main') or {}).get('options') or {})
    untold = sorted(n for n in main if n not in named and '`%s`' % n not in text)
    assert untold == [], 'roles/%s/README.md never names: %s' % (role, ', '.join(untold))
