"""The network input checks: each problem is one line naming the host and the variable."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.filter.network_config import (
    network_domain_errors, network_hostname_errors, network_hosts_lines, network_hosts_loopback_pattern, network_static_errors,
    network_static_facts)

GOOD = {'interface': 'enp3s0', 'address': '192.168.1.100/24', 'gateway': '192.168.1.1', 'dns': ['192.168.1.1', '1.1.1.1']}
IFACES = ['lo', 'enp3s0', 'wlp2s0']


def errors(**change):
    static = dict(GOOD, **change)
    return network_static_errors(static, 'gpu-master', '192.168.1.0/24', IFACES, '192.168.1.100')


def test_the_home_lan_settings_are_sound():
    assert errors() == []
    assert network_static_facts(GOOD) == {
        'interface': 'enp3s0', 'address': '192.168.1.100/24', 'ip': '192.168.1.100', 'prefix': 24,
        'netmask': '255.255.255.0', 'network': '192.168.1.0/24', 'gateway': '192.168.1.1',
        'dns': ['192.168.1.1', '1.1.1.1']}


def test_address_outside_the_cluster_network():
    assert errors(address='10.0.0.7/24', gateway='10.0.0.1') == [
        'host gpu-master: network_static.address 10.0.0.7/24 is outside cluster_cidr 192.168.1.0/24']


def test_prefix_length_out_of_range_or_missing():
    assert errors(address='192.168.1.100/33') == [
        'host gpu-master: network_static.address 192.168.1.100/33: prefix length 33 is out of range (1-32)']
    assert errors(address='192.168.1.100/0')[0].endswith('prefix length 0 is out of range (1-32)')
    assert errors(address='192.168.1.100') == [
        'host gpu-master: network_static.address 192.168.1.100 has no prefix length; '
        'write it as a.b.c.d/prefix, e.g. 192.168.1.100/24']


def test_interface_the_node_does_not_have():
    assert errors(interface='eth0') == [
        'host gpu-master: network_static.interface eth0 does not exist on this node; it has enp3s0, wlp2s0']


def test_gateway_outside_the_subnet_or_the_node_itself():
    assert errors(gateway='192.168.2.1') == [
        "host gpu-master: network_static.gateway 192.168.2.1 is outside the node's subnet 192.168.1.0/24 "
        "(from network_static.address 192.168.1.100/24)"]
    assert errors(gateway='192.168.1.255')[0].startswith('host gpu-master: network_static.gateway 192.168.1.255 is outside')
    assert errors(gateway='192.168.1.100') == ["host gpu-master: network_static.gateway 192.168.1.100 is the node's own address"]


def test_address_other_than_the_cluster_address_unknown_keys_and_bad_dns():
    assert errors(address='192.168.1.150/24') == [
        'host gpu-master: network_static.address 192.168.1.150/24 differs from the cluster address 192.168.1.100; '
        'set cluster_address to 192.168.1.150 (the address the other nodes will use)']
    assert errors(netmask='255.255.255.0') == [
        'host gpu-master: network_static has unknown key(s) netmask; known keys are interface, address, gateway, dns']
    assert errors(dns='1.1.1.1') == ["host gpu-master: network_static.dns must be a list of IP addresses, got '1.1.1.1'"]
    assert errors(dns=['one.one']) == ['host gpu-master: network_static.dns: one.one is not an IP address']
    assert network_static_errors('eth0', 'n1', '10.0.0.0/8', IFACES)[0].startswith('host n1: network_static must be a dict')


def test_hostnames():
    assert network_hostname_errors('gpu-worker-1', 'w1') == []
    assert network_hostname_errors('node1.lab.example', 'w1') == []
    assert network_hostname_errors('gpu_worker', 'w1') == [
        "host w1: network_hostname 'gpu_worker' is not a valid host name (letters, digits and hyphens, labels separated by dots)"]


def test_hosts_lines_head_first_with_fqdn_and_short_name():
    groups = {'cluster': ['gpu-worker-2', 'gpu-master', 'gpu-worker-1'], 'head': ['gpu-master'],
              'workers': ['gpu-worker-2', 'gpu-worker-1']}
    hostvars = {'gpu-master': {'ansible_host': '192.168.1.100'},
                'gpu-worker-1': {'ansible_host': '192.168.1.101', 'network_hostname': 'laptop'},
                'gpu-worker-2': {'ansible_host': '10.9.9.9', 'cluster_address': '192.168.1.102'}}
    assert network_hosts_lines(groups, hostvars, 'home.lan') == [
        '192.168.1.100 gpu-master.home.lan gpu-master',
        '192.168.1.101 laptop.home.lan laptop gpu-worker-1',
        '192.168.1.102 gpu-worker-2.home.lan gpu-worker-2']
    assert network_hosts_lines({'head': ['n1.dc.example'], 'workers': []}, {'n1.dc.example': {'ansible_host': '10.0.0.1'}}) == [
        '10.0.0.1 n1.dc.example n1']


def test_a_spare_resolves_on_every_node_too():
    # a restart that takes a spare reaches it by name from the head (the hostfile names it)
    groups = {'cluster': ['h', 'w1', 's1'], 'head': ['h'], 'workers': ['w1'], 'spares': ['s1']}
    hostvars = {'h': {'ansible_host': '10.0.0.1'}, 'w1': {'ansible_host': '10.0.0.2'}, 's1': {'ansible_host': '10.0.0.9'}}
    assert network_hosts_lines(groups, hostvars) == ['10.0.0.1 h', '10.0.0.2 w1', '10.0.0.9 s1']


def test_domain_must_be_rfc1123():
    assert network_domain_errors('', 'h') == []
    assert network_domain_errors('home.lan', 'h') == []
    assert network_domain_errors('dc1.example.com.', 'h') == []
    for bad in ('my lab', '-lab', 'lab_1', 'a..b', 'x' * 64):
        assert network_domain_errors(bad, 'bad-head') == [
            "host bad-head: network_domain %r is not a valid DNS domain (RFC 1123: letters, digits and inner "
            "hyphens, labels separated by dots, no spaces); /etc/hosts would give a wrong name" % bad]


def test_an_installers_loopback_line_for_a_cluster_name_is_matched_and_nothing_else():
    import re  # pylint: disable=import-outside-toplevel
    groups = {'cluster': ['gpu-master', 'gpu-worker-1'], 'head': ['gpu-master'], 'workers': ['gpu-worker-1']}
    hostvars = {'gpu-master': {'ansible_host': '192.168.1.100'}, 'gpu-worker-1': {'ansible_host': '192.168.1.101'}}
    hosts = ('# BEGIN gpucluster.multinode cluster nodes (Ansible managed)\n'
             '192.168.1.100 gpu-master.home.lan gpu-master\n'
             '192.168.1.101 gpu-worker-1.home.lan gpu-worker-1\n'
             '# END gpucluster.multinode cluster nodes (Ansible managed)\n'
             '127.0.0.1\tlocalhost\n'
             '127.0.1.1\tgpu-master.home.lan\tgpu-master\n'
             '::1     localhost ip6-localhost ip6-loopback gpu-worker-1  # a hand edit\n'
             '127.0.1.1 gpu-master-old\n'
             '#127.0.1.1 gpu-master\n'
             '10.9.9.9 gpu-master-bmc\n')
    pattern = network_hosts_loopback_pattern(groups, hostvars, 'home.lan')
    done = re.sub(pattern, r'# \1  # note', hosts, flags=re.M)
    assert done.splitlines()[5:7] == ['# 127.0.1.1\tgpu-master.home.lan\tgpu-master  # note',
                                      '# ::1     localhost ip6-localhost ip6-loopback gpu-worker-1  # a hand edit  # note']
    # the block, localhost, another name that starts like a cluster name, a comment and other addresses stay
    assert [line for i, line in enumerate(done.splitlines()) if i not in (5, 6)] == [
        line for i, line in enumerate(hosts.splitlines()) if i not in (5, 6)]
    # a second run changes nothing
    assert re.sub(pattern, r'# \1  # note', done, flags=re.M) == done
