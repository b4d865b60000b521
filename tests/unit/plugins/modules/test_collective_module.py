"""The collective module's nccl-tests method, run as Ansible runs it.

mpirun and all_reduce_perf are stand-ins that print a published nccl-tests output (see
tests/unit/fixtures/nccl_tests/README.md) and record the command line they were given; the
module builds the command, reads the table by its header and applies the thresholds.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'collective.py')
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')
FIXTURES = os.path.join(ROOT, 'tests', 'unit', 'fixtures', 'nccl_tests')

NODES = [{'name': 'ztan-mig-235z', 'address': '10.0.0.1', 'slots': 8},
         {'name': 'ztan-mig-gq73', 'address': '10.0.0.2', 'slots': 8}]


def run(tmp_path, check=False, **args):
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=check, _ansible_tmpdir=str(tmp_path))}
    args_file = tmp_path / 'args.json'
    args_file.write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, MODULE, str(args_file)], capture_output=True, text=True, env=env,
                          check=False, timeout=120)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))


def stand_ins(tmp_path, fixture, lines=None, rc=0):
    """mpirun and all_reduce_perf that record their command line (mpirun also the hostfile it was
    given) and print the fixture, or only its first lines, then exit with rc."""
    tools = tmp_path / 'nccl-tests'
    tools.mkdir()
    show = ('head -n %d %s' % (lines, os.path.join(FIXTURES, fixture)) if lines
            else 'cat %s' % os.path.join(FIXTURES, fixture))
    for name in ('mpirun', 'all_reduce_perf'):
        script = tools / name
        script.write_text('#!/bin/sh\necho "$0 $*" >> %s\n' % (tmp_path / 'calls.txt')
                          + ('while [ $# -gt 0 ]; do if [ "$1" = --hostfile ]; then cp "$2" %s; fi; shift; done\n'
                             % (tmp_path / 'hostfile.txt') if name == 'mpirun' else '')
                          + '%s\nexit %d\n' % (show, rc))
        script.chmod(0o755)
    return tools


def test_two_nodes_through_mpirun_with_a_threshold_missed(tmp_path):
    tools = stand_ins(tmp_path, 'all_reduce_h100x16_2nodes.txt')
    out = run(tmp_path, method='nccl_tests', node='ztan-mig-235z', nodes=NODES, nccl_tests_dir=str(tools),
              mpirun=str(tools / 'mpirun'), sizes=['8', '16', '1M', '8G'], thresholds={'8G': 400, '1M': 9.0},
              env_files=[], env={'NCCL_IB_HCA': 'mlx5_0'})
    assert not out.get('failed'), out
    call = (tmp_path / 'calls.txt').read_text().split()
    assert call[1:3] == ['-np', '16'] and call[3] == '--hostfile' and call[5:7] == ['--bind-to', 'none']
    assert (tmp_path / 'hostfile.txt').read_text() == '10.0.0.1 slots=8\n10.0.0.2 slots=8\n'
    assert out['ranks'] == [{'node': 'ztan-mig-235z', 'slots': 8, 'first_rank': 0},
                            {'node': 'ztan-mig-gq73', 'slots': 8, 'first_rank': 8}]
    assert ['-x', 'NCCL_IB_HCA'] == call[call.index('-x'):call.index('-x') + 2]
    assert call[-13:] == [str(tools / 'all_reduce_perf'), '-b', '8', '-e', '8589934592', '-f', '2', '-n', '5',
                          '-w', '2', '-c', '1', '-g', '1'][-13:]
    assert out['algorithm'] == 'nccl-tests all_reduce_perf' and out['world_size'] == 16 and out['nnodes'] == 2
    assert len(out['rows']) == 31 and out['rows'][-1]['busbw_gbs'] == 338.82 and out['max_busbw_gbs'] == 338.82
    assert out['correct'] is True and out['nccl_tests_avg_busbw_gbs'] == 70.742
    assert out['out_of_bounds'] == {'count': 0, 'ok': True}
    assert out['below_threshold'] == [{'size': 8589934592, 'busbw_gbs': 338.82, 'threshold_gbs': 400.0}]
    assert out['ok'] is False


def test_wrong_elements_make_the_result_incorrect(tmp_path):
    tools = stand_ins(tmp_path, 'all_reduce_gh200x16_4nodes_corrupted_v2.17.9.txt')
    nodes = [{'name': 'n%d' % i, 'address': '10.0.0.%d' % i, 'slots': 4} for i in range(1, 5)]
    out = run(tmp_path, method='nccl_tests', node='n1', nodes=nodes, nccl_tests_dir=str(tools),
              mpirun=str(tools / 'mpirun'), sizes=['1M', '2M'], env_files=[])
    assert not out.get('failed'), out
    assert out['correct'] is False and out['ok'] is False
    assert any(r['wrong'] > 0 for r in out['rows'])


def test_one_node_runs_the_binary_with_its_gpus(tmp_path):
    tools = stand_ins(tmp_path, 'all_reduce_v100x4_1node_nccl2.4.txt')
    out = run(tmp_path, method='nccl_tests', node='gpu01', nodes=[{'name': 'gpu01', 'address': '10.0.0.1', 'slots': 4}],
              nccl_tests_dir=str(tools), sizes=['8', '128M'], env_files=[])
    assert not out.get('failed'), out
    call = (tmp_path / 'calls.txt').read_text().split()
    assert call[0].endswith('all_reduce_perf') and call[-2:] == ['-g', '4']
    assert out['world_size'] == 4 and out['rows'] and out['correct'] is True


def test_no_binary_names_the_host_and_the_way_out(tmp_path):
    out = run(tmp_path, method='nccl_tests', node='gpu01', nodes=[{'name': 'gpu01', 'address': '10.0.0.1'}],
              nccl_tests_dir=str(tmp_path), env_files=[])
    assert out['failed'] and out['msg'] == ('host gpu01: all_reduce_perf not found (%s); build nccl-tests or use '
                                            'method torch' % tmp_path)


@pytest.mark.parametrize('sizes,message', [
    ([], 'host gpu01: sizes is empty; give at least one message size, e.g. [1M, 64M]'),
    (['64M', '1M'], 'host gpu01: sizes must be increasing: sizes[1] = 1048576 bytes does not exceed '
                    'sizes[0] = 67108864 bytes'),
])
def test_bad_sizes_fail_naming_the_host(tmp_path, sizes, message):
    out = run(tmp_path, node='gpu01', nodes=[{'name': 'gpu01', 'address': '10.0.0.1'}], sizes=sizes)
    assert out['failed'] and out['msg'] == message


def test_probe_reports_what_the_node_has(tmp_path):
    tools = stand_ins(tmp_path, 'all_reduce_v100x4_1node_nccl2.4.txt')
    out = run(tmp_path, probe=True, node='gpu01', nodes=[{'name': 'gpu01', 'address': '10.0.0.1'}],
              nccl_tests_dir=str(tools), env_path=str(tmp_path / 'no-env'))
    assert out['found']['nccl_tests'] == str(tools / 'all_reduce_perf') and out['found']['torchrun'] is None


def test_a_2_1_1_cluster_gets_each_nodes_own_slots_through_mpirun(tmp_path):
    tools = stand_ins(tmp_path, 'all_reduce_h100x16_2nodes.txt')
    nodes = [{'name': 'alpha', 'address': '10.99.0.11', 'slots': 2},
             {'name': 'bravo-2', 'address': '10.99.0.12', 'slots': 1},
             {'name': 'charlie', 'address': '10.99.0.13', 'slots': 1}]
    out = run(tmp_path, method='nccl_tests', node='alpha', nodes=nodes, nccl_tests_dir=str(tools),
              mpirun=str(tools / 'mpirun'), sizes=['8', '16'], env_files=[])
    call = (tmp_path / 'calls.txt').read_text().split()
    assert call[1:3] == ['-np', '4']
    assert (tmp_path / 'hostfile.txt').read_text() == ('10.99.0.11 slots=2\n10.99.0.12 slots=1\n'
                                                       '10.99.0.13 slots=1\n')
    assert [(r['node'], r['slots'], r['first_rank']) for r in out['ranks']] == [
        ('alpha', 2, 0), ('bravo-2', 1, 2), ('charlie', 1, 3)]


def test_a_run_that_printed_one_row_then_timed_out_is_a_failure_naming_the_missing_sizes(tmp_path):
    # the header and the first row (8 bytes) of the recorded run, then timeout(1)'s exit 124
    tools = stand_ins(tmp_path, 'all_reduce_h100x16_2nodes.txt', lines=24, rc=124)
    out = run(tmp_path, method='nccl_tests', node='ztan-mig-235z', nodes=NODES, nccl_tests_dir=str(tools),
              mpirun=str(tools / 'mpirun'), sizes=['8', '1M', '8G'], thresholds={'8G': 100}, env_files=[], timeout=60)
    assert not out.get('failed'), out
    assert [r['size'] for r in out['rows']] == [8]
    assert out['ok'] is False
    assert out['missing_sizes'] == [1048576, 8589934592]
    assert out['error'] == 'nccl-tests exited 124 (timed out after 60 s); size(s) 1M, 8G missing from the output'
    assert out['below_threshold'] == [{'size': 8589934592, 'busbw_gbs': None, 'threshold_gbs': 100.0}]


def test_a_complete_table_with_a_non_zero_exit_is_not_ok(tmp_path):
    tools = stand_ins(tmp_path, 'all_reduce_h100x16_2nodes.txt', rc=1)
    out = run(tmp_path, method='nccl_tests', node='ztan-mig-235z', nodes=NODES, nccl_tests_dir=str(tools),
              mpirun=str(tools / 'mpirun'), sizes=['8', '16'], env_files=[])
    assert out['missing_sizes'] == [] and out['correct'] is True
    assert out['ok'] is False and out['error'] == 'nccl-tests exited 1'
