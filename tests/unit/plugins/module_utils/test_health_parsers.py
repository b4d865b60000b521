"""Node-side parsers of the health probe, on recorded real output."""

from __future__ import annotations

import os

from ansible_collections.gpucluster.multinode.plugins.module_utils import health_parsers

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures')
HEALTH = os.path.join(FIX, 'health')


def read(*parts):
    with open(os.path.join(FIX, *parts)) as f:
        return f.read()


# ------------------------------------------------------------------ parsers

def test_xid_lines_from_a_syslog_excerpt():
    found = health_parsers.parse_xid_lines(read('health', 'xid_gpu_operator_1146.log'))
    assert [x['code'] for x in found] == [48, 64]
    assert found[0]['pci'] == 'PCI:0000:07:00'
    assert 'double bit error' in found[0]['text']


def test_xid_lines_from_dmesg_ctime():
    found = health_parsers.parse_xid_lines(read('health', 'xid_gpud_46.log'))
    assert [x['code'] for x in found] == [13, 13, 13, 109]
    assert found[-1]['text'].startswith('pid=1797828, name=pt_main_thread')


def test_a_kernel_log_with_nvidia_lines_but_no_xid_has_none():
    assert health_parsers.parse_xid_lines(read('nvidia_smi', 'h100-sxm-x1-driver580', 'dmesg-nvrm.txt')) == []


def test_profile_env_of_the_nccl_env_role():
    env = health_parsers.parse_profile_env(read('health', 'gpucluster-nccl.sh'))
    assert env['NCCL_SOCKET_IFNAME'] == 'eth0'
    assert env['GLOO_SOCKET_IFNAME'] == 'eth0'


MOUNTINFO = (
    '22 1 0:21 / / rw,relatime shared:1 - overlay overlay rw,lowerdir=/l\n'
    '41 22 0:38 / /shared rw,relatime shared:20 - nfs4 10.213.111.10:/shared rw,vers=4.2,hard\n'
    '42 22 0:39 / /data\\040set ro,relatime - ext4 /dev/sdb1 ro\n'
    '43 41 0:40 / /shared ro,relatime - nfs4 10.213.111.10:/other ro\n')


def test_mount_point_type_from_mountinfo():
    assert health_parsers.mount_point_type(MOUNTINFO, '/') == (True, 'overlay')
    assert health_parsers.mount_point_type(MOUNTINFO, '/data set') == (True, 'ext4 (ro)')
    assert health_parsers.mount_point_type(MOUNTINFO, '/tmp') == (False, None)
    # a later mount on the same point hides the earlier one
    assert health_parsers.mount_point_type(MOUNTINFO, '/shared') == (True, 'nfs4 (ro)')
    assert health_parsers.mount_point_type('garbage line\n', '/') == (False, None)
