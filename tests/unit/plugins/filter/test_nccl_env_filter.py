"""The NCCL/gloo environment a node gets: interface lookup, variables, rendered files."""

import pytest

from ansible.errors import AnsibleFilterError
from ansible_collections.gpucluster.multinode.plugins.filter import nccl_env as nccl

# Shape of ansible_facts on a node whose cluster NIC is not eth0 (names as on design card 3).
FACTS = {
    'interfaces': ['lo', 'eno1', 'enp26s0np0', 'docker0'],
    'lo': {'ipv4': {'address': '127.0.0.1'}},
    'eno1': {'ipv4': {'address': '192.168.10.5'}},
    'enp26s0np0': {'ipv4': {'address': '10.1.0.7'}, 'ipv4_secondaries': [{'address': '10.1.0.200'}],
                   'ipv6': [{'address': 'fd00::7', 'prefix': '64'}]},
    'docker0': {'ipv4': {'address': '172.17.0.1'}},
}


@pytest.mark.parametrize('address, expected', [
    ('10.1.0.7', 'enp26s0np0'),
    ('10.1.0.200', 'enp26s0np0'),     # a secondary address
    ('fd00::7', 'enp26s0np0'),
    ('192.168.10.5/24', 'eno1'),
    ('10.9.9.9', ''),                  # on no interface: the role fails naming the host
])
def test_interface_is_the_one_holding_the_cluster_address(address, expected):
    assert nccl.nccl_interface_for_address(FACTS, address) == expected


def test_dashed_and_dotted_interface_names_are_found():
    facts = {'interfaces': ['bond0.100'], 'bond0_100': {'ipv4': {'address': '10.2.0.1'}}}
    assert nccl.nccl_interface_for_address(facts, '10.2.0.1') == 'bond0.100'


def test_tcp_environment_in_order():
    env = nccl.nccl_environment('tcp', 'enp26s0np0', master_addr='10.1.0.1', master_port=29600,
                                ds_accelerator='cpu', extra={'NCCL_P2P_DISABLE': '1', 'NCCL_DEBUG': 'INFO'})
    assert list(env.items()) == [
        ('NCCL_DEBUG', 'INFO'),                 # extra wins but keeps the first position
        ('NCCL_SOCKET_IFNAME', 'enp26s0np0'),
        ('GLOO_SOCKET_IFNAME', 'enp26s0np0'),
        ('NCCL_IB_DISABLE', '1'),
        ('NCCL_SOCKET_NTHREADS', '4'),
        ('NCCL_NSOCKS_PERTHREAD', '4'),
        ('TORCH_NCCL_ASYNC_ERROR_HANDLING', '1'),
        ('MASTER_ADDR', '10.1.0.1'),
        ('MASTER_PORT', '29600'),
        ('DS_ACCELERATOR', 'cpu'),
        ('NCCL_P2P_DISABLE', '1'),
    ]
    assert 'NCCL_IB_HCA' not in env


def test_rdma_environment_names_the_hcas():
    env = nccl.nccl_environment('rdma', 'ib0', ib_hca=['mlx5_0', 'mlx5_1'], ib_gid_index=3,
                                net_gdr_level='SYS', async_error_handling=False)
    assert env['NCCL_IB_DISABLE'] == '0'
    assert env['NCCL_IB_HCA'] == 'mlx5_0,mlx5_1'
    assert env['NCCL_IB_GID_INDEX'] == '3'
    assert env['NCCL_NET_GDR_LEVEL'] == 'SYS'
    assert env['NCCL_IB_TIMEOUT'] == '22'
    assert env['TORCH_NCCL_ASYNC_ERROR_HANDLING'] == '0'
    assert 'DS_ACCELERATOR' not in env and 'MASTER_ADDR' not in env


@pytest.mark.parametrize('args, match', [
    (('udp', 'eth0'), 'mode must be tcp or rdma'),
    (('tcp', ''), 'no socket interface'),
    (('rdma', 'ib0'), 'needs the RDMA devices'),
])
def test_bad_input_is_refused(args, match):
    with pytest.raises(AnsibleFilterError, match=match):
        nccl.nccl_environment(*args)


def test_profile_script_puts_the_env_first_and_quotes_values():
    env = nccl.nccl_environment('tcp', 'eth0', extra={'NCCL_ALGO': 'Ring;Tree'})
    script = nccl.nccl_profile_script(env, '/opt/gpucluster/env/bin')
    lines = script.splitlines()
    assert lines[0] == 'case ":$PATH:" in *:/opt/gpucluster/env/bin:*) ;; *) PATH=/opt/gpucluster/env/bin:$PATH ;; esac'
    assert lines[1] == 'export PATH'
    assert "export NCCL_ALGO='Ring;Tree'" in lines
    assert 'export NCCL_SOCKET_IFNAME=eth0' in lines


def test_deepspeed_env_lists_path_first_and_can_leave_the_interface_out():
    env = nccl.nccl_environment('tcp', 'eth0', ds_accelerator='cpu')
    text = nccl.nccl_deepspeed_env(env, '/shared/envs/train/bin')
    lines = text.splitlines()
    assert lines[0] == 'PATH=/shared/envs/train/bin:' + nccl.DEFAULT_PATH
    assert 'NCCL_SOCKET_IFNAME=eth0' in lines and 'DS_ACCELERATOR=cpu' in lines
    assert all('=' in line for line in lines) and text.endswith('\n') and '' not in lines
    left = nccl.nccl_deepspeed_env(env, '/e/bin', leave_out=['NCCL_SOCKET_IFNAME', 'GLOO_SOCKET_IFNAME'])
    assert 'IFNAME' not in left


def test_deepspeed_env_refuses_a_multi_line_value():
    with pytest.raises(AnsibleFilterError, match='newline'):
        nccl.nccl_deepspeed_env({'X': 'a\nb'})
