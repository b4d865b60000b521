# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The collective test of the ``collective`` module: nccl-tests (one node, or several through
mpirun with the collection's one hostfile renderer) or the torch.distributed all-reduce
benchmark started by torchrun on every node with that node's own ``--nproc-per-node``.

Node dicts are ``{name, address, slots}``, head first; the world size is the sum of the slots.
A run is ok only when it exited 0, every requested size is in its table, every value is right
and no size is under its threshold.
"""

from __future__ import annotations

import os

from ansible_collections.gpucluster.multinode.plugins.module_utils import hostfile
from ansible_collections.gpucluster.multinode.plugins.module_utils import nccl_tests_output as nt
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes
from ansible_collections.gpucluster.multinode.plugins.module_utils.node_commands import json_lines, tail

MARKER = 'GPUCLUSTER_ALLREDUCE '
TIMED_OUT = (124, 137)


class CollectiveError(ValueError):
    """A test that cannot start; the message names the host and what to do."""


def world_size(nodes):
    return sum(int(n['slots']) for n in nodes)


def ranks_by_node(nodes):
    """[{node, slots, first_rank}]: where each rank runs (ranks are numbered node by node)."""
    out, first = [], 0
    for n in nodes:
        out.append({'node': n['name'], 'slots': int(n['slots']), 'first_rank': first})
        first += int(n['slots'])
    return out


def nccl_tests_args(sizes, iterations, warmup):
    """-b/-e/-f/-n/-w/-c of an nccl-tests binary covering the sizes (a factor from the first two)."""
    factor = sizes[1] // sizes[0] if len(sizes) > 1 and sizes[1] % sizes[0] == 0 else 2
    return ['-b', str(sizes[0]), '-e', str(sizes[-1]), '-f', str(max(2, factor)),
            '-n', str(iterations), '-w', str(warmup), '-c', '1']


def nccl_tests_command(binary, args, nodes, mpirun=None, hostfile_path=None, forward=()):
    """The command line: the binary with every GPU of one node (-g), or mpirun over the hostfile
    (one rank per slot, one GPU each) forwarding the variables named in forward (-x)."""
    if len(nodes) == 1:
        return [binary] + list(args) + ['-g', str(nodes[0]['slots'])]
    command = [mpirun, '-np', str(world_size(nodes)), '--hostfile', hostfile_path, '--bind-to', 'none']
    for key in sorted(forward):
        command += ['-x', key]
    return command + [binary] + list(args) + ['-g', '1']


def write_hostfile(nodes, directory):
    """The Open MPI hostfile of the nodes (by address, each with its own slots) in directory."""
    path = os.path.join(directory, 'nccl-tests.hostfile')
    with open(path, 'w') as handle:
        handle.write(hostfile.render(nodes, fmt='openmpi', use_address=True))
    return path


def rows_from_nccl_tests(parsed):
    """The module's rows (out-of-place figures, wrong elements of both groups) from parse_nccl_tests."""
    rows = []
    for r in parsed['rows']:
        part = r.get('out_of_place') or {}
        wrong = sum(int(r[g].get('wrong') or 0) for g in ('out_of_place', 'in_place')
                    if isinstance(r.get(g), dict) and isinstance(r[g].get('wrong'), int))
        rows.append({'size': r['size'], 'count': r.get('count'), 'type': r.get('type'), 'redop': r.get('redop'),
                     'time_us': part.get('time_us'), 'algbw_gbs': part.get('algbw_gbs'),
                     'busbw_gbs': part.get('busbw_gbs'), 'wrong': wrong, 'in_place': r.get('in_place')})
    return rows


def exit_error(what, rc, timeout):
    """'nccl-tests exited 124 (timed out after 600 s)', or None for exit 0."""
    if rc == 0:
        return None
    return '%s exited %d%s' % (what, rc, ' (timed out after %d s)' % timeout if rc in TIMED_OUT else '')


def verdict(rows, sizes, thresholds=None, error=None, correct=True):
    """{ok, missing_sizes, below_threshold, correct, error}: ok only with no error, every
    requested size in rows, every value right and every size at or above its threshold.

    A size with a threshold that never got a row is listed in below_threshold with busbw None.
    """
    have = {r['size']: r for r in rows}
    missing = [s for s in sizes if s not in have]
    below = []
    for size in sorted((thresholds or {})):
        limit = thresholds[size]
        busbw = (have.get(size) or {}).get('busbw_gbs')
        if busbw is None or busbw < limit:
            below.append({'size': size, 'busbw_gbs': busbw, 'threshold_gbs': limit})
    correct = bool(correct) and all(not r.get('wrong') for r in rows)
    problems = [error] if error else []
    if missing:
        problems.append('size(s) %s missing from the output' % ', '.join(nt.size_label(s) for s in missing))
    return {'ok': not problems and correct and not below, 'missing_sizes': missing, 'below_threshold': below,
            'correct': correct, 'error': '; '.join(problems) or None}


def result(method, rows, sizes, thresholds, world, nodes, algorithm, backend, error=None, correct=True, **extra):
    """The reporter's result: rows, busbw figures, where the ranks ran, the verdict."""
    out = dict(changed=False, method=method, reporter=True, algorithm=algorithm, backend=backend,
               world_size=world, nnodes=len(nodes), ranks=ranks_by_node(nodes), rows=rows,
               max_busbw_gbs=rows[-1].get('busbw_gbs') if rows else None)
    busbws = [r['busbw_gbs'] for r in rows if isinstance(r.get('busbw_gbs'), (int, float))]
    out['avg_busbw_gbs'] = sum(busbws) / len(busbws) if busbws else None
    out.update(verdict(rows, sizes, thresholds, error, correct))
    out.update(extra)
    return out


def _binary(module, p):
    name = '%s_perf' % nt.collective_name(p['collective'])
    if p['nccl_tests_dir']:
        path = os.path.join(p['nccl_tests_dir'], name)
        return path if os.access(path, os.X_OK) else None
    return module.get_bin_path(name)


def _torchrun(p):
    path = os.path.join(p['env_path'], 'bin', 'torchrun')
    return path if os.access(path, os.X_OK) else None


def _mpirun(module, p):
    if p['mpirun']:
        return p['mpirun'] if os.access(p['mpirun'], os.X_OK) else None
    return module.get_bin_path('mpirun')


def probe(module, p):
    """What this node has: {nccl_tests, mpirun, torchrun} (paths or None)."""
    return {'nccl_tests': _binary(module, p), 'mpirun': _mpirun(module, p), 'torchrun': _torchrun(p)}


def _bounded(module, command, seconds):
    timeout = module.get_bin_path('timeout')
    return ([timeout, '-k', '10', str(seconds)] if timeout else []) + command


def run_nccl_tests(module, p, sizes, thresholds, env):
    """Run nccl-tests from this node (the head) and return the module's result."""
    node, nodes = p['node'], p['nodes']
    binary = _binary(module, p)
    name = '%s_perf' % nt.collective_name(p['collective'])
    if not binary:
        raise CollectiveError('host %s: %s not found (%s); build nccl-tests or use method torch'
                              % (node, name, p['nccl_tests_dir'] or 'on PATH'))
    args = nccl_tests_args(sizes, p['iterations'], p['warmup'])
    world = world_size(nodes) if len(nodes) > 1 else nodes[0]['slots']
    if len(nodes) == 1:
        command = nccl_tests_command(binary, args, nodes)
    else:
        mpirun = _mpirun(module, p)
        if not mpirun:
            raise CollectiveError('host %s: mpirun not found; multi-node nccl-tests runs through Open MPI '
                                  '(install openmpi-bin, or use method torch)' % node)
        forward = [k for k in env if k.startswith('NCCL_') or k in p['env']]
        path = write_hostfile(nodes, module.tmpdir) if not module.check_mode else '<hostfile>'
        command = nccl_tests_command(binary, args, nodes, mpirun, path, forward)
    if module.check_mode:
        return dict(changed=False, method='nccl_tests', reporter=True, ok=True, rows=[], command=command,
                    world_size=world, nnodes=len(nodes), ranks=ranks_by_node(nodes))
    rc, out, err = module.run_command(_bounded(module, command, p['timeout']), environ_update=env)
    error = exit_error('nccl-tests', rc, p['timeout'])
    try:
        parsed = nt.parse_nccl_tests(out, nranks=world, collective=p['collective'])
    except ValueError as exc:
        return result('nccl_tests', [], sizes, thresholds, world, nodes, 'nccl-tests %s' % name, 'nccl',
                      error='%s (%s)' % (exc, error or 'exit 0'), correct=False, command=command,
                      output=tail(out + '\n' + err))
    oob = parsed.get('out_of_bounds')
    return result('nccl_tests', rows_from_nccl_tests(parsed), sizes, thresholds, parsed.get('nranks') or world,
                  nodes, 'nccl-tests %s' % name, 'nccl', error=error, correct=not (oob and not oob['ok']),
                  out_of_bounds=oob, command=command, nccl_tests_avg_busbw_gbs=parsed.get('avg_busbw_gbs'),
                  hosts=parsed.get('hosts'), output=tail(out + ('\n' + err if rc else ''), 40))


def torchrun_command(torchrun, nodes, node, master_port, script, sizes, iterations, warmup, backend, timeout):
    """torchrun on one node with that node's own --nproc-per-node: torchrun's agents add up the
    counts of every node (world = sum of the slots, ranks numbered node by node), so nodes may
    differ. The node rank is fixed (the head is 0), so global rank 0, which reports, is on the
    head."""
    names = [n['name'] for n in nodes]
    rank = names.index(node)
    return [torchrun, '--nnodes', str(len(nodes)), '--nproc-per-node', str(nodes[rank]['slots']),
            '--node-rank', str(rank), '--master-addr', nodes[0]['address'], '--master-port', str(master_port),
            '--max-restarts', '0',
            script, '--sizes', ','.join(str(s) for s in sizes), '--iters', str(iterations),
            '--warmup', str(warmup), '--backend', backend, '--timeout', str(timeout)]


def run_torch(module, p, sizes, thresholds, env):
    """Run this node's part of the torch all-reduce benchmark; the head's result holds the rows."""
    node, nodes = p['node'], p['nodes']
    if nt.collective_name(p['collective']) != 'all_reduce':
        raise CollectiveError('host %s: collective %s: the torch benchmark does all_reduce only '
                              '(nccl-tests does the others)' % (node, p['collective']))
    rank = [n['name'] for n in nodes].index(node)
    base = dict(changed=False, method='torch', reporter=rank == 0, world_size=world_size(nodes),
                nnodes=len(nodes), ranks=ranks_by_node(nodes))
    if module.check_mode:
        # the environment and the script may come with this same run
        return dict(base, ok=True, rows=[])
    torchrun = _torchrun(p)
    if not torchrun:
        raise CollectiveError('host %s: %s/bin/torchrun not found; install torch (the python_env role) or set '
                              'env_path' % (node, p['env_path']))
    if not p['script'] or not os.path.isfile(p['script']):
        raise CollectiveError('host %s: script %s does not exist (copied by roles/cluster_tests/tasks/'
                              'collective.yml)' % (node, p['script']))
    if rank == 0:
        users = processes.port_listeners(p['master_port'])
        if users:
            raise CollectiveError('host %s: %s (the rendezvous port, master_port)'
                                  % (node, processes.describe_listeners(p['master_port'], users)))
    command = torchrun_command(torchrun, nodes, node, p['master_port'], p['script'], sizes, p['iterations'],
                               p['warmup'], p['backend'], p['timeout'])
    rc, out, err = module.run_command(_bounded(module, command, p['timeout']), environ_update=env)
    found = json_lines(out, MARKER)
    error = exit_error('torchrun on %s' % node, rc, p['timeout'])
    if rank != 0:
        return dict(base, ok=error is None, rows=[], command=command, error=error,
                    **({'output': tail(out + '\n' + err, 25)} if error else {}))
    start = next((f for f in found if f.get('kind') == 'start'), None)
    if start is None:
        return dict(base, ok=False, rows=[], command=command, output=tail(out + '\n' + err, 25),
                    error=error or 'torchrun on %s printed no result' % node)
    if error is None and not any(f.get('kind') == 'end' for f in found):
        error = 'torchrun on %s ended before the benchmark did' % node
    rows = nt.allreduce_rows([f for f in found if f.get('kind') == 'row'], start['world_size'])
    return result('torch', rows, sizes, thresholds, start['world_size'], nodes,
                  'torch.distributed all_reduce (%s)' % start['backend'], start['backend'], error=error,
                  torch=start.get('torch'), device=start.get('device'), command=command,
                  output=tail(out + '\n' + err, 25) if error else tail(err, 5))
