"""The documentation a newcomer meets: a short README whose links lead somewhere, and one
skeleton for every role README."""

from __future__ import annotations

import glob
import os
import re

import pytest

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
