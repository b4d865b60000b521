#!/usr/bin/env python3
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Distributed smoke test: every node joins one torch.distributed group with its own number of
ranks, all-reduces a known tensor, checks the sum and leaves.

Run once per node with its index (the head is node 0 and holds the rendezvous store). The
node starts --slots ranks of its own (forked after torch is imported; ranks are numbered node
by node, so the world size is the sum of the slots). The --timeout clock starts once torch is
imported. Each step is reported, so that a node that cannot join says where it stopped:

  connect  a worker reaches the head's rendezvous port (a raw TCP probe first, which tells a
           name that does not resolve from a closed port or no route);
  store    every rank registers in the head's TCPStore; the head waits for every rank and
           names the nodes whose ranks did not all register;
  init     the process group forms (gloo/nccl connect every pair of ranks: an interface that
           does not exist or a blocked port between workers shows here);
  reduce   every rank all-reduces a tensor of rank + 1: the sum must be n(n+1)/2.

One JSON line per node, prefixed GPUCLUSTER_DIST_CHECK, is printed at the end (the first rank
of the node that failed says where); the exit status is 0 only when every rank of the node
passed every step.
"""

import argparse
import datetime
import errno
import json
import os
import socket
import sys
import time

MARKER = 'GPUCLUSTER_DIST_CHECK '


def emit(obj):
    sys.stdout.write(MARKER + json.dumps(obj, sort_keys=True) + '\n')
    sys.stdout.flush()


def cause_of(exc):
    """The likely cause of a failed TCP connect, in words a user acts on.

    The only copy: this script runs on the nodes without the collection, and the smoke test's
    report reads the cause it prints (tests/unit/roles/cluster_tests/test_smoke_script.py).
    """
    if isinstance(exc, socket.gaierror):
        return 'name not resolvable'
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return 'no answer (port filtered by a firewall, or the host is down)'
    code = getattr(exc, 'errno', None)
    if code == errno.ECONNREFUSED:
        return 'port closed (connection refused: nothing listens, or a firewall rejects it)'
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return 'no route to the host'
    if code in (errno.EACCES, errno.EPERM):
        return 'blocked by a local rule (connection not permitted)'
    return 'connection failed'


def reach(host, port, deadline):
    """Connect to host:port until it answers or the deadline passes: None, or (cause, error)."""
    last = None
    while True:
        try:
            infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            return cause_of(exc), '%s: %s' % (host, exc)
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(max(0.5, min(3.0, deadline - time.time())))
            try:
                sock.connect(addr)
                return None
            except OSError as exc:
                last = exc
            finally:
                sock.close()
        if time.time() >= deadline:
            return cause_of(last), '%s:%d: %s' % (host, port, last)
        time.sleep(0.5)


def plan(nodes, slots, index):
    """{'node', 'world', 'first_rank', 'slots'} of the node at index (ranks node by node)."""
    if len(slots) != len(nodes) or any(int(n) < 1 for n in slots):
        raise ValueError('slots must give 1 or more ranks for each of the %d nodes, got %r' % (len(nodes), slots))
    return {'node': nodes[index], 'world': sum(slots), 'first_rank': sum(slots[:index]), 'slots': slots[index]}


def joined_nodes(nodes, slots, registered):
    """The nodes all of whose ranks are in registered (a set of global ranks), in order."""
    out, first = [], 0
    for node, count in zip(nodes, slots):
        if all(r in registered for r in range(first, first + count)):
            out.append(node)
        first += count
    return out


def check_rank(args, nodes, slots, where, local, deadline, torch, dist):
    """One rank's steps (store, init, reduce): its result and exit status."""
    world, rank = where['world'], where['first_rank'] + local
    node = where['node']
    result = {'node': node, 'rank': rank, 'world_size': world, 'backend': args.backend, 'stage': 'store',
              'ok': False, 'cause': None, 'error': None, 'joined_store': False,
              'rendezvous': '%s:%d' % (args.master_addr, args.master_port)}
    try:
        store = dist.TCPStore(args.master_addr, args.master_port, world, rank == 0,
                              timeout=datetime.timedelta(seconds=max(15, int(deadline - time.time()))),
                              wait_for_workers=False)
        store.set('joined/%d' % rank, node)
    except Exception as exc:  # noqa: BLE001 - any failure here is reported, with its text
        result['cause'] = 'rendezvous store failed'
        result['error'] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return result, 5
    result['joined_store'] = True

    if rank == 0:
        registered = {0}
        while time.time() < deadline:
            registered = {i for i in range(world) if i == 0 or store.check(['joined/%d' % i])}
            if len(registered) == world:
                break
            time.sleep(0.5)
        result['joined'] = joined_nodes(nodes, slots, registered)
        missing = [n for n in nodes if n not in result['joined']]
        if missing:
            result['cause'] = 'waited %d s for %s' % (args.timeout, ', '.join(missing))
            result['error'] = 'not every node reached the rendezvous'
            return result, 6

    result['stage'] = 'init'
    try:
        if args.backend == 'nccl':
            torch.cuda.set_device(local)
        dist.init_process_group(args.backend, store=dist.PrefixStore('group', store), rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=max(10, int(deadline - time.time()))))
    except Exception as exc:  # noqa: BLE001
        text = str(exc)
        result['cause'] = 'process group did not form'
        if 'find address' in text or 'interface' in text.lower():
            result['cause'] = 'interface mismatch'
        result['error'] = ' '.join(text.split())[:400] or type(exc).__name__
        return result, 7

    result['stage'] = 'reduce'
    device = torch.device('cuda') if args.backend == 'nccl' else torch.device('cpu')
    tensor = torch.full((1024,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2.0
    value = tensor[0].item()
    wrong = int((tensor != expected).sum().item())
    result.update(sum=value, expected=expected, wrong=wrong)
    if wrong:
        result['cause'] = 'wrong all-reduce result'
        result['error'] = '%d of 1024 elements differ from %s (first: %s)' % (wrong, expected, value)
        return result, 8
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        result['joined'] = list(nodes)
    result['stage'] = 'done'
    result['ok'] = True
    return result, 0


def merge(results, where):
    """The node's one result from its ranks' (first rank first): the first rank that failed
    says where and why; ranks lists the node's global ranks."""
    node = dict(results[0])
    failed = [r for r in results if not r.get('ok')]
    if failed and node.get('ok'):
        first = failed[0]
        node.update(ok=False, stage=first.get('stage'), cause='rank %s: %s' % (first.get('rank'), first.get('cause')),
                    error=first.get('error'))
    node['rank'] = where['first_rank']
    node['slots'] = where['slots']
    node['ranks'] = list(range(where['first_rank'], where['first_rank'] + where['slots']))
    return node


def _fork_rank(run, local):
    """Run run(local) in a child; (pid, read end of the pipe its JSON result comes back on)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 9
        try:
            result, code = run(local)
            os.write(write, json.dumps(result).encode())
        finally:
            os.close(write)
            os._exit(code)  # noqa: SLF001 - a forked child must not run the parent's exit handlers
    os.close(write)
    return pid, read


def _collect(pid, read, local, where):
    chunks = []
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    try:
        return json.loads(b''.join(chunks).decode())
    except ValueError:
        return {'node': where['node'], 'rank': where['first_rank'] + local, 'ok': False, 'stage': 'start',
                'cause': 'rank ended without a result (wait status %d)' % status, 'error': None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--nodes', required=True, help='JSON list of node names, head first')
    parser.add_argument('--slots', help='JSON list of the ranks of each node (default: 1 each)')
    parser.add_argument('--node-index', type=int, required=True, help='index of this node in --nodes')
    parser.add_argument('--master-addr', required=True)
    parser.add_argument('--master-port', type=int, required=True)
    parser.add_argument('--backend', default='gloo', choices=['gloo', 'nccl'])
    parser.add_argument('--timeout', type=int, default=120, help='seconds to wait for every node')
    args = parser.parse_args()
    nodes = json.loads(args.nodes)
    slots = json.loads(args.slots) if args.slots else [1] * len(nodes)
    where = plan(nodes, slots, args.node_index)
    result = {'node': where['node'], 'rank': where['first_rank'], 'world_size': where['world'],
              'backend': args.backend, 'stage': 'connect', 'ok': False, 'cause': None, 'error': None,
              'joined_store': False, 'rendezvous': '%s:%d' % (args.master_addr, args.master_port)}
    try:
        # before the clock starts: importing torch takes long on a busy node
        import torch
        import torch.distributed as dist
    except Exception as exc:  # noqa: BLE001 - reported with its text
        result.update(stage='import', cause='torch does not import', error=str(exc).splitlines()[0])
        emit(merge([result], where))
        return 3
    deadline = time.time() + args.timeout

    if args.node_index != 0:
        failed = reach(args.master_addr, args.master_port, deadline)
        if failed:
            result['cause'], result['error'] = failed
            emit(merge([result], where))
            return 4

    def run(local):
        return check_rank(args, nodes, slots, where, local, deadline, torch, dist)

    children = [_fork_rank(run, local) for local in range(1, where['slots'])]
    first, code = run(0)
    results = [first] + [_collect(pid, read, local, where) for local, (pid, read) in enumerate(children, 1)]
    node = merge(results, where)
    emit(node)
    return code if not node['ok'] and code else (0 if node['ok'] else 9)


if __name__ == '__main__':
    sys.exit(main())
