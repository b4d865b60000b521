"""The collective test's commands, ranks and verdict, on a 2+1+1 cluster."""

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import collective as ct
from ansible_collections.gpucluster.multinode.plugins.module_utils import nccl_tests_output as nt

NODES = [{'name': 'alpha', 'address': '10.99.0.11', 'slots': 2},
         {'name': 'bravo-2', 'address': '10.99.0.12', 'slots': 1},
         {'name': 'charlie', 'address': '10.99.0.13', 'slots': 1},
         {'name': 'delta', 'address': '10.99.0.14', 'slots': 1}]


def test_world_is_the_sum_of_the_slots_and_ranks_are_numbered_node_by_node():
    assert ct.world_size(NODES) == 5
    assert ct.ranks_by_node(NODES) == [{'node': 'alpha', 'slots': 2, 'first_rank': 0},
                                       {'node': 'bravo-2', 'slots': 1, 'first_rank': 2},
                                       {'node': 'charlie', 'slots': 1, 'first_rank': 3},
                                       {'node': 'delta', 'slots': 1, 'first_rank': 4}]


@pytest.mark.parametrize('node, nproc, node_rank', [('alpha', '2', '0'), ('bravo-2', '1', '1'), ('delta', '1', '3')])
def test_torchrun_starts_each_nodes_own_count(node, nproc, node_rank):
    cmd = ct.torchrun_command('/env/bin/torchrun', NODES, node, 29500, '/t/collective.py', [1024, 4096],
                              5, 2, 'gloo', 600)
    value = dict(zip(cmd, cmd[1:]))
    assert (value['--nnodes'], value['--nproc-per-node'], value['--node-rank']) == ('4', nproc, node_rank)
    assert (value['--master-addr'], value['--master-port']) == ('10.99.0.11', '29500')
    assert value['--sizes'] == '1024,4096'


def test_busbw_of_the_rows_uses_the_real_world_size():
    rows = nt.allreduce_rows([{'size': 1 << 20, 'count': 1 << 18, 'time_us': 1000.0, 'wrong': 0}], ct.world_size(NODES))
    assert rows[0]['busbw_gbs'] == pytest.approx(rows[0]['algbw_gbs'] * 2 * 4 / 5)
    assert nt.busbw('all_reduce', 1.0, 5) == pytest.approx(1.6)


def test_nccl_tests_through_mpirun_reads_the_hostfile(tmp_path):
    path = ct.write_hostfile(NODES, str(tmp_path))
    assert open(path).read() == ('10.99.0.11 slots=2\n10.99.0.12 slots=1\n10.99.0.13 slots=1\n'
                                 '10.99.0.14 slots=1\n')
    cmd = ct.nccl_tests_command('/nt/all_reduce_perf', ['-b', '8'], NODES, '/usr/bin/mpirun', path,
                                forward=['NCCL_SOCKET_IFNAME', 'NCCL_DEBUG'])
    assert cmd[:7] == ['/usr/bin/mpirun', '-np', '5', '--hostfile', path, '--bind-to', 'none']
    assert cmd[7:11] == ['-x', 'NCCL_DEBUG', '-x', 'NCCL_SOCKET_IFNAME']
    assert cmd[-2:] == ['-g', '1']
    one = ct.nccl_tests_command('/nt/all_reduce_perf', ['-b', '8'], NODES[:1])
    assert one == ['/nt/all_reduce_perf', '-b', '8', '-g', '2']


def rows(*sizes, busbw=5.0, wrong=0):
    return [{'size': s, 'busbw_gbs': busbw, 'wrong': wrong} for s in sizes]


def test_verdict_ok_only_with_every_size_and_no_error():
    assert ct.verdict(rows(1024, 4096), [1024, 4096])['ok'] is True
    partial = ct.verdict(rows(1024), [1024, 4096, 1 << 20], error=ct.exit_error('nccl-tests', 124, 600))
    assert partial['ok'] is False and partial['missing_sizes'] == [4096, 1 << 20]
    assert partial['error'] == 'nccl-tests exited 124 (timed out after 600 s); size(s) 4K, 1M missing from the output'
    assert ct.verdict(rows(1024, 4096), [1024, 4096], error='nccl-tests exited 1')['ok'] is False
    assert ct.verdict(rows(1024, 4096), [1024, 4096], correct=False)['ok'] is False
    assert ct.verdict(rows(1024, 4096, wrong=3), [1024, 4096])['correct'] is False


def test_a_threshold_on_a_size_never_reached_is_not_skipped():
    v = ct.verdict(rows(1024), [1024, 4096], thresholds={4096: 2.0, 1024: 1.0})
    assert v['below_threshold'] == [{'size': 4096, 'busbw_gbs': None, 'threshold_gbs': 2.0}]
    low = ct.verdict(rows(1024, 4096, busbw=1.5), [1024, 4096], thresholds={4096: 2.0})
    assert low['below_threshold'] == [{'size': 4096, 'busbw_gbs': 1.5, 'threshold_gbs': 2.0}] and not low['ok']


def test_result_says_where_the_ranks_ran():
    out = ct.result('torch', rows(1024), [1024], {}, 5, NODES, 'torch.distributed all_reduce (gloo)', 'gloo')
    assert out['ok'] and out['world_size'] == 5 and out['nnodes'] == 4
    assert [r['slots'] for r in out['ranks']] == [2, 1, 1, 1]


class FakeModule:
    check_mode = False
    tmpdir = '/nonexistent'

    def __init__(self, answer):
        self.answer = answer
        self.commands = []

    def get_bin_path(self, name):
        return '/usr/bin/timeout' if name == 'timeout' else None

    def run_command(self, argv, environ_update=None):
        self.commands.append(argv)
        return self.answer


def torch_params(tmp_path, node='alpha'):
    env = tmp_path / 'env' / 'bin'
    env.mkdir(parents=True, exist_ok=True)
    (env / 'torchrun').write_text('#!/bin/sh\n')
    (env / 'torchrun').chmod(0o755)
    script = tmp_path / 'collective.py'
    script.write_text('')
    return dict(node=node, nodes=NODES, collective='all_reduce', env_path=str(tmp_path / 'env'), script=str(script),
                master_port=29500, iterations=5, warmup=2, backend='auto', timeout=300)


def bench_output(sizes, end=True):
    import json
    lines = [ct.MARKER + json.dumps({'kind': 'start', 'backend': 'gloo', 'world_size': 5, 'nnodes': 4})]
    for size in sizes:
        lines.append(ct.MARKER + json.dumps({'kind': 'row', 'size': size, 'count': size // 4, 'time_us': 900.0,
                                             'wrong': 0}))
    if end:
        lines.append(ct.MARKER + json.dumps({'kind': 'end'}))
    return '\n'.join(lines) + '\n'


def test_the_head_reports_rows_with_the_world_of_5(tmp_path, monkeypatch):
    monkeypatch.setattr(ct.processes, 'port_listeners', lambda port, address=None: [])
    module = FakeModule((0, bench_output([65536, 1 << 20]), ''))
    out = ct.run_torch(module, torch_params(tmp_path), [65536, 1 << 20], {}, {})
    assert module.commands[0][:4] == ['/usr/bin/timeout', '-k', '10', '300']
    assert out['ok'] and out['reporter'] and out['world_size'] == 5
    assert out['rows'][-1]['busbw_gbs'] == pytest.approx(out['rows'][-1]['algbw_gbs'] * 8 / 5)


def test_the_head_timed_out_after_one_size(tmp_path, monkeypatch):
    monkeypatch.setattr(ct.processes, 'port_listeners', lambda port, address=None: [])
    out = ct.run_torch(FakeModule((124, bench_output([65536], end=False), '')), torch_params(tmp_path),
                       [65536, 1 << 20], {}, {})
    assert out['ok'] is False and out['missing_sizes'] == [1 << 20]
    assert out['error'] == 'torchrun on alpha exited 124 (timed out after 300 s); size(s) 1M missing from the output'


def test_a_worker_reports_its_exit_only(tmp_path):
    ok = ct.run_torch(FakeModule((0, '', '')), torch_params(tmp_path, 'charlie'), [65536], {}, {})
    assert ok['ok'] and not ok['reporter'] and ok['rows'] == []
    bad = ct.run_torch(FakeModule((1, '', 'RendezvousTimeoutError')), torch_params(tmp_path, 'charlie'), [65536], {}, {})
    assert not bad['ok'] and bad['error'] == 'torchrun on charlie exited 1' and 'Rendezvous' in bad['output']


def test_the_rendezvous_port_held_by_another_job_is_refused_on_the_head(tmp_path, monkeypatch):
    monkeypatch.setattr(ct.processes, 'port_listeners', lambda port, address=None: [
        {'pid': 77, 'uid': 1000, 'cmdline': 'python train.py', 'job_id': 'run-3', 'address': '0.0.0.0'}])
    with pytest.raises(ct.CollectiveError) as err:
        ct.run_torch(FakeModule((0, '', '')), torch_params(tmp_path), [65536], {}, {})
    assert str(err.value) == ('host alpha: port 29500 is in use by pid 77 (python train.py) of job run-3 '
                              '(the rendezvous port, master_port)')
