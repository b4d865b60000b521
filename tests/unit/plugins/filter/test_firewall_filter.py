"""The firewall input checks: each problem is one line naming the host and the variable."""

from __future__ import annotations

import pytest

from ansible_collections.gpucluster.multinode.plugins.filter.firewall import (
    firewall_admin_errors, firewall_controller_address, firewall_port_errors, firewall_source_errors)


def test_controller_address_and_lockout():
    assert firewall_controller_address('192.168.1.50 51234 22') == '192.168.1.50'
    assert firewall_controller_address('') == ''
    assert firewall_controller_address(None) == ''
    assert firewall_admin_errors(['10.8.0.0/24'], 'gpu-master', '192.168.1.0/24', '192.168.1.50') == []
    assert firewall_admin_errors(['10.8.0.0/24'], 'gpu-master', '192.168.1.0/24', '') == []
    assert firewall_admin_errors(['10.8.0.0/24'], 'gpu-master', '192.168.1.0/24', '172.16.0.9') == [
        "host gpu-master: firewall_admin_networks 10.8.0.0/24 excludes the controller's own address 172.16.0.9 (the "
        "Ansible connection comes from it), and it is outside cluster_cidr 192.168.1.0/24: SSH would be locked out. "
        "Add 172.16.0.9/32 (or its network) to firewall_admin_networks"]
    assert firewall_admin_errors(['office'], 'h', '10.0.0.0/8') == [
        "host h: firewall_admin_networks entry 'office' is not an address or a network (a.b.c.d/prefix)"]


@pytest.mark.parametrize('ports', [['29500'], [29500], ['29500:29510'], ['1:65535'], []])
def test_ports_and_ranges_inside_1_65535_pass(ports):
    assert firewall_port_errors(ports, 'h', 'firewall_ray_ports') == []


@pytest.mark.parametrize('port, why', [
    ('29500:70000', "entry '29500:70000' is not a port (1-65535) or a range first:last of ports"),
    ('70000', "entry '70000' is not a port (1-65535) or a range first:last of ports"),
    ('0', "entry '0' is not a port (1-65535) or a range first:last of ports"),
    ('http', "entry 'http' is not a port (1-65535) or a range first:last of ports"),
    ('1:2:3', "entry '1:2:3' is not a port (1-65535) or a range first:last of ports"),
    ('29510:29500', 'range 29510:29500 starts above its end'),
])
def test_ports_ufw_would_refuse_are_named(port, why):
    assert firewall_port_errors(port, 'gpu-master', 'firewall_rendezvous_ports') == [
        'host gpu-master: firewall_rendezvous_ports ' + why]


def test_sources_are_addresses_or_networks():
    assert firewall_source_errors(['10.0.0.0/8', '10.1.1.1'], 'h', 'firewall_ray_sources') == []
    assert firewall_source_errors(['lab'], 'h', 'firewall_ray_sources') == [
        "host h: firewall_ray_sources entry 'lab' is not an address or a network (a.b.c.d/prefix)"]
    assert firewall_source_errors('10.0.0.0/8', 'h', 'firewall_ray_sources') == [
        "host h: firewall_ray_sources must be a list of addresses or networks, got '10.0.0.0/8'"]


def test_the_port_ranges_derive_from_the_port_they_start_at():
    from ansible_collections.gpucluster.multinode.plugins.filter.firewall import port_range
    assert port_range(29500, 101) == '29500:29600'
    assert port_range('30000', 101) == '30000:30100'
    assert port_range(6379) == '6379'
