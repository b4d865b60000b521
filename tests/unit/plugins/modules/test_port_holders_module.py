"""port_holders: a port another process holds is refused naming the process; one the collection's
own running job holds is a notice; a port set by two variables is looked at once."""

from __future__ import annotations

import os
import socket

from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr
from ansible_collections.gpucluster.multinode.plugins.modules import port_holders


def fake(table):
    return lambda port: table.get(port, [])


SSHD = {'pid': 412, 'uid': 0, 'cmdline': 'sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups',
        'job_id': None, 'address': '0.0.0.0'}
AGENT = {'pid': 900, 'uid': 2000, 'cmdline': 'torchrun --nnodes 2', 'job_id': 'train-20261125-0650',
         'address': '0.0.0.0'}


def test_a_port_held_by_another_process_is_refused_naming_it_and_the_variables():
    ports = [{'port': 22, 'variable': 'cluster_master_port'}, {'port': 22, 'variable': 'cluster_tests_master_port'},
             {'port': 5201, 'variable': 'cluster_tests_bandwidth_port'}]
    entries, refusals, notices = port_holders.survey('alpha', ports, fake({22: [SSHD]}))
    assert [(e['port'], e['variables'], e['free']) for e in entries] == [
        (22, ['cluster_master_port', 'cluster_tests_master_port'], False),
        (5201, ['cluster_tests_bandwidth_port'], True)]
    assert refusals == ['host alpha: cluster_master_port and cluster_tests_master_port 22 is held on the head: port 22 '
                        'is in use by pid 412 (sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups); stop that '
                        'process or choose another port']
    assert notices == []


def test_a_port_held_by_a_running_job_of_the_collection_is_a_notice_only():
    entries, refusals, notices = port_holders.survey(
        'alpha', [{'port': 29500, 'variable': 'cluster_master_port'}], fake({29500: [AGENT]}))
    assert refusals == [] and entries[0]['own_job'] is True
    assert notices == ['host alpha: cluster_master_port 29500 is held by the running job train-20261125-0650 of the '
                       'collection; it is free again when that job ends (train.yml -e training_state=stopped -e '
                       'training_job_id=train-20261125-0650 stops it)']
    # the job and another process on the same port: refused
    _, refusals, _ = port_holders.survey('alpha', [{'port': 29500, 'variable': 'cluster_master_port'}],
                                         fake({29500: [AGENT, SSHD]}))
    assert len(refusals) == 1 and 'pid 412' in refusals[0] and 'pid 900' in refusals[0]


def test_the_real_proc_names_this_process_and_its_job(monkeypatch):
    monkeypatch.setenv(pr.JOB_ENV, '')
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    try:
        _, refusals, _ = port_holders.survey('me', [{'port': port, 'variable': 'cluster_master_port'}])
        assert len(refusals) == 1 and ('pid %d' % os.getpid()) in refusals[0]
    finally:
        sock.close()
    assert port_holders.survey('me', [{'port': port, 'variable': 'cluster_master_port'}])[1] == []
