# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""How the pods' agents reach each other: one JSON request and one JSON line back over TCP (request), a pod's
name resolved once per process (ADDRESSES) and, before the headless Service publishes it, the address the pod
registered on the job's volume (register, registered, REGISTRY_ROOT); many pods asked at once (each).
Standard library only; mounted beside the pod entrypoint (k8s_pod.py) from the ConfigMap."""

import json
import os
import socket
import threading
import time


IO_TIMEOUT = 5.0


LOST_IO_TIMEOUT = 5.0   # a request to a pod that has not answered for a while: it is not waited on longer


REGISTRY = '.pods'      # <state dir>/.pods/<pod>.json: each agent's own address (the downward API's podIP)


def replace_file(path, text):
    """Write text to path whole or not at all (a reader never sees half of it): a temporary file beside it,
    then renamed over it."""
    tmp = '%s.tmp' % path
    with open(tmp, 'w') as handle:
        handle.write(text)
    os.replace(tmp, path)


def register(root, name, address, node, boot):
    """Write where this pod's agent answers (best effort: a volume it cannot write is named by the launch)."""
    if not address:
        return False
    path = os.path.join(root, REGISTRY)
    try:
        os.makedirs(path, mode=0o2770, exist_ok=True)
        replace_file(os.path.join(path, '%s.json' % name),
                     json.dumps({'pod': name, 'address': address, 'node': node, 'boot': boot, 'time': time.time()}))
        return True
    except OSError:
        return False


def registered(root, name):
    """The address a pod registered ('' when none)."""
    try:
        with open(os.path.join(root, REGISTRY, '%s.json' % name)) as handle:
            entry = json.load(handle)
    except (OSError, ValueError):
        return ''
    address = str(entry.get('address') or '') if isinstance(entry, dict) else ''
    return address if _is_address(address) else ''


def each(items, call):
    """call(item) for every item at once, the results in order: a pod that does not answer costs its own
    timeout, not every other pod's too. call handles its own errors."""
    results = [None] * len(items)

    def run(index, item):
        results[index] = call(item)
    threads = [threading.Thread(target=run, args=(i, item), daemon=True) for i, item in enumerate(items)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def resolve(name):
    """The IPv4/IPv6 addresses a name resolves to now ([] when it does not)."""
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)})
    except (socket.gaierror, UnicodeError):
        return []


# A pod's name resolved once per process: a DNS answer that takes seconds (conntrack races, a busy
# CoreDNS) then costs one lookup, not one per request. A request whose cached address no longer
# answers (the pod came back with another address) resolves the name again and tries once more.
ADDRESSES = {}


ADDRESSES_LOCK = threading.Lock()


# Where the pods registered their addresses (the job's state directory; main() sets it): a name the Service has
# not published yet is reached at its pod's registered address. A reply from another pod there is not taken.
REGISTRY_ROOT = None


def _is_address(host):
    try:
        socket.inet_pton(socket.AF_INET6 if ':' in host else socket.AF_INET, host)
        return True
    except (OSError, ValueError):
        return False


def remember(name, addresses):
    """Keep the first of the addresses a pod's name resolved to (none: nothing kept)."""
    if addresses:
        with ADDRESSES_LOCK:
            ADDRESSES[name] = addresses[0]


def forget(name):
    with ADDRESSES_LOCK:
        ADDRESSES.pop(name, None)


def address_of(name, fresh=False):
    """The address to connect to for a pod's name: the one cached, else resolved now (and kept); the name
    itself when it does not resolve (the connection then fails, naming it)."""
    if _is_address(name):
        return name
    with ADDRESSES_LOCK:
        if not fresh and name in ADDRESSES:
            return ADDRESSES[name]
    found = resolve(name)
    if not found and REGISTRY_ROOT:
        found = [a for a in [registered(REGISTRY_ROOT, name.split('.')[0])] if a]
    remember(name, found)
    return found[0] if found else name


def _exchange(address, port, message, timeout):
    with socket.create_connection((address, port), timeout=timeout) as conn:
        conn.sendall((json.dumps(message) + '\n').encode())
        data = b''
        while not data.endswith(b'\n'):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data.decode() or '{}')


def request(address, port, message, timeout=IO_TIMEOUT):
    """One JSON request, one JSON line back; address is a pod's name (resolved once, see ADDRESSES) or
    an address."""
    target = address_of(address)
    try:
        return _exchange(target, port, message, timeout)
    except socket.timeout:
        raise
    except OSError:
        if _is_address(address):
            raise
        again = address_of(address, fresh=True)
        if again == target:
            raise
        return _exchange(again, port, message, timeout)
