# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A stand-in for the cluster DNS (CoreDNS with the kubernetes plugin) in front of the pods' network DNS:
a pod's name exists only once the Service publishes it. The pods use it as their resolver (the kubelet
stand-in's --dns, as a kubelet writes the cluster DNS into every pod's resolv.conf).

    python3 cluster_dns.py --listen 10.213.121.53 --upstream 10.213.121.1 --publish /dns/publish.json

publish.json: {"<name>": <epoch>}. Before that time a query for the name (or the name with a search
domain appended) is answered NXDOMAIN: the name does not exist yet, as for a pod whose address the
endpoints controller has not published, or whose absence a resolver cached (CoreDNS `cache 30`). Every
other query is passed to the upstream server and its answer relayed. Each NXDOMAIN given is a line in
<publish dir>/nxdomain.log. The file is read again when it changes. UDP only (what glibc asks first);
only the standard library.
"""

import argparse
import json
import os
import socket
import struct
import threading
import time


def question_name(packet):
    """The first question's name, lower case, without the final dot ('' when unreadable)."""
    labels, offset = [], 12
    try:
        while True:
            length = packet[offset]
            if length == 0:
                break
            if length & 0xC0:
                return ''
            labels.append(packet[offset + 1:offset + 1 + length].decode('ascii', 'replace'))
            offset += 1 + length
    except IndexError:
        return ''
    return '.'.join(labels).lower()


def nxdomain(query):
    """The NXDOMAIN answer to a query: its id and question, QR and RA set, RD kept, no records."""
    ident, flags = struct.unpack('!HH', query[:4])
    flags = 0x8000 | (flags & 0x7900) | 0x0080 | 3   # QR, opcode and RD kept, RA, RCODE 3
    end = 12
    while query[end] != 0:
        end += 1 + query[end]
    end += 5                                            # the root label, QTYPE, QCLASS
    return struct.pack('!HHHHHH', ident, flags, 1, 0, 0, 0) + query[12:end]


class Publisher:
    def __init__(self, path):
        self.path, self.stamp, self.table = path, None, {}

    def hidden(self, name, now=None):
        """Whether a name is not published yet (a search domain appended to it counts as the name)."""
        try:
            stamp = os.stat(self.path).st_mtime_ns
        except OSError:
            stamp = None
        if stamp != self.stamp:
            try:
                with open(self.path) as handle:
                    self.table = {k.lower().rstrip('.'): float(v) for k, v in json.load(handle).items()}
            except (OSError, ValueError):
                self.table = {}
            self.stamp = stamp
        now = time.time() if now is None else now
        return any((name == key or name.startswith(key + '.')) and now < at for key, at in self.table.items())


def serve(listen, upstream, publish):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((listen, 53))
    publisher = Publisher(publish)
    log = os.path.join(os.path.dirname(publish), 'nxdomain.log')

    def forward(data, client):
        out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        out.settimeout(5)
        try:
            out.sendto(data, (upstream, 53))
            sock.sendto(out.recv(65535), client)
        except OSError:
            pass
        finally:
            out.close()

    while True:
        data, client = sock.recvfrom(65535)
        name = question_name(data)
        if name and publisher.hidden(name):
            sock.sendto(nxdomain(data), client)
            try:
                with open(log, 'a') as handle:
                    handle.write('%.1f %s %s\n' % (time.time(), client[0], name))
            except OSError:
                pass
            continue
        threading.Thread(target=forward, args=(data, client), daemon=True).start()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--listen', required=True)
    parser.add_argument('--upstream', required=True)
    parser.add_argument('--publish', required=True)
    args = parser.parse_args()
    serve(args.listen, args.upstream, args.publish)


if __name__ == '__main__':
    main()
