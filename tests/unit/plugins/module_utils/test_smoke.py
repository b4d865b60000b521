"""The smoke module's logic: its input checks, the script's command line with each node's
ranks, and the result it reads back (with the cause found on the node put first)."""

import json
import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import smoke as st

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures')

NODES = ['alpha', 'bravo-2', 'charlie', 'delta']


def params(tmp_path, node='bravo-2', **extra):
    python = tmp_path / 'python'
    python.write_text('#!/bin/sh\n')
    python.chmod(0o755)
    script = tmp_path / 'smoke.py'
    script.write_text('')
    p = dict(node=node, nodes=list(NODES), slots=[2, 1, 1, 1], address='10.99.0.12', master_addr='10.99.0.11',
             master_port=29500, backend='gloo', python=str(python), script=str(script), timeout=60,
             socket_ifname='', env_files=[], env={})
    p.update(extra)
    return p


class FakeModule:
    """run_command answers the script with `answer` and ip with the recorded ip -j output."""

    def __init__(self, answer=(0, '', ''), check_mode=False):
        self.answer = answer
        self.check_mode = check_mode
        self.commands = []

    def get_bin_path(self, name):
        return {'timeout': '/usr/bin/timeout', 'ip': '/usr/sbin/ip'}.get(name)

    def run_command(self, argv, environ_update=None):
        self.commands.append((argv, environ_update))
        if argv[0] == '/usr/sbin/ip':
            with open(os.path.join(FIXTURES, 'interfaces', 'ip-j-addr-show.json')) as handle:
                return 0, handle.read(), ''
        return self.answer


def line(**result):
    return st.MARKER + json.dumps(result) + '\n'


def test_a_worker_runs_the_script_with_its_place_among_the_ranks(tmp_path):
    p = params(tmp_path)
    out = line(node='bravo-2', rank=2, slots=1, ranks=[2], world_size=5, ok=True, stage='done', sum=15.0,
               expected=15.0)
    module = FakeModule((0, 'torch noise\n' + out, ''))
    result = st.run(module, p)
    argv, env = module.commands[-1]
    assert argv[:4] == ['/usr/bin/timeout', '-k', '10', '180']
    value = dict(zip(argv, argv[1:]))
    assert json.loads(value['--slots']) == [2, 1, 1, 1] and value['--node-index'] == '1'
    assert json.loads(value['--nodes']) == NODES and value['--master-addr'] == '10.99.0.11'
    assert result['ok'] is True and result['sum'] == 15.0 and result['world_size'] == 5 and result['rank'] == 2


def test_place_of_each_node_on_a_2_1_1_1_cluster(tmp_path):
    assert st.check_input(params(tmp_path, node='alpha')) == {'index': 0, 'slots': [2, 1, 1, 1], 'world': 5,
                                                              'first_rank': 0}
    assert st.check_input(params(tmp_path, node='delta'))['first_rank'] == 4
    assert st.check_input(params(tmp_path, slots=None))['world'] == 4   # one rank each unless told


@pytest.mark.parametrize('extra, message', [
    ({'node': 'echo'}, 'host echo: node echo is not in nodes (alpha, bravo-2, charlie, delta)'),
    ({'nodes': ['alpha', 'bravo-2', 'bravo-2', 'delta']}, 'host bravo-2: nodes lists a node twice'),
    ({'slots': [2, 1, 1]}, 'host bravo-2: slots gives 3 count(s) for 4 node(s)'),
    ({'slots': [2, 0, 1, 1]}, 'host bravo-2: slots of node bravo-2 must be from 1 to 1024, got 0'),
    ({'master_port': 70000}, 'host bravo-2: master_port must be from 1 to 65535, got 70000'),
    ({'timeout': 2}, 'host bravo-2: timeout must be from 5 to 3600 seconds, got 2'),
])
def test_bad_input_names_the_host(tmp_path, extra, message):
    with pytest.raises(st.SmokeError) as err:
        st.check_input(params(tmp_path, **extra))
    assert str(err.value).startswith(message)


def test_a_socket_interface_that_does_not_hold_the_address_is_the_cause(tmp_path):
    p = params(tmp_path, socket_ifname='eth9', address='192.0.2.2')
    out = line(node='bravo-2', ok=False, stage='init', cause='process group did not form', error='timeout')
    result = st.run(FakeModule((7, out, 'trace')), p)
    assert result['ok'] is False and result['stage'] == 'init'
    assert result['cause'] == 'interface mismatch: socket interface eth9 does not exist here (eth0 holds 192.0.2.2)'
    assert result['socket_ifname'] == 'eth9' and 'trace' in result['output']


def test_the_right_interface_leaves_the_librarys_cause(tmp_path):
    p = params(tmp_path, socket_ifname='eth0', address='192.0.2.2')
    out = line(node='bravo-2', ok=False, stage='connect', cause='no route to the host', error='x')
    assert st.run(FakeModule((4, out, '')), p)['cause'] == 'no route to the host'


def test_a_script_that_printed_nothing_says_it_did_not_run(tmp_path):
    result = st.run(FakeModule((127, '', 'python: No module named torch\n')), params(tmp_path))
    assert result['ok'] is False and result['cause'] == 'the check did not run (exit 127)'
    assert result['error'] == 'python: No module named torch'


def test_check_mode_runs_nothing(tmp_path):
    module = FakeModule(check_mode=True)
    result = st.run(module, params(tmp_path, python='/nonexistent/python'))
    assert result['stage'] == 'skipped' and module.commands == []


def test_missing_python_and_a_held_port_name_the_host(tmp_path, monkeypatch):
    with pytest.raises(st.SmokeError, match='host bravo-2: python /nowhere/python does not exist'):
        st.run(FakeModule(), params(tmp_path, python='/nowhere/python'))
    monkeypatch.setattr(st.processes, 'port_listeners', lambda port, address=None: [
        {'pid': 4242, 'uid': 0, 'cmdline': 'torchrun --master-port 29500 train.py', 'job_id': 'job-7',
         'address': '0.0.0.0'}])
    with pytest.raises(st.SmokeError) as err:
        st.run(FakeModule(), params(tmp_path, node='alpha'))
    assert str(err.value) == ('host alpha: port 29500 is in use by pid 4242 (torchrun --master-port 29500 '
                              'train.py) of job job-7 (the rendezvous port, master_port)')
    assert st.run(FakeModule((0, line(ok=True, stage='done'), '')), params(tmp_path))['ok']  # workers do not check
