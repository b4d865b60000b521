# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""What nvidia-smi and the PCI bus say about a node's GPUs, parsed.

The parsers work on text already read (a command's output, a sysfs listing), so they are tested
on recorded real output without a GPU. read_gpu_facts() at the end runs the commands for the
gpu_facts module and the health probe.
"""

from __future__ import annotations

import glob
import os
import re

NVIDIA_VENDOR = '0x10de'

# Fields asked with --query-gpu, in this order. Parsing goes by the header nvidia-smi prints,
# so a driver that lacks some of them (they are dropped and retried) or answers [N/A] is fine.
QUERY_FIELDS = (
    'index', 'name', 'uuid', 'pci.bus_id', 'memory.total', 'memory.used', 'driver_version',
    'compute_cap', 'ecc.mode.current', 'ecc.errors.uncorrected.volatile.total',
    'retired_pages.pending', 'remapped_rows.pending', 'remapped_rows.failure',
    'clocks_event_reasons.active', 'temperature.gpu', 'power.draw', 'power.limit',
    'persistence_mode', 'mig.mode.current',
)

# Older drivers know some fields only by their former names (and newer ones print the new
# name in the header when the old one is asked).
ALIASES = {
    'clocks_event_reasons.active': 'clocks_throttle_reasons.active',
    'name': 'gpu_name',
    'uuid': 'gpu_uuid',
    'pci.bus_id': 'gpu_bus_id',
}
CANONICAL = dict((old, new) for new, old in ALIASES.items())

# nvml.h: nvmlClocksEventReason* bits, in bit order.
CLOCK_EVENT_REASONS = (
    (0x1, 'gpu_idle'),
    (0x2, 'applications_clocks_setting'),
    (0x4, 'sw_power_cap'),
    (0x8, 'hw_slowdown'),
    (0x10, 'sync_boost'),
    (0x20, 'sw_thermal_slowdown'),
    (0x40, 'hw_thermal_slowdown'),
    (0x80, 'hw_power_brake_slowdown'),
    (0x100, 'display_clock_setting'),
)

# The keys of one GPU in gpu_facts, and the query field each comes from.
GPU_KEYS = (
    ('index', 'index', 'int'),
    ('name', 'name', 'str'),
    ('uuid', 'uuid', 'str'),
    ('pci_bus_id', 'pci.bus_id', 'str'),
    ('memory_total_mib', 'memory.total', 'int'),
    ('memory_used_mib', 'memory.used', 'int'),
    ('driver_version', 'driver_version', 'str'),
    ('compute_cap', 'compute_cap', 'str'),
    ('ecc_mode', 'ecc.mode.current', 'str'),
    ('ecc_errors_uncorrected_volatile', 'ecc.errors.uncorrected.volatile.total', 'int'),
    ('retired_pages_pending', 'retired_pages.pending', 'bool'),
    ('remapped_rows_pending', 'remapped_rows.pending', 'bool'),
    ('remapped_rows_failure', 'remapped_rows.failure', 'bool'),
    ('clock_event_reasons', 'clocks_event_reasons.active', 'reasons'),
    ('temperature_c', 'temperature.gpu', 'int'),
    ('power_draw_w', 'power.draw', 'float'),
    ('power_limit_w', 'power.limit', 'float'),
    ('persistence_mode', 'persistence_mode', 'str'),
    ('mig_mode', 'mig.mode.current', 'str'),
)

# Link kinds of `nvidia-smi topo -m`, nearest first.
LINK_RANK = {'X': 0, 'PIX': 1, 'PXB': 2, 'PHB': 3, 'NODE': 4, 'SYS': 5}

_UNIT = re.compile(r'\s*\[[^\]]*\]\s*$')
_ANSI = re.compile(r'\x1b\[[0-9;]*m')
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_BANNER = re.compile(r'Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)')
_VERSION_LINE = re.compile(r'^\s*(DRIVER version|CUDA Version)\s*:\s*(\S+)', re.M)


class ParseError(ValueError):
    """The text is not what the parser expects."""


def _split_csv_line(line):
    # nvidia-smi separates with ", " and quotes nothing; a comma inside a value is rare
    # (never in the fields asked here), so a plain split is exact for them.
    return [cell.strip() for cell in line.split(',')]


def header_name(cell):
    """'memory.total [MiB]' -> 'memory.total'; old alias names -> the current ones."""
    name = _UNIT.sub('', cell.strip())
    return CANONICAL.get(name, name)


def is_missing(value):
    """[N/A], N/A, [Not Supported], [Unknown Error], deprecated markers and empty cells."""
    if value is None:
        return True
    text = value.strip()
    if text == '' or text in ('N/A', 'Unknown'):
        return True
    return text.startswith('[') and text.endswith(']')


def _strip_unit(value):
    return re.sub(r'\s*(MiB|W|%|MHz|C|us|ms)$', '', value.strip())


def convert(value, kind):
    """A cell as the type gpu_facts returns; None when the GPU does not report it."""
    if is_missing(value):
        return [] if kind == 'reasons' else None
    text = _strip_unit(value)
    try:
        if kind == 'int':
            return int(float(text))
        if kind == 'float':
            return float(text)
    except ValueError:
        return None
    if kind == 'bool':
        lowered = text.lower()
        if lowered in ('yes', 'true', 'enabled', 'active'):
            return True
        if lowered in ('no', 'false', 'disabled', 'not active'):
            return False
        return None
    if kind == 'reasons':
        return clock_event_reasons(text)
    return text


def clock_event_reasons(mask):
    """Names of the active clock event (throttle) reasons in a bitmask such as 0x...0005."""
    try:
        bits = int(mask, 16) if isinstance(mask, str) else int(mask)
    except (TypeError, ValueError):
        return []
    names = [name for bit, name in CLOCK_EVENT_REASONS if bits & bit]
    known = 0
    for bit, _name in CLOCK_EVENT_REASONS:
        known |= bit
    if bits & ~known:
        names.append('unknown_0x%x' % (bits & ~known))
    return names


def parse_query_csv(text):
    """Rows of `nvidia-smi --query-gpu=... --format=csv[,nounits]` as dicts keyed by field.

    The header names the columns (units and former alias names removed). A column printed
    twice (an alias asked beside its current name) keeps its first value.
    """
    lines = [ln for ln in (text or '').splitlines() if ln.strip()]
    if not lines:
        raise ParseError('nvidia-smi printed nothing')
    header = [header_name(c) for c in _split_csv_line(lines[0])]
    if 'index' not in header and 'uuid' not in header and 'name' not in header:
        raise ParseError('no CSV header in the nvidia-smi output: %s' % lines[0][:120])
    rows = []
    for line in lines[1:]:
        cells = _split_csv_line(line)
        if len(cells) != len(header):
            raise ParseError('a row has %d values for %d columns: %s' % (len(cells), len(header), line[:120]))
        row = {}
        for name, cell in zip(header, cells):
            row.setdefault(name, cell)
        rows.append(row)
    return rows


def gpus_from_rows(rows):
    """The gpu_facts list of GPUs from parsed query rows; a field not reported is None."""
    gpus = []
    for position, row in enumerate(rows):
        gpu = {}
        for key, field, kind in GPU_KEYS:
            gpu[key] = convert(row.get(field), kind)
        if gpu['index'] is None:
            gpu['index'] = position
        gpus.append(gpu)
    gpus.sort(key=lambda g: g['index'])
    return gpus


def invalid_fields(output):
    """Field names nvidia-smi refused ('Field "x" is not a valid field to query.')."""
    return _INVALID_FIELD.findall(output or '')


def parse_help_query_gpu(text):
    """Every field name `nvidia-smi --help-query-gpu` lists, aliases included."""
    names = set()
    for line in (text or '').splitlines():
        if line.startswith('"'):
            names.update(re.findall(r'"([^"]+)"', line))
    return names


def usable_fields(wanted, valid):
    """The wanted fields the driver knows, each under the name it knows (current or former)."""
    chosen = []
    for field in wanted:
        if field in valid:
            chosen.append(field)
        elif ALIASES.get(field) in valid:
            chosen.append(ALIASES[field])
    return chosen


def parse_versions(text):
    """(driver_version, cuda_version) from the nvidia-smi banner or `nvidia-smi --version`."""
    match = _BANNER.search(text or '')
    if match:
        cuda = match.group(2)
        return match.group(1), (None if cuda in ('N/A', '') else cuda)
    found = dict((k.lower(), v) for k, v in _VERSION_LINE.findall(text or ''))
    if found:
        cuda = found.get('cuda version')
        return found.get('driver version'), (None if cuda in (None, 'N/A') else cuda)
    return None, None


def failure_reason(output, rc):
    """One line saying why nvidia-smi could not read the GPUs (its own first message)."""
    for line in (output or '').splitlines():
        line = line.strip()
        if line:
            return 'nvidia-smi failed (rc %s): %s' % (rc, line)
    return 'nvidia-smi failed (rc %s) and printed nothing' % rc


def parse_pci_listing(text):
    """NVIDIA devices from lines '<sysfs path> <vendor> <device> <class>' (as pci.txt records).

    Returns dicts with address, device_id and kind: 'gpu' (display class 0x03xxxx),
    'nvswitch' (bridge class 0x0680xx) or 'other'.
    """
    devices = []
    for line in (text or '').splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[1].lower() != NVIDIA_VENDOR:
            continue
        devices.append(pci_device(parts[0].rstrip('/').split('/')[-1], parts[2], parts[3]))
    return devices


def pci_device(address, device_id, pci_class):
    pci_class = pci_class.lower()
    if pci_class.startswith('0x03'):
        kind = 'gpu'
    elif pci_class.startswith('0x0680'):
        kind = 'nvswitch'
    else:
        kind = 'other'
    return {'address': address, 'device_id': device_id.lower(), 'class': pci_class, 'kind': kind}


def open_modules_supported(device_id):
    """NVIDIA's open kernel modules need Turing or newer: PCI device ids from 0x1e00 on."""
    try:
        return int(device_id, 16) >= 0x1e00
    except (TypeError, ValueError):
        return False


def _split_topo_line(line):
    if '\t' in line:
        return [c.strip() for c in line.split('\t')]
    for multi in ('CPU Affinity', 'NUMA Affinity', 'GPU NUMA ID'):
        line = line.replace(multi, multi.replace(' ', '\x00'))
    return [c.replace('\x00', ' ') for c in line.split()]


def parse_topology(text):
    """The `nvidia-smi topo -m` matrix.

    Returns {'devices': [...], 'gpus': [...], 'nics': {column: device name}, 'matrix':
    {row: {column: link}}, 'cpu_affinity', 'numa_affinity', 'nvlink' (any GPU pair over
    NVLink), 'nic_affinity' ({gpu: [nearest NIC names]})} or {} for empty text.
    """
    lines = [_ANSI.sub('', ln).strip() for ln in (text or '').splitlines()]
    # The header (device names, then affinity columns) is the first line naming GPU0.
    header_at = None
    for i, line in enumerate(lines):
        if 'GPU0' in _split_topo_line(line):
            header_at = i
            break
    if header_at is None:
        if not any(lines):
            return {}
        raise ParseError('no GPU0 header line in the nvidia-smi topo -m output')
    header = [c for c in _split_topo_line(lines[header_at]) if c != '']
    devices = [c for c in header if c not in ('CPU Affinity', 'NUMA Affinity', 'GPU NUMA ID')]
    extra = header[len(devices):]
    matrix, cpu_aff, numa_aff = {}, {}, {}
    for line in lines[header_at + 1:]:
        if not line.strip():
            break
        cells = _split_topo_line(line)
        name, values = cells[0], cells[1:]
        if name not in devices:
            continue
        links = {}
        for column, value in zip(devices, values):
            links[column] = value.strip() or None
        matrix[name] = links
        rest = values[len(devices):]
        for key, value in zip(extra, rest):
            if key == 'CPU Affinity' and value.strip():
                cpu_aff[name] = value.strip()
            elif key == 'NUMA Affinity' and value.strip():
                numa_aff[name] = value.strip()
    nics = {}
    for line in lines:
        match = re.match(r'^\s*(NIC\d+):\s*(\S+)\s*$', line)
        if match:
            nics[match.group(1)] = match.group(2)
    gpus = [d for d in devices if re.match(r'^GPU\d+$', d)]
    nic_columns = [d for d in devices if d not in gpus]
    for column in nic_columns:
        nics.setdefault(column, column)
    nvlink = any((matrix.get(a, {}).get(b) or '').startswith('NV')
                 for a in gpus for b in gpus if a != b)
    nic_affinity = {}
    for gpu in gpus:
        ranked = [(LINK_RANK.get(matrix.get(gpu, {}).get(n) or 'SYS', 9), n) for n in nic_columns
                  if matrix.get(gpu, {}).get(n)]
        if ranked:
            best = min(r for r, _n in ranked)
            nic_affinity[gpu] = [nics[n] for r, n in ranked if r == best]
    return {'devices': devices, 'gpus': gpus, 'nics': nics, 'matrix': matrix, 'cpu_affinity': cpu_aff,
            'numa_affinity': numa_aff, 'nvlink': nvlink, 'nic_affinity': nic_affinity}


def summarize(gpus, driver_version=None, cuda_version=None):
    """Top-level driver version: the banner's, else the GPUs' (all equal on a sane node)."""
    if not driver_version:
        versions = sorted(set(g.get('driver_version') for g in gpus if g.get('driver_version')))
        driver_version = versions[0] if len(versions) == 1 else (', '.join(versions) or None)
    return driver_version, cuda_version


# Reading a node (used by the gpu_facts module and by the health probe, which reads the GPUs in
# the same round trip as its other checks).

def read_pci(root):
    """NVIDIA devices under a sysfs PCI directory, as pci_device() describes them."""
    devices = []
    for path in sorted(glob.glob(os.path.join(root, '*'))):
        try:
            with open(os.path.join(path, 'vendor')) as f:
                vendor = f.read().strip().lower()
            if vendor != NVIDIA_VENDOR:
                continue
            with open(os.path.join(path, 'device')) as f:
                device = f.read().strip()
            with open(os.path.join(path, 'class')) as f:
                pci_class = f.read().strip()
        except (IOError, OSError):
            continue
        devices.append(pci_device(os.path.basename(path), device, pci_class))
    return devices


class Reader(object):
    """Runs nvidia-smi through an AnsibleModule, each call bounded by timeout(1)."""

    def __init__(self, module, binary, timeout):
        self.module = module
        self.binary = binary
        self.timeout = timeout

    def run(self, *args):
        """(rc, stdout, stderr): the output is parsed from stdout only; a warning nvidia-smi
        prints on stderr (an infoROM warning, say) must not turn into a row or a header."""
        cmd = ['timeout', str(self.timeout), self.binary] + list(args)
        rc, out, err = self.module.run_command(cmd, environ_update={'LC_ALL': 'C'})
        return rc, out or '', err or ''

    def query(self, fields):
        """Rows for the fields; fields the driver refuses are dropped and the query retried."""
        dropped, refused, valid = [], set(), None
        wanted = list(fields)
        for _attempt in range(len(fields) + 1):
            rc, out, err = self.run('--query-gpu=' + ','.join(wanted), '--format=csv,nounits')
            if rc == 0:
                return parse_query_csv(out), dropped, None
            newly = set(invalid_fields(out + '\n' + err)) - refused
            if not newly:
                return None, dropped, failure_reason(err + '\n' + out, rc)
            refused |= newly
            if valid is None:
                hrc, help_text, _ = self.run('--help-query-gpu')
                valid = parse_help_query_gpu(help_text) if hrc == 0 else set()
            keep = []
            for field in wanted:
                names = [field, ALIASES.get(field), CANONICAL.get(field)]
                usable = [n for n in names if n and n not in refused and (not valid or n in valid)]
                if usable:
                    keep.append(usable[0])
                else:
                    dropped.append(CANONICAL.get(field, field))
            if not keep:
                return None, dropped, failure_reason(err + '\n' + out, rc)
            wanted = keep
        return None, dropped, 'nvidia-smi kept refusing the query fields'


def read_gpu_facts(module, nvidia_smi='nvidia-smi', timeout=60, topology=True,
                   sysfs_pci='/sys/bus/pci/devices'):
    """The gpu_facts of this node (see the gpu_facts module's RETURN); never fails."""
    pci = read_pci(sysfs_pci)
    pci_gpus = [d for d in pci if d['kind'] == 'gpu']
    facts = {
        'gpu_count': 0, 'reason': '', 'driver_version': None, 'cuda_version': None, 'gpus': [],
        'topology': {}, 'pci_gpu_count': len(pci_gpus),
        'pci_nvswitch_count': len([d for d in pci if d['kind'] == 'nvswitch']),
        'pci_devices': pci, 'query_fields_dropped': [],
    }

    def done(reason=''):
        facts['reason'] = reason
        return facts

    binary = nvidia_smi
    if os.sep not in binary:
        binary = module.get_bin_path(binary, opt_dirs=['/usr/bin', '/usr/local/bin']) or ''
    if not binary or not os.access(binary, os.X_OK):
        if pci_gpus:
            return done('nvidia-smi not found: no NVIDIA driver is installed (%d NVIDIA GPU(s) on the PCI bus)'
                        % len(pci_gpus))
        return done('no NVIDIA GPU on the PCI bus and no nvidia-smi')

    reader = Reader(module, binary, timeout)
    rc, banner, err = reader.run()
    if rc != 0:
        reason = failure_reason(err + '\n' + banner, rc)
        if not pci_gpus:
            reason += ' (no NVIDIA GPU on the PCI bus)'
        return done(reason)
    facts['driver_version'], facts['cuda_version'] = parse_versions(banner)

    try:
        rows, dropped, error = reader.query(QUERY_FIELDS)
    except ParseError as exc:
        return done('cannot parse the nvidia-smi query output: %s' % exc)
    facts['query_fields_dropped'] = dropped
    if rows is None:
        return done(error)
    facts['gpus'] = gpus_from_rows(rows)
    facts['gpu_count'] = len(facts['gpus'])
    facts['driver_version'], facts['cuda_version'] = summarize(
        facts['gpus'], facts['driver_version'], facts['cuda_version'])

    if topology and facts['gpu_count']:
        trc, topo, terr = reader.run('topo', '-m')
        if trc == 0:
            try:
                facts['topology'] = parse_topology(topo)
            except ParseError as exc:
                facts['topology'] = {'error': str(exc)}
        else:
            facts['topology'] = {'error': failure_reason(terr + '\n' + topo, trc)}
    if not facts['gpu_count']:
        return done('nvidia-smi answers but lists no GPU%s' % (': ' + err.strip().splitlines()[0] if err.strip() else ''))
    return done('')
