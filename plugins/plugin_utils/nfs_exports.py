# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""NFS exports: parse and check exports(5) lines, and render the cluster's export.

Two layers:

* ``parse_line`` / ``parse_exports`` follow the syntax rules of ``exportfs`` from nfs-utils
  2.6 (recorded under tests/unit/fixtures/exportfs/): the keywords it knows, the values it
  takes for anonuid/anongid/fsid/sec, host prefixes, the option list in parentheses.
* ``policy_errors`` adds the cluster's rules on top of the syntax, for what ``exportfs``
  silently accepts but a cluster must not have: an export to ``*`` or to names that cannot be
  checked, a client network outside ``cluster_cidr``, a space before ``(`` (which exports the
  options to the world), conflicting options (exportfs lets the last one win), a relative
  path, ``no_root_squash`` or ``async`` that were not asked for explicitly.
"""

from __future__ import annotations

import ipaddress
import re
import uuid

# Bare keywords exportfs accepts (nfs-utils 2.6 support/nfs/exports.c parseopts).
FLAGS = frozenset((
    'ro', 'rw', 'secure', 'insecure', 'sync', 'async', 'wdelay', 'no_wdelay',
    'hide', 'nohide', 'crossmnt', 'nocrossmnt', 'root_squash', 'no_root_squash',
    'all_squash', 'no_all_squash', 'subtree_check', 'no_subtree_check',
    'secure_locks', 'insecure_locks', 'auth_nlm', 'no_auth_nlm', 'acl', 'no_acl',
    'pnfs', 'no_pnfs', 'security_label', 'mountpoint', 'mp',
))
# Keywords that take a value.
VALUED = frozenset(('anonuid', 'anongid', 'fsid', 'sec', 'mountpoint', 'mp', 'refer', 'replicas'))
SEC_FLAVORS = frozenset(('sys', 'krb5', 'krb5i', 'krb5p', 'none', 'null', 'unix'))
# Pairs where exportfs keeps the last one written; a cluster export names one of each.
CONFLICTS = (
    ('rw', 'ro'), ('sync', 'async'), ('root_squash', 'no_root_squash'),
    ('all_squash', 'no_all_squash'), ('subtree_check', 'no_subtree_check'),
    ('secure', 'insecure'), ('wdelay', 'no_wdelay'), ('hide', 'nohide'),
    ('crossmnt', 'nocrossmnt'), ('secure_locks', 'insecure_locks'), ('acl', 'no_acl'),
    ('pnfs', 'no_pnfs'),
)
_SIGNED_INT = re.compile(r'^-?[0-9]+$')
_WORLD = ('*', '*.*', '0.0.0.0/0', '::/0')


class ExportsError(ValueError):
    """A line exportfs would refuse (or that the cluster policy refuses)."""


def _check_option(opt):
    if opt == '':
        raise ExportsError('unknown keyword ""')
    key, sep, value = opt.partition('=')
    if not sep:
        if key not in FLAGS:
            raise ExportsError('unknown keyword "%s"' % opt)
        return
    if key not in VALUED:
        raise ExportsError('unknown keyword "%s"' % opt)
    if key in ('anonuid', 'anongid'):
        if not _SIGNED_INT.match(value):
            raise ExportsError('bad %s "%s"' % (key, opt))
    elif key == 'fsid':
        if value == 'root' or value.isdigit():
            return
        try:
            uuid.UUID(value)
        except ValueError as exc:
            raise ExportsError('bad fsid "%s"' % opt) from exc
    elif key == 'sec':
        for flavor in value.split(':'):
            if flavor not in SEC_FLAVORS:
                raise ExportsError('unknown flavor %s' % flavor)


def parse_options(text):
    """The option list of one client, as exportfs reads it: 'rw,sync' -> ['rw', 'sync']."""
    if any(c.isspace() for c in text):
        raise ExportsError('syntax error: bad option list')
    opts = text.split(',') if text else []
    for opt in opts:
        _check_option(opt)
    return opts


def _check_host(host):
    if '/' in host:
        addr, _, mask = host.partition('/')
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            return  # a name with a slash: exportfs treats it as a name
        if mask.isdigit():
            bits = 32 if ':' not in addr else 128
            if int(mask) > bits:
                raise ExportsError("Invalid prefix `%s' for %s" % (mask, host))
        else:
            try:
                ipaddress.ip_network('%s/%s' % (addr, mask), strict=False)
            except ValueError as exc:
                raise ExportsError('Invalid netmask `%s\' for %s' % (mask, host)) from exc


def _split_fields(line):
    """Split a line into fields; a double-quoted path may hold spaces."""
    fields, cur, quoted = [], '', False
    for ch in line:
        if ch == '"':
            quoted = not quoted
            continue
        if ch.isspace() and not quoted:
            if cur:
                fields.append(cur)
                cur = ''
            continue
        cur += ch
    if quoted:
        raise ExportsError('syntax error: unterminated quote')
    if cur:
        fields.append(cur)
    return fields


def parse_line(line):
    """One exports(5) line -> {'path', 'clients': [{'host', 'options', 'detached'}], 'default_options'}.

    A client written as ``host (opts)`` (space before the parenthesis) is kept as exportfs
    reads it: ``host`` with no options, then ``*`` with the options, both marked detached.
    """
    fields = _split_fields(line.split('#', 1)[0])
    if not fields:
        raise ExportsError('empty line')
    path = fields[0]
    default_options = []
    clients = []
    for field in fields[1:]:
        if field.startswith('-') and not clients:
            default_options = parse_options(field[1:])
            continue
        if field.startswith('('):
            if not field.endswith(')'):
                raise ExportsError('syntax error: bad option list')
            clients.append({'host': '*', 'options': parse_options(field[1:-1]), 'detached': True})
            if len(clients) > 1 and clients[-2]['options'] == [] and not clients[-2]['detached']:
                clients[-2]['detached'] = True
            continue
        host, paren, rest = field.partition('(')
        if paren:
            if not rest.endswith(')'):
                raise ExportsError('syntax error: bad option list')
            options = parse_options(rest[:-1])
        else:
            options = []
        _check_host(host)
        clients.append({'host': host, 'options': default_options + options, 'detached': False})
    if not clients:
        clients.append({'host': '*', 'options': default_options, 'detached': True})
    return {'path': path, 'clients': clients, 'default_options': default_options}


def parse_exports(text):
    """Every export of an exports file -> (entries, errors); errors read 'line N: ...'."""
    entries, errors = [], []
    joined = text.replace('\\\n', ' ')
    for number, raw in enumerate(joined.splitlines(), 1):
        if not raw.split('#', 1)[0].strip():
            continue
        try:
            entry = parse_line(raw)
        except ExportsError as exc:
            errors.append('line %d: %s' % (number, exc))
            continue
        entry['line'] = number
        entries.append(entry)
    return entries, errors


def _network(host):
    try:
        return ipaddress.ip_network(host, strict=False)
    except ValueError:
        return None


def client_errors(host, cluster_cidr, allow_outside=False):
    """Why a client spec may not be exported to in this cluster ([] when it may)."""
    if host in _WORLD or (host.endswith('/0') and _network(host) is not None):
        return ['%s exports to every host; name networks inside cluster_cidr %s' % (host, cluster_cidr)]
    if any(c in host for c in '*?[]') or host.startswith('@') or host.startswith('gss/'):
        return ['%s is a wildcard, netgroup or name that cannot be checked against cluster_cidr %s; '
                'use an address or a network' % (host, cluster_cidr)]
    net = _network(host)
    if net is None:
        return ['%s is not an address or a network (like 192.168.1.0/24)' % host]
    if allow_outside:
        return []
    cluster = ipaddress.ip_network(str(cluster_cidr), strict=False)
    if net.version != cluster.version or not net.subnet_of(cluster):
        return ['%s is outside or wider than cluster_cidr %s' % (host, cluster_cidr)]
    return []


def option_errors(options):
    """Syntax and conflict problems of one option list ([] when there are none)."""
    errors = []
    for opt in options:
        try:
            _check_option(opt)
        except ExportsError as exc:
            errors.append(str(exc))
    present = set(options)
    for a, b in CONFLICTS:
        if a in present and b in present:
            errors.append('%s and %s contradict each other (exportfs would keep the last one)' % (a, b))
    return errors


def policy_errors(entry, cluster_cidr, allow_outside=False, allow_no_root_squash=False, allow_async=False):
    """The cluster's rules for one parsed entry: what exportfs would accept but we refuse."""
    errors = []
    if not entry['path'].startswith('/'):
        errors.append('export path %s is not absolute' % entry['path'])
    for client in entry['clients']:
        where = '%s %s' % (entry['path'], client['host'])
        if client['detached']:
            errors.append('%s: a space before "(" exports these options to every host' % where)
            continue
        errors.extend('%s: %s' % (where, e) for e in client_errors(client['host'], cluster_cidr, allow_outside))
        errors.extend('%s: %s' % (where, e) for e in option_errors(client['options']))
        if 'no_root_squash' in client['options'] and not allow_no_root_squash:
            errors.append('%s: no_root_squash lets root on a client act as root on the server' % where)
        if 'async' in client['options'] and not allow_async:
            errors.append('%s: async may lose written data when the server crashes' % where)
        if 'sync' not in client['options'] and 'async' not in client['options']:
            errors.append('%s: name sync (exportfs warns and older versions defaulted to async)' % where)
    return errors


def export_options(options, no_root_squash=False):
    """The option list the cluster export gets: the given ones, then sync, no_subtree_check
    and the squash choice, in a fixed order and without duplicates."""
    out = []
    for opt in list(options) + ['sync', 'no_subtree_check', 'no_root_squash' if no_root_squash else 'root_squash']:
        if opt not in out:
            out.append(opt)
    return out


def render_line(path, clients, options):
    """One exports(5) line: path, then each client with its options, no space before '('."""
    if any(c.isspace() for c in path):
        path = '"%s"' % path
    return '%s %s' % (path, ' '.join('%s(%s)' % (c, ','.join(options)) for c in clients))


def export_errors(path, clients, options, cluster_cidr, no_root_squash=False, allow_outside=False):
    """Problems of the cluster export settings, each as 'variable: problem' (the role's names)."""
    errors = []
    if not isinstance(path, str) or not path.startswith('/'):
        errors.append('nfs_server_export_path: %r is not an absolute path' % (path,))
    elif any(c.isspace() or c in '"#\\' for c in path):
        errors.append('nfs_server_export_path: %r holds a space, quote, # or backslash' % (path,))
    elif path.rstrip('/') == '':
        errors.append('nfs_server_export_path: / would export the whole root file system')
    if not clients:
        errors.append('nfs_server_export_clients: is empty; name at least cluster_cidr')
    for host in clients or []:
        errors.extend('nfs_server_export_clients: %s' % e for e in client_errors(str(host), cluster_cidr, allow_outside))
    for opt in options or []:
        if opt == 'no_root_squash':
            errors.append('nfs_server_export_options: no_root_squash is set with nfs_server_no_root_squash: true')
        elif opt in ('async', 'subtree_check'):
            errors.append('nfs_server_export_options: %s is decided by the role (it always renders sync and '
                          'no_subtree_check)' % opt)
    final = export_options([o for o in options or [] if o not in ('no_root_squash', 'async', 'subtree_check')],
                           no_root_squash)
    errors.extend('nfs_server_export_options: %s' % e for e in option_errors(final))
    if errors:
        return errors
    # What is validated is what is written: parse the rendered line back with exportfs' rules.
    line = render_line(path, [str(c) for c in clients], final)
    try:
        entry = parse_line(line)
    except ExportsError as exc:
        return ['rendered export %r: %s' % (line, exc)]
    return ['rendered export %r: %s' % (line, e) for e in policy_errors(
        entry, cluster_cidr, allow_outside=allow_outside, allow_no_root_squash=no_root_squash)]
