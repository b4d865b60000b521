"""The lab's layout (names, addresses, slots, NIC names) and the molecule networks filter."""

from __future__ import annotations

import importlib.util
import os

import pytest
from ansible.errors import AnsibleFilterError

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'filter_plugins', 'lab.py')
_SPEC = importlib.util.spec_from_file_location('gpucluster_lab_filters', _PATH)
lab_filters = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lab_filters)

lab_layout = lab_filters.lab_layout
platform_networks = lab_filters.platform_networks


def test_lab_layout_names_groups_and_addresses():
    nodes = lab_layout('lab', 3, '10.213.0.0/24')
    assert [n['name'] for n in nodes] == ['lab-head', 'lab-worker-1', 'lab-worker-2']
    assert [n['group'] for n in nodes] == ['head', 'workers', 'workers']
    assert [n['address'] for n in nodes] == ['10.213.0.10', '10.213.0.11', '10.213.0.12']
    assert nodes[1]['container'] == 'lab-lab-worker-1'


def test_lab_layout_gives_the_head_its_own_slots_and_each_worker_another_nic_name():
    nodes = lab_layout('lab', 5, '10.213.0.0/24', head_slots=2, worker_slots=1,
                       interface_names=['eth0', 'enp26s0np0', 'ens5'])
    assert [n['slots'] for n in nodes] == [2, 1, 1, 1, 1]
    # the head keeps the first name; the workers take the others in turn
    assert [n['interface'] for n in nodes] == ['eth0', 'enp26s0np0', 'ens5', 'enp26s0np0', 'ens5']


def test_lab_layout_with_one_name_gives_it_to_every_node():
    nodes = lab_layout('lab', 3, '10.213.0.0/24', interface_names=['eth0'])
    assert {n['interface'] for n in nodes} == {'eth0'}
    assert [n['slots'] for n in nodes] == [1, 1, 1]


def test_lab_layout_refuses_no_nodes_a_full_subnet_bad_slots_and_bad_nic_names():
    with pytest.raises(AnsibleFilterError, match='at least 1'):
        lab_layout('lab', 0, '10.213.0.0/24')
    with pytest.raises(AnsibleFilterError, match='no room'):
        lab_layout('lab', 8, '10.213.0.0/29', first_host=2)
    with pytest.raises(AnsibleFilterError, match='lab_head_slots and lab_worker_slots must be at least 1, got 0 and 1'):
        lab_layout('lab', 3, '10.213.0.0/24', head_slots=0)
    with pytest.raises(AnsibleFilterError, match="lab_interface_names holds 'a-name-far-too-long-for-linux'"):
        lab_layout('lab', 3, '10.213.0.0/24', interface_names=['eth0', 'a-name-far-too-long-for-linux'])


def test_platform_networks_take_the_subnet_of_the_first_address():
    nets = platform_networks([
        {'name': 'a', 'network': 'inside,outside', 'ip': '10.213.103.10'},
        {'name': 'b', 'network': 'inside', 'ip': '10.213.103.11'},
        {'name': 'c', 'network': 'outside', 'ip': '10.213.203.20'},
        {'name': 'd'},
    ])
    assert nets == [{'name': 'inside', 'subnet': '10.213.103.0/24'},
                    {'name': 'outside', 'subnet': '10.213.203.0/24'}]
