"""No module returns a key that Ansible reads as its own flag about the task: a module result with a true
`unreachable` is the node unreachable (its read lost), one with a true `skipped` a skipped task. Read from each
module's RETURN documentation and from the code that builds its results."""

import ast
import glob
import os

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
MODULES = sorted(glob.glob(os.path.join(ROOT, 'plugins', 'modules', '*.py')))
RESERVED = ('unreachable', 'skipped')


def returned(path):
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == 'RETURN' for t in node.targets):
            return yaml.safe_load(node.value.value) or {}
    return {}


@pytest.mark.parametrize('path', MODULES, ids=lambda p: os.path.basename(p)[:-3])
def test_no_module_documents_a_key_ansible_reserves(path):
    assert [key for key in returned(path) if key in RESERVED] == []


def test_no_result_is_given_a_reserved_key_in_the_code():
    """out['unreachable'] = ... (out or result: the names the modules build their results in) or
    exit_json(unreachable=...), in module code or module_utils."""
    found = []
    files = MODULES + sorted(glob.glob(os.path.join(ROOT, 'plugins', 'module_utils', '**', '*.py'), recursive=True))
    for path in files:
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                key = node.slice
                if (isinstance(key, ast.Constant) and key.value in RESERVED
                        and getattr(node.value, 'id', None) in ('out', 'result')):
                    found.append('%s:%d' % (os.path.relpath(path, ROOT), node.lineno))
            elif isinstance(node, ast.Call) and getattr(node.func, 'attr', None) == 'exit_json':
                found += ['%s:%d' % (os.path.relpath(path, ROOT), node.lineno)
                          for kw in node.keywords if kw.arg in RESERVED]
    assert found == []
