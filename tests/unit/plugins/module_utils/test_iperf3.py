import json
import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.iperf3 import parse_iperf3

from test_launchers import Clock  # the fake clock whose sleep advances it

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'iperf3')


def read(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


def test_four_streams_sum_and_retransmits():
    res = parse_iperf3(read('client-P4-loopback.json'))
    data = json.loads(read('client-P4-loopback.json'))
    assert res['ok'] is True and res['error'] is None
    assert res['streams'] == 4 and res['protocol'] == 'TCP' and res['reverse'] is False
    assert res['sent_bps'] == data['end']['sum_sent']['bits_per_second']
    assert res['gbps'] == pytest.approx(data['end']['sum_received']['bits_per_second'] / 1e9)
    # the sum is the sum of the four streams, not one of them
    per_stream = sum(s['receiver']['bits_per_second'] for s in data['end']['streams'])
    assert res['received_bps'] == pytest.approx(per_stream, rel=0.01)
    assert res['retransmits'] == 13
    assert (res['remote_host'], res['remote_port']) == ('127.0.0.1', 5299)


def test_reverse_run_is_marked_and_reads_what_arrived():
    res = parse_iperf3(read('client-P4-reverse-loopback.json'))
    assert res['reverse'] is True and res['streams'] == 4
    assert res['bytes_received'] == 3005284299 and res['retransmits'] == 7


def test_single_stream():
    res = parse_iperf3(json.loads(read('client-P1-loopback.json')))
    assert res['streams'] == 1 and res['gbps'] > 1


@pytest.mark.parametrize('name,error', [
    ('client-refused.json', 'unable to connect to server: Connection refused'),
    ('client-server-busy.json', 'the server is busy running a test. try again later'),
])
def test_failed_runs_are_not_ok_and_carry_the_error(name, error):
    res = parse_iperf3(read(name))
    assert res['ok'] is False and res['error'] == error and res['gbps'] is None


def test_text_output_is_rejected_with_the_reason():
    with pytest.raises(ValueError, match='not JSON.*-J'):
        parse_iperf3('Connecting to host 127.0.0.1, port 5201\n[  5] local 127.0.0.1 port 1 connected')
    with pytest.raises(ValueError, match='empty'):
        parse_iperf3('')


def test_unfinished_test_names_the_missing_section():
    data = json.loads(read('client-P4-loopback.json'))
    del data['end']['sum_received']
    with pytest.raises(ValueError, match='end.sum_received'):
        parse_iperf3(data)
    with pytest.raises(ValueError, match="no 'start' or 'end'"):
        parse_iperf3({'intervals': []})


class _Module:
    """run_command answers from a list, in order (the last answer repeats)."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), 0

    def run_command(self, command):
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


PARAMS = {'server': '10.0.0.2', 'port': 5201, 'streams': 4, 'duration': 1, 'connect_timeout': 5,
          'node': 'n1', 'peer': 'n2', 'server_wait': 0}


def test_an_iperf3_that_printed_nothing_and_exit_0_is_tried_again_and_then_measures():
    from ansible_collections.gpucluster.multinode.plugins.module_utils import bandwidth
    clock = Clock()
    module = _Module([(0, '', ''), (0, read('client-P4-loopback.json'), '')])
    result = bandwidth.iperf3_run(module, 'iperf3', PARAMS, reverse=False, sleep=clock.sleep, clock=clock)
    assert module.calls == 2 and result['error'] is None and result['gbps'] > 0


def test_an_iperf3_that_keeps_printing_nothing_is_a_bounded_failure_naming_the_time():
    from ansible_collections.gpucluster.multinode.plugins.module_utils import bandwidth
    clock = Clock()
    module = _Module([(0, '', '')])
    result = bandwidth.iperf3_run(module, 'iperf3', PARAMS, reverse=False, sleep=clock.sleep, clock=clock)
    assert result['gbps'] is None and 'iperf3 output is empty' in result['error']
    assert 'exit 0 after 10 s' in result['error']
    assert module.calls == 21  # 10 s of tries half a second apart, then the failure
