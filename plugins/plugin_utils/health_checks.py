# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The health checks: per-node and cross-node records of the quick tier (from the probe results)
and of the deep tier (from the cluster_tests reports), with their thresholds."""

from __future__ import annotations

import os
from collections import Counter

from ansible_collections.gpucluster.multinode.plugins.module_utils import interfaces
from ansible_collections.gpucluster.multinode.plugins.module_utils.health_records import fmt, record, worst


DEFAULT_THRESHOLDS = {
    # free space and inodes on each path in disk_paths, percent
    'disk_free_warn_pct': 15,
    'disk_free_fail_pct': 5,
    'inodes_free_warn_pct': 15,
    'inodes_free_fail_pct': 5,
    # clock offset to the shared storage server (the head), seconds
    'clock_offset_warn_s': 1.0,
    'clock_offset_fail_s': 10.0,
    # GPU: uncorrected volatile ECC errors above this fail
    'ecc_uncorrected_max': 0,
    # Xid codes that fail the node (others warn)
    'xid_fail_codes': [48, 63, 64, 74, 79, 92, 94, 95, 119, 120],
    # clock event (throttle) reasons that warn; matched as substrings, case-insensitive
    'throttle_warn_reasons': ['hw_slowdown', 'hw_thermal_slowdown', 'hw_power_brake_slowdown',
                              'sw_thermal_slowdown', 'sw_power_cap'],
    # auto: a node without GPUs fails when its gpu_slots is above 0, when GPUs are on its PCI bus unread,
    # or when it sets no gpu_slots and another node has GPUs; its GPU checks are n/a when it declares
    # none (gpu_slots 0, or not set where no node has GPUs); required: fails; optional: n/a
    'expect_gpus': 'auto',
    'persistence_mode_required': True,
    # deep tier: a link below this fraction of the median bandwidth is slow
    'bandwidth_min_ratio': 0.7,
    # changes since the last run: a numeric value that fell by more than this percent
    'change_drop_pct': 20,
}


# Versions compared across nodes, and the status of a mismatch.
VERSION_COMPONENTS = dict([
    ('driver', 'fail'),
    ('cuda', 'fail'),
    ('torch_cuda', 'fail'),
    ('torch_nccl', 'fail'),
    ('nccl_wheel', 'fail'),
    ('torch', 'fail'),
    ('deepspeed', 'fail'),
    ('ray', 'fail'),
    ('python', 'fail'),
    ('kernel', 'warn'),
])


# Compared only when a node reports them (ray is optional; the probe reads torch's NCCL only
# when it imports torch, which the quick tier does not).
VERSION_OPTIONAL = ('ray', 'torch_nccl')


VERSION_GPU_ONLY = ('driver', 'cuda', 'torch_cuda', 'nccl_wheel')


VERSION_REMEDY = {
    'driver': 'install the same NVIDIA driver on every node (site.yml --tags nvidia_driver --limit {node})',
    'cuda': 'install the same NVIDIA driver (its CUDA version) on every node (--limit {node})',
    'torch_cuda': 'install the same torch build on every node: site.yml --tags python_env --limit {node}',
    'torch_nccl': 'install the same torch build on every node: site.yml --tags python_env --limit {node}',
    'nccl_wheel': 'install the same torch/NCCL packages on every node: site.yml --tags python_env --limit {node}',
    'ray': 'install the same ray on every node: site.yml --limit {node}',
    'python': 'build the environment with the same Python on every node: site.yml --tags python_env --limit {node}',
    'torch': 'reinstall the environment on {node}: site.yml --tags python_env --limit {node}',
    'deepspeed': 'reinstall the environment on {node}: site.yml --tags python_env --limit {node}',
    'kernel': 'boot {node} into the same kernel as the other nodes (drivers and RDMA modules follow it)',
}


# A GPU component no node reports, on a node that declares GPUs (or may have them).
VERSION_MISSING_REMEDY = {
    'driver': 'install the NVIDIA driver on {node}: site.yml --tags nvidia_driver --limit {node} (see gpu)',
    'cuda': 'install the NVIDIA driver on {node}: site.yml --tags nvidia_driver --limit {node} (see gpu)',
    'torch_cuda': 'install a CUDA build of torch on {node}: site.yml --tags python_env --limit {node}',
    'nccl_wheel': 'install a CUDA build of torch on {node}: site.yml --tags python_env --limit {node}',
}


def _pct_status(value, warn, fail):
    if value is None:
        return 'unknown'
    if value < fail:
        return 'fail'
    if value < warn:
        return 'warn'
    return 'ok'


def _majority(values, head_value):
    """The reference value: the most common one; a tie goes to the head's value."""
    counts = Counter(values)
    best = max(counts.values())
    tied = sorted(v for v, c in counts.items() if c == best)
    if head_value in tied:
        return head_value
    return tied[0]


def check_reachable(node):
    if node.get('unreachable'):
        value = 'timeout' if str(node['unreachable']).startswith('timeout') else 'unreachable'
        return record(node['name'], 'reachable', 'fail', value, 'answers over SSH',
                      node['unreachable'],
                      'start the node or its sshd (systemctl start ssh), check its network, then '
                      'ssh to %s' % (node.get('address') or node['name']))
    return record(node['name'], 'reachable', 'ok', 'reachable', 'answers over SSH')


def gpus_not_declared(node, any_gpus, t):
    """Why the GPU checks do not apply to a node (its records are n/a), or None when they do.

    They do not when the node declares no GPU and none is seen: gpu_slots 0, or no gpu_slots where no
    node has a GPU (or with expect_gpus optional). They always apply with expect_gpus required, to a
    node with gpu_slots above 0, and to a node whose GPUs are readable or on the PCI bus."""
    if t['expect_gpus'] == 'required':
        return None
    slots = node.get('gpu_slots')
    undeclared = slots is None or slots == ''
    if not undeclared and int(slots) != 0:
        return None
    gpu = node.get('gpu')
    if not gpu or gpu.get('disabled'):
        # not read (health_gpu_checks off): only what the inventory says
        return None if undeclared else 'no GPU declared on this node (gpu_slots 0)'
    on_bus = gpu.get('pci_gpu_count') if isinstance(gpu.get('pci_gpu_count'), int) else 0
    if int(gpu.get('gpu_count') or 0) > 0 or on_bus > 0:
        return None
    if not undeclared:
        return 'no GPU declared on this node (gpu_slots 0)'
    if t['expect_gpus'] == 'auto' and any_gpus:
        return None
    return 'no GPU declared on this node (gpu_slots not set)'


def check_gpu(node, any_gpus, t):
    """GPU count, ECC, remapped rows, retired pages, throttle reasons, persistence, Xid."""
    name = node['name']
    gpu = node.get('gpu')
    if gpu is not None and gpu.get('disabled'):
        return None
    if gpu is None:
        return record(name, 'gpu', 'unknown', None, None, 'gpu_facts did not run on this node',
                      'run the quick tier again; check that gpucluster.multinode.gpu_facts is installed')
    count = int(gpu.get('gpu_count') or 0)
    slots = node.get('gpu_slots')
    expect = t['expect_gpus']
    if count == 0:
        reason = gpu.get('reason') or 'no GPU found'
        not_declared = gpus_not_declared(node, any_gpus, t)
        if not_declared:
            return record(name, 'gpu', 'n/a', 0, None, '%s; %s' % (not_declared, reason))
        on_bus = gpu.get('pci_gpu_count') if isinstance(gpu.get('pci_gpu_count'), int) else 0
        # auto: GPUs on the PCI bus that the driver cannot read are a fault, even on a lone node.
        must = (expect == 'required' or (expect == 'auto' and (any_gpus or on_bus > 0))
                or (slots and int(slots) > 0))
        if must:
            return record(name, 'gpu', 'fail', 0, '>= %s' % (slots or on_bus or 1), 'no GPU: %s' % reason,
                          'check the driver on %s (nvidia-smi; dmesg | grep -i nvrm), reinstall it or '
                          'replace the GPU' % name)
        return record(name, 'gpu', 'unknown', 0, 'expect_gpus=%s' % expect, 'no GPU: %s' % reason,
                      'none needed on a node without GPUs; set health_expect_gpus=required on a GPU cluster')
    findings = []  # (status, text, remedy)
    pci = gpu.get('pci_gpu_count')
    if isinstance(pci, int) and pci > count:
        findings.append(('fail', '%d GPU(s) on the PCI bus, %d readable by the driver' % (pci, count),
                         'a GPU fell off the bus or the driver lost it: check dmesg for Xid 79, reset or reseat it'))
    if slots and count < int(slots):
        findings.append(('fail', '%d GPU(s), gpu_slots is %s' % (count, slots),
                         'a GPU fell off the bus or the driver lost it: check dmesg for Xid 79 and reseat or replace it'))
    for g in gpu.get('gpus') or []:
        idx = g.get('index')
        ecc = g.get('ecc_errors_uncorrected_volatile')
        if isinstance(ecc, int) and ecc > int(t['ecc_uncorrected_max']):
            findings.append(('fail', 'GPU %s: %d uncorrected ECC error(s)' % (idx, ecc),
                             'drain the node and reset the GPU (nvidia-smi -r) or replace it'))
        if g.get('remapped_rows_failure') in (True, 'Yes', 'yes', 1):
            findings.append(('fail', 'GPU %s: row remapping failed' % idx, 'replace the GPU (RMA)'))
        if g.get('remapped_rows_pending') in (True, 'Yes', 'yes', 1) or g.get('retired_pages_pending') in (True, 'Yes', 'yes', 1):
            findings.append(('warn', 'GPU %s: remap/retirement pending' % idx,
                             'reset the GPU or reboot the node when it is idle to apply the pending remap'))
        reasons = [str(r).lower() for r in (g.get('clock_event_reasons') or [])]
        bad = [r for r in reasons if any(w in r for w in t['throttle_warn_reasons'])]
        if bad:
            findings.append(('warn', 'GPU %s throttled: %s' % (idx, ', '.join(bad)),
                             'check cooling and power limits (nvidia-smi -q -d PERFORMANCE)'))
        pm = str(g.get('persistence_mode', '')).lower()
        if t['persistence_mode_required'] and pm in ('disabled', 'off', 'false', '0'):
            findings.append(('warn', 'GPU %s: persistence mode off' % idx,
                             'enable it: systemctl enable --now nvidia-persistenced (or nvidia-smi -pm 1)'))
    xids = node.get('xid')
    if xids:
        fail_codes = set(int(c) for c in t['xid_fail_codes'])
        codes = sorted(set(x['code'] for x in xids))
        st = 'fail' if any(c in fail_codes for c in codes) else 'warn'
        findings.append((st, 'Xid %s in the kernel log' % ','.join(str(c) for c in codes),
                         'look up the Xid in NVIDIA\'s Xid catalog; 79/48/94/95 mean drain and reset or replace the GPU'))
    if not findings:
        return record(name, 'gpu', 'ok', count, '>= %s' % (slots or 1), '%d GPU(s) healthy' % count)
    st = worst(f[0] for f in findings)
    top = [f for f in findings if f[0] == st]
    return record(name, 'gpu', st, count, '>= %s' % (slots or 1), '; '.join(f[1] for f in findings), top[0][2])


def check_versions(nodes, head, any_gpus=False, thresholds=None):
    """One record per node and component whose version at least one node reports. A GPU component
    (VERSION_GPU_ONLY) that a node without a declared GPU does not report is n/a there, and that node
    is left out of the comparison."""
    t = dict(DEFAULT_THRESHOLDS)
    t.update(thresholds or {})
    out = []
    live = [n for n in nodes if not n.get('unreachable') and n.get('probe')]
    not_declared = dict((n['name'], gpus_not_declared(n, any_gpus, t)) for n in live)
    for comp, mismatch in VERSION_COMPONENTS.items():
        values = {n['name']: (n.get('versions') or {}).get(comp) for n in live}
        present = [v for v in values.values() if v]
        if not present and comp in VERSION_OPTIONAL:
            continue
        compared = live
        if comp in VERSION_GPU_ONLY:
            na = [n for n in live if not values[n['name']] and not_declared[n['name']]]
            for n in na:
                out.append(record(n['name'], 'version.' + comp, 'n/a', None, None, not_declared[n['name']]))
            compared = [n for n in live if n not in na]
        if not present:
            for n in compared:
                out.append(record(n['name'], 'version.' + comp, 'unknown', None, 'equal on all nodes',
                                  'no node reports a %s version' % comp,
                                  VERSION_MISSING_REMEDY.get(comp, 'install the environment: site.yml --tags python_env')
                                  .format(node=n['name'])))
            continue
        as_text = dict((n['name'], values[n['name']] or 'absent') for n in compared)
        ref = _majority(list(as_text.values()), as_text.get(head))
        agree = sorted(k for k, v in as_text.items() if v == ref)
        for n in compared:
            v = as_text[n['name']]
            thr = '== %s (%d of %d nodes)' % (ref, len(agree), len(compared))
            if v == ref:
                out.append(record(n['name'], 'version.' + comp, 'ok', v, thr))
            else:
                out.append(record(n['name'], 'version.' + comp, mismatch, v, thr,
                                  '%s %s here, %s on %s' % (comp, v, ref, ', '.join(agree)),
                                  VERSION_REMEDY[comp].format(node=n['name'])))
    return out


def _cluster_iface(probe, address):
    """The probe's interface that holds address (module_utils/interfaces.py decides), or None."""
    ifaces = dict((i['name'], i) for i in probe.get('interfaces') or [])
    name = interfaces.interface_for_address(address, ifaces)
    return ifaces[name] if name else None


def check_nccl_interface(node):
    name, probe, addr = node['name'], node['probe'], node['address']
    ifaces = dict((i['name'], i) for i in probe.get('interfaces') or [])
    holder = _cluster_iface(probe, addr)
    nccl = probe.get('nccl_env') or {}
    spec = nccl.get('NCCL_SOCKET_IFNAME')
    gloo = nccl.get('GLOO_SOCKET_IFNAME')
    thr = 'selects the interface holding %s' % addr
    if holder is None:
        return record(name, 'nccl_interface', 'fail', None, thr,
                      'no interface holds the cluster address %s (%s)' % (addr, ', '.join(sorted(ifaces))),
                      'bring the cluster NIC up with %s (site.yml --tags network) or correct cluster_address' % addr)
    if not probe.get('nccl_env_file_found'):
        return record(name, 'nccl_interface', 'warn', None, thr,
                      '%s is missing: NCCL picks an interface by itself' % probe.get('nccl_env_file'),
                      'write it: site.yml --tags nccl_env --limit %s' % name)
    problems = []
    for var, spec_value in (('NCCL_SOCKET_IFNAME', spec), ('GLOO_SOCKET_IFNAME', gloo)):
        if not spec_value:
            continue
        if var == 'GLOO_SOCKET_IFNAME':
            chosen = [n for n in spec_value.split(',') if n in ifaces]
            missing = [n for n in spec_value.split(',') if n not in ifaces]
        else:
            chosen = interfaces.ifname_selects(spec_value, [n for n in ifaces if n != 'lo'] if not spec_value.lstrip('^=').startswith('lo') else list(ifaces))
            missing = [] if chosen else [spec_value]
        if missing:
            problems.append('%s=%s names no interface of %s (has %s)'
                            % (var, spec_value, name, ', '.join(sorted(ifaces))))
        elif holder['name'] not in chosen:
            problems.append('%s=%s selects %s, the cluster address %s is on %s'
                            % (var, spec_value, ','.join(chosen), addr, holder['name']))
    if problems:
        return record(name, 'nccl_interface', 'fail', spec or gloo, thr, '; '.join(problems),
                      'set it to %s: site.yml --tags nccl_env --limit %s (nccl_env_socket_ifname)' % (holder['name'], name))
    return record(name, 'nccl_interface', 'ok', spec or holder['name'], thr,
                  'NCCL/gloo use %s' % holder['name'])


def check_mtu(nodes):
    live = [n for n in nodes if n.get('probe')]
    mtus = {}
    for n in live:
        iface = _cluster_iface(n['probe'], n['address'])
        mtus[n['name']] = iface.get('mtu') if iface else None
    known = [m for m in mtus.values() if m]
    out = []
    if not known:
        return out
    ref = _majority(known, None)
    agree = sorted(k for k, v in mtus.items() if v == ref)
    for n in live:
        m = mtus[n['name']]
        thr = '== %s (%d of %d nodes)' % (ref, len(agree), len(live))
        if m is None:
            out.append(record(n['name'], 'mtu', 'unknown', None, thr, 'no interface holds the cluster address',
                              'see nccl_interface'))
        elif m == ref:
            out.append(record(n['name'], 'mtu', 'ok', m, thr))
        else:
            out.append(record(n['name'], 'mtu', 'fail', m, thr,
                              'MTU %s here, %s on %s: large packets are dropped and NCCL hangs' % (m, ref, ', '.join(agree)),
                              'set MTU %s on the cluster NIC of %s (and on the switch port)' % (ref, n['name'])))
    return out


def check_names(node):
    name, probe = node['name'], node['probe']
    res = probe.get('resolve') or []
    if not res:
        return record(name, 'name_resolution', 'unknown', None, None, 'no names to resolve', '')

    def bad(r):
        addrs = r.get('addresses') or []
        v4 = [a for a in addrs if ':' not in a]
        # connect() takes the first address; a loopback one keeps the other nodes out
        return (r.get('expected') not in addrs or any(a.startswith('127.') or a == '::1' for a in addrs)
                or (':' not in r.get('expected', '') and v4 and v4[0] != r.get('expected')))
    wrong = [r for r in res if bad(r)]
    thr = '%d name(s) resolve to their cluster address' % len(res)
    if not wrong:
        return record(name, 'name_resolution', 'ok', len(res), thr)
    parts = []
    for r in wrong:
        got = ', '.join(r.get('addresses') or []) or (r.get('error') or 'nothing')
        parts.append('%s -> %s (cluster address %s)' % (r['name'], got, r['expected']))
    return record(name, 'name_resolution', 'fail', len(res) - len(wrong), thr, '; '.join(parts),
                  'correct /etc/hosts (or DNS) on %s: site.yml --tags network --limit %s' % (name, name))


def check_port(node, head_node, port):
    name, probe = node['name'], node['probe']
    conn = probe.get('connect') or {}
    thr = 'TCP connect to %s:%s' % (head_node.get('address') if head_node else '?', port)
    if head_node is None or head_node.get('unreachable'):
        return record(name, 'rendezvous_port', 'unknown', None, thr, 'the head does not answer', 'see reachable on the head')
    if not conn:
        return record(name, 'rendezvous_port', 'unknown', None, thr, 'not measured', '')
    if conn.get('result') == 'connected':
        return record(name, 'rendezvous_port', 'ok', 'connected', thr, '%.1f ms' % (conn.get('seconds', 0) * 1000))
    if conn.get('result') == 'timeout':
        return record(name, 'rendezvous_port', 'fail', 'timeout', thr,
                      'no answer from %s:%s within %ss: a firewall on the head or on the way drops it'
                      % (head_node['address'], port, conn.get('timeout')),
                      'allow %s to port %s on the head (site.yml --tags firewall; iptables -S / ufw status there)'
                      % (node['address'], port))
    return record(name, 'rendezvous_port', 'fail', conn.get('result'), thr,
                  '%s:%s: %s' % (head_node['address'], port, conn.get('error') or conn.get('result')),
                  'allow %s to port %s on the head; check the health listener ran (port_free on the head)'
                  % (node['address'], port))


def check_port_free(node, port):
    holder = (node.get('listen') or {})
    if not holder:
        return None
    if holder.get('in_use'):
        who = '; '.join('pid %s (%s)' % (p.get('pid'), p.get('cmdline')) for p in holder.get('holders') or []) or 'unknown process'
        return record(node['name'], 'port_free', 'warn', 'in use', 'port %s free between jobs' % port,
                      'port %s is held by %s' % (port, who),
                      'stop the stale job (train.yml -e training_state=stopped -e training_job_id=...) or kill it, '
                      'or choose another cluster_master_port')
    return record(node['name'], 'port_free', 'ok', 'free', 'port %s free between jobs' % port)


def check_shared(node, token):
    name, sh = node['name'], (node['probe'].get('shared') or {})
    path = sh.get('path')
    thr = 'mounted, writable, same content as the head'
    if not sh:
        return None
    if sh.get('timeout'):
        return record(name, 'shared_storage', 'fail', 'timeout', thr, sh.get('write_error') or '%s does not answer' % path,
                      'the storage server of %s does not answer %s: check it and the network '
                      '(on %s: grep %s /proc/mounts; dmesg | grep -i nfs)' % (path, name, name, path))
    problems = []
    remedy = ''
    if not sh.get('exists'):
        problems.append('%s does not exist' % path)
        remedy = 'mount the shared storage on %s: site.yml --tags shared_storage --limit %s' % (name, name)
    else:
        if sh.get('must_be_mount') and not sh.get('mounted'):
            problems.append('%s is not a mount point' % path)
            remedy = 'mount it: mount %s (site.yml --tags shared_storage --limit %s)' % (path, name)
        if not sh.get('writable'):
            problems.append('%s is not writable: %s' % (path, sh.get('write_error') or 'unknown error'))
            remedy = remedy or ('remount %s read-write on %s (mount -o remount,rw %s) and check the export'
                                % (path, name, path))
        if token and sh.get('token_read') != token:
            problems.append('the head\'s marker file %s' % (
                'is missing' if sh.get('token_read') is None else 'has other content (%s)' % sh.get('token_read')))
            remedy = remedy or ('%s on %s is not the head\'s shared storage: mount it (site.yml --tags shared_storage)'
                                % (path, name))
    if problems:
        return record(name, 'shared_storage', 'fail', sh.get('fstype'), thr, '; '.join(problems), remedy)
    return record(name, 'shared_storage', 'ok', sh.get('fstype'), thr, '%s mounted rw' % path)


def check_disk(node, t):
    name, disks = node['name'], node['probe'].get('disks') or []
    out = []
    hung = [d for d in disks if d.get('timeout')]
    for check, key, warn, fail in (('disk_free', 'free_pct', t['disk_free_warn_pct'], t['disk_free_fail_pct']),
                                   ('inodes_free', 'inodes_free_pct', t['inodes_free_warn_pct'], t['inodes_free_fail_pct'])):
        if hung:
            out.append(record(name, check, 'fail', 'timeout', 'answers within the probe\'s storage_timeout',
                              '; '.join(d.get('error') or '%s does not answer' % d['path'] for d in hung),
                              'the file system of %s does not answer on %s: check its server and the network'
                              % (', '.join(d['path'] for d in hung), name)))
            continue
        measured = [(d['path'], d.get(key)) for d in disks if d.get(key) is not None]
        if not measured:
            out.append(record(name, check, 'unknown', None, None, 'no path measured', ''))
            continue
        path, low = min(measured, key=lambda pv: pv[1])
        st = _pct_status(low, float(warn), float(fail))
        thr = 'warn < %s%%, fail < %s%%' % (warn, fail)
        detail = ', '.join('%s %.1f%%' % pv for pv in measured)
        what = 'space' if check == 'disk_free' else 'inodes'
        out.append(record(name, check, st, round(low, 1), thr, detail,
                          'free %s on %s:%s (old checkpoints, logs, pip/torch caches)' % (what, name, path)))
    return out


def check_clock(node, t):
    name, clock = node['name'], node['probe'].get('clock') or {}
    thr = 'warn > %ss, fail > %ss' % (t['clock_offset_warn_s'], t['clock_offset_fail_s'])
    off = clock.get('offset_s')
    if off is None:
        return record(name, 'clock_offset', 'unknown', None, thr,
                      clock.get('error') or 'no shared file to compare with', 'fix shared storage first')
    a = abs(off)
    st = 'fail' if a > float(t['clock_offset_fail_s']) else 'warn' if a > float(t['clock_offset_warn_s']) else 'ok'
    return record(name, 'clock_offset', st, round(off, 3), thr,
                  'clock %+.3f s against the shared storage server (%s)' % (off, clock.get('reference') or 'head'),
                  'synchronise the clock of %s: systemctl enable --now chrony (or systemd-timesyncd); chronyc tracking' % name)


def evaluate_quick(nodes, head, port, token=None, thresholds=None):
    """Records of the quick tier.

    nodes: list of dicts, head first: name, address, unreachable (message or None), probe (the
    health_probe result), gpu (gpu_facts result or None), gpu_slots, versions (component -> version),
    listen (the head's port check), xid (list from parse_xid_lines).
    """
    t = dict(DEFAULT_THRESHOLDS)
    t.update(thresholds or {})
    head_node = next((n for n in nodes if n['name'] == head), None)
    any_gpus = any(int((n.get('gpu') or {}).get('gpu_count') or 0) > 0 for n in nodes)
    per_node = dict((n['name'], [check_reachable(n)]) for n in nodes)
    for n in nodes:
        if n.get('probe_error'):
            per_node[n['name']].append(record(n['name'], 'probe', 'fail', None, 'the probe runs', n['probe_error'],
                                              'read the error; the node needs python3 and a working /proc'))
        if n.get('unreachable') or not n.get('probe'):
            continue
        recs = per_node[n['name']]
        gpu_rec = check_gpu(n, any_gpus, t)
        if gpu_rec:
            recs.append(gpu_rec)
        recs.append(check_nccl_interface(n))
        recs.append(check_names(n))
        recs.append(check_port(n, head_node, port))
        if n['name'] == head:
            pf = check_port_free(n, port)
            if pf:
                recs.append(pf)
        sh = check_shared(n, token)
        if sh:
            recs.append(sh)
        recs.extend(check_disk(n, t))
        recs.append(check_clock(n, t))
    for rec in check_versions(nodes, head, any_gpus, t) + check_mtu(nodes):
        per_node[rec['node']].append(rec)
    return [r for recs in per_node.values() for r in recs]


def evaluate_deep(nodes, bandwidth=None, smoke=None, collective=None, errors=None, tests=None):
    """Records of the deep tier from the cluster_tests results.

    bandwidth: the bandwidth_report dict (node_summary, culprits, slow_links, median_gbps);
    smoke: the dist_check_report dict (ok, problems, missing); collective: a dict with 'ok' and
    optionally 'lines'/'below'; errors: {test: message} for a test that did not finish.
    """
    errors = errors or {}
    tests = list(tests if tests is not None else ('smoke', 'bandwidth', 'collective'))
    out = []
    for test in tests:
        check = {'bandwidth': 'bandwidth', 'smoke': 'dist_smoke', 'collective': 'collective'}[test]
        if test in errors:
            for n in nodes:
                out.append(record(n, check, 'fail', None, 'the test finishes',
                                  'the %s test did not finish: %s' % (test, errors[test]),
                                  'fix the cause named, then run the deep tier again'))
            continue
        if test == 'bandwidth':
            out.extend(_bandwidth_records(nodes, bandwidth))
        elif test == 'smoke':
            out.extend(_smoke_records(nodes, smoke))
        else:
            out.extend(_collective_records(nodes, collective))
    return out


def _round(value, digits=3):
    return round(value, digits) if isinstance(value, float) else value


def _bandwidth_records(nodes, rep):
    if not rep:
        return [record(n, 'bandwidth', 'unknown', None, None, 'no bandwidth result', 'run the deep tier again')
                for n in nodes]
    summary = rep.get('node_summary') or {}
    culprits = set(rep.get('culprits') or [])
    flagged = {}
    for f in rep.get('slow_links') or []:
        for end in (f.get('a'), f.get('b')):
            flagged.setdefault(end, []).append(f)
    median = rep.get('median_gbps')
    thr = 'no slow link (fleet median %s Gbit/s, threshold %s)' % (fmt(median), fmt(rep.get('threshold_gbps')))
    out = []
    for n in nodes:
        s = summary.get(n) or {}
        value = s.get('median')
        links = flagged.get(n) or []
        text = '; '.join('%s-%s %s' % (f.get('a'), f.get('b'), 'slow, %s Gbit/s' % fmt(f.get('gbps'))
                                       if f.get('reason') == 'slow' else f.get('reason')) for f in links)
        if n in culprits:
            out.append(record(n, 'bandwidth', 'fail', _round(value), thr, 'slow node: ' + text,
                              'check the NIC of %s: ethtool (speed, errors), tc qdisc show, the cable and switch port' % n))
        elif links and all(culprits & set((f.get('a'), f.get('b'))) for f in links):
            out.append(record(n, 'bandwidth', 'ok', _round(value), thr,
                              'its flagged link(s) end at the slow node %s: %s' % (', '.join(sorted(culprits)), text)))
        elif links:
            out.append(record(n, 'bandwidth', 'warn', _round(value), thr, 'on flagged link(s): ' + text,
                              'compare with the other end of the link; the node at fault is slow on all its links'))
        elif not s:
            out.append(record(n, 'bandwidth', 'unknown', None, thr, 'not measured', 'run the deep tier again'))
        else:
            out.append(record(n, 'bandwidth', 'ok', _round(value), thr, 'median of %s link(s)' % s.get('links')))
    return out


def _smoke_records(nodes, rep):
    if not rep:
        return [record(n, 'dist_smoke', 'unknown', None, None, 'no smoke test result', 'run the deep tier again')
                for n in nodes]
    problems = dict((p.get('node'), p) for p in rep.get('problems') or [])
    missing = set(rep.get('missing') or [])
    out = []
    for n in nodes:
        thr = 'joins one torch.distributed group, all-reduce sum right'
        if n in problems or n in missing:
            p = problems.get(n) or {}
            out.append(record(n, 'dist_smoke', 'fail', 'not joined' if n in missing else 'failed', thr,
                              '%s%s%s' % (p.get('cause') or 'did not join', ' at %s' % p['stage'] if p.get('stage') else '',
                                          ': %s' % p['error'] if p.get('error') else ''),
                              'fix the cause named on %s (interface, firewall, rendezvous port), then run again' % n))
        else:
            out.append(record(n, 'dist_smoke', 'ok', 'joined', thr))
    return out


def _collective_records(nodes, rep):
    if not rep:
        return [record(n, 'collective', 'unknown', None, None, 'no collective test result', 'run the deep tier again')
                for n in nodes]
    # rep is the cluster_tests collective_summary: rows per size, problems, below_threshold.
    rows = rep.get('rows') or []
    below = rep.get('below_threshold') or []
    ok = rep.get('ok', bool(rows) and not below)
    last = rows[-1] if rows else {}
    value = last.get('busbw_gbs')
    size = last.get('size')
    if ok:
        detail = 'busbw %s GB/s at %s bytes, average %s GB/s, %s rank(s), %s' % (
            fmt(value), size, fmt(rep.get('avg_busbw_gbs')), rep.get('world_size'),
            'values correct' if rep.get('correct') else 'values not checked')
    else:
        detail = '; '.join(rep.get('problems') or rep.get('lines') or ['the collective test failed'])[-300:]
    return [record(n, 'collective', 'ok' if ok else 'fail', value,
                   'busbw at the largest size (GB/s); thresholds per size: cluster_tests_collective_thresholds',
                   detail, 'read the collective test output; with one slow node see bandwidth') for n in nodes]


# ---------------------------------------------------------------- settings

def _number(settings, name):
    try:
        return float(settings[name])
    except (KeyError, TypeError, ValueError):
        return None


def setting_errors(settings):
    """Problems with the health role's settings (a dict of its variables), one line each naming the
    variable: percentages in 0-100, positive seconds and counts, warn thresholds before fail ones."""
    errors = []
    present = [k for k in settings if k.startswith('health_')]

    def need(name, ok, what):
        if name not in present:
            return
        value = _number(settings, name)
        if value is None or not ok(value):
            errors.append('%s must be %s (got %s)' % (name, what, settings.get(name)))

    for name in ('health_disk_free_warn_pct', 'health_disk_free_fail_pct', 'health_inodes_free_warn_pct',
                 'health_inodes_free_fail_pct', 'health_change_drop_pct', 'health_slurm_drain_max_pct'):
        need(name, lambda v: 0 <= v <= 100, 'a percentage from 0 to 100')
    for name in ('health_clock_offset_warn_s', 'health_clock_offset_fail_s', 'health_connect_timeout',
                 'health_port_listen_seconds', 'health_probe_timeout', 'health_storage_timeout',
                 'health_task_timeout'):
        need(name, lambda v: v > 0, 'a positive number of seconds')
    need('health_report_keep', lambda v: v >= 1 and v == int(v), 'a whole number of at least 1')
    need('health_ecc_uncorrected_max', lambda v: v >= 0 and v == int(v), 'a whole number of at least 0')
    need('health_bandwidth_min_ratio', lambda v: 0 < v <= 1, 'a ratio above 0 and at most 1')
    for warn, fail, order in (('health_disk_free_warn_pct', 'health_disk_free_fail_pct', 'above'),
                              ('health_inodes_free_warn_pct', 'health_inodes_free_fail_pct', 'above'),
                              ('health_clock_offset_warn_s', 'health_clock_offset_fail_s', 'below')):
        w, f = _number(settings, warn), _number(settings, fail)
        if w is None or f is None or any(e.startswith((warn + ' ', fail + ' ')) for e in errors):
            continue
        if (order == 'above' and w < f) or (order == 'below' and w > f):
            errors.append('%s (%s) must be %s or equal to %s (%s): a node warns before it fails'
                          % (warn, settings[warn], order, fail, settings[fail]))
    probe, task = _number(settings, 'health_probe_timeout'), _number(settings, 'health_storage_timeout')
    if probe and task and task >= probe:
        errors.append('health_storage_timeout (%s) must be below health_probe_timeout (%s): the probe reports a '
                      'hung mount only if it ends before its task is stopped' % (settings['health_storage_timeout'],
                                                                                 settings['health_probe_timeout']))
    return errors


def page_dir_error(path):
    """Why path cannot take the report's page on the controller (health_report_page_dir), '' when it can:
    it names a file, or a directory that cannot be created or written. A relative path is read from the
    current directory, as the fetch of the page reads it."""
    full = os.path.realpath(path)
    if os.path.exists(full):
        if not os.path.isdir(full):
            return 'is a file on the controller; name a directory (it is created when missing)'
        if not os.access(full, os.W_OK | os.X_OK):
            return 'is a directory the controller cannot write; name one it can (it is created when missing)'
        return ''
    parent = os.path.dirname(full)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return ('cannot be created on the controller: %s is a file; name a directory (it is created when missing)'
                % parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        return ('cannot be created on the controller: %s cannot be written; name a directory that can '
                '(it is created when missing)' % parent)
    return ''


def check_container_image(images, head, image):
    """The training image of every node against the head's (container.image), one record per node.

    images: {node: image id, '' when the image is missing there, None when it could not be read}.
    The head's id is the reference (it builds and saves the image); without it, the most common one."""
    read = dict((n, v) for n, v in images.items() if v is not None)
    present = [v for v in read.values() if v]
    if not present:
        return [record(n, 'container.image', 'fail' if v == '' else 'unknown', None, 'the same image on every node',
                       'image %s is on no node' % image,
                       'build and load it: ansible-playbook playbooks/site.yml --tags container')
                for n, v in images.items()]
    ref = read.get(head) or _majority(present, None)
    agree = sorted(n for n, v in read.items() if v == ref)
    out = []
    thr = '== %s (%d of %d nodes)' % (ref, len(agree), len(images))
    for node, value in images.items():
        remedy = ('load the image of %s on %s: ansible-playbook playbooks/site.yml --tags container --limit %s,%s'
                  % (agree[0], node, agree[0], node))
        if value is None:
            out.append(record(node, 'container.image', 'unknown', None, thr, 'the image could not be read here',
                              'check that podman runs for the training account on %s' % node))
        elif value == ref:
            out.append(record(node, 'container.image', 'ok', value, thr))
        elif value == '':
            out.append(record(node, 'container.image', 'fail', 'missing', thr,
                              'image %s is missing here; %s on %s' % (image, ref, ', '.join(agree)), remedy))
        else:
            out.append(record(node, 'container.image', 'fail', value, thr,
                              'image %s is %s here, %s on %s' % (image, value, ref, ', '.join(agree)), remedy))
    return out
