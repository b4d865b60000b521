# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The inventory contract of gpucluster.multinode, checked on the controller.

    cluster            every node of the training cluster
      head             exactly one: rank 0, master address, NFS server, launch host
      workers          the other nodes
      spares           optional: nodes set up like the others that run no job until a supervisor's
                       restart takes one in place of a node it left out

Every problem found is one line that names the host and the variable at fault.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import addresses
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import replaced_vars
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.python_env import VERSION_RE
from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults
from ansible_collections.gpucluster.multinode.plugins.module_utils.containers import RUNTIMES
from ansible_collections.gpucluster.multinode.plugins.module_utils.training.launchers import DEEPSPEED_LAUNCHERS, LAUNCHERS
from ansible_collections.gpucluster.multinode.plugins.module_utils.hostfile import natural_key, type_name

USER_RE = re.compile(r'^[a-z_][a-z0-9_-]{0,31}$')
# RFC 1123 host names: labels of letters, digits and inner hyphens, 63 characters each, 253 in all.
HOSTNAME_RE = re.compile(r'^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$', re.I)
# The widest cluster_cidr taken without cluster_cidr_allow_wide: the firewall opens it to everything.
WIDEST_PREFIX = {4: 16, 6: 48}


def _get(hostvars, host, name, default=None):
    try:
        value = hostvars[host].get(name, default)
    except Exception:  # HostVars raise on undefined templated values
        return default
    return default if value is None else value


def _text(value):
    """A variable's value as text, None when unset, None or blank (the one rule for 'empty')."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _var(host_vars, name):
    try:
        return host_vars.get(name)
    except Exception:  # HostVars raise on undefined templated values
        return None


def address_of(host_vars, host=None):
    """The address a node is known by inside the cluster, from that node's own variables.

    cluster_address, else ansible_host, else the inventory name (host, or the vars' inventory_hostname).
    An unset, None or blank value counts as not set, so '' never becomes an address."""
    host_vars = host_vars if host_vars is not None else {}
    for name in ('cluster_address', 'ansible_host'):
        text = _text(_var(host_vars, name))
        if text is not None:
            return text
    name = _text(host) or _text(_var(host_vars, 'inventory_hostname'))
    if name is None:
        raise ValueError('cluster_address: no cluster_address, ansible_host or host name to take the address from')
    return name


def address_source(host_vars):
    """Which variable address_of() took the address from: cluster_address, ansible_host or inventory_hostname."""
    for name in ('cluster_address', 'ansible_host'):
        if _text(_var(host_vars or {}, name)) is not None:
            return name
    return 'inventory_hostname'


def cluster_address(hostvars, host):
    """The address a node is known by inside the cluster: cluster_address, else ansible_host, else its name."""
    try:
        host_vars = hostvars[host]
    except Exception:
        host_vars = {}
    return address_of(host_vars, host)


def ordered_nodes(groups):
    """Head first, then the workers in natural order."""
    head = list(groups.get('head') or [])
    workers = sorted((h for h in groups.get('workers') or [] if h not in head), key=natural_key)
    return head + workers


def cluster_nodes(groups):
    """Every node to check: the job nodes (ordered_nodes), then the spares in natural order."""
    nodes = ordered_nodes(groups)
    return nodes + sorted((h for h in groups.get('spares') or [] if h not in nodes), key=natural_key)


def is_hostname(name):
    """True when name is an RFC 1123 host name (dotted labels allowed)."""
    return isinstance(name, str) and bool(HOSTNAME_RE.match(name))


def _truthy(value):
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ('1', 'true', 'yes', 'on')


def cidr_errors(host, cidr, allow_wide=False):
    """Problems of one cluster_cidr value: the firewall trusts it and NFS exports to it, so it must be
    a private or site network, never the whole internet; wider than /16 (IPv4) or /48 (IPv6) only
    with cluster_cidr_allow_wide."""
    net = ipaddress.ip_network(str(cidr), strict=False)
    if net.prefixlen == 0:
        return ['host %s: cluster_cidr %s is every address there is; the firewall would trust the whole internet. '
                'Set the cluster network (e.g. 192.168.1.0/24)' % (host, cidr)]
    if net.is_multicast or net.is_unspecified:
        return ['host %s: cluster_cidr %s is a multicast or unspecified range, not a cluster network' % (host, cidr)]
    widest = WIDEST_PREFIX[net.version]
    if net.prefixlen < widest and not allow_wide:
        return ['host %s: cluster_cidr %s holds %d addresses, wider than /%d; the firewall trusts all of it. '
                'Narrow it to the nodes\' network, or set cluster_cidr_allow_wide: true if it really is that wide'
                % (host, cidr, net.num_addresses, widest)]
    return []


STATIC_KEYS = ('interface', 'address', 'gateway', 'dns')


def static_errors(static, host, cluster_cidr, cluster_address='', interfaces=None):
    """Problems of one node's network_static, each line naming the host and the variable. All of them are
    read from the inventory (the contract checks them on the controller, before any node is contacted)
    but whether the interface exists on the node: checked only when its interfaces are given (the network
    role's, from the node's facts)."""
    where = 'host %s: network_static' % host
    if not isinstance(static, dict):
        return ['%s must be a dict with interface, address (a.b.c.d/prefix), gateway and dns, got %r'
                % (where, static)]
    errors = []
    unknown = sorted(set(static) - set(STATIC_KEYS))
    if unknown:
        errors.append('%s has unknown key(s) %s; known keys are %s' % (where, ', '.join(unknown), ', '.join(STATIC_KEYS)))

    iface = static.get('interface')
    if not iface or not isinstance(iface, str):
        errors.append('%s.interface is not set; name the interface that carries the cluster address (e.g. enp3s0)' % where)
    elif interfaces is not None and iface not in interfaces:
        errors.append('%s.interface %s does not exist on this node; it has %s'
                      % (where, iface, ', '.join(sorted(i for i in interfaces if i != 'lo')) or 'none'))

    text = static.get('address')
    interface = None
    ip_of = addresses.ip_or_none
    if not text or not isinstance(text, str):
        errors.append('%s.address is not set; write it as a.b.c.d/prefix, e.g. 192.168.1.100/24' % where)
    elif '/' not in text:
        errors.append('%s.address %s has no prefix length; write it as a.b.c.d/prefix, e.g. %s/24' % (where, text, text))
    else:
        addr, _sep, prefix = text.partition('/')
        ip = ip_of(addr)
        limit = 128 if ip is not None and ip.version == 6 else 32
        if ip is None:
            errors.append('%s.address %s: %s is not an IP address' % (where, text, addr))
        elif not prefix.isdigit() or not 1 <= int(prefix) <= limit:
            errors.append('%s.address %s: prefix length %s is out of range (1-%d)' % (where, text, prefix, limit))
        else:
            interface = ipaddress.ip_interface(text)
            net = addresses.network_or_none(cluster_cidr)
            if net is None or interface.ip.version != net.version or interface.ip not in net:
                errors.append('%s.address %s is outside cluster_cidr %s' % (where, text, cluster_cidr))
            elif cluster_address and ip_of(cluster_address) is not None and interface.ip != ip_of(cluster_address):
                errors.append('%s.address %s differs from the cluster address %s; set cluster_address to %s '
                              '(the address the other nodes will use)' % (where, text, cluster_address, interface.ip))

    gateway = static.get('gateway')
    if gateway not in (None, ''):
        gw = ip_of(gateway)
        if gw is None:
            errors.append('%s.gateway %r is not an IP address' % (where, gateway))
        elif interface is not None:
            subnet = interface.network
            if gw.version != subnet.version or gw not in subnet or gw in (subnet.network_address, subnet.broadcast_address):
                errors.append('%s.gateway %s is outside the node\'s subnet %s (from network_static.address %s)'
                              % (where, gateway, subnet, text))
            elif gw == interface.ip:
                errors.append('%s.gateway %s is the node\'s own address' % (where, gateway))

    dns = static.get('dns')
    if dns not in (None, ''):
        if not isinstance(dns, list):
            errors.append('%s.dns must be a list of IP addresses, got %r' % (where, dns))
        else:
            bad = [str(d) for d in dns if ip_of(d) is None]
            if bad:
                errors.append('%s.dns: %s is not an IP address' % (where, ', '.join(bad)))
    return errors


def _check_int(errors, host, hostvars, name, low, high):
    value = _get(hostvars, host, name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        else:
            errors.append('host %s: %s must be an integer from %d to %d, got %r (%s)'
                          % (host, name, low, high, str(value) if isinstance(value, str) else value, type_name(value)))
            return
    if not low <= value <= high:
        errors.append('host %s: %s must be from %d to %d, got %d' % (host, name, low, high, value))


def contract_errors(groups, hostvars):
    """All violations of the inventory contract, one line each; an empty list means the inventory is sound."""
    errors = []
    cluster = list(groups.get('cluster') or [])
    heads = list(groups.get('head') or [])
    workers = list(groups.get('workers') or [])
    spares = list(groups.get('spares') or [])

    if not cluster:
        return ["inventory: group 'cluster' is missing or empty; put every node under cluster: head or workers"]
    if len(heads) != 1:
        if heads:
            errors.append("inventory: group 'head' must hold exactly one host, it holds %d: %s"
                          % (len(heads), ', '.join(sorted(heads, key=natural_key))))
        else:
            errors.append("inventory: group 'head' is empty; exactly one host must be the head (rank 0, master address)")
    for host in groups.get('ungrouped') or []:
        errors.append("host %s: is in no group; put it under cluster: head or workers" % host)
    for host in heads + workers:
        if host not in cluster:
            errors.append("host %s: is in group '%s' but not in group 'cluster'"
                          % (host, 'head' if host in heads else 'workers'))
    for host in sorted(cluster, key=natural_key):
        if host in heads and host in workers:
            errors.append("host %s: is in both 'head' and 'workers'; a node is one or the other" % host)
        elif host in spares and (host in heads or host in workers):
            errors.append("host %s: is in 'spares' and in '%s'; a spare runs no job until it replaces a node"
                          % (host, 'head' if host in heads else 'workers'))
        elif host not in heads and host not in workers and host not in spares:
            errors.append("host %s: is in 'cluster' but in neither 'head' nor 'workers' (nor 'spares')" % host)
    for host in spares:
        if host not in cluster:
            errors.append("host %s: is in group 'spares' but not in group 'cluster' (site.yml sets up the cluster's "
                          "nodes, spares included)" % host)

    seen = {}
    cidrs = {}
    shared_dirs = {}
    same = {}
    for host in sorted(cluster, key=natural_key):
        if not is_hostname(host):
            errors.append('host %s: the inventory name %r is not a valid host name (RFC 1123: letters, digits and '
                          'inner hyphens, labels separated by dots); it becomes the node\'s name in /etc/hosts and '
                          'hostfiles' % (host, host))
        cidr = _get(hostvars, host, 'cluster_cidr')
        if cidr is None:
            errors.append('host %s: cluster_cidr is not set; set it for the cluster (e.g. 192.168.1.0/24)' % host)
        elif not addresses.is_cidr(cidr):
            errors.append('host %s: cluster_cidr must be a network in CIDR form like 192.168.1.0/24, got %r'
                          % (host, cidr))
            cidr = None
        else:
            cidr = str(ipaddress.ip_network(str(cidr), strict=False))
            cidrs.setdefault(cidr, []).append(host)
            errors.extend(cidr_errors(host, cidr, _truthy(_get(hostvars, host, 'cluster_cidr_allow_wide', False))))
        address = cluster_address(hostvars, host)
        source = address_source(hostvars[host])
        if not addresses.is_ip(address):
            errors.append('host %s: %s %r is not an IP address; set cluster_address to the address '
                          'the node has on the cluster network' % (host, source, address))
        else:
            if cidr is not None and not addresses.cidr_contains(cidr, address):
                errors.append('host %s: %s %s is outside cluster_cidr %s' % (host, source, address, cidr))
            if address in seen:
                errors.append('host %s: cluster_address %s is already used by host %s' % (host, address, seen[address]))
            else:
                seen[address] = host
        static = _get(hostvars, host, 'network_static')
        if static is not None and cidr is not None:
            # what the network step would refuse from the inventory alone (an address outside cluster_cidr), here
            # before any node is contacted; whether its interface exists is the step's (it reads the node)
            errors.extend(static_errors(static, host, cidr, address if addresses.is_ip(address) else ''))
        user = _get(hostvars, host, 'cluster_user')
        if user is not None and (not isinstance(user, str) or not USER_RE.match(user)):
            errors.append('host %s: cluster_user must be a POSIX user name (lowercase letters, digits, _ or -), got %r'
                          % (host, user))
        shared = _get(hostvars, host, 'cluster_shared_dir')
        if shared is not None:
            problem = shared_dir_problem(shared)
            if problem:
                errors.append('host %s: cluster_shared_dir %s' % (host, problem))
            else:
                shared_dirs.setdefault(shared, []).append(host)
        for name, example in CLUSTER_PATHS:
            value = _get(hostvars, host, name)
            problem = path_problem(value, example) if value is not None else None
            if problem:
                errors.append('host %s: %s %s' % (host, name, problem))
            else:
                same.setdefault(name, {}).setdefault(value or cluster_default(name), []).append(host)
        for name in CLUSTER_VERSIONS:
            value = _get(hostvars, host, name)
            if value is not None and not (isinstance(value, str) and VERSION_RE.match(value)):
                errors.append('host %s: %s must be a version like %s (a string: quote it in YAML), got %r (%s)'
                              % (host, name, cluster_defaults.DEFAULTS[CLUSTER_VERSIONS[name]], value, type_name(value)))
            else:
                same.setdefault(name, {}).setdefault(value or cluster_defaults.DEFAULTS[CLUSTER_VERSIONS[name]], []).append(host)
        for name, kind in CLUSTER_SETTINGS:
            value = _get(hostvars, host, name)
            if value is None:
                value = cluster_default(name, hostvars, host)
            else:
                problem = setting_problem(kind, value)
                if problem:
                    errors.append('host %s: %s %s' % (host, name, problem))
                    continue
            same.setdefault(name, {}).setdefault(_shown(value), []).append(host)
        uid_errors = len(errors)
        _check_int(errors, host, hostvars, 'cluster_user_uid', 1, 65533)
        if len(errors) == uid_errors:
            same.setdefault('cluster_user_uid', {}).setdefault(
                str(_get(hostvars, host, 'cluster_user_uid', cluster_defaults.USER_UID)), []).append(host)
        errors.extend(replaced_errors(host, hostvars))
        _check_int(errors, host, hostvars, 'gpu_slots', 0, cluster_defaults.MAX_SLOTS)
        _check_int(errors, host, hostvars, 'node_slots', 1, cluster_defaults.MAX_SLOTS)
        _check_int(errors, host, hostvars, 'cluster_master_port', 1, 65535)
    if len(cidrs) > 1:
        head = heads[0] if len(heads) == 1 else None
        ref = next((c for c, hs in cidrs.items() if head in hs), None) or max(cidrs, key=lambda c: len(cidrs[c]))
        for cidr, hosts in sorted(cidrs.items()):
            if cidr != ref:
                errors.append('host %s: cluster_cidr %s differs from %s (%s); the cluster has one network, set '
                              'cluster_cidr once for all nodes' % (', '.join(hosts), cidr, ref,
                                                                   'the head\'s' if head in cidrs[ref] else 'most nodes\''))
    if len(shared_dirs) > 1:
        errors.append('hosts %s: cluster_shared_dir differs between nodes (%s); every node must see the shared '
                      'storage at the same path (the launchers, hostfiles and checkpoints name it), set it once for all'
                      % (', '.join(sorted((h for hs in shared_dirs.values() for h in hs), key=natural_key)),
                         ', '.join(sorted(shared_dirs))))
    if not any(_get(hostvars, host, 'cluster_container_mounts') is not None for host in cluster):
        same.pop('cluster_container_mounts', None)  # follows cluster_shared_dir, checked the same on every node above
    for name in sorted(same):
        if len(same[name]) > 1:
            errors.append('hosts %s: %s differs between nodes (%s); it must be the same on every node, set it once for all'
                          % (', '.join(sorted((h for hs in same[name].values() for h in hs), key=natural_key)), name,
                             ', '.join(sorted(same[name]))))
    return errors


# Cluster-wide values several roles read (each role's own variable derives from it by default).
CLUSTER_PATHS = (('cluster_env_path', '/opt/gpucluster/env'), ('cluster_nccl_profile', '/etc/profile.d/gpucluster-nccl.sh'))
CLUSTER_VERSIONS = {'cluster_torch_version': 'torch_version', 'cluster_deepspeed_version': 'deepspeed_version',
                    'cluster_ninja_version': 'ninja_version'}
# The other cluster-wide settings: the same on every node, of this kind (text, a list of texts, a
# boolean, a port, or one of these choices); unset, each is cluster_defaults.DEFAULTS[name less cluster_].
CLUSTER_SETTINGS = (
    ('cluster_pip_index_url', 'text'),
    ('cluster_pip_extra_index_urls', 'texts'),
    ('cluster_pip_find_links', 'texts'),
    ('cluster_pip_offline', 'bool'),
    ('cluster_python_packages', 'texts'),
    ('cluster_deepspeed_ops', 'texts'),
    ('cluster_deepspeed_cpu_ops', 'texts'),
    ('cluster_launcher', tuple(LAUNCHERS)),
    ('cluster_deepspeed_launcher', DEEPSPEED_LAUNCHERS),
    ('cluster_ssh_all_to_all', 'bool'),
    ('cluster_container_runtime', ('none',) + RUNTIMES),
    ('cluster_container_image', 'text'),
    ('cluster_container_image_digest', 'text'),
    ('cluster_container_mounts', 'texts'),
    ('cluster_ray_enabled', 'bool'),
    ('cluster_ray_port', 'port'),
    ('cluster_ray_dashboard_port', 'port'),
    ('cluster_ray_client_server_port', 'port'),
    ('cluster_bandwidth_port', 'port'),
    ('cluster_nccl_tests_dir', 'text'),
)
BOOL_WORDS = {'true': True, 'yes': True, 'on': True, '1': True, 'false': False, 'no': False, 'off': False, '0': False}


def cluster_default(name, hostvars=None, host=None):
    """A cluster-wide variable's value when the inventory leaves it unset."""
    if name == 'cluster_container_mounts':
        return [_get(hostvars or {}, host, 'cluster_shared_dir', cluster_defaults.SHARED_DIR)]
    return cluster_defaults.DEFAULTS[name[len('cluster_'):]]


def setting_problem(kind, value):
    """Why a value is not of a cluster-wide setting's kind, or None."""
    if kind == 'text':
        ok = isinstance(value, str)
        want = 'a string'
    elif kind == 'texts':
        ok = isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value)
        want = 'a list of non-empty strings'
    elif kind == 'bool':
        ok = isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in BOOL_WORDS)
        want = 'true or false'
    elif kind == 'port':
        ok = not isinstance(value, bool) and str(value).strip().isdigit() and 1 <= int(str(value)) <= 65535
        want = 'a port from 1 to 65535'
    else:
        ok = value in kind
        want = 'one of %s' % ', '.join(kind)
    return None if ok else 'must be %s, got %r (%s)' % (want, value, type_name(value))


def _shown(value):
    """A setting's value in one comparable, printable form (true/false, 8265, a,b)."""
    if isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in BOOL_WORDS
                                   and not value.strip().isdigit()):
        return 'true' if _truthy(value) else 'false'
    if isinstance(value, (list, tuple)):
        return '[%s]' % ', '.join(str(v) for v in value)
    return str(value).strip()


# A role's variable that other roles read before the cluster-wide one took its place (plugin_utils/
# replaced_vars.py holds the table): set alone, the other roles would not follow it, so a value other
# than the cluster-wide one is refused, naming both.
REPLACED = replaced_vars.REPLACED


def replaced_errors(host, hostvars):
    """A role variable set to another value than the cluster-wide one that replaced it, one line each."""
    errors = []
    for role_var, cluster_var, readers in REPLACED:
        value = _get(hostvars, host, role_var)
        wanted = _get(hostvars, host, cluster_var)
        if wanted is None:
            wanted = cluster_default(cluster_var, hostvars, host)
        if value is not None and _shown(value) != _shown(wanted):
            errors.append('host %s: %s is %s but %s is %s; %s is what %s read, not %s: set %s: %s instead'
                          % (host, role_var, _shown(value), cluster_var, _shown(wanted), cluster_var, readers,
                             role_var, cluster_var, _shown(value)))
    return errors


def path_problem(value, example):
    """Why a value cannot be a cluster-wide path, or None: an absolute, normalised path other than /,
    without blanks (it goes into /etc/exports, fstab, profiles and command lines)."""
    if not isinstance(value, str):
        return 'must be an absolute path like %s, got %s %r' % (example, type_name(value), value)
    if not value.startswith('/') or value == '/' or posixpath.normpath(value) != value or re.search(r'[\s,:]', value):
        return ('must be an absolute path like %s, not / and without a trailing slash, blanks, commas '
                'or colons, got %r' % (example, value))
    return None


def shared_dir_problem(value):
    """Why a cluster_shared_dir value cannot be the shared storage's path, or None (path_problem)."""
    return path_problem(value, '/shared')


def cluster_manifest(groups, hostvars):
    """The cluster as the roles read it from the inventory: head, master address and port, nodes in rank order."""
    nodes = ordered_nodes(groups)
    head = nodes[0] if nodes else None
    first = hostvars[head] if head else {}
    return {
        'head': head,
        'master_addr': cluster_address(hostvars, head) if head else None,
        'master_port': int(_get(hostvars, head, 'cluster_master_port', cluster_defaults.MASTER_PORT)) if head else cluster_defaults.MASTER_PORT,
        'cluster_cidr': first.get('cluster_cidr') if head else None,
        'nodes': [
            {'name': h, 'address': cluster_address(hostvars, h), 'rank': i,
             'role': 'head' if i == 0 else 'worker'}
            for i, h in enumerate(nodes)
        ],
        # the spares group: no rank until a restart takes one, but names, addresses and host keys
        # every node knows (a job that takes a spare reaches it as it reaches the workers)
        'spares': [{'name': h, 'address': cluster_address(hostvars, h), 'role': 'spare'}
                   for h in cluster_nodes(groups)[len(nodes):]],
    }
