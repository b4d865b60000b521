import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import addresses
from ansible_collections.gpucluster.multinode.plugins.filter.lab import lab_layout
from ansible.errors import AnsibleFilterError


def test_overlap_and_containment():
    assert addresses.cidr_overlaps('10.213.0.0/24', '10.213.0.128/25')
    assert not addresses.cidr_overlaps('10.213.0.0/24', '10.214.0.0/24')
    assert not addresses.cidr_overlaps('10.0.0.0/8', 'fd00::/64')
    assert addresses.cidr_contains('192.168.1.0/24', '192.168.1.101')
    assert addresses.cidr_contains('192.168.1.0/24', '192.168.1.101/24')
    assert not addresses.cidr_contains('192.168.1.0/24', '192.168.2.1')


def test_cidr_tests_reject_non_networks():
    assert addresses.is_cidr('10.0.0.0/16')
    assert not addresses.is_cidr('10.0.0.0')
    assert not addresses.is_cidr('10.0.0.0/33')
    assert not addresses.is_cidr(24)
    assert addresses.is_ip('10.0.0.1')
    assert not addresses.is_ip('10.0.0.1/24')


def test_host_outside_network_is_an_error():
    assert addresses.cidr_host('10.213.0.0/24', 10) == '10.213.0.10'
    with pytest.raises(ValueError, match='outside'):
        addresses.cidr_host('10.213.0.0/30', 4)


def test_lab_layout_names_groups_and_addresses():
    nodes = lab_layout('lab', 3, '10.213.0.0/24')
    assert [n['name'] for n in nodes] == ['lab-head', 'lab-worker-1', 'lab-worker-2']
    assert [n['group'] for n in nodes] == ['head', 'workers', 'workers']
    assert [n['address'] for n in nodes] == ['10.213.0.10', '10.213.0.11', '10.213.0.12']
    assert nodes[1]['container'] == 'lab-lab-worker-1'


def test_lab_layout_refuses_no_nodes_and_a_full_subnet():
    with pytest.raises(AnsibleFilterError, match='at least 1'):
        lab_layout('lab', 0, '10.213.0.0/24')
    with pytest.raises(AnsibleFilterError, match='no room'):
        lab_layout('lab', 8, '10.213.0.0/29', first_host=2)


def test_platform_networks_take_the_subnet_of_the_first_address():
    from ansible_collections.gpucluster.multinode.plugins.filter.lab import platform_networks
    nets = platform_networks([
        {'name': 'a', 'network': 'inside,outside', 'ip': '10.213.103.10'},
        {'name': 'b', 'network': 'inside', 'ip': '10.213.103.11'},
        {'name': 'c', 'network': 'outside', 'ip': '10.213.203.20'},
        {'name': 'd'},
    ])
    assert nets == [{'name': 'inside', 'subnet': '10.213.103.0/24'},
                    {'name': 'outside', 'subnet': '10.213.203.0/24'}]
