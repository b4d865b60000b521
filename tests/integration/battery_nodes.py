"""Two throw-away nodes for the bad-input battery: systemd containers from the node image, on
their own podman network, reached over real SSH with pinned host keys (as the lab does), and a
fingerprint of what the collection would change on them.

    python tests/integration/battery_nodes.py up     # start them, print the inventory path
    python tests/integration/battery_nodes.py down   # remove them
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = os.environ.get('GPUCLUSTER_BATTERY_NAME', 'gpucluster-battery')
SUBNET = os.environ.get('GPUCLUSTER_BATTERY_SUBNET', '10.234.1.0/24')
PREFIX = SUBNET.rsplit('.', 1)[0]
NODES = [('bat-head', 'head', PREFIX + '.10'), ('bat-worker-1', 'workers', PREFIX + '.11')]
STATE = os.path.join(ROOT, '.lab', NAME)
ADMIN = 'batadmin'
LABEL = 'gpucluster.battery=%s' % NAME

# Everything a step of site.yml writes, read in one go per node: one line per item, "name digest".
FINGERPRINT = r'''
set -u
h() { if [ -e "$1" ]; then sha256sum "$1" 2>/dev/null | cut -c1-16; else echo absent; fi; }
for f in /etc/hosts /etc/hostname /etc/ssh/sshd_config /etc/exports /etc/fstab /etc/passwd /etc/group \
         /etc/profile.d/gpucluster-nccl.sh /etc/pdsh/rcmd_default /etc/default/ufw /etc/ufw/user.rules \
         /etc/gpucluster/cluster.json /home/train/.deepspeed_env /home/train/.ssh/authorized_keys \
         /etc/ssh/ssh_known_hosts; do
  echo "$f $(h "$f")"
done
for d in /etc/ssh/sshd_config.d /etc/exports.d /etc/profile.d /etc/sudoers.d /etc/modprobe.d /etc/apt/sources.list.d; do
  echo "$d $( (ls -la --time-style=+ "$d" 2>/dev/null; cat "$d"/* 2>/dev/null) | sha256sum | cut -c1-16)"
done
echo "packages $(dpkg-query -W -f '${Package} ${Version} ${Status}\n' 2>/dev/null | sha256sum | cut -c1-16)"
echo "iptables $( (iptables-save 2>/dev/null; ip6tables-save 2>/dev/null) | grep -v '^[#:]' | sha256sum | cut -c1-16)"
echo "opt $(ls -la /opt /opt/gpucluster 2>/dev/null | sha256sum | cut -c1-16)"
echo "shared $(ls -la /shared 2>/dev/null | sha256sum | cut -c1-16)"
'''


class NodesUnavailable(Exception):
    """podman or the node image is missing: the battery cannot run here."""


def _env():
    env = dict(os.environ)
    env.setdefault('CONTAINERS_CONF', os.path.join(ROOT, 'lab', 'containers.conf'))
    return env


def podman(*args, check=True, timeout=120, stdin=None):
    proc = subprocess.run(['podman'] + list(args), capture_output=True, text=True, timeout=timeout,
                          env=_env(), input=stdin, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError('podman %s: rc %d: %s' % (' '.join(args), proc.returncode, proc.stderr.strip()))
    return proc


def node_image():
    image = os.environ.get('GPUCLUSTER_NODE_IMAGE')
    if not image:
        for path in (os.path.join(ROOT, '.lab', 'node-image'),):
            if os.path.exists(path):
                image = open(path, encoding='utf-8').read().strip()
    return image


def container(node):
    return '%s-%s' % (NAME, node)


def check_available():
    if shutil.which('podman') is None:
        raise NodesUnavailable('podman is not installed (scripts/setup.sh installs it)')
    image = node_image()
    if not image:
        raise NodesUnavailable('no node image: set GPUCLUSTER_NODE_IMAGE or build it (make lab-up writes .lab/node-image)')
    if podman('image', 'exists', image, check=False).returncode != 0:
        raise NodesUnavailable('node image %s is not in the podman store (make lab-up builds it)' % image)
    return image


def down():
    for node, _group, _address in NODES:
        podman('rm', '-f', '-t', '0', container(node), check=False)
    podman('network', 'rm', '-f', NAME, check=False)
    shutil.rmtree(STATE, ignore_errors=True)


def _exec(node, script, timeout=60):
    return podman('exec', '-i', container(node), '/bin/sh', '-c', script, timeout=timeout)


def up():
    """Start the nodes and write an inventory; returns its path."""
    image = check_available()
    down()
    os.makedirs(os.path.join(STATE, 'ssh'), exist_ok=True)
    os.makedirs(os.path.join(STATE, 'shared'), exist_ok=True)
    key = os.path.join(STATE, 'ssh', 'id_ed25519')
    subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', ADMIN, '-f', key], check=True)
    pub = open(key + '.pub', encoding='utf-8').read().strip()
    podman('network', 'create', '--subnet', SUBNET, '--label', LABEL, NAME)
    for node, _group, address in NODES:
        podman('run', '-d', '--name', container(node), '--hostname', node, '--network', NAME, '--ip', address,
               '--systemd', 'always', '--cap-add', 'NET_ADMIN,NET_RAW', '--label', LABEL,
               '--volume', '%s:/shared:z' % os.path.join(STATE, 'shared'), image, '/sbin/init')
    setup = ('timeout 120 systemctl is-system-running --wait >/dev/null 2>&1; '
             'id %(u)s >/dev/null 2>&1 || useradd -m -s /bin/bash %(u)s; '
             'install -d -m 0700 -o %(u)s -g %(u)s /home/%(u)s/.ssh; '
             'echo "%(pub)s" > /home/%(u)s/.ssh/authorized_keys; '
             'chown %(u)s: /home/%(u)s/.ssh/authorized_keys; chmod 0600 /home/%(u)s/.ssh/authorized_keys; '
             'echo "%(u)s ALL=(ALL) NOPASSWD: ALL" > /etc/sudoers.d/%(u)s; chmod 0440 /etc/sudoers.d/%(u)s; '
             'for i in $(seq 60); do [ -s /etc/ssh/ssh_host_ed25519_key.pub ] && break; sleep 1; done; '
             'cat /etc/ssh/ssh_host_ed25519_key.pub') % {'u': ADMIN, 'pub': pub}
    known = []
    for node, _group, address in NODES:
        hostkey = _exec(node, setup, timeout=180).stdout.split()
        known.append('%s %s %s' % (address, hostkey[0], hostkey[1]))
    with open(os.path.join(STATE, 'ssh', 'known_hosts'), 'w', encoding='utf-8') as handle:
        handle.write('\n'.join(known) + '\n')
    inventory = {'all': {
        'vars': {
            'ansible_user': ADMIN, 'ansible_become': True, 'ansible_ssh_private_key_file': key,
            'ansible_ssh_common_args': '-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes'
                                       % os.path.join(STATE, 'ssh', 'known_hosts'),
            'cluster_cidr': SUBNET, 'cluster_user': 'train', 'cluster_master_port': 29500,
            'nfs_client_mode': 'check',
        },
        'children': {'cluster': {'children': {
            group: {'hosts': {node: {'ansible_host': address} for node, g, address in NODES if g == group}}
            for group in ('head', 'workers')}}}}}
    path = os.path.join(STATE, 'hosts.yml')
    with open(path, 'w', encoding='utf-8') as handle:
        json.dump(inventory, handle, indent=2)
    deadline = time.time() + 60
    for _node, _group, address in NODES:
        while subprocess.run(['ssh', '-i', key, '-o', 'UserKnownHostsFile=' + os.path.join(STATE, 'ssh', 'known_hosts'),
                              '-o', 'StrictHostKeyChecking=yes', '-o', 'BatchMode=yes', '-o', 'ConnectTimeout=3',
                              '%s@%s' % (ADMIN, address), 'true'], capture_output=True, check=False).returncode != 0:
            if time.time() > deadline:
                raise RuntimeError('sshd on %s does not answer' % address)
            time.sleep(1)
    return path


def fingerprint():
    """{node: {item: digest}} of every node, one podman exec per node."""
    out = {}
    for node, _group, _address in NODES:
        lines = _exec(node, FINGERPRINT).stdout.splitlines()
        out[node] = dict(line.split(' ', 1) for line in lines if ' ' in line)
    return out


def changes(before, after):
    """'node item' for each item that differs."""
    return ['%s %s' % (node, item) for node in sorted(before) for item in sorted(before[node])
            if after.get(node, {}).get(item) != before[node][item]]


if __name__ == '__main__':
    if sys.argv[1:] == ['up']:
        print(up())
    elif sys.argv[1:] == ['down']:
        down()
    elif sys.argv[1:] == ['fingerprint']:
        print(json.dumps(fingerprint(), indent=2))
    else:
        sys.exit(__doc__)
