# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Hostfiles for the launchers: DeepSpeed, Open MPI, MPICH, plain lists, Slurm node lists and a
torchrun table.

Node code: the ``hostfile`` module (hosts given as parameters) and the launchers of
``training_job`` and ``collective`` render with it. The controller's filters (``cluster_job_nodes``,
``hostfile_hosts``) read the hosts and their slots from the inventory with
plugin_utils/inventory.py, which builds the same host dicts with normalize().

Slots per host (how many ranks a launcher starts there): a host's ``slots`` when given, else its
detected GPU count ``gpus``; a host with no GPU, or whose GPU count is unknown, gets
``default_slots`` (1 unless told), so a CPU-only lab still gets a usable hostfile.

One renderer, render(), writes every hostfile (deepspeed, Open MPI, MPICH, plain, Slurm, torchrun)
with each host's own slots; world_size() and rank_layout() say how many ranks run where.

Every problem raises HostfileError with one message that names the host and the
variable at fault.
"""

from __future__ import annotations

import re

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults

FORMATS = ('deepspeed', 'openmpi', 'mpich', 'plain', 'slurm', 'torchrun')
MAX_SLOTS = cluster_defaults.MAX_SLOTS
_NAME_RE = re.compile(r'^[A-Za-z0-9_.:-]+$')
_SUFFIX_RE = re.compile(r'^(.*?)(\d+)$')


def natural_key(name):
    """Sort key that puts worker-2 before worker-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r'(\d+)', str(name))]


class HostfileError(ValueError):
    """Bad input for a hostfile; the message names the host and the variable."""


def type_name(value):
    """The plain type name of a value a user wrote, for error messages (str for Ansible's own string class,
    and so on); the one such helper of the collection."""
    for kind in (bool, int, float, str, list, dict):
        if isinstance(value, kind):
            return kind.__name__
    return type(value).__name__


def whole_number(value, host, label, low):
    """An integer >= low from an int or a numeric string (INI inventories give strings)."""
    where = 'host %s: %s' % (host, label) if host else label
    if isinstance(value, bool):
        raise HostfileError('%s must be a whole number of %d or more, got %r (bool)' % (where, low, value))
    if isinstance(value, str) and re.match(r'^\s*-?\d+\s*$', value):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise HostfileError('%s must be a whole number of %d or more, got %r (%s)'
                            % (where, low, value, type_name(value)))
    if value < low or value > MAX_SLOTS:
        hint = '; leave the host out with exclude instead' if label.endswith('slots') and value == 0 else ''
        raise HostfileError('%s must be from %d to %d, got %d%s' % (where, low, MAX_SLOTS, value, hint))
    return value


def check_default_slots(value):
    """default_slots as an int >= 1 (shared by the module and the filter)."""
    return whole_number(value, None, 'default_slots', 1)


def resolve_slots(host, slots, gpus, default_slots, slots_label='slots', gpus_label='gpus'):
    """Slots for one host: explicit slots, else detected GPUs, else default_slots."""
    if slots is not None:
        return whole_number(slots, host, slots_label, 1)
    if gpus is not None:
        gpus = whole_number(gpus, host, gpus_label, 0)
        if gpus > 0:
            return gpus
    return default_slots


def _check_name(name, where):
    if not isinstance(name, str) or not name.strip():
        raise HostfileError('%s: name must be a non-empty string, got %r' % (where, name))
    if not _NAME_RE.match(name):
        raise HostfileError('host %s: name may hold only letters, digits and . _ : - '
                            '(a launcher splits hostfile lines on spaces)' % name)
    return name


def order_hosts(names, head=None):
    """Head first, then the others in natural order (worker-2 before worker-10)."""
    rest = sorted((n for n in names if n != head), key=natural_key)
    return ([head] if head in names else []) + rest


def select(hosts, include=None, exclude=None):
    """Keep the hosts named in include (all when None), drop those in exclude.

    A name in include or exclude that is not a known host is an error: a typo must not
    silently leave a node in or out of the job.
    """
    names = [h['name'] for h in hosts]
    for label, wanted in (('include', include), ('exclude', exclude)):
        if wanted is None:
            continue
        if isinstance(wanted, str) or not isinstance(wanted, (list, tuple, set)):
            raise HostfileError('%s must be a list of host names, got %r (%s)' % (label, wanted, type_name(wanted)))
        unknown = [str(w) for w in wanted if w not in names]
        if unknown:
            raise HostfileError('%s names %s, which %s not in the host list (%s)'
                                % (label, ', '.join(unknown), 'is' if len(unknown) == 1 else 'are',
                                   ', '.join(names)))
    kept = [h for h in hosts
            if (include is None or h['name'] in include) and (exclude is None or h['name'] not in exclude)]
    if not kept:
        raise HostfileError('no hosts left after include/exclude (hosts: %s)' % ', '.join(names))
    return kept


def normalize(entries, head=None, default_slots=1, slots_label='slots', gpus_label='gpus'):
    """Ordered host dicts {name, address, slots} from entries {name, address, slots, gpus}.

    entries: list of dicts (a bare string is a host name). head: the name to put first;
    when None the first entry is the head.
    """
    default_slots = check_default_slots(default_slots)
    if not entries:
        raise HostfileError('no hosts given')
    seen = {}
    for index, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {'name': entry}
        if not isinstance(entry, dict):
            raise HostfileError('hosts[%d]: must be a host name or a dict with name, address, slots, got %r (%s)'
                                % (index, entry, type_name(entry)))
        name = _check_name(entry.get('name'), 'hosts[%d]' % index)
        if name in seen:
            raise HostfileError('host %s: listed twice' % name)
        address = entry.get('address')
        if address is None or address == '':
            address = name
        elif not isinstance(address, str):
            raise HostfileError('host %s: address must be a string, got %r (%s)'
                                % (name, address, type_name(address)))
        seen[name] = {
            'name': name,
            'address': address,
            'slots': resolve_slots(name, entry.get('slots'), entry.get('gpus'), default_slots,
                                   slots_label, gpus_label),
        }
    names = list(seen)
    if head is None:
        head = names[0]
    elif head not in seen:
        raise HostfileError('head %s is not in the host list (%s)' % (head, ', '.join(names)))
    return [seen[n] for n in order_hosts(names, head)]


def world_size(hosts):
    """Ranks of a job over host dicts {name, slots}: the sum of their slots."""
    return sum(int(h['slots']) for h in hosts)


def rank_layout(hosts):
    """{name: [first_rank, last_rank]} in hostfile order (ranks fill a node's slots, then the next)."""
    out, first = {}, 0
    for h in hosts:
        out[h['name']] = [first, first + int(h['slots']) - 1]
        first += int(h['slots'])
    return out


def node_of_rank(hosts, rank):
    """The name of the host that runs a global rank (None when the rank is out of range)."""
    for name, (first, last) in rank_layout(hosts).items():
        if first <= rank <= last:
            return name
    return None


def describe_layout(hosts):
    """'5 ranks: alpha 2 (0-1), bravo-2 1 (2), ...' for reports."""
    parts = []
    for name, (first, last) in rank_layout(hosts).items():
        span = '%d' % first if first == last else '%d-%d' % (first, last)
        parts.append('%s %d (%s)' % (name, last - first + 1, span))
    return '%d rank(s): %s' % (world_size(hosts), ', '.join(parts))


# --- Slurm host lists ---------------------------------------------------------------

def _split(name):
    m = _SUFFIX_RE.match(name)
    if not m:
        return name, None
    return m.group(1), m.group(2)


def _padded(digits):
    return len(digits) > 1 and digits.startswith('0')


def _compatible(width, padded, digits):
    """Can digits join a bracket whose numbers are `width` wide (zero padded or not)?"""
    if padded or _padded(digits):
        return len(digits) == width
    return True


def _ranges(numbers, width, padded):
    parts = []
    start = prev = numbers[0]
    for n in numbers[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        fmt = '%0*d' % (width, start) if padded else str(start)
        if prev != start:
            fmt += '-' + ('%0*d' % (width, prev) if padded else str(prev))
        parts.append(fmt)
        if n is not None:
            start = prev = n
    return parts


def compress_hostlist(names):
    """Compress host names into a Slurm host list: gpu-node[01-04],gpu-master.

    Consecutive names that share a prefix and a number width (zero padding is kept)
    go in one bracket; the order of the names is kept, as ``scontrol show hostlist``
    keeps it. Names without a numeric suffix stand alone.
    """
    out = []
    group = None  # [prefix, width, padded, [numbers]]

    def flush():
        if group is None:
            return
        prefix, width, padded, numbers = group
        if len(numbers) == 1:
            out.append(prefix + ('%0*d' % (width, numbers[0]) if padded else str(numbers[0])))
        else:
            out.append('%s[%s]' % (prefix, ','.join(_ranges(numbers, width, padded))))

    for name in names:
        prefix, digits = _split(name)
        if digits is None:
            flush()
            group = None
            out.append(name)
            continue
        number = int(digits)
        if (group is not None and group[0] == prefix and _compatible(group[1], group[2], digits)
                and number not in group[3]):
            group[3].append(number)
            group[1] = max(group[1], len(digits))
            group[2] = group[2] or _padded(digits)
            continue
        flush()
        group = [prefix, len(digits), _padded(digits), [number]]
    flush()
    return ','.join(out)


def expand_hostlist(text):
    """The names in a Slurm host list (inverse of compress_hostlist for its output)."""
    names = []
    for m in re.finditer(r'([^,\[]+)(?:\[([^\]]+)\])?([^,\[]*)', text or ''):
        prefix, ranges, tail = m.group(1), m.group(2), m.group(3)
        if not prefix and not ranges:
            continue
        if ranges is None:
            names.append(prefix + tail)
            continue
        for part in ranges.split(','):
            lo, _, hi = part.partition('-')
            hi = hi or lo
            width = len(lo) if _padded(lo) else 0
            for n in range(int(lo), int(hi) + 1):
                names.append('%s%0*d%s' % (prefix, width, n, tail))
    return names


# --- rendering --------------------------------------------------------------------------

TORCHRUN_HEADER = ('# node address torchrun-options (torchrun $(awk -v n="$(hostname -s)" '
                   '\'$1 == n {$1 = $2 = ""; print}\' %s) train.py)')


def render_torchrun(hosts, master_addr=None, master_port=29500, path=None):
    """One line per node: name, address, then the torchrun options it runs with (--nnodes,
    --node-rank, --nproc-per-node, --master-addr, --master-port); the head (first) is rank 0 and,
    unless master_addr is given, the master address."""
    if isinstance(master_port, bool) or not isinstance(master_port, int) or not 1 <= master_port <= 65535:
        raise HostfileError('master_port must be a port from 1 to 65535, got %r' % (master_port,))
    master = master_addr or hosts[0]['address']
    lines = [TORCHRUN_HEADER % (path or 'FILE')]
    for rank, h in enumerate(hosts):
        lines.append('%s %s --nnodes=%d --node-rank=%d --nproc-per-node=%d --master-addr=%s --master-port=%d'
                     % (h['name'], h['address'], len(hosts), rank, h['slots'], master, master_port))
    return '\n'.join(lines) + '\n'


def render(hosts, fmt='deepspeed', use_address=False, master_addr=None, master_port=29500, path=None):
    """The hostfile text (with a final newline) for ordered host dicts {name, address, slots}."""
    if fmt not in FORMATS:
        raise HostfileError('format must be one of %s, got %r' % (', '.join(FORMATS), fmt))
    if fmt == 'torchrun':
        return render_torchrun(hosts, master_addr, master_port, path)
    key = 'address' if use_address else 'name'
    labels = [str(h[key]) for h in hosts]
    if fmt == 'slurm':
        return compress_hostlist(labels) + '\n'
    if fmt in ('deepspeed', 'openmpi'):
        lines = ['%s slots=%d' % (label, h['slots']) for label, h in zip(labels, hosts)]
    elif fmt == 'mpich':
        lines = ['%s:%d' % (label, h['slots']) for label, h in zip(labels, hosts)]
    else:
        lines = labels
    return '\n'.join(lines) + '\n'


def build(entries, fmt='deepspeed', head=None, default_slots=1, include=None, exclude=None,
          use_address=False, slots_label='slots', gpus_label='gpus', master_addr=None, master_port=29500, path=None):
    """normalize + select + render: returns {content, hosts, total_slots}."""
    hosts = normalize(entries, head=head, default_slots=default_slots,
                      slots_label=slots_label, gpus_label=gpus_label)
    hosts = select(hosts, include, exclude)
    return {
        'content': render(hosts, fmt, use_address, master_addr, master_port, path),
        'hosts': hosts,
        'total_slots': sum(h['slots'] for h in hosts),
    }
