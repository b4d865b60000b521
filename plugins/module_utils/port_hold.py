# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Hold a port open for the other nodes' connection test, and release it: one protocol for the
health probe (the rendezvous port) and the Ray preflight (Ray's ports on the head).

hold() binds the port and, when that works, leaves a detached listener (a grandchild in its own
session, with none of the caller's pipes) that accepts and closes connections until its time is
up, it accepted ``expect`` of them, or a connection sends RELEASE_TOKEN; release() sends it.
Nothing is ever signalled: the listener ends itself."""

from __future__ import annotations

import os
import socket
import time

RELEASE_TOKEN = b'gpucluster-release-port\n'


def quiet_stdio():
    """Point stdin, stdout and stderr at /dev/null (a detached child keeps no pipe of its parent)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):   # nothing of the listener keeps the module's output open
        os.dup2(devnull, fd)


def _serve(sock, seconds, expect):
    """Accept until the deadline, ``expect`` connections (0: any number) or the release token."""
    deadline = time.time() + seconds
    accepted = 0
    while time.time() < deadline and (expect <= 0 or accepted < expect):
        sock.settimeout(max(0.1, deadline - time.time()))
        try:
            conn, _addr = sock.accept()
        except socket.timeout:
            break
        except (IOError, OSError):
            continue
        conn.settimeout(0.5)
        try:
            said = conn.recv(len(RELEASE_TOKEN))
        except (IOError, OSError):
            said = b''
        conn.close()
        if said == RELEASE_TOKEN:
            break
        accepted += 1


def hold(port, seconds, address='0.0.0.0', expect=0):
    """Bind address:port; when that works, a detached listener keeps it open (see above) and None
    is returned at once; otherwise the OSError of the bind (EADDRINUSE: someone holds it)."""
    family = socket.AF_INET6 if ':' in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        sock.listen(128)
    except (IOError, OSError) as exc:
        sock.close()
        return exc
    pid = os.fork()
    if pid:
        sock.close()
        os.waitpid(pid, 0)  # the first child exits at once; the grandchild holds the port
        return None
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        quiet_stdio()
        _serve(sock, seconds, expect)
    finally:
        os._exit(0)


def release(port, address='127.0.0.1', timeout=2.0):
    """Send the release token to the listener on address:port; True when one took the connection."""
    try:
        conn = socket.create_connection((address, port), timeout=timeout)
    except (IOError, OSError):
        return False
    try:
        conn.sendall(RELEASE_TOKEN)
    except (IOError, OSError):
        return False
    finally:
        conn.close()
    return True
