"""The bandwidth module run as Ansible runs it, with the real iperf3 on loopback addresses."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'bandwidth.py')
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')

pytestmark = pytest.mark.skipif(shutil.which('iperf3') is None, reason='needs iperf3 (make setup installs it)')


def run(tmp_path, path=None, check=False, **args):
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=check, _ansible_tmpdir=str(tmp_path))}
    args_file = tmp_path / 'args.json'
    args_file.write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    if path is not None:
        env['PATH'] = path
    proc = subprocess.run([sys.executable, MODULE, str(args_file)], capture_output=True, text=True, env=env,
                          check=False, timeout=120)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))


def free_port():
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def listening(address, port):
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((address, port)) == 0


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open('/proc/%d/stat' % pid) as handle:
        return handle.read().split(')')[-1].split()[0] != 'Z'


def test_a_pair_measured_both_ways_and_the_server_stopped(tmp_path):
    port = free_port()
    common = dict(port=port, run_dir=str(tmp_path / 'run'))
    started = run(tmp_path, state='server', node='n2', bind='127.0.0.12', **common)
    assert not started.get('failed'), started
    pid = started['pid']
    assert alive(pid)
    try:
        measured = run(tmp_path, state='client', node='n1', server='127.0.0.12', peer='n2', streams=2,
                       duration=1, **common)
    finally:
        stopped = run(tmp_path, state='stopped', node='n2', **common)
    assert pid in stopped['stopped'] and not alive(pid)
    assert all(not alive(p) for p in stopped['stopped'])
    assert not listening('127.0.0.12', port)   # the server itself, not only its wrapper, is gone
    assert not (tmp_path / 'run' / ('net_bandwidth-n2-iperf3-%d' % port) / 'pid').exists()
    results = measured['results']
    assert [(r['client'], r['server']) for r in results] == [('n1', 'n2'), ('n2', 'n1')]
    assert all(r['error'] is None and r['gbps'] > 0 and r['streams'] == 2 for r in results)
    assert measured['changed'] is False
    again = run(tmp_path, state='stopped', node='n2', **common)
    assert again['stopped'] == [] and not again.get('failed')


def test_a_client_without_a_server_is_a_failed_result_not_a_module_failure(tmp_path):
    measured = run(tmp_path, state='client', node='n1', server='127.0.0.12', peer='n2', port=free_port(),
                   duration=1, both_directions=False, connect_timeout=2)
    assert not measured.get('failed'), measured
    assert measured['results'][0]['gbps'] is None
    assert 'unable to connect' in measured['results'][0]['error']


def test_check_names_the_process_holding_the_port(tmp_path):
    holder = socket.socket()
    holder.bind(('127.0.0.12', 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        checked = run(tmp_path, state='check', node='n2', port=port, bind='127.0.0.12')
        refused = run(tmp_path, state='server', node='n2', port=port, bind='127.0.0.12',
                      run_dir=str(tmp_path / 'run'))
    finally:
        holder.close()
    assert len(checked['problems']) == 1
    problem = checked['problems'][0]
    assert problem.startswith('host n2: port %d is in use by pid %d (' % (port, os.getpid()))
    assert problem.endswith(') (the bandwidth test port)')
    assert refused['failed'] and refused['msg'] == problem


def test_check_names_the_node_and_the_package_when_iperf3_is_missing(tmp_path):
    empty = tmp_path / 'bin'
    empty.mkdir()
    checked = run(tmp_path, path=str(empty), state='check', node='gpu-worker-2', port=free_port())
    assert 'host gpu-worker-2: iperf3 is not installed (install the package iperf3)' in checked['problems']
    client = run(tmp_path, path=str(empty), state='client', node='gpu-worker-2', server='127.0.0.1', peer='x')
    assert client['failed'] and client['msg'] == 'host gpu-worker-2: iperf3 is not installed (install the package iperf3)'


def test_check_mode_starts_nothing(tmp_path):
    port = free_port()
    out = run(tmp_path, check=True, state='server', node='n2', bind='127.0.0.12', port=port,
              run_dir=str(tmp_path / 'run'))
    assert not out.get('failed') and 'pid' not in out
    assert not (tmp_path / 'run').exists()


def test_out_of_range_settings_name_the_host(tmp_path):
    out = run(tmp_path, state='check', node='n1', streams=0)
    assert out['failed'] and out['msg'] == 'host n1: streams must be from 1 to 128, got 0'


def test_a_server_busy_with_another_test_is_tried_again(tmp_path):
    port = free_port()
    common = dict(port=port, run_dir=str(tmp_path / 'run'))
    started = run(tmp_path, state='server', node='n2', bind='127.0.0.12', **common)
    assert not started.get('failed'), started
    other = subprocess.Popen(['iperf3', '-c', '127.0.0.12', '-p', str(port), '-t', '3'],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        measured = run(tmp_path, state='client', node='n1', server='127.0.0.12', peer='n2', duration=1,
                       both_directions=False, **common)
    finally:
        other.wait(timeout=30)
        run(tmp_path, state='stopped', node='n2', **common)
    assert measured['results'][0]['error'] is None, measured
    assert measured['results'][0]['gbps'] > 0


def test_a_stale_pid_file_naming_another_process_is_never_signalled(tmp_path):
    port = free_port()
    state = tmp_path / 'run' / ('net_bandwidth-n2-iperf3-%d' % port)
    state.mkdir(parents=True, mode=0o700)
    bystander = subprocess.Popen(['sleep', '60'], start_new_session=True)
    try:
        # an old pid file: a bare pid, as an earlier version wrote it, now reused by another process
        (state / 'pid').write_text('%d\n' % bystander.pid)
        first = run(tmp_path, state='stopped', node='n2', port=port, run_dir=str(tmp_path / 'run'))
        assert first['stopped'] == [] and bystander.poll() is None
        # a record whose start time does not match the live process
        (state / 'pid').write_text(json.dumps({'pid': bystander.pid, 'start_time': 1, 'uid': os.getuid(),
                                              'job_id': 'net_bandwidth-iperf3-%d' % port}))
        second = run(tmp_path, state='stopped', node='n2', port=port, run_dir=str(tmp_path / 'run'))
        assert second['stopped'] == [] and bystander.poll() is None
        assert not (state / 'pid').exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_a_client_started_before_its_server_waits_for_it(tmp_path):
    port = free_port()
    common = dict(port=port, run_dir=str(tmp_path / 'run'))
    client_dir = tmp_path / 'client'
    client_dir.mkdir()
    payload = {'ANSIBLE_MODULE_ARGS': dict(state='client', node='n1', server='127.0.0.12', peer='n2', duration=1,
                                           both_directions=False, server_wait=20, port=port,
                                           _ansible_tmpdir=str(client_dir))}
    (client_dir / 'args.json').write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    client = subprocess.Popen([sys.executable, MODULE, str(client_dir / 'args.json')], stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        time.sleep(1.5)  # the client is refused, and tries again
        started = run(tmp_path, state='server', node='n2', bind='127.0.0.12', **common)
        assert not started.get('failed'), started
        measured = json.loads(client.communicate(timeout=60)[0])
    finally:
        run(tmp_path, state='stopped', node='n2', **common)
        if client.poll() is None:
            client.kill()
    assert measured['results'][0]['error'] is None, measured
    assert measured['results'][0]['gbps'] > 0


def start(tmp_path, name, **args):
    """The module in the background (as Ansible runs one task on several hosts at once)."""
    where = tmp_path / name
    where.mkdir()
    (where / 'args.json').write_text(json.dumps({'ANSIBLE_MODULE_ARGS': dict(args, _ansible_tmpdir=str(where))}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    return subprocess.Popen([sys.executable, MODULE, str(where / 'args.json')], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish(proc):
    out, err = proc.communicate(timeout=180)
    try:
        return json.loads(out)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, out, err))


def round_robin(nodes):
    """The rounds of the bandwidth_plan filter for these {name: address} nodes (circle method)."""
    names = list(nodes)
    rounds = []
    for r in range(len(names) - 1):
        order = [names[0]] + names[1:][r:] + names[1:][:r]
        rounds.append([{'client': order[i], 'server': order[-1 - i], 'server_address': nodes[order[-1 - i]]}
                       for i in range(len(names) // 2)])
    return rounds


def test_a_schedule_of_every_round_in_one_run_per_node(tmp_path):
    nodes = {'n1': '127.0.0.31', 'n2': '127.0.0.32', 'n3': '127.0.0.33', 'n4': '127.0.0.34'}
    rounds = round_robin(nodes)
    port = free_port()
    procs = dict((n, start(tmp_path, n, state='schedule', node=n, port=port, rounds=rounds, streams=1, duration=1))
                 for n in nodes)
    out = dict((n, finish(p)) for n, p in procs.items())
    assert all(not o.get('failed') for o in out.values()), out
    results = [r for o in out.values() for r in o['results']]
    # every pair of 4 nodes, both ways, each a real measurement
    assert sorted((r['client'], r['server']) for r in results) == sorted(
        (a, b) for a in nodes for b in nodes if a != b)
    assert all(r['error'] is None and r['gbps'] > 0 for r in results), results
    assert sorted(set(r['round'] for r in results)) == [1, 2, 3]
    # each node had one part per round, in round order, none failed
    for name, o in out.items():
        assert [p['round'] for p in o['parts']] == [0, 1, 2], (name, o['parts'])
        assert all(p['error'] is None for p in o['parts'])
    assert not any(listening(a, port + i) for a in nodes.values() for i in range(3))


def test_a_partner_that_never_comes_is_an_error_naming_it_and_the_node_goes_on(tmp_path):
    nodes = {'n1': '127.0.0.41', 'n2': '127.0.0.42'}
    rounds = [[{'client': 'n1', 'server': 'n2', 'server_address': nodes['n2']}],
              [{'client': 'n2', 'server': 'n1', 'server_address': nodes['n1']}]]
    port = free_port()
    # only n2 runs: its server part waits server_wait for n1, then its client part for n1's server
    out = finish(start(tmp_path, 'n2', state='schedule', node='n2', port=port, rounds=rounds, duration=1,
                       server_wait=2, connect_timeout=1))
    assert not out.get('failed'), out
    served, measured = out['parts']
    assert served['role'] == 'server' and 'no test from n1 came to port %d' % port in served['error']
    assert measured['role'] == 'client' and measured['error'] and measured['seconds'] < 30
    assert all(r['gbps'] is None for r in out['results'])
