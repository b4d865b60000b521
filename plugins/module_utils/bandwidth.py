# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""One node's part of a bandwidth test (the ``bandwidth`` module): can it take part, a
server started and stopped through processes.py (a detached group whose pid file records its
identity; only that very process is ever signalled), and a client that measures with iperf3
(both directions) or ib_write_bw.

Problems a user acts on raise BandwidthError naming the host; a measurement that fails is a
result with ``error``, not an exception.
"""

from __future__ import annotations

import os
import shlex
import time

from ansible_collections.gpucluster.multinode.plugins.module_utils import processes
from ansible_collections.gpucluster.multinode.plugins.module_utils.iperf3 import parse_iperf3
from ansible_collections.gpucluster.multinode.plugins.module_utils.perftest import parse_perftest_bw

PACKAGES = {'iperf3': 'iperf3', 'ib_write_bw': 'perftest'}
IB_SYSFS = '/sys/class/infiniband'
LISTEN_WAIT = 10.0


class BandwidthError(ValueError):
    """A node that cannot run its part; the message names the host and what to do."""


def state_dir(params):
    """Where the server's pid file, exit code and log live (one per node, tool and port)."""
    return os.path.join(params['run_dir'], 'net_bandwidth-%s-%s-%d' % (params['node'], params['tool'], params['port']))


def job_id(params):
    """The id the server's processes carry (GPUCLUSTER_JOB_ID), checked before any signal."""
    return 'net_bandwidth-%s-%d' % (params['tool'], params['port'])


def _port_in_use(params, port=None):
    port = params['port'] if port is None else port
    users = processes.port_listeners(port, params['bind'] or None)
    if not users:
        return None
    return 'host %s: %s (the bandwidth test port)' % (params['node'], processes.describe_listeners(port, users))


def rdma_devices(root=IB_SYSFS):
    try:
        return sorted(os.listdir(root))
    except OSError:
        return []


def check(module, params):
    """{rdma_devices, perftest, tool_version, problems}: whether this node can take part."""
    node = params['node']
    problems = []
    out = {'rdma_devices': rdma_devices(), 'perftest': bool(module.get_bin_path('ib_write_bw'))}
    iperf3 = module.get_bin_path('iperf3')
    if not iperf3:
        problems.append('host %s: iperf3 is not installed (install the package iperf3)' % node)
    else:
        rc, text, err = module.run_command([iperf3, '--version'])
        out['tool_version'] = (text or err).splitlines()[0] if (text or err) else None
    if params['rdma'] != 'never':
        if out['rdma_devices'] and not out['perftest']:
            problems.append('host %s: RDMA devices %s but ib_write_bw is not installed (install the package perftest)'
                            % (node, ', '.join(out['rdma_devices'])))
        if params['rdma'] == 'required' and not out['rdma_devices']:
            problems.append('host %s: no RDMA device in %s (rdma: required)' % (node, IB_SYSFS))
    for port in range(params['port'], params['port'] + (params.get('port_count') or 1)):
        busy = _port_in_use(params, port)
        if busy:
            problems.append(busy)
    out['problems'] = problems
    return out


def _binary(module, params):
    binary = module.get_bin_path(params['tool'])
    if not binary:
        raise BandwidthError('host %s: %s is not installed (install the package %s)'
                             % (params['node'], params['tool'], PACKAGES[params['tool']]))
    return binary


def server_command(binary, params, timeout_bin=None):
    if params['tool'] == 'iperf3':
        command = [binary, '-s', '-p', str(params['port']), '-B', params['bind']]
    else:
        command = [binary, '-d', params['device'], '-p', str(params['port']), '-q', str(params['streams']),
                   '-D', str(params['duration']), '--report_gbits', '-F']
    if timeout_bin:
        command = [timeout_bin, str(params['server_lifetime'])] + command
    return command


def server(module, params, sleep=time.sleep, clock=time.time):
    """Start the server and wait (bounded) until it listens: {pid, command}."""
    node, port, tool = params['node'], params['port'], params['tool']
    binary = _binary(module, params)
    if tool == 'iperf3' and not params['bind']:
        raise BandwidthError('host %s: bind (the address the iperf3 server listens on) is required with '
                             'state=server' % node)
    if tool == 'ib_write_bw' and not params['device']:
        raise BandwidthError('host %s: device (the RDMA device, e.g. mlx5_0) is required for ib_write_bw' % node)
    busy = _port_in_use(params)
    if busy:
        raise BandwidthError(busy)
    if module.check_mode:
        return {}
    stop(params)  # a server of an earlier, interrupted run on this port
    command = server_command(binary, params, module.get_bin_path('timeout'))
    where = state_dir(params)
    log_path = os.path.join(where, 'server.log')
    try:
        processes.private_dir(where)
        if os.path.exists(log_path):
            os.unlink(log_path)
        record = processes.spawn_detached(' '.join(shlex.quote(c) for c in command), dict(os.environ), '/',
                                          log_path, where, job_id=job_id(params))
    except (processes.ProcessError, OSError) as exc:
        raise BandwidthError('host %s: cannot start the %s server: %s' % (node, tool, exc))
    deadline = clock() + LISTEN_WAIT
    while clock() < deadline:
        code = processes.read_exit_code(where)
        if code is not None:
            said = '\n'.join(processes.tail(log_path, 5))
            stop(params)
            raise BandwidthError('host %s: the %s server on port %d ended at once (exit %s): %s'
                                 % (node, tool, port, code, said[-500:]))
        if tool != 'iperf3' or processes.port_listeners(port, params['bind']):
            if tool != 'iperf3':
                sleep(1)  # perftest has no listening probe before its exchange; give it a moment
            return {'pid': record['pid'], 'command': command}
        sleep(0.1)
    stop(params)
    raise BandwidthError('host %s: the %s server did not listen on %s:%d within %d s'
                         % (node, tool, params['bind'], port, LISTEN_WAIT))


def stop(params, grace=3.0, sleep=time.sleep, clock=time.time):
    """Stop the server this module started on the port: the processes of this account that carry
    its job id (the wrapper, timeout and the server itself), and the process group of the pid
    file's process only while the file still names that very process (start time, owner, job id).
    A stale pid file is removed without signalling anything. Returns the pids signalled."""
    where = state_dir(params)
    leader = processes.pidfile_process(where, job_id(params))
    done = processes.stop_job(job_id(params), grace=grace, leaders=[leader] if leader else [],
                              sleep=sleep, clock=clock)
    for name in (processes.PIDFILE, processes.EXIT_CODE_FILE):
        try:
            os.unlink(os.path.join(where, name))
        except OSError:
            pass
    return done['signalled']


def iperf3_command(binary, params, reverse=False):
    command = [binary, '-c', params['server'], '-p', str(params['port']), '-P', str(params['streams']),
               '-t', str(params['duration']), '-J', '--connect-timeout', str(params['connect_timeout'] * 1000)]
    if params.get('omit'):
        command += ['-O', str(params['omit'])]
    if reverse:
        command.append('-R')
    return command


BUSY_WAIT = 10.0


def iperf3_run(module, binary, params, reverse, sleep=time.sleep, clock=time.time):
    """One direction: {client (sender), server (receiver), tool, streams, gbps, retransmits, error}.

    A server busy with the previous test (it ends a moment after its client) is tried again for
    up to 10 s; a server not listening yet (refused) for up to server_wait seconds, so that the
    servers and the clients of a round can start in the same task."""
    command = iperf3_command(binary, params, reverse)
    start = clock()
    while True:
        rc, out, err = module.run_command(command)
        text = out + err
        waited = clock() - start
        if 'server is busy' in text and waited < BUSY_WAIT:
            sleep(0.5)
            continue
        if 'Connection refused' in text and waited < (params.get('server_wait') or 0):
            sleep(0.2)
            continue
        # iperf3 3.12 with -J can end a test that did not happen with exit 0 and nothing printed (its
        # error path prints a JSON document only while it has one): no answer, tried again like a busy server
        if rc == 0 and not text.strip() and waited < BUSY_WAIT:
            sleep(0.5)
            continue
        break
    sender, receiver = (params['peer'], params['node']) if reverse else (params['node'], params['peer'])
    result = {'client': sender, 'server': receiver, 'tool': 'iperf3', 'streams': params['streams'],
              'gbps': None, 'retransmits': None, 'error': None}
    try:
        parsed = parse_iperf3(out)
    except ValueError as exc:
        result['error'] = '%s (exit %d after %.0f s%s)' % (exc, rc, waited, ': ' + err.strip()[-300:] if err.strip() else '')
        return result
    if not parsed['ok']:
        result['error'] = parsed['error']
    else:
        result.update(gbps=parsed['gbps'], retransmits=parsed['retransmits'])
    return result


def ib_run(module, binary, params):
    command = [binary, '-d', params['device'], '-p', str(params['port']), '-q', str(params['streams']),
               '-D', str(params['duration']), '--report_gbits', '-F', params['server']]
    rc, out, err = module.run_command(command)
    result = {'client': params['node'], 'server': params['peer'], 'tool': 'ib_write_bw',
              'device': params['device'], 'gbps': None, 'error': None}
    try:
        result['gbps'] = parse_perftest_bw(out + '\n' + err)['bw_average_gbps']
    except ValueError as exc:
        result['error'] = '%s (exit %d)' % (exc, rc)
    return result


def iperf3_pair(module, binary, params, sleep=time.sleep, clock=time.time):
    """This node to the server, then (with both_directions) the server to this node (-R)."""
    results = [iperf3_run(module, binary, params, reverse=False, sleep=sleep, clock=clock)]
    if params['both_directions']:
        results.append(iperf3_run(module, binary, params, reverse=True, sleep=sleep, clock=clock))
    return results


def client(module, params):
    """Measure against the server: {'results': [one dict per direction]}."""
    node, tool = params['node'], params['tool']
    for key in ('server', 'peer'):
        if not params[key]:
            raise BandwidthError('host %s: %s is required with state=client' % (node, key))
    if tool == 'ib_write_bw' and not params['device']:
        raise BandwidthError('host %s: device (the RDMA device, e.g. mlx5_0) is required for ib_write_bw' % node)
    binary = _binary(module, params)
    if module.check_mode:
        return {'results': []}
    if tool == 'iperf3':
        results = iperf3_pair(module, binary, params)
    else:
        results = [ib_run(module, binary, params)]
    return {'results': results}


def parts_of(node, rounds):
    """This node's parts of a schedule, in round order: [{round, role, peer, address}] where
    address is the server's (its own when role is server). A node in no pair of a round has no
    part there."""
    parts = []
    for index, pairs in enumerate(rounds):
        for pair in pairs:
            if pair.get('client') == node:
                parts.append({'round': index, 'role': 'client', 'peer': pair['server'], 'address': pair['server_address']})
            elif pair.get('server') == node:
                parts.append({'round': index, 'role': 'server', 'peer': pair['client'], 'address': pair['server_address']})
    return parts


def pair_seconds(params):
    """How long one pair takes at most once both ends are there: each direction's test, its
    warm-up, and a margin for the start and the exchange of results."""
    tests = 2 if params['both_directions'] else 1
    return tests * (params['duration'] + (params.get('omit') or 0) + params['connect_timeout']) + 5


def schedule_wait(params, rounds):
    """Seconds a part waits for its partner: long enough for the partner's earlier pairs."""
    return params.get('server_wait') or pair_seconds(params) * max(1, len(rounds)) + 30


def serve(module, binary, params, part, wait, clock=time.time):
    """Serve this part's tests with one-off iperf3 servers (one per direction) on the round's port;
    each waits (bounded) for its client. Returns an error line or None."""
    tests = 2 if params['both_directions'] else 1
    port = params['port'] + part['round']
    timeout_bin = module.get_bin_path('timeout')
    for number in range(tests):
        limit = int(wait if number == 0 else params['connect_timeout'] + 15) + params['duration'] + (params.get('omit') or 0)
        command = [binary, '-s', '-1', '-p', str(port), '-B', part['address']]
        if timeout_bin:
            command = [timeout_bin, str(limit)] + command
        started = clock()
        rc, out, err = module.run_command(command)
        if rc == 124:
            return 'host %s: no test from %s came to port %d within %d s (round %d)' % (
                params['node'], part['peer'], port, limit, part['round'] + 1)
        if rc != 0:
            said = ' '.join((err or out or '').strip().splitlines()[-2:])[-300:]
            return 'host %s: the iperf3 server on port %d ended with exit %d after %.0f s (round %d): %s' % (
                params['node'], port, rc, clock() - started, part['round'] + 1, said)
    return None


def run_schedule(module, params, sleep=time.sleep, clock=time.time):
    """This node's part of every round, in one run: as a client it measures against the round's
    server (retrying while that server is not up yet, for up to the part's wait); as a server it
    serves that one client. A pair starts as soon as both its nodes are free, never waiting for
    the other pairs of its round. Round i uses port + i, so a client early for its next pair is
    refused, not served by the wrong server. Returns {'results', 'parts'}."""
    if params['tool'] != 'iperf3':
        raise BandwidthError('host %s: state=schedule runs iperf3 only' % params['node'])
    binary = _binary(module, params)
    rounds = params['rounds'] or []
    parts = parts_of(params['node'], rounds)
    if module.check_mode:
        return {'results': [], 'parts': parts}
    wait = schedule_wait(params, rounds)
    results = []
    for part in parts:
        started = clock()
        if part['role'] == 'server':
            part['error'] = serve(module, binary, params, part, wait, clock=clock)
        else:
            run = dict(params, server=part['address'], peer=part['peer'], port=params['port'] + part['round'],
                       server_wait=wait)
            got = iperf3_pair(module, binary, run, sleep=sleep, clock=clock)
            for item in got:
                item['round'] = part['round'] + 1
            results.extend(got)
            part['error'] = '; '.join(r['error'] for r in got if r.get('error')) or None
        part['seconds'] = round(clock() - started, 1)
    return {'results': results, 'parts': parts}
