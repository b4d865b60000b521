import pytest

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import addresses


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
