# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Shared pieces of the cluster tests (net_bandwidth, nccl_test, dist_check).

Input checks (message sizes, thresholds, pairs of nodes), who holds a TCP port (from
``ss -Hltnp``), quick network probes (a name that does not resolve, a closed port, an
interface that does not hold the node's address), and the reports built on the
controller from the per-node results.

Every check raises ClusterTestError with one message that names the variable (and the
host where there is one).
"""

from __future__ import annotations

import errno
import re
import socket
import statistics

from ansible_collections.gpucluster.multinode.plugins.module_utils.inventory_contract import natural_key
from ansible_collections.gpucluster.multinode.plugins.module_utils import netbench
from ansible_collections.gpucluster.multinode.plugins.module_utils import nccl_tests

_SIZE_RE = re.compile(r'^\s*(?P<number>\d+)\s*(?P<unit>[KMGkmg])?(?:i?B)?\s*$')
_UNITS = {None: 1, 'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}


class ClusterTestError(ValueError):
    """Bad input for a cluster test; the message names the variable (and the host)."""


def _type_name(value):
    for kind in (bool, int, float, str, list, dict):
        if isinstance(value, kind):
            return kind.__name__
    return type(value).__name__


def _where(label, host=None):
    return 'host %s: %s' % (host, label) if host else label


# --- input checks ------------------------------------------------------------------------

def parse_size(value, label='size', host=None):
    """Bytes from 1048576, '1048576', '1M', '64K', '1GiB' (K/M/G are powers of 1024, as in nccl-tests)."""
    where = _where(label, host)
    if isinstance(value, bool):
        raise ClusterTestError('%s must be a size in bytes (like 1048576 or 1M), got %r (bool)' % (where, value))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and _SIZE_RE.match(value):
        m = _SIZE_RE.match(value)
        number = int(m.group('number')) * _UNITS[(m.group('unit') or '').upper() or None]
    else:
        raise ClusterTestError('%s must be a size in bytes (like 1048576 or 1M), got %r (%s)'
                               % (where, value, _type_name(value)))
    if number <= 0:
        raise ClusterTestError('%s must be above 0 bytes, got %r' % (where, value))
    return number


def check_sizes(values, label='sizes', host=None, multiple_of=1):
    """A non-empty, strictly increasing list of sizes in bytes (each a multiple of multiple_of)."""
    where = _where(label, host)
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise ClusterTestError('%s must be a list of message sizes, got %r (%s)' % (where, values, _type_name(values)))
    if not values:
        raise ClusterTestError('%s is empty; give at least one message size, e.g. [1M, 64M]' % where)
    sizes = []
    for index, value in enumerate(values):
        size = parse_size(value, '%s[%d]' % (label, index), host)
        if size % multiple_of:
            raise ClusterTestError('%s[%d] %r is not a multiple of %d bytes (one float32 element)'
                                   % (where, index, value, multiple_of))
        if sizes and size <= sizes[-1]:
            raise ClusterTestError('%s must be increasing: %s[%d] = %d bytes does not exceed %s[%d] = %d bytes'
                                   % (where, label, index, size, label, index - 1, sizes[-1]))
        sizes.append(size)
    return sizes


def check_positive(value, label, host=None, allow_none=True):
    """A number above 0 (int, float or a numeric string); None passes when allow_none."""
    where = _where(label, host)
    if value is None or (isinstance(value, str) and value.strip() == '' and allow_none):
        if allow_none:
            return None
        raise ClusterTestError('%s is required (a number above 0)' % where)
    number = None
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or number != number:
        raise ClusterTestError('%s must be a positive number, got %r (%s)' % (where, value, _type_name(value)))
    if number <= 0:
        raise ClusterTestError('%s must be a positive number, got %r' % (where, value))
    return number


def check_thresholds(thresholds, sizes, label='thresholds', host=None):
    """{size_bytes: min busbw GB/s} from a dict keyed by sizes (1048576 or '1M'); keys must be tested sizes."""
    where = _where(label, host)
    if thresholds is None:
        return {}
    if not isinstance(thresholds, dict):
        raise ClusterTestError('%s must be a dict of message size to minimum busbw in GB/s, got %r (%s)'
                               % (where, thresholds, _type_name(thresholds)))
    out = {}
    for key, value in thresholds.items():
        size = parse_size(key, '%s key' % label, host)
        if size not in sizes:
            raise ClusterTestError('%s: size %r (%d bytes) is not one of the sizes tested (%s)'
                                   % (where, key, size, ', '.join(str(s) for s in sizes)))
        out[size] = check_positive(value, '%s[%s]' % (label, key), host, allow_none=False)
    return out


def plan_pairs(nodes, pairs=None, schedule='round_robin'):
    """Rounds of disjoint pairs to test.

    nodes: the node names, head first. pairs: None (every pair) or a list of two-name lists;
    each name must be one of nodes. schedule: round_robin (disjoint pairs at the same time, N-1
    rounds for N even) or sequential (one pair per round, for comparison).
    Returns {'nodes': [...], 'rounds': [[[a, b], ...], ...], 'pairs': n}.
    """
    if schedule not in ('round_robin', 'sequential'):
        raise ClusterTestError("schedule must be round_robin or sequential, got %r" % (schedule,))
    nodes = list(nodes)
    if len(nodes) < 2:
        raise ClusterTestError('a bandwidth test needs at least 2 nodes, got %d (%s)'
                               % (len(nodes), ', '.join(nodes) or 'none'))
    if pairs is None or pairs == []:
        rounds = netbench.round_robin(nodes)
    else:
        if isinstance(pairs, (str, dict)) or not isinstance(pairs, (list, tuple)):
            raise ClusterTestError('pairs must be a list of [node, node] pairs, got %r (%s)'
                                   % (pairs, _type_name(pairs)))
        wanted = []
        for index, pair in enumerate(pairs):
            if isinstance(pair, str) or not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ClusterTestError('pairs[%d] must be a list of two node names, got %r' % (index, pair))
            for name in pair:
                if name not in nodes:
                    raise ClusterTestError('pairs[%d] names %s, which is not a node of the inventory (%s)'
                                           % (index, name, ', '.join(nodes)))
            if pair[0] == pair[1]:
                raise ClusterTestError('pairs[%d] pairs %s with itself' % (index, pair[0]))
            key = frozenset(pair)
            if key in [frozenset(p) for p in wanted]:
                raise ClusterTestError('pairs[%d] %s-%s is listed twice' % (index, pair[0], pair[1]))
            wanted.append(list(pair))
        used = [n for n in nodes if any(n in p for p in wanted)]
        rounds = []
        for rnd in netbench.round_robin(used) if len(used) >= 2 else []:
            kept = [p for p in rnd if frozenset(p) in [frozenset(w) for w in wanted]]
            if kept:
                rounds.append(kept)
        nodes = used
    if schedule == 'sequential':
        rounds = [[pair] for rnd in rounds for pair in rnd]
    return {'nodes': nodes, 'rounds': rounds, 'pairs': sum(len(r) for r in rounds)}


# --- ports and probes ----------------------------------------------------------------------

_SS_USERS_RE = re.compile(r'\("(?P<name>[^"]+)",pid=(?P<pid>\d+)')


def _local_port(local):
    host, _, port = local.rpartition(':')
    return host.strip('[]'), port


def port_users(ss_output, port, address=None):
    """Listeners on a TCP port from ``ss -Hltnp`` output: [{'address', 'process', 'pid'}].

    address: only sockets bound to it or to every address (0.0.0.0, ::, *) count.
    """
    found = []
    for line in (ss_output or '').splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[0] != 'LISTEN':
            continue
        local = fields[3]
        host, lport = _local_port(local)
        if lport != str(port):
            continue
        host = host.split('%')[0]
        if address and host not in ('0.0.0.0', '::', '*', address):
            continue
        users = [{'process': m.group('name'), 'pid': int(m.group('pid'))}
                 for m in _SS_USERS_RE.finditer(line)]
        if not users:
            users = [{'process': None, 'pid': None}]
        for user in users:
            found.append(dict(user, address=host))
    return found


def describe_users(users):
    """'iperf3 (pid 123) on 10.0.0.1' for the listeners found by port_users."""
    parts = []
    for u in users:
        who = '%s (pid %s)' % (u['process'], u['pid']) if u.get('process') else 'a process ss cannot name (run as root to see it)'
        parts.append('%s on %s' % (who, u.get('address') or '*'))
    return ', '.join(parts)


def socket_cause(exc):
    """The likely cause of a failed TCP connect, in words a user acts on.

    roles/cluster_tests/files/dist_check.py has the same mapping (cause_of): that script runs
    on the nodes without the collection, so it keeps its own copy;
    tests/unit/plugins/module_utils/test_dist_check_script.py fails when the two differ.
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


def probe_tcp(host, port, timeout=3.0):
    """Try one TCP connection: {'ok', 'cause', 'error'}; names that do not resolve are told apart."""
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return {'ok': False, 'cause': socket_cause(exc), 'error': '%s: %s' % (host, exc)}
    last = None
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(addr)
            return {'ok': True, 'cause': None, 'error': None}
        except OSError as exc:
            last = exc
        finally:
            sock.close()
    return {'ok': False, 'cause': socket_cause(last), 'error': '%s:%s: %s' % (host, port, last)}


# --- reports built on the controller ----------------------------------------------------------

def _fmt(value, digits=2):
    return '-' if value is None else ('%.*f' % (digits, value))


def bandwidth_report(results, nodes, threshold_gbps=None, relative=None, rounds=None):
    """Matrix, per-node summary, flagged links and printable lines from the measured directions.

    results: list of {'client' (sender), 'server' (receiver), 'gbps' or 'error', 'tool'}.
    threshold_gbps / relative: see netbench.flag_slow_links; both None: nothing is flagged but
    failed links.
    """
    threshold_gbps = check_positive(threshold_gbps, 'threshold_gbps')
    relative = check_positive(relative, 'relative_threshold')
    if relative is not None and relative >= 1:
        raise ClusterTestError('relative_threshold must be a fraction of the fleet median below 1 '
                               '(e.g. 0.7), got %r' % relative)
    report = netbench.bandwidth_matrix(results or [], nodes=list(nodes))
    if threshold_gbps is None and relative is None:
        flags = netbench.flag_slow_links(report, threshold_gbps=1e-12)  # failed links only
        flags['threshold_gbps'] = None
        flags['slow_links'] = [f for f in flags['slow_links'] if f['reason'] != 'slow']
    else:
        flags = netbench.flag_slow_links(report, threshold_gbps=threshold_gbps, relative=relative)
    names = report['nodes']
    width = max([len(n) for n in names] + [8])
    lines = ['bandwidth matrix, Gbit/s (row sends to column), %d node(s), %d link(s) measured%s'
             % (len(names), len(report['links']),
                ', %d round(s)' % rounds if rounds is not None else '')]
    lines.append(' '.join(['%-*s' % (width, 'from\\to')] + ['%*s' % (width, n) for n in names]))
    for i, a in enumerate(names):
        cells = []
        for j, _ in enumerate(names):
            cells.append('%*s' % (width, '.' if i == j else _fmt(report['matrix'][i][j])))
        lines.append(' '.join(['%-*s' % (width, a)] + cells))
    for n in names:
        s = report['node_summary'][n]
        lines.append('node %s: links %d, min %s, median %s, max %s Gbit/s'
                     % (n, s['links'], _fmt(s['min']), _fmt(s['median']), _fmt(s['max'])))
    lines.append('fleet median %s Gbit/s; threshold %s Gbit/s'
                 % (_fmt(report['median_gbps']), _fmt(flags['threshold_gbps'])))
    for f in flags['slow_links']:
        lines.append('flagged %s - %s: %s' % (f['a'], f['b'], 'slow, %s Gbit/s' % _fmt(f['gbps'])
                                              if f['reason'] == 'slow' else f['reason']))
    if flags['culprits']:
        lines.append('slow node(s): %s (on every flagged link of its group)' % ', '.join(flags['culprits']))
    elif not flags['slow_links']:
        lines.append('no slow or failed link')
    report.update(flags)
    report['rounds'] = rounds
    report['ok'] = not flags['slow_links']
    report['lines'] = lines
    return report


def collective_report(rows, thresholds=None):
    """Rows below their per-size busbw threshold: [{'size', 'busbw_gbs', 'threshold_gbs'}]."""
    below = []
    for row in rows:
        limit = (thresholds or {}).get(row['size'])
        if limit is not None and (row.get('busbw_gbs') is None or row['busbw_gbs'] < limit):
            below.append({'size': row['size'], 'busbw_gbs': row.get('busbw_gbs'), 'threshold_gbs': limit})
    return below


def allreduce_rows(raw_rows, world_size):
    """Rows of the torch benchmark with algbw and busbw by the nccl-tests formulas.

    raw_rows: [{'size', 'count', 'time_us', 'wrong'}]; algbw = size / time (GB/s),
    busbw = algbw x 2(n-1)/n.
    """
    rows = []
    for raw in raw_rows:
        alg = nccl_tests.algbw(raw['size'], raw['time_us'])
        rows.append(dict(raw, algbw_gbs=alg, busbw_gbs=nccl_tests.busbw('all_reduce', alg, world_size)))
    return rows


def dist_check_report(results, nodes):
    """One verdict from the per-node dist_check results.

    results: {node: module result or None (Ansible could not run it there)}; nodes: the node
    names, head first. The head's result says who reached the rendezvous (joined); every node
    says where it stopped and why.
    """
    head = nodes[0]
    head_result = results.get(head) or {}
    joined = head_result.get('joined')
    if joined is None:
        joined = [n for n in nodes if (results.get(n) or {}).get('joined_store')]
    problems = []
    for node in nodes:
        r = results.get(node)
        if not r:
            problems.append({'node': node, 'stage': 'ansible', 'cause': 'Ansible did not run the check there '
                             '(host unreachable or failed earlier)', 'error': None})
            continue
        if r.get('ok'):
            continue
        problems.append({'node': node, 'stage': r.get('stage'), 'cause': r.get('cause'), 'error': r.get('error')})
    missing = [n for n in nodes if n not in joined]
    ok = not problems and all((results.get(n) or {}).get('ok') for n in nodes)
    # a node that did not join, or that names a cause of its own, is at fault; the others
    # only waited for it
    waiting = ('process group did not form', 'waited ', 'rendezvous store failed')
    at_fault = [p['node'] for p in problems
                if p['node'] in missing or not str(p['cause'] or '').startswith(waiting)]
    lines = []
    if ok:
        lines.append('dist_check: %d of %d node(s) joined one %s group through %s; all-reduce sum %s '
                     '(expected %s) on every node'
                     % (len(joined), len(nodes), head_result.get('backend'), head_result.get('rendezvous'),
                        head_result.get('sum'), head_result.get('expected')))
    else:
        if missing:
            lines.append('dist_check: %d of %d node(s) joined (%s); did not join: %s'
                         % (len(joined), len(nodes), ', '.join(joined) or 'none', ', '.join(missing)))
        else:
            lines.append('dist_check: %d of %d node(s) reached the rendezvous but the check failed%s'
                         % (len(joined), len(nodes),
                            ' at %s' % ', '.join(at_fault) if at_fault else ''))
        order = sorted(problems, key=lambda p: (p['node'] not in at_fault, nodes.index(p['node'])))
        for p in order:
            lines.append('host %s: %s%s%s' % (p['node'], p['cause'] or 'failed',
                                              ' (at %s)' % p['stage'] if p['stage'] else '',
                                              ': %s' % p['error'] if p['error'] else ''))
    return {'ok': ok, 'nodes': list(nodes), 'joined': joined, 'missing': missing, 'at_fault': at_fault,
            'problems': problems, 'lines': lines}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def sorted_names(names):
    return sorted(names, key=natural_key)


# --- running on a node ------------------------------------------------------------------------

_ENV_DUMP = 'set -a; for f in "$@"; do if [ -r "$f" ]; then . "$f" >/dev/null 2>&1; fi; done; env -0'


def node_environment(module, files=None, extra=None):
    """os.environ plus what the shell files set (sourced in order when readable), plus extra."""
    import os
    env = dict(os.environ)
    files = [f for f in (files or []) if f]
    if files:
        rc, out, err = module.run_command(['/bin/sh', '-c', _ENV_DUMP, 'env'] + files)
        if rc == 0:
            for item in out.split('\0'):
                key, sep, value = item.partition('=')
                if sep and key and not key.startswith('BASH_FUNC_'):
                    env[key] = value
    for key, value in (extra or {}).items():
        env[str(key)] = str(value)
    return env


def json_lines(text, prefix):
    """The JSON objects of the lines that start with prefix (other lines are ignored)."""
    import json
    found = []
    for line in (text or '').splitlines():
        at = line.find(prefix)
        if at < 0:
            continue
        try:
            found.append(json.loads(line[at + len(prefix):]))
        except ValueError:
            continue
    return found


def tail(text, lines=15):
    return '\n'.join((text or '').strip().splitlines()[-lines:])


def _size_label(size):
    for unit, factor in (('G', 1 << 30), ('M', 1 << 20), ('K', 1 << 10)):
        if size >= factor and size % factor == 0:
            return '%d%s' % (size // factor, unit)
    return str(size)


def collective_summary(results, nodes):
    """One report from the nccl_test results of the nodes: {ok, rows, ..., problems, lines}.

    results: {node: nccl_test result or None}. The reporter's result (the head's) holds the
    rows; every node that failed adds a problem naming it.
    """
    reporter = None
    problems = []
    for node in nodes:
        r = results.get(node)
        if r is None:
            continue
        if r.get('failed'):
            problems.append('host %s: %s' % (node, r.get('msg') or 'failed'))
            continue
        if r.get('reporter') and reporter is None:
            reporter = dict(r, node=node)
        elif r.get('error'):
            problems.append('host %s: %s%s' % (node, r['error'], ('\n' + r['output']) if r.get('output') else ''))
    if reporter is None:
        problems.insert(0, 'no node reported the collective test (the head did not run it)')
        return {'ok': False, 'rows': [], 'problems': problems, 'lines': problems[:]}
    if reporter.get('error'):
        problems.insert(0, 'host %s: %s' % (reporter['node'], reporter['error']))
    rows = reporter.get('rows') or []
    lines = ['collective: %s, %s rank(s) on %s node(s), method %s'
             % (reporter.get('algorithm'), reporter.get('world_size'), reporter.get('nnodes'), reporter.get('method'))]
    lines.append('%10s %12s %12s %11s %11s %6s' % ('size', 'count', 'time_us', 'algbw GB/s', 'busbw GB/s', 'wrong'))
    for r in rows:
        lines.append('%10s %12s %12s %11s %11s %6s'
                     % (_size_label(r['size']), r.get('count'), _fmt(r.get('time_us'), 1), _fmt(r.get('algbw_gbs'), 4),
                        _fmt(r.get('busbw_gbs'), 4), r.get('wrong')))
    if rows:
        lines.append('busbw at the largest size (%s): %s GB/s; average busbw %s GB/s; values %s'
                     % (_size_label(rows[-1]['size']), _fmt(rows[-1].get('busbw_gbs'), 4),
                        _fmt(reporter.get('avg_busbw_gbs'), 4), 'correct' if reporter.get('correct') else 'WRONG'))
        if not reporter.get('correct'):
            bad = [_size_label(r['size']) for r in rows if r.get('wrong')]
            problems.append('wrong reduced values at size(s) %s' % (', '.join(bad) or 'see out_of_bounds'))
    for b in reporter.get('below_threshold') or []:
        problems.append('size %s: busbw %s GB/s is under its threshold %s GB/s'
                        % (_size_label(b['size']), _fmt(b['busbw_gbs'], 4), _fmt(b['threshold_gbs'], 4)))
    lines.extend(problems)
    ok = bool(rows) and not problems
    out = {k: reporter.get(k) for k in ('method', 'algorithm', 'backend', 'world_size', 'nnodes', 'correct',
                                        'avg_busbw_gbs', 'max_busbw_gbs', 'below_threshold')}
    out.update(ok=ok, rows=rows, problems=problems, lines=lines, reporter=reporter['node'])
    return out
