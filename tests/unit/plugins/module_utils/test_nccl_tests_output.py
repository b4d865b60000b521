import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import nccl_tests_output as nt

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'nccl_tests')


def read(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


# file, collective (when the output does not say), ranks, hosts, rows, avg busbw
CASES = [
    ('all_reduce_v100x4_1node_nccl2.4.txt', 'all_reduce', 4, ['bessemer-node026'], 25, 4.42606),
    ('all_reduce_h100x16_2nodes.txt', 'all_reduce', 16, ['ztan-mig-235z', 'ztan-mig-gq73'], 31, 70.742),
    ('all_reduce_a100x16_2nodes_concluded.txt', None, 16, ['inst-li3ob-ao-ub24', 'inst-wyzi7-ao-ub24'], 1, 191.752),
    ('all_reduce_gh200x16_4nodes_corrupted_v2.17.9.txt', None, 16,
     ['gpu-1-43', 'gpu-1-47', 'gpu-1-49', 'gpu-1-51'], 28, None),
]


@pytest.mark.parametrize('name,collective,ranks,hosts,rows,avg', CASES)
def test_every_recorded_layout_gives_ranks_hosts_rows_and_average(name, collective, ranks, hosts, rows, avg):
    res = nt.parse_nccl_tests(read(name), collective=collective)
    assert res['collective'] == 'all_reduce'
    assert res['nranks'] == ranks
    assert res['hosts'] == hosts
    assert len(res['rows']) == rows
    assert res['avg_busbw_gbs'] == avg


@pytest.mark.parametrize('name,collective,ranks,hosts,rows,avg', CASES)
def test_busbw_of_every_recorded_row_follows_the_all_reduce_formula(name, collective, ranks, hosts, rows, avg):
    res = nt.parse_nccl_tests(read(name), collective=collective)
    checked = 0
    for row in res['rows']:
        for group in ('out_of_place', 'in_place'):
            g = row[group]
            algbw = nt.algbw(row['size'], g['time_us'])
            # the printed figures are rounded to 2 decimals, time to 4 significant digits
            assert algbw == pytest.approx(g['algbw_gbs'], abs=0.006, rel=0.003), (row['size'], group)
            expected = nt.busbw('all_reduce', algbw, res['nranks'])
            assert expected == pytest.approx(g['busbw_gbs'], abs=0.011, rel=0.003), (row['size'], group)
            checked += 1
    assert checked == 2 * rows


def test_all_gather_busbw_is_half_of_algbw_on_two_ranks():
    res = nt.parse_nccl_tests(read('all_gather_2gpu_bfloat16_excerpt.txt'), nranks=2, collective='all_gather_perf')
    assert res['collective'] == 'all_gather' and res['nranks'] == 2 and res['devices'] == []
    first = res['rows'][0]
    assert (first['size'], first['type'], first['redop']) == (16777216, 'bfloat16', 'none')
    for row in res['rows']:
        for group in ('out_of_place', 'in_place'):
            g = row[group]
            algbw = nt.algbw(row['size'], g['time_us'])
            assert algbw == pytest.approx(g['algbw_gbs'], abs=0.006, rel=0.003)
            assert nt.busbw('all_gather', g['algbw_gbs'], 2) == pytest.approx(g['busbw_gbs'], abs=0.006)


def test_old_layout_reads_the_error_column_and_has_no_root():
    res = nt.parse_nccl_tests(read('all_reduce_v100x4_1node_nccl2.4.txt'))
    last = res['rows'][-1]
    assert 'root' not in last
    assert last['out_of_place'] == {'time_us': 18003, 'algbw_gbs': 7.46, 'busbw_gbs': 11.18, 'error': 2e-07}
    assert res['devices'][0] == {'rank': 0, 'group': None, 'pid': 31823, 'host': 'bessemer-node026',
                                 'device': 0, 'bus_id': '0x3d', 'name': 'Tesla V100-PCIE-32GB'}
    assert res['out_of_bounds'] == {'count': 0, 'ok': True}
    assert res['wrong_total'] == 0


def test_device_lines_with_group_and_pci_domain():
    res = nt.parse_nccl_tests(read('all_reduce_h100x16_2nodes.txt'))
    dev = res['devices'][9]
    assert dev == {'rank': 9, 'group': 0, 'pid': 6734, 'host': 'ztan-mig-gq73', 'device': 1,
                   'bus_id': '0000:05:00', 'name': 'NVIDIA H100 80GB HBM3'}
    assert res['max_busbw_gbs'] == 338.82
    assert res['rows'][-1]['root'] == -1


def test_newer_build_reports_version_and_corrupted_sizes():
    res = nt.parse_nccl_tests(read('all_reduce_gh200x16_4nodes_corrupted_v2.17.9.txt'))
    assert res['version'] == '2.17.9'
    assert res['rows_with_wrong'] == [2097152, 4194304, 8388608, 16777216, 33554432, 67108864]
    assert res['wrong_total'] == 18134 + 9609 + 96817 + 124342 + 763876 + 530181 + 404221 + 103664 + 951005 + 820604 + 113492
    # the published block stops after the rows: no verdict, no average
    assert res['out_of_bounds'] is None and res['avg_busbw_gbs'] is None


def test_concluded_line_is_seen():
    assert nt.parse_nccl_tests(read('all_reduce_a100x16_2nodes_concluded.txt'))['concluded'] is True
    assert nt.parse_nccl_tests(read('all_reduce_h100x16_2nodes.txt'))['concluded'] is False


def test_rows_are_read_by_header_name_when_columns_are_added():
    text = read('all_reduce_h100x16_2nodes.txt').replace(
        '#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong',
        '#       size         count      type   redop    root     time   algbw   busbw #wrong    i_min     time   algbw   busbw #wrong    i_min')
    text = text.replace('  8589934592    2147483648     float     sum      -1    47535  180.71  338.82      0    47743  179.92  337.35      0',
                        '  8589934592    2147483648     float     sum      -1  '
                        '  47535  180.71  338.82      0    47001    47743  179.92  337.35      0    47100')
    res = nt.parse_nccl_tests(text)
    last = res['rows'][-1]
    assert last['in_place'] == {'time_us': 47743, 'algbw_gbs': 179.92, 'busbw_gbs': 337.35, 'wrong': 0, 'i_min': 47100}
    assert len(res['rows']) == 1  # the other rows no longer have the header's width and are skipped


def test_mpirun_prefixes_and_nccl_info_lines_are_skipped():
    text = '\n'.join('[1,0]<stdout>:' + line for line in read('all_reduce_a100x16_2nodes_concluded.txt').splitlines())
    text = text.replace('[1,0]<stdout>: 10737418240',
                        'node1:26:26 [0] NCCL INFO Launch mode Parallel\n[1,0]<stdout>: 10737418240')
    res = nt.parse_nccl_tests(text)
    assert len(res['rows']) == 1 and res['rows'][0]['in_place']['busbw_gbs'] == 191.75


def test_output_without_header_names_what_is_missing():
    with pytest.raises(ValueError, match='no column header') as err:
        nt.parse_nccl_tests('node1: Test NCCL failure common.cu:1005 \'unhandled system error\'\n')
    assert 'Test NCCL failure' in str(err.value)


def test_header_without_rows_is_an_error():
    header = '\n'.join(read('all_reduce_h100x16_2nodes.txt').splitlines()[:23])
    with pytest.raises(ValueError, match='no result rows'):
        nt.parse_nccl_tests(header)


@pytest.mark.parametrize('op,n,factor', [
    ('all_reduce', 8, 1.75), ('all_reduce_perf', 2, 1.0), ('AllReduce', 16, 1.875),
    ('all_gather', 4, 0.75), ('reduce_scatter', 8, 0.875), ('alltoall', 2, 0.5),
    ('broadcast', 8, 1.0), ('reduce', 8, 1.0),
])
def test_bus_factors(op, n, factor):
    assert nt.bus_factor(op, n) == pytest.approx(factor)


def test_formula_inputs_are_checked():
    with pytest.raises(ValueError, match='unknown collective'):
        nt.bus_factor('all_sum', 4)
    with pytest.raises(ValueError, match='nranks'):
        nt.bus_factor('all_reduce', 0)
    with pytest.raises(ValueError, match='time'):
        nt.algbw(1024, 0)
