"""The dist_check script's copy of the connect-failure causes is the module_utils one.

roles/cluster_tests/files/dist_check.py runs on the nodes without the collection, so it
carries its own cause_of; these tests fail when it and cluster_tests.socket_cause drift apart.
"""

import ast
import errno
import importlib.util
import inspect
import os
import socket
import textwrap

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_tests as ct

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
SCRIPT = os.path.join(ROOT, 'roles', 'cluster_tests', 'files', 'dist_check.py')


def load_script():
    # the script imports torch only inside main(), so it loads without torch
    spec = importlib.util.spec_from_file_location('dist_check_script', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def body(function):
    """The statements of a function, without its name and docstring, as an AST dump."""
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    statements = node.body
    if statements and isinstance(statements[0], ast.Expr) and isinstance(statements[0].value, ast.Constant):
        statements = statements[1:]
    return [ast.dump(s) for s in statements]


def test_the_script_maps_causes_with_the_same_code():
    assert body(load_script().cause_of) == body(ct.socket_cause)


@pytest.mark.parametrize('exc', [
    socket.gaierror(socket.EAI_NONAME, 'Name or service not known'),
    socket.timeout('timed out'),
    TimeoutError(),
    ConnectionRefusedError(errno.ECONNREFUSED, 'Connection refused'),
    OSError(errno.EHOSTUNREACH, 'No route to host'),
    OSError(errno.ENETUNREACH, 'Network is unreachable'),
    PermissionError(errno.EACCES, 'Permission denied'),
    OSError(errno.EPERM, 'Operation not permitted'),
    OSError(errno.ECONNRESET, 'Connection reset by peer'),
    OSError('no errno'),
    None,  # getaddrinfo gave no address to try
], ids=repr)
def test_the_script_and_module_utils_give_the_same_cause(exc):
    assert load_script().cause_of(exc) == ct.socket_cause(exc)
