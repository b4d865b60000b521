import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile as hf

LAN = [
    {'name': 'gpu-master', 'address': '192.168.1.100', 'gpus': 1},
    {'name': 'gpu-worker-10', 'address': '192.168.1.110', 'gpus': 1},
    {'name': 'gpu-worker-2', 'address': '192.168.1.102', 'gpus': 1},
    {'name': 'gpu-worker-1', 'address': '192.168.1.101', 'gpus': 1},
]


@pytest.mark.parametrize('fmt,expected', [
    ('deepspeed', 'gpu-master slots=1\ngpu-worker-1 slots=1\ngpu-worker-2 slots=1\ngpu-worker-10 slots=1\n'),
    ('openmpi', 'gpu-master slots=1\ngpu-worker-1 slots=1\ngpu-worker-2 slots=1\ngpu-worker-10 slots=1\n'),
    ('mpich', 'gpu-master:1\ngpu-worker-1:1\ngpu-worker-2:1\ngpu-worker-10:1\n'),
    ('plain', 'gpu-master\ngpu-worker-1\ngpu-worker-2\ngpu-worker-10\n'),
    ('slurm', 'gpu-master,gpu-worker-[1-2,10]\n'),
])
def test_formats_put_the_head_first_then_natural_order(fmt, expected):
    assert hf.build(LAN, fmt=fmt)['content'] == expected


def test_heterogeneous_gpu_counts_explicit_slots_and_cpu_nodes():
    hosts = [{'name': 'head', 'gpus': 8}, {'name': 'w1', 'gpus': 4},
             {'name': 'w2', 'gpus': 8, 'slots': 2}, {'name': 'cpu1', 'gpus': 0}, {'name': 'cpu2'}]
    res = hf.build(hosts, default_slots=3)
    assert res['content'] == 'head slots=8\ncpu1 slots=3\ncpu2 slots=3\nw1 slots=4\nw2 slots=2\n'
    assert res['total_slots'] == 20


def test_cpu_only_lab_gets_one_slot_per_node_by_default():
    res = hf.build(['node-a', 'node-b', 'node-c'])
    assert res['content'] == 'node-a slots=1\nnode-b slots=1\nnode-c slots=1\n' and res['total_slots'] == 3


def test_use_address_writes_cluster_addresses():
    assert hf.build(LAN, fmt='mpich', use_address=True)['content'].splitlines() == [
        '192.168.1.100:1', '192.168.1.101:1', '192.168.1.102:1', '192.168.1.110:1']


def test_include_and_exclude():
    assert hf.build(LAN, fmt='plain', exclude=['gpu-worker-2'])['content'] == 'gpu-master\ngpu-worker-1\ngpu-worker-10\n'
    assert hf.build(LAN, fmt='plain', include=['gpu-worker-10', 'gpu-master'])['content'] == 'gpu-master\ngpu-worker-10\n'


@pytest.mark.parametrize('kwargs,message', [
    ({'exclude': ['gpu-worker-3']}, 'exclude names gpu-worker-3, which is not in the host list'),
    ({'include': ['gpu-master', 'gpu-wroker-1']}, 'include names gpu-wroker-1, which is not in the host list'),
    ({'exclude': ['gpu-master', 'gpu-worker-1', 'gpu-worker-2', 'gpu-worker-10']}, 'no hosts left'),
    ({'fmt': 'hydra'}, "format must be one of deepspeed, openmpi, mpich, plain, slurm, torchrun, got 'hydra'"),
    ({'default_slots': 0}, 'default_slots must be from 1 to 1024, got 0'),
])
def test_bad_options_fail_with_one_message(kwargs, message):
    with pytest.raises(hf.HostfileError, match=message.replace('[', r'\[')):
        hf.build(LAN, **kwargs)


@pytest.mark.parametrize('entry,message', [
    ({'name': 'w1', 'slots': -2}, 'host w1: slots must be from 1 to 1024, got -2'),
    ({'name': 'w1', 'slots': 0}, 'host w1: slots must be from 1 to 1024, got 0; leave the host out with exclude'),
    ({'name': 'w1', 'slots': True}, 'host w1: slots must be a whole number of 1 or more, got True (bool)'),
    ({'name': 'w1', 'slots': 'eight'}, "host w1: slots must be a whole number of 1 or more, got 'eight' (str)"),
    ({'name': 'w1', 'gpus': -1}, 'host w1: gpus must be from 0 to 1024, got -1'),
    ({'name': 'w 1'}, 'host w 1: name may hold only'),
    ({'name': 'w1', 'address': 7}, 'host w1: address must be a string'),
    ({'name': 'gpu-master'}, 'host gpu-master: listed twice'),
])
def test_bad_host_fails_naming_the_host_and_the_variable(entry, message):
    with pytest.raises(hf.HostfileError, match='^' + message.replace('(', r'\(').replace(')', r'\)')):
        hf.build([{'name': 'gpu-master'}, entry])


def test_numeric_strings_from_ini_inventories_are_counts():
    assert hf.build([{'name': 'a', 'slots': '8'}])['content'] == 'a slots=8\n'


def test_head_can_be_named():
    assert hf.build(LAN, fmt='plain', head='gpu-worker-2')['content'].splitlines()[0] == 'gpu-worker-2'
    with pytest.raises(hf.HostfileError, match='head gpu-x is not in the host list'):
        hf.build(LAN, head='gpu-x')


@pytest.mark.parametrize('names,expected', [
    (['gpu-master', 'gpu-node01', 'gpu-node02', 'gpu-node03', 'gpu-node04'], 'gpu-master,gpu-node[01-04]'),
    (['gpu-node01', 'gpu-node02', 'gpu-node03', 'gpu-node04', 'gpu-master'], 'gpu-node[01-04],gpu-master'),
    (['n1', 'n2', 'n3', 'n5', 'n7', 'n8'], 'n[1-3,5,7-8]'),
    (['n9', 'n10', 'n11'], 'n[9-11]'),
    (['node098', 'node099', 'node100'], 'node[098-100]'),
    (['node09', 'node10', 'node100'], 'node[09-10],node100'),
    (['rack1-gpu7'], 'rack1-gpu7'),
    (['login', 'gpu1', 'gpu2'], 'login,gpu[1-2]'),
])
def test_slurm_hostlist_compression_keeps_zero_padding(names, expected):
    assert hf.compress_hostlist(names) == expected
    assert hf.expand_hostlist(expected) == names
