#!/usr/bin/env python3
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Distributed smoke test: every node joins one torch.distributed group, all-reduces a known
tensor, checks the sum and leaves.

Run once per node with its rank (the head is rank 0 and holds the rendezvous store). The
--timeout clock starts once torch is imported. Each step is reported, so that a node that cannot join says where it stopped:

  connect  a worker reaches the head's rendezvous port (a raw TCP probe first, which tells a
           name that does not resolve from a closed port or no route);
  store    the node registers in the head's TCPStore; the head waits for every node and
           names the ones that did not register;
  init     the process group forms (gloo/nccl connect every pair of nodes: an interface that
           does not exist or a blocked port between workers shows here);
  reduce   every node all-reduces a tensor of rank + 1: the sum must be n(n+1)/2.

One JSON line, prefixed GPUCLUSTER_DIST_CHECK, is printed at the end; the exit status is 0
only when the node passed every step.
"""

import argparse
import datetime
import errno
import json
import os
import socket
import sys
import time

PREFIX = 'GPUCLUSTER_DIST_CHECK '


def emit(obj):
    sys.stdout.write(PREFIX + json.dumps(obj, sort_keys=True) + '\n')
    sys.stdout.flush()


def cause_of(exc):
    """The likely cause of a failed TCP connect, in words a user acts on.

    The same mapping as socket_cause in the collection's plugins/module_utils/cluster_tests.py,
    copied because this script runs without the collection; a unit test keeps the two in step.
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--nodes', required=True, help='JSON list of node names, head first (rank = index)')
    parser.add_argument('--rank', type=int, required=True)
    parser.add_argument('--master-addr', required=True)
    parser.add_argument('--master-port', type=int, required=True)
    parser.add_argument('--backend', default='gloo', choices=['gloo', 'nccl'])
    parser.add_argument('--timeout', type=int, default=120, help='seconds to wait for every node')
    args = parser.parse_args()
    nodes = json.loads(args.nodes)
    world, rank = len(nodes), args.rank
    node = nodes[rank]
    result = {'node': node, 'rank': rank, 'world_size': world, 'backend': args.backend, 'stage': 'connect',
              'ok': False, 'cause': None, 'error': None, 'joined_store': False,
              'rendezvous': '%s:%d' % (args.master_addr, args.master_port)}
    try:
        # before the clock starts: importing torch takes long on a busy node
        import torch
        import torch.distributed as dist
    except Exception as exc:  # noqa: BLE001 - reported with its text
        result.update(stage='import', cause='torch does not import', error=str(exc).splitlines()[0])
        emit(result)
        return 3
    deadline = time.time() + args.timeout

    if rank != 0:
        failed = reach(args.master_addr, args.master_port, deadline)
        if failed:
            result['cause'], result['error'] = failed
            emit(result)
            return 4

    result['stage'] = 'store'
    try:
        store = dist.TCPStore(args.master_addr, args.master_port, world, rank == 0,
                              timeout=datetime.timedelta(seconds=max(15, int(deadline - time.time()))),
                              wait_for_workers=False)
        store.set('joined/%d' % rank, node)
    except Exception as exc:  # noqa: BLE001 - any failure here is reported, with its text
        result['cause'] = 'rendezvous store failed'
        result['error'] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        emit(result)
        return 5
    result['joined_store'] = True

    if rank == 0:
        joined = [0]
        while time.time() < deadline:
            joined = [i for i in range(world) if i == 0 or store.check(['joined/%d' % i])]
            if len(joined) == world:
                break
            time.sleep(0.5)
        result['joined'] = [nodes[i] for i in joined]
        missing = [nodes[i] for i in range(world) if i not in joined]
        if missing:
            result['cause'] = 'waited %d s for %s' % (args.timeout, ', '.join(missing))
            result['error'] = 'not every node reached the rendezvous'
            emit(result)
            return 6

    result['stage'] = 'init'
    try:
        if args.backend == 'nccl':
            torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', '0')))
        dist.init_process_group(args.backend, store=dist.PrefixStore('group', store), rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=max(10, int(deadline - time.time()))))
    except Exception as exc:  # noqa: BLE001
        text = str(exc)
        result['cause'] = 'process group did not form'
        if 'find address' in text or 'interface' in text.lower():
            result['cause'] = 'interface mismatch'
        result['error'] = ' '.join(text.split())[:400] or type(exc).__name__
        emit(result)
        return 7

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
        emit(result)
        return 8
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        result['joined'] = list(nodes)
    result['stage'] = 'done'
    result['ok'] = True
    emit(result)
    return 0


if __name__ == '__main__':
    sys.exit(main())
