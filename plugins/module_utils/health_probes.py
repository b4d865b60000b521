# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Node-side readers of the health probe: interfaces, names, the rendezvous port (a connection to
the head, and on the head a short-lived listener), shared storage with the clock offset against
its server, free space, and the kernel log.

Storage can hang: a ``hard`` NFS mount whose server is gone blocks ``isdir``, ``open`` and
``statvfs`` forever. ``start_storage`` therefore runs each storage and disk path in a child
process of its own, and ``collect_storage`` waits for them until one deadline; a path whose child
has not answered by then is reported with ``timeout: true`` and the child is killed, while every
other path and check is still reported.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_parsers
from ansible_collections.gpucluster.multinode.plugins.module_utils import interfaces
from ansible_collections.gpucluster.multinode.plugins.module_utils import nvidia_smi
from ansible_collections.gpucluster.multinode.plugins.module_utils import port_hold
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes

MARKER_DIR = '.gpucluster-health'


# ---------------------------------------------------------------- interfaces, names, port

def node_interfaces(module):
    """[{'name', 'mtu', 'addresses'}] of this node, by name (module_utils/interfaces.py reads them)."""
    found = interfaces.read_interfaces(module)
    return [{'name': n, 'mtu': found[n].get('mtu'), 'addresses': list(found[n].get('addresses') or [])}
            for n in sorted(found)]


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
    """A TCP connection to host:port: connected, refused, timeout or error, with the seconds taken."""
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
    return port_hold.release(port)


def listen(port, seconds, expect, holders_of):
    """Bind the port; if it is free, keep it open in a detached child for the other nodes.
    holders_of(port) names the processes holding a port that is in use."""
    exc = port_hold.hold(port, seconds, '0.0.0.0', expect)
    if exc is None:
        return {'port': port, 'in_use': False, 'holders': [], 'listener_pid': 'detached'}
    if exc.errno == errno.EADDRINUSE:
        return {'port': port, 'in_use': True, 'holders': holders_of(port), 'listener_pid': None}
    return {'port': port, 'in_use': None, 'holders': [], 'listener_pid': None, 'error': str(exc)}


# ---------------------------------------------------------------- storage, in bounded children

def mount_of(path):
    """(mounted, fstype) of path from /proc/self/mountinfo ('nfs4 (ro)' for a read-only mount)."""
    real = os.path.realpath(path)
    try:
        with open('/proc/self/mountinfo') as f:
            text = f.read()
    except (IOError, OSError):
        return os.path.ismount(real), None
    return health_parsers.mount_point_type(text, real)


def shared(path, token, write_token, must_be_mount, node):
    """(info, clock) of the shared storage at path: exists, mounted, writable, the head's marker
    read back, and the clock offset against the storage server from a fresh file's mtime."""
    info = {'path': path, 'exists': os.path.isdir(path), 'must_be_mount': must_be_mount, 'timeout': False,
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
        clock['offset_s'] = round((t0 + t1) / 2.0 - os.stat(probe).st_mtime, 4)
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


def disk(path):
    """Free space and inodes (percent) of the file system holding path; None when path is missing."""
    if not os.path.exists(path):
        return None
    st = os.statvfs(path)
    free_pct = 100.0 * st.f_bavail / st.f_blocks if st.f_blocks else None
    inodes_pct = 100.0 * st.f_favail / st.f_files if st.f_files else None
    return {'path': path, 'free_pct': None if free_pct is None else round(free_pct, 2),
            'inodes_free_pct': None if inodes_pct is None else round(inodes_pct, 2),
            'free_bytes': st.f_bavail * st.f_frsize, 'timeout': False}


def start_child(func, *args):
    """Run func(*args) in a forked child whose only link to this process is a pipe carrying the
    JSON of its result; stdin, stdout and stderr are /dev/null, so a child stuck on a hung mount
    holds nothing of the module's (or SSH's) pipes. Returns (pid, read fd)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(wfd)
        return pid, rfd
    try:
        os.close(rfd)
        port_hold.quiet_stdio()
        try:
            payload = {'result': func(*args)}
        except Exception as exc:  # reported to the parent  # pylint: disable=broad-except
            payload = {'error': '%s: %s' % (type(exc).__name__, exc)}
        data = json.dumps(payload).encode()
        while data:
            data = data[os.write(wfd, data):]
    finally:
        os._exit(0)


def wait_children(children, deadline):
    """{key: (pid, fd)} -> {key: {'result': ...} | {'error': ...} | {'timeout': True}}, waiting
    until time.monotonic() reaches deadline at most. What a child wrote before the deadline is read
    even when the caller comes after it (the probe's other reads can outlast the bound on a loaded
    node): only a child with nothing to read by then is late. A child that has not answered is
    killed (SIGKILL reaches a task blocked on NFS) and never waited for."""
    bufs = dict((key, b'') for key in children)
    pending = dict((fd, key) for key, (_, fd) in children.items())
    while pending:
        left = max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select(list(pending), [], [], left)
        if not ready:
            break
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                bufs[pending[fd]] += chunk
            else:
                os.close(fd)
                del pending[fd]
    out = {}
    for key, (pid, fd) in children.items():
        if fd in pending:
            os.close(fd)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass
            out[key] = {'timeout': True}
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass
        try:
            out[key] = json.loads(bufs[key].decode('utf-8'))
        except ValueError:
            out[key] = {'error': 'the check ended without a result'}
    return out


def start_storage(shared_args, disk_paths):
    """Start the storage checks (shared path, each disk path) in children; shared_args is None or
    (path, token, write_token, must_be_mount, node)."""
    children = {}
    if shared_args:
        children['shared'] = start_child(shared, *shared_args)
    for i, path in enumerate(disk_paths):
        children['disk%d' % i] = start_child(disk, path)
    return children


def collect_storage(children, shared_args, disk_paths, deadline, timeout, node):
    """(shared, clock, disks) from the children started by start_storage, waiting until deadline
    (time.monotonic()) at most; a path that did not answer by then is reported as a timeout of
    timeout seconds naming node and path."""
    got = wait_children(children, deadline)
    shared_info = clock = None
    if shared_args:
        path = shared_args[0]
        res = got['shared']
        if 'result' in res:
            shared_info, clock = res['result']
        else:
            why = ('no answer from %s on %s within %s s (a hung mount?)' % (path, node, timeout)
                   if res.get('timeout') else res.get('error'))
            shared_info = {'path': path, 'exists': None, 'must_be_mount': shared_args[3], 'timeout': bool(res.get('timeout')),
                           'mounted': None, 'fstype': None, 'writable': False, 'write_error': why, 'token_read': None}
            clock = {'offset_s': None, 'reference': 'shared storage %s' % path, 'error': why}
    disks = []
    for i, path in enumerate(disk_paths):
        res = got['disk%d' % i]
        if res.get('result'):
            disks.append(res['result'])
        elif 'result' not in res:
            disks.append({'path': path, 'free_pct': None, 'inodes_free_pct': None, 'free_bytes': None,
                          'timeout': bool(res.get('timeout')),
                          'error': ('no answer from %s on %s within %s s (a hung mount?)' % (path, node, timeout)
                                    if res.get('timeout') else res.get('error'))})
    return shared_info, clock, disks


# ---------------------------------------------------------------- kernel log, profile

def kernel_xids(module):
    """(Xid events, error) from dmesg."""
    dmesg = module.get_bin_path('dmesg')
    if not dmesg:
        return [], 'dmesg is not installed'
    rc, out, err = module.run_command([dmesg])
    if rc != 0:
        return [], (err or out).strip() or 'dmesg failed'
    return health_parsers.parse_xid_lines(out), ''


def nccl_env(path):
    """(found, {NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME}) as the profile script at path sets them."""
    if not os.path.isfile(path):
        return False, {}
    with open(path) as f:
        env = health_parsers.parse_profile_env(f.read())
    return True, dict((k, v) for k, v in env.items() if k in ('NCCL_SOCKET_IFNAME', 'GLOO_SOCKET_IFNAME'))


# ---------------------------------------------------------------- the whole probe

def probe(module):
    """The health_probe module's result from its params (see its RETURN); fails only on bad input."""
    p = module.params
    if p['release_port']:
        return {'changed': False, 'released': release(p['release_port'])}
    for port_opt in ('connect_port', 'listen_port'):
        if not 0 <= p[port_opt] <= 65535:
            module.fail_json(msg='%s must be a port number 0-65535, got %s' % (port_opt, p[port_opt]))
    if p['storage_timeout'] <= 0 or p['connect_timeout'] <= 0:
        module.fail_json(msg='storage_timeout and connect_timeout must be positive, got %s and %s'
                         % (p['storage_timeout'], p['connect_timeout']))
    node = socket.gethostname()
    # storage first, in children (before any thread starts): they run while the rest is read
    deadline = time.monotonic() + p['storage_timeout']
    shared_args = None
    if p['shared_path']:
        shared_args = (p['shared_path'], p['shared_token'], p['shared_token_write'], p['shared_must_be_mount'],
                       re.sub(r'[^A-Za-z0-9_.-]', '_', node))
    children = start_storage(shared_args, p['disk_paths'])
    result = {'changed': False, 'kernel': os.uname()[2]}
    if p['listen_port']:
        result['listen'] = listen(p['listen_port'], p['listen_seconds'], p['listen_expect'],
                                  processes.port_listeners)
    result['interfaces'] = node_interfaces(module)
    result['nccl_env_file'] = p['nccl_env_file']
    result['nccl_env_file_found'], result['nccl_env'] = nccl_env(p['nccl_env_file'])
    result['resolve'] = resolve(p['resolve'])
    if p['connect_host']:
        result['connect'] = connect(p['connect_host'], p['connect_port'], p['connect_timeout'])
    versions, verr = env_versions.read(module, p['python'])
    versions['kernel'] = result['kernel']
    result['versions'], result['versions_error'] = versions, verr
    result['xid'], result['kernel_log_error'] = kernel_xids(module) if p['kernel_log'] else ([], 'not read')
    if p['gpus']:
        result['gpu'] = nvidia_smi.read_gpu_facts(module, p['nvidia_smi'], p['gpu_timeout'], topology=False)
    shared, clock, result['disks'] = collect_storage(children, shared_args, p['disk_paths'], deadline,
                                                     p['storage_timeout'], node)
    if shared_args:
        result['shared'], result['clock'] = shared, clock
    return result
