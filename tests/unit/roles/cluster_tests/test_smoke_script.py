"""The smoke test script (roles/cluster_tests/files/smoke.py) without torch: the causes
it gives for a failed connect, where a node's ranks are, who joined, and one result per node.

The script runs on the nodes without the collection; it imports torch only inside main(), so
it loads here without torch.
"""

import errno
import importlib.util
import os
import socket
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
SCRIPT = os.path.join(ROOT, 'roles', 'cluster_tests', 'files', 'smoke.py')


@pytest.fixture(scope='module')
def script():
    spec = importlib.util.spec_from_file_location('smoke_script', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('exc, cause', [
    (socket.gaierror(socket.EAI_NONAME, 'Name or service not known'), 'name not resolvable'),
    (socket.timeout('timed out'), 'no answer (port filtered by a firewall, or the host is down)'),
    (TimeoutError(), 'no answer (port filtered by a firewall, or the host is down)'),
    (ConnectionRefusedError(errno.ECONNREFUSED, 'Connection refused'),
     'port closed (connection refused: nothing listens, or a firewall rejects it)'),
    (OSError(errno.EHOSTUNREACH, 'No route to host'), 'no route to the host'),
    (OSError(errno.ENETUNREACH, 'Network is unreachable'), 'no route to the host'),
    (PermissionError(errno.EACCES, 'Permission denied'), 'blocked by a local rule (connection not permitted)'),
    (OSError(errno.EPERM, 'Operation not permitted'), 'blocked by a local rule (connection not permitted)'),
    (OSError(errno.ECONNRESET, 'Connection reset by peer'), 'connection failed'),
    (None, 'connection failed'),  # getaddrinfo gave no address to try
], ids=repr)
def test_a_failed_connect_gets_a_cause_a_user_acts_on(script, exc, cause):
    assert script.cause_of(exc) == cause


def test_reach_tells_a_closed_port_from_an_unknown_name(script):
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    cause, error = script.reach('127.0.0.1', port, time.time() + 1)
    assert cause.startswith('port closed') and str(port) in error
    cause, _ = script.reach('no-such-node.invalid', port, time.time() + 1)
    assert cause == 'name not resolvable'
    with socket.socket() as listener:
        listener.bind(('127.0.0.1', 0))
        listener.listen(1)
        assert script.reach('127.0.0.1', listener.getsockname()[1], time.time() + 1) is None


def test_ranks_are_numbered_node_by_node_on_a_2_1_1_cluster(script):
    nodes = ['alpha', 'bravo-2', 'charlie', 'delta']
    slots = [2, 1, 1, 1]
    assert script.plan(nodes, slots, 0) == {'node': 'alpha', 'world': 5, 'first_rank': 0, 'slots': 2}
    assert script.plan(nodes, slots, 1) == {'node': 'bravo-2', 'world': 5, 'first_rank': 2, 'slots': 1}
    assert script.plan(nodes, slots, 3)['first_rank'] == 4
    with pytest.raises(ValueError, match='slots must give 1 or more ranks for each of the 4 nodes'):
        script.plan(nodes, [2, 1, 1], 0)
    with pytest.raises(ValueError):
        script.plan(nodes, [2, 0, 1, 1], 0)


def test_a_node_joined_only_when_all_its_ranks_registered(script):
    nodes, slots = ['alpha', 'bravo', 'charlie'], [2, 1, 1]
    assert script.joined_nodes(nodes, slots, {0, 1, 2, 3}) == nodes
    assert script.joined_nodes(nodes, slots, {0, 2, 3}) == ['bravo', 'charlie']  # alpha's rank 1 is missing
    assert script.joined_nodes(nodes, slots, {0, 1}) == ['alpha']


def test_the_node_result_says_which_of_its_ranks_failed(script):
    where = {'node': 'alpha', 'world': 4, 'first_rank': 0, 'slots': 2}
    good = {'node': 'alpha', 'rank': 0, 'ok': True, 'stage': 'done', 'cause': None, 'error': None, 'sum': 10.0}
    bad = {'node': 'alpha', 'rank': 1, 'ok': False, 'stage': 'init', 'cause': 'process group did not form',
           'error': 'Connection closed by peer'}
    merged = script.merge([good, bad], where)
    assert (merged['ok'], merged['stage'], merged['cause']) == (False, 'init', 'rank 1: process group did not form')
    assert merged['ranks'] == [0, 1] and merged['slots'] == 2
    assert script.merge([good, dict(good, rank=1)], where)['ok'] is True


def test_forked_ranks_report_back_through_their_pipe(script):
    where = {'node': 'alpha', 'world': 3, 'first_rank': 0, 'slots': 3}

    def run(local):
        return {'node': 'alpha', 'rank': local, 'ok': local != 2, 'stage': 'done' if local != 2 else 'reduce',
                'cause': None if local != 2 else 'wrong all-reduce result', 'error': None}, 0 if local != 2 else 8

    children = [script._fork_rank(run, local) for local in (1, 2)]
    results = [run(0)[0]] + [script._collect(pid, read, local, where) for local, (pid, read) in enumerate(children, 1)]
    merged = script.merge(results, where)
    assert [r['rank'] for r in results] == [0, 1, 2]
    assert merged['ok'] is False and merged['cause'] == 'rank 2: wrong all-reduce result'


def test_a_rank_that_dies_without_a_result_is_named(script):
    where = {'node': 'bravo', 'world': 3, 'first_rank': 1, 'slots': 2}

    def run(local):
        os._exit(3)

    pid, read = script._fork_rank(run, 1)
    lost = script._collect(pid, read, 1, where)
    assert lost['ok'] is False and lost['rank'] == 2 and lost['cause'].startswith('rank ended without a result')
