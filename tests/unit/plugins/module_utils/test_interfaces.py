"""Which interface holds an address: the readers of ip and facts, and the questions on them."""

import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import interfaces as itf

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures')


def fixture(*parts):
    with open(os.path.join(FIXTURES, *parts)) as handle:
        return handle.read()


# Shape of ansible_facts on a node whose cluster NIC is not eth0.
FACTS = {
    'interfaces': ['lo', 'eno1', 'enp26s0np0', 'docker0', 'bond0.100'],
    'lo': {'ipv4': {'address': '127.0.0.1', 'prefix': '8'}, 'mtu': 65536, 'active': True},
    'eno1': {'ipv4': {'address': '192.168.10.5', 'prefix': '24'}, 'mtu': 1500, 'active': True},
    'enp26s0np0': {'ipv4': {'address': '10.1.0.7', 'prefix': '24'}, 'mtu': 9000, 'active': True,
                   'ipv4_secondaries': [{'address': '10.1.0.200', 'prefix': '24'}],
                   'ipv6': [{'address': 'fd00::7', 'prefix': '64'}]},
    'docker0': {'ipv4': {'address': '172.17.0.1'}, 'active': False},
    'bond0_100': {'ipv4': {'address': '10.2.0.1'}},
}


def test_ip_json_recorded_gives_names_mtus_states_and_every_address():
    found = itf.from_ip_json(fixture('interfaces', 'ip-j-addr-show.json'))
    assert sorted(found) == ['cni-podman0', 'eth0', 'ifb0', 'ifb1', 'lo']
    assert found['eth0']['mtu'] == 1400
    assert found['eth0']['state'] == 'UP'
    assert found['eth0']['addresses'] == ['192.0.2.2', 'fd00::2', 'fe80::fc:ff:fe00:1']
    assert found['eth0']['cidrs'][0] == '192.0.2.2/24'
    assert found['ifb0']['addresses'] == [] and found['ifb0']['state'] == 'DOWN'


def test_ip_json_that_is_not_a_list_is_refused():
    with pytest.raises(ValueError):
        itf.from_ip_json('{"ifname": "eth0"}')
    with pytest.raises(ValueError):
        itf.from_ip_json('Object "addr" is unknown')


def test_ip_oneline_and_ip_json_agree_on_addresses():
    oneline = itf.from_ip_oneline(fixture('cluster_tests', 'ip-o-addr-show.txt'))
    json_ = itf.from_ip_json(fixture('interfaces', 'ip-j-addr-show.json'))
    assert sorted(oneline) == ['eth0', 'lo']
    for name in oneline:
        assert oneline[name]['addresses'] == json_[name]['addresses'][:len(oneline[name]['addresses'])]
    assert oneline['eth0']['mtu'] is None


@pytest.mark.parametrize('address, expected', [
    ('10.1.0.7', 'enp26s0np0'),
    ('10.1.0.200', 'enp26s0np0'),     # a secondary address
    ('fd00::7', 'enp26s0np0'),
    ('fd00:0:0::7', 'enp26s0np0'),    # the same IPv6 address written longer
    ('192.168.10.5/24', 'eno1'),
    ('10.2.0.1', 'bond0.100'),        # a dotted name whose fact key has an underscore
    ('10.9.9.9', None),
    ('', None),
])
def test_interface_for_address_from_facts(address, expected):
    assert itf.interface_for_address(address, itf.from_facts(FACTS)) == expected


def test_facts_give_mtu_and_state():
    found = itf.from_facts(FACTS)
    assert found['enp26s0np0']['mtu'] == 9000
    assert found['enp26s0np0']['cidrs'] == ['10.1.0.7/24', '10.1.0.200/24', 'fd00::7/64']
    assert found['docker0']['state'] == 'DOWN'


def test_an_address_on_two_interfaces_names_the_one_that_is_not_loopback():
    found = {'lo': {'addresses': ['10.0.0.1']}, 'br0': {'addresses': ['10.0.0.1']}}
    assert itf.holders('10.0.0.1', found) == ['br0', 'lo']
    assert itf.interface_for_address('10.0.0.1', found) == 'br0'


@pytest.mark.parametrize('spec, expected', [
    ('', ['eno1', 'eth0', 'lo']),
    ('eth', ['eth0']),                 # a prefix
    ('=eth', []),                      # exact names only
    ('=eth0,lo', ['eth0', 'lo']),
    ('^lo', ['eno1', 'eth0']),         # all but
    ('^=eno1', ['eth0', 'lo']),
])
def test_ifname_selects_follows_nccl_rules(spec, expected):
    assert itf.ifname_selects(spec, ['lo', 'eth0', 'eno1']) == expected


def test_socket_interface_problem_names_the_interface_that_holds_the_address():
    found = itf.from_ip_oneline(fixture('cluster_tests', 'ip-o-addr-show.txt'))
    assert itf.socket_interface_problem('eth0', '192.0.2.2', found) is None
    assert itf.socket_interface_problem('eth', '192.0.2.2', found) is None
    assert itf.socket_interface_problem('^lo', '192.0.2.2', found) is None
    assert itf.socket_interface_problem('', '192.0.2.2', found) is None
    assert itf.socket_interface_problem('eth9', '192.0.2.2', found) == (
        'interface mismatch: socket interface eth9 does not exist here (eth0 holds 192.0.2.2)')
    assert itf.socket_interface_problem('lo', '192.0.2.2', found) == (
        'interface mismatch: socket interface lo does not hold the cluster address (eth0 holds 192.0.2.2)')
    assert itf.socket_interface_problem('eth9', '10.9.9.9', found) == (
        'interface mismatch: socket interface eth9 does not exist here (no interface holds 10.9.9.9)')


class FakeModule:
    def __init__(self, answers, ip='/usr/sbin/ip'):
        self.answers = answers
        self.ip = ip
        self.commands = []

    def get_bin_path(self, name):
        return self.ip if name == 'ip' else None

    def run_command(self, argv):
        self.commands.append(argv)
        return self.answers[tuple(argv[1:])]


def test_read_interfaces_prefers_ip_json():
    module = FakeModule({('-j', 'addr', 'show'): (0, fixture('interfaces', 'ip-j-addr-show.json'), '')})
    assert itf.read_interfaces(module)['eth0']['mtu'] == 1400
    assert len(module.commands) == 1


def test_read_interfaces_falls_back_to_ip_oneline_on_an_old_iproute2():
    module = FakeModule({('-j', 'addr', 'show'): (255, '', 'Option "-j" is unknown'),
                         ('-o', 'addr', 'show'): (0, fixture('cluster_tests', 'ip-o-addr-show.txt'), '')})
    assert itf.interface_for_address('192.0.2.2', itf.read_interfaces(module)) == 'eth0'


def test_read_interfaces_without_ip_reads_sys(tmp_path):
    (tmp_path / 'eth0').mkdir()
    (tmp_path / 'eth0' / 'mtu').write_text('1500\n')
    (tmp_path / 'eth0' / 'operstate').write_text('up\n')
    found = itf.read_interfaces(FakeModule({}, ip=None), sys_root=str(tmp_path))
    assert found == {'eth0': {'name': 'eth0', 'mtu': 1500, 'state': 'UP', 'addresses': [], 'cidrs': []}}
