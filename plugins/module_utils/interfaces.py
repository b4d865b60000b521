# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A node's network interfaces and which one holds an address.

Every reader returns the same shape, one entry per interface::

    {'eth0': {'name': 'eth0', 'mtu': 1500, 'state': 'UP',
              'addresses': ['192.0.2.2', 'fd00::2'], 'cidrs': ['192.0.2.2/24', 'fd00::2/64']}}

Readers: ``from_ip_json`` (``ip -j addr show``), ``from_ip_oneline`` (``ip -o addr show``),
``from_facts`` (Ansible's interface facts) and ``read_interfaces`` (runs ``ip`` on the node).
Questions: ``interface_for_address`` (the one interface that holds an address),
``holders`` (all of them), ``ifname_selects`` (the interfaces an ``NCCL_SOCKET_IFNAME`` value
picks, by NCCL's rules) and ``socket_interface_problem`` (why a socket interface setting
cannot carry a node's cluster traffic).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re


def _entry(name, mtu=None, state=None):
    return {'name': name, 'mtu': mtu, 'state': state, 'addresses': [], 'cidrs': []}


def _add(entry, address, prefix=None):
    address = str(address).split('%')[0]
    if address and address not in entry['addresses']:
        entry['addresses'].append(address)
        entry['cidrs'].append('%s/%s' % (address, prefix) if prefix not in (None, '') else address)


def _same_address(a, b):
    """True when two addresses (with or without a prefix or a %scope) are the same."""
    a, b = str(a).split('/')[0].split('%')[0], str(b).split('/')[0].split('%')[0]
    if a == b:
        return True
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def from_ip_json(data):
    """Interfaces from ``ip -j addr show`` (the JSON text or the list it decodes to).

    Raises ValueError when the text is not that JSON.
    """
    if isinstance(data, (str, bytes)):
        data = json.loads(data)
    if not isinstance(data, list):
        raise ValueError('ip -j addr show gave %s, not a list of interfaces' % type(data).__name__)
    found = {}
    for item in data:
        if not isinstance(item, dict) or not item.get('ifname'):
            continue
        entry = found.setdefault(item['ifname'], _entry(item['ifname'], item.get('mtu'), item.get('operstate')))
        for info in item.get('addr_info') or []:
            if isinstance(info, dict) and info.get('local'):
                _add(entry, info['local'], info.get('prefixlen'))
    return found


_ONELINE_RE = re.compile(r'^\d+:\s+(?P<ifname>[^\s:@]+)(?:@\S+)?\s+inet6?\s+(?P<address>[0-9a-fA-F.:]+)/(?P<prefix>\d+)')


def from_ip_oneline(text):
    """Interfaces from ``ip -o addr show`` (no MTU nor state there: both None)."""
    found = {}
    for line in (text or '').splitlines():
        m = _ONELINE_RE.match(line.strip())
        if m:
            entry = found.setdefault(m.group('ifname'), _entry(m.group('ifname')))
            _add(entry, m.group('address'), m.group('prefix'))
    return found


def _fact_of(facts, name):
    key = name.replace('-', '_').replace('.', '_').replace(':', '_')
    return facts.get(key) or facts.get('ansible_' + key) or facts.get('ansible_' + name) or {}


def from_facts(facts):
    """Interfaces from Ansible facts (``ansible_facts``: ``interfaces`` plus one entry each;
    primary and secondary IPv4 and every IPv6 address)."""
    found = {}
    for name in (facts or {}).get('interfaces') or []:
        data = _fact_of(facts, name)
        if not isinstance(data, dict):
            data = {}
        active = data.get('active')
        entry = found.setdefault(name, _entry(name, data.get('mtu'),
                                              None if active is None else ('UP' if active else 'DOWN')))
        v4 = [data.get('ipv4') or {}] + list(data.get('ipv4_secondaries') or [])
        for item in v4 + list(data.get('ipv6') or []):
            if isinstance(item, dict) and item.get('address'):
                _add(entry, item['address'], item.get('prefix'))
    return found


def holders(address, interfaces):
    """Sorted names of the interfaces that hold address (it may carry a /prefix)."""
    if not address:
        return []
    return sorted(name for name, entry in (interfaces or {}).items()
                  if any(_same_address(address, a) for a in entry.get('addresses') or []))


def interface_for_address(address, interfaces):
    """Name of the interface that holds address, or None when none does.

    When several do (the same address on a bridge and a port, say), the first by name that is
    not the loopback."""
    names = holders(address, interfaces)
    plain = [n for n in names if n != 'lo']
    return (plain or names or [None])[0]


def ifname_selects(spec, names):
    """Sorted names of ``names`` that an ``NCCL_SOCKET_IFNAME`` value selects, by NCCL's rules:
    a comma list of name prefixes; ``=`` before the list means exact names; ``^`` means every
    interface but these. An empty value selects every name."""
    spec = (spec or '').strip()
    if not spec:
        return sorted(names)
    exclude = spec.startswith('^')
    if exclude:
        spec = spec[1:]
    exact = spec.startswith('=')
    if exact:
        spec = spec[1:]
    items = [s.strip() for s in spec.split(',') if s.strip()]

    def hit(name):
        return any((name == i) if exact else name.startswith(i) for i in items)
    return sorted(n for n in names if hit(n) != exclude)


def socket_interface_problem(spec, address, interfaces):
    """Why a socket interface setting (``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` value)
    cannot carry the traffic of a node whose cluster address is address, or None when it can
    (or when spec is empty: the libraries then pick by themselves)."""
    if not (spec or '').strip():
        return None
    names = list(interfaces or {})
    chosen = ifname_selects(spec, names)
    holding = holders(address, interfaces)
    where = ('%s holds %s' % (', '.join(holding), address)) if holding else ('no interface holds %s' % address)
    if not chosen:
        return 'interface mismatch: socket interface %s does not exist here (%s)' % (spec.strip(), where)
    if address and holding and not set(chosen) & set(holding):
        return ('interface mismatch: socket interface %s does not hold the cluster address (%s)'
                % (spec.strip(), where))
    return None


def _from_sys(root='/sys/class/net'):
    found = {}
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return found
    for name in names:
        values = {}
        for key in ('mtu', 'operstate'):
            try:
                with open(os.path.join(root, name, key)) as f:
                    values[key] = f.read().strip()
            except (IOError, OSError):
                values[key] = None
        mtu = int(values['mtu']) if (values['mtu'] or '').isdigit() else None
        state = values['operstate'].upper() if values['operstate'] else None
        found[name] = _entry(name, mtu, state)
    return found


def read_interfaces(module, sys_root='/sys/class/net'):
    """This node's interfaces: ``ip -j addr show``, else ``ip -o addr show``, else the names
    and MTUs of /sys/class/net without addresses. Never fails; {} when nothing could be read."""
    ip = module.get_bin_path('ip')
    if ip:
        rc, out, _ = module.run_command([ip, '-j', 'addr', 'show'])
        if rc == 0:
            try:
                return from_ip_json(out)
            except ValueError:
                pass
        rc, out, _ = module.run_command([ip, '-o', 'addr', 'show'])
        if rc == 0 and out.strip():
            return from_ip_oneline(out)
    return _from_sys(sys_root)
