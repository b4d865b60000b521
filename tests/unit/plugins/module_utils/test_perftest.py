import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import perftest

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'perftest')


def read(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


def test_bidirectional_gbits_sweep():
    res = perftest.parse_perftest_bw(read('write_bw_bidir_all_sizes_gbits.txt'))
    assert res['test'] == 'RDMA_Write Bidirectional BW Test' and res['bidirectional'] is True
    assert res['unit'] == 'Gb/sec' and res['link_type'] == 'Ethernet' and res['qps'] == 1
    assert [r['bytes'] for r in res['rows']] == [2 ** k for k in range(1, 24)]
    assert res['rows'][15] == {'bytes': 65536, 'iterations': 5000, 'bw_peak': 204.12, 'bw_average': 203.85,
                               'msg_rate_mpps': 0.388818, 'bw_peak_gbps': 204.12, 'bw_average_gbps': 203.85}
    assert (res['bytes'], res['bw_average_gbps']) == (8388608, 204.59)


@pytest.mark.parametrize('name', ['write_bw_bidir_all_sizes_gbits.txt', 'read_bw_all_sizes_mbsec_excerpt.txt',
                                  'atomic_bw_mbsec.txt', 'write_bw_postlist_duration_gbits.txt'])
def test_average_bandwidth_agrees_with_message_rate_times_size(name):
    """perftest prints BW and MsgRate from the same count: a misread column breaks this."""
    res = perftest.parse_perftest_bw(read(name))
    for row in res['rows']:
        if row['bw_average'] < 1:  # two printed decimals are too coarse below 1
            continue
        from_rate = row['msg_rate_mpps'] * 1e6 * row['bytes'] * 8 / 1e9
        assert row['bw_average_gbps'] == pytest.approx(from_rate, rel=0.02), row


def test_mb_per_sec_is_mebibytes_and_converted_to_gbits():
    res = perftest.parse_perftest_bw(read('read_bw_all_sizes_mbsec_excerpt.txt'))
    assert res['unit'] == 'MB/sec' and res['test'] == 'RDMA_Read BW Test' and res['device'] == 'mlx5_1'
    row = res['rows'][-1]
    assert row['bw_average'] == 19.50
    assert row['bw_average_gbps'] == pytest.approx(19.50 * 2 ** 20 * 8 / 1e9)


def test_unmeasured_peak_is_none_and_tabs_are_columns():
    res = perftest.parse_perftest_bw(read('write_bw_postlist_duration_gbits.txt'))
    assert res['rows'] == [{'bytes': 8, 'iterations': 224958464, 'bw_peak': None, 'bw_average': 0.48,
                            'msg_rate_mpps': 7.498617, 'bw_peak_gbps': None, 'bw_average_gbps': 0.48}]
    assert res['device'] == 'ib0'


def test_warning_lines_around_the_table_are_ignored():
    res = perftest.parse_perftest_bw(read('atomic_bw_mbsec.txt'))
    assert res['test'] == 'Atomic CMP_AND_SWAP BW Test' and len(res['rows']) == 1
    text = read('read_bw_all_sizes_mbsec_excerpt.txt').replace(
        ' 4          1000', 'Conflicting CPU frequency values detected: 3900 != 400. CPU Frequency is not max.\n 4          1000')
    assert len(perftest.parse_perftest_bw(text)['rows']) == 3


def test_missing_table_names_what_is_missing_and_what_the_tool_said():
    with pytest.raises(ValueError, match=r"no result header .*Couldn't connect to 10.0.0.2:18515"):
        perftest.parse_perftest_bw("Couldn't connect to 10.0.0.2:18515\nUnable to open file descriptor for socket connection")
    header = read('atomic_bw_mbsec.txt').split(' 8          1000')[0]
    with pytest.raises(ValueError, match='no result rows'):
        perftest.parse_perftest_bw(header)
    with pytest.raises(ValueError, match='empty'):
        perftest.parse_perftest_bw('')
