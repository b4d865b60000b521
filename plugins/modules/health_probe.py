#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: health_probe
short_description: Read, in one pass, what the quick health tier needs from a node
description:
  - Reads the node's interfaces (name, MTU, addresses), the NCCL/gloo interface settings of a
    profile script, how the cluster's names resolve here, a TCP connection to the rendezvous
    port on the head, shared storage (mounted, writable, the head's marker file, and the clock
    offset against the storage server from the modification time the server gives a fresh file),
    free space and inodes, the kernel release, the versions of torch, DeepSpeed and NCCL in a
    Python environment (from the installed distributions, without importing them), NVIDIA
    Xid events in the kernel log and, with O(gpus), the GPUs as M(gpucluster.multinode.gpu_facts)
    reads them (so a node is contacted once for the whole quick tier).
  - On the head, O(listen_port) checks whether the rendezvous port is free, names the processes
    holding it, and otherwise holds it open for O(listen_seconds) in a detached child, so that the
    other nodes can test the path to it; O(shared_token_write) writes the marker file.
  - Everything is reported, nothing fails. A missing file or a refused connection is a finding,
    judged by the health playbook; the module fails only on invalid arguments.
version_added: 0.1.0
author: gpucluster.multinode contributors
options:
  cluster_address:
    description: The node's address on the cluster network.
    type: str
  nccl_env_file:
    description: Profile script with C(NCCL_SOCKET_IFNAME)/C(GLOO_SOCKET_IFNAME) (written by the nccl_env role).
    type: path
    default: /etc/profile.d/gpucluster-nccl.sh
  resolve:
    description: Names to resolve here, each with the cluster address it must resolve to.
    type: list
    elements: dict
    default: []
  connect_host:
    description: Address of the head to connect to (the master address); empty skips the test.
    type: str
    default: ""
  connect_port:
    description: Rendezvous port on the head.
    type: int
    default: 29500
  connect_timeout:
    description: Seconds a connection may take; no answer by then is reported as a timeout.
    type: float
    default: 3.0
  listen_port:
    description: On the head, the rendezvous port to check and hold open; 0 skips it.
    type: int
    default: 0
  listen_seconds:
    description: How long the detached listener keeps the port open at most.
    type: int
    default: 60
  listen_expect:
    description: The listener exits once it has accepted this many connections (0 means wait the whole time).
    type: int
    default: 0
  release_port:
    description: Tell the listener this module left on this port to exit (on the head, after the other nodes connected); 0 skips it.
    type: int
    default: 0
  shared_path:
    description: Shared storage mount point; empty skips the shared storage and clock checks.
    type: path
  shared_must_be_mount:
    description: Report O(shared_path) as a problem when it is not a mount point of its own.
    type: bool
    default: true
  shared_token:
    description: Content of the head's marker file for this run.
    type: str
    default: ""
  shared_token_write:
    description: Write the marker file (on the head) instead of reading it.
    type: bool
    default: false
  disk_paths:
    description: Paths whose file system's free space and inodes are measured (missing ones are skipped).
    type: list
    elements: path
    default: [/]
  python:
    description: Interpreter of the training environment whose package versions are read; empty skips it.
    type: str
    default: ""
  kernel_log:
    description: Read the kernel log (dmesg) for NVIDIA Xid events.
    type: bool
    default: true
  gpus:
    description:
      - Also read the GPUs (PCI bus and C(nvidia-smi), without the topology matrix) and return
        them as RV(gpu). No GPU or no driver is a finding, not a failure.
    type: bool
    default: false
  nvidia_smi:
    description: The nvidia-smi program, as in M(gpucluster.multinode.gpu_facts).
    type: str
    default: nvidia-smi
  gpu_timeout:
    description: Seconds each nvidia-smi call may take (a hung driver makes it hang).
    type: int
    default: 30
attributes:
  check_mode:
    support: full
    details: >-
      Runs in check mode too: it only reads, apart from the small marker and clock files under
      O(shared_path)/.gpucluster-health and the short-lived listener, which are part of the measurement.
  diff_mode:
    support: none
notes:
  - The clock offset is the node's time minus the modification time the storage server gave the
    node's fresh file; with NFS that is the server's (the head's) clock, the way C(make) detects skew.
'''

EXAMPLES = r'''
- name: Probe a worker
  gpucluster.multinode.health_probe:
    cluster_address: 192.168.1.101
    resolve:
      - {name: gpu-master, expected: 192.168.1.100}
    connect_host: 192.168.1.100
    connect_port: 29500
    shared_path: /shared
    shared_token: "{{ run_token }}"
    disk_paths: [/, /shared]
    python: /opt/gpucluster/env/bin/python
  register: probe
'''

RETURN = r'''
released:
  description: Whether the listener was told to exit.
  returned: when release_port is set
  type: bool
kernel:
  description: Kernel release.
  returned: unless release_port is set
  type: str
  sample: 6.1.0-18-amd64
interfaces:
  description: Interfaces with MTU and addresses.
  returned: always
  type: list
  elements: dict
  sample: [{name: eth0, mtu: 1500, addresses: [192.168.1.101]}]
nccl_env_file_found:
  description: Whether O(nccl_env_file) exists.
  returned: always
  type: bool
nccl_env:
  description: C(NCCL_SOCKET_IFNAME) and C(GLOO_SOCKET_IFNAME) as the profile script sets them.
  returned: always
  type: dict
  sample: {NCCL_SOCKET_IFNAME: eth0, GLOO_SOCKET_IFNAME: eth0}
resolve:
  description: Each name with the addresses it resolved to and the expected one.
  returned: always
  type: list
  elements: dict
  sample: [{name: gpu-master, expected: 192.168.1.100, addresses: [192.168.1.100], error: null}]
connect:
  description: Result of the connection to the head (C(connected), C(refused), C(timeout), C(error)).
  returned: when connect_host is set
  type: dict
  sample: {result: connected, seconds: 0.0004, timeout: 3.0, error: null}
listen:
  description: On the head, whether the port was in use (and by which processes) or is held for the test.
  returned: when listen_port is set
  type: dict
  sample: {port: 29500, in_use: false, holders: [], listener_pid: 4242}
shared:
  description: Shared storage findings.
  returned: when shared_path is set
  type: dict
  sample: {path: /shared, exists: true, mounted: true, fstype: nfs4, writable: true, token_read: abc}
clock:
  description: Clock offset (seconds) of this node against the storage server.
  returned: when shared_path is set
  type: dict
  sample: {offset_s: 0.002, reference: shared storage /shared}
disks:
  description: Free space and inodes per path, percent.
  returned: always
  type: list
  elements: dict
  sample: [{path: /, free_pct: 63.2, inodes_free_pct: 91.0, free_bytes: 12345678}]
versions:
  description:
    - The environment's versions with the keys of C(module_utils/env_versions.py) (C(python), C(torch),
      C(torch_cuda), C(torch_nccl), C(nccl_wheel), C(deepspeed), C(ray)), read from the installed
      distributions without importing them (so C(torch_nccl) is null), and C(kernel).
  returned: always
  type: dict
  sample: {python: 3.11.2, torch: 2.13.0+cpu, torch_cuda: null, torch_nccl: null, nccl_wheel: null,
           deepspeed: 0.19.8, ray: null, kernel: 6.1.0-18-amd64}
xid:
  description: NVIDIA Xid events found in the kernel log.
  returned: always
  type: list
  elements: dict
  sample: [{pci: "PCI:0000:3b:00", code: 79, text: "pid=0, GPU has fallen off the bus."}]
kernel_log_error:
  description: Why the kernel log could not be read, if it could not.
  returned: always
  type: str
gpu:
  description: The GPUs, with the keys M(gpucluster.multinode.gpu_facts) returns (C(topology) empty).
  returned: when gpus is true
  type: dict
  sample: {gpu_count: 0, reason: no NVIDIA GPU on the PCI bus and no nvidia-smi, pci_gpu_count: 0}
'''

import errno
import glob
import json
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions
from ansible_collections.gpucluster.multinode.plugins.module_utils import health
from ansible_collections.gpucluster.multinode.plugins.module_utils import nvidia_smi

MARKER_DIR = '.gpucluster-health'
STOP_MESSAGE = b'gpucluster-health-stop'

def interfaces(module):
    ip = module.get_bin_path('ip')
    if ip:
        rc, out, _ = module.run_command([ip, '-j', 'addr', 'show'])
        if rc == 0:
            try:
                return [{'name': i['ifname'], 'mtu': i.get('mtu'),
                         'addresses': [a['local'] for a in i.get('addr_info', []) if 'local' in a]}
                        for i in json.loads(out)]
            except (ValueError, KeyError):
                pass
    found = []
    for name in sorted(os.listdir('/sys/class/net')):
        try:
            with open('/sys/class/net/%s/mtu' % name) as f:
                mtu = int(f.read().strip())
        except (IOError, OSError, ValueError):
            mtu = None
        found.append({'name': name, 'mtu': mtu, 'addresses': []})
    return found


def _resolve_one(item):
    name, expected = str(item.get('name')), str(item.get('expected', item.get('address')))
    addrs, error = [], None
    try:
        for info in socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM):
            if info[4][0] not in addrs:
                addrs.append(info[4][0])
    except socket.gaierror as exc:
        error = str(exc)
    return {'name': name, 'expected': expected, 'addresses': addrs, 'error': error}


def resolve(items):
    """Every name at once: a name the resolver does not know costs its DNS timeout, and a node
    where DNS is broken would otherwise pay it once per cluster node."""
    items = list(items)
    if len(items) <= 1:
        return [_resolve_one(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
        return list(pool.map(_resolve_one, items))


def connect(host, port, timeout):
    start = time.time()
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.close()
        return {'result': 'connected', 'seconds': round(time.time() - start, 4), 'timeout': timeout, 'error': None}
    except socket.timeout:
        return {'result': 'timeout', 'seconds': round(time.time() - start, 4), 'timeout': timeout, 'error': 'timed out'}
    except (IOError, OSError) as exc:
        result = 'refused' if exc.errno == errno.ECONNREFUSED else 'error'
        return {'result': result, 'seconds': round(time.time() - start, 4), 'timeout': timeout, 'error': str(exc)}


def release(port):
    """Tell this module's listener on the port to exit."""
    try:
        sock = socket.create_connection(('127.0.0.1', port), timeout=2)
        sock.sendall(STOP_MESSAGE + b'\n')
        sock.close()
        return True
    except (IOError, OSError):
        return False


def port_holders(port):
    inodes = []
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        try:
            with open(table) as f:
                inodes.extend(health.parse_proc_net_tcp_listeners(f.read(), port))
        except (IOError, OSError):
            pass
    wanted = set('socket:[%s]' % i for i in inodes)
    holders = []
    for pid in (p for p in os.listdir('/proc') if p.isdigit()):
        try:
            fds = os.listdir('/proc/%s/fd' % pid)
        except (IOError, OSError):
            continue
        for fd in fds:
            try:
                if os.readlink('/proc/%s/fd/%s' % (pid, fd)) in wanted:
                    with open('/proc/%s/cmdline' % pid, 'rb') as f:
                        cmd = f.read().replace(b'\0', b' ').decode('utf-8', 'replace').strip()
                    holders.append({'pid': int(pid), 'cmdline': cmd[:200]})
                    break
            except (IOError, OSError):
                continue
    return holders


def listen(port, seconds, expect):
    """Bind the port; if it is free, keep it open in a detached child for the other nodes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(('0.0.0.0', port))
        sock.listen(128)
    except (IOError, OSError) as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return {'port': port, 'in_use': True, 'holders': port_holders(port), 'listener_pid': None}
        return {'port': port, 'in_use': None, 'holders': [], 'listener_pid': None, 'error': str(exc)}
    pid = os.fork()
    if pid:
        sock.close()
        os.waitpid(pid, 0)  # the first child exits at once; the grandchild holds the port
        return {'port': port, 'in_use': False, 'holders': [], 'listener_pid': 'detached'}
    # first child: detach and fork the listener, so nothing of it keeps the module's pipes open
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    deadline = time.time() + seconds
    accepted = 0
    try:
        while time.time() < deadline and (expect <= 0 or accepted < expect):
            sock.settimeout(max(0.1, deadline - time.time()))
            try:
                conn, _ = sock.accept()
                conn.settimeout(0.5)
                try:
                    stop = conn.recv(64).startswith(STOP_MESSAGE)
                except (IOError, OSError):
                    stop = False
                conn.close()
                if stop:
                    break
                accepted += 1
            except socket.timeout:
                break
            except (IOError, OSError):
                continue
    finally:
        sock.close()
        os._exit(0)


def mount_of(path):
    """(mounted, fstype) of path from /proc/self/mountinfo."""
    real = os.path.realpath(path)
    try:
        with open('/proc/self/mountinfo') as f:
            lines = f.read().splitlines()
    except (IOError, OSError):
        return os.path.ismount(real), None
    fstype = None
    mounted = False
    for line in lines:
        parts = line.split(' - ')
        if len(parts) != 2:
            continue
        left, right = parts[0].split(), parts[1].split()
        mp = left[4].replace('\\040', ' ')
        if mp == real:
            mounted, fstype = True, right[0]
            opts = left[5].split(',')
            if 'ro' in opts:
                fstype = '%s (ro)' % fstype
    return mounted, fstype


def shared(path, token, write_token, must_be_mount, node):
    info = {'path': path, 'exists': os.path.isdir(path), 'must_be_mount': must_be_mount,
            'mounted': False, 'fstype': None, 'writable': False, 'write_error': None, 'token_read': None}
    clock = {'offset_s': None, 'reference': 'shared storage %s' % path, 'error': None}
    if not info['exists']:
        clock['error'] = '%s does not exist' % path
        return info, clock
    info['mounted'], info['fstype'] = mount_of(path)
    mdir = os.path.join(path, MARKER_DIR)
    token_file = os.path.join(mdir, 'token')
    try:
        if not os.path.isdir(mdir):
            os.makedirs(mdir, 0o755)
        probe = os.path.join(mdir, 'clock-%s' % node)
        t0 = time.time()
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, ('%s %.6f\n' % (node, t0)).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        t1 = time.time()
        mtime = os.stat(probe).st_mtime
        clock['offset_s'] = round((t0 + t1) / 2.0 - mtime, 4)
        if write_token:
            tmp = token_file + '.tmp'
            with open(tmp, 'w') as f:
                f.write(token)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, token_file)
        info['writable'] = True
    except (IOError, OSError) as exc:
        info['write_error'] = exc.strerror or str(exc)
        clock['error'] = 'cannot write to %s: %s' % (path, info['write_error'])
    try:
        with open(token_file) as f:
            info['token_read'] = f.read().strip()
    except (IOError, OSError):
        info['token_read'] = None
    return info, clock


def disks(paths):
    out = []
    for p in paths:
        if not os.path.exists(p):
            continue
        st = os.statvfs(p)
        free_pct = 100.0 * st.f_bavail / st.f_blocks if st.f_blocks else None
        inodes_pct = 100.0 * st.f_favail / st.f_files if st.f_files else None
        out.append({'path': p, 'free_pct': None if free_pct is None else round(free_pct, 2),
                    'inodes_free_pct': None if inodes_pct is None else round(inodes_pct, 2),
                    'free_bytes': st.f_bavail * st.f_frsize})
    return out


def kernel_xids(module):
    dmesg = module.get_bin_path('dmesg')
    if not dmesg:
        return [], 'dmesg is not installed'
    rc, out, err = module.run_command([dmesg])
    if rc != 0:
        return [], (err or out).strip() or 'dmesg failed'
    return health.parse_xid_lines(out), ''


def main():
    module = AnsibleModule(
        argument_spec=dict(
            cluster_address=dict(type='str'),
            nccl_env_file=dict(type='path', default='/etc/profile.d/gpucluster-nccl.sh'),
            resolve=dict(type='list', elements='dict', default=[]),
            connect_host=dict(type='str', default=''),
            connect_port=dict(type='int', default=29500),
            connect_timeout=dict(type='float', default=3.0),
            listen_port=dict(type='int', default=0),
            listen_seconds=dict(type='int', default=60),
            listen_expect=dict(type='int', default=0),
            release_port=dict(type='int', default=0),
            shared_path=dict(type='path'),
            shared_must_be_mount=dict(type='bool', default=True),
            shared_token=dict(type='str', default='', no_log=False),
            shared_token_write=dict(type='bool', default=False),
            disk_paths=dict(type='list', elements='path', default=['/']),
            python=dict(type='str', default=''),
            kernel_log=dict(type='bool', default=True),
            gpus=dict(type='bool', default=False),
            nvidia_smi=dict(type='str', default='nvidia-smi'),
            gpu_timeout=dict(type='int', default=30),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p['release_port']:
        module.exit_json(changed=False, released=release(p['release_port']))
    for port_opt in ('connect_port', 'listen_port'):
        if not 0 <= p[port_opt] <= 65535:
            module.fail_json(msg='%s must be a port number 0-65535, got %s' % (port_opt, p[port_opt]))
    node = socket.gethostname()
    result = {'changed': False, 'kernel': os.uname()[2]}
    if p['listen_port']:
        result['listen'] = listen(p['listen_port'], p['listen_seconds'], p['listen_expect'])
    result['interfaces'] = interfaces(module)
    nccl_file = p['nccl_env_file']
    result['nccl_env_file'] = nccl_file
    result['nccl_env_file_found'] = os.path.isfile(nccl_file)
    env = {}
    if result['nccl_env_file_found']:
        with open(nccl_file) as f:
            env = health.parse_profile_env(f.read())
    result['nccl_env'] = dict((k, v) for k, v in env.items() if k in ('NCCL_SOCKET_IFNAME', 'GLOO_SOCKET_IFNAME'))
    result['resolve'] = resolve(p['resolve'])
    if p['connect_host']:
        result['connect'] = connect(p['connect_host'], p['connect_port'], p['connect_timeout'])
    if p['shared_path']:
        result['shared'], result['clock'] = shared(p['shared_path'], p['shared_token'], p['shared_token_write'],
                                                   p['shared_must_be_mount'], re.sub(r'[^A-Za-z0-9_.-]', '_', node))
    result['disks'] = disks(p['disk_paths'])
    versions, verr = env_versions.read(module, p['python'])
    versions['kernel'] = result['kernel']
    result['versions'] = versions
    result['versions_error'] = verr
    result['xid'], result['kernel_log_error'] = kernel_xids(module) if p['kernel_log'] else ([], 'not read')
    if p['gpus']:
        result['gpu'] = nvidia_smi.read_gpu_facts(module, p['nvidia_smi'], p['gpu_timeout'], topology=False)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
