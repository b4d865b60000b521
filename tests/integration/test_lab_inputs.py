"""lab/lab.yml (the lab, development only) refuses bad input before it creates anything."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = 'gpucluster-inputtest'

pytestmark = pytest.mark.skipif(shutil.which('ansible-playbook') is None or shutil.which('podman') is None,
                                reason='needs ansible-playbook and podman (make setup)')


def lab(*extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'),
               CONTAINERS_CONF=os.path.join(ROOT, 'lab', 'containers.conf'))
    cmd = ['ansible-playbook', 'lab/lab.yml', '-e', 'lab_name=' + NAME,
           '-e', 'lab_inventory_dir=' + os.path.join(ROOT, '.build', 'inputtest-inventory')] + list(extra)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def podman(*args):
    env = dict(os.environ, CONTAINERS_CONF=os.path.join(ROOT, 'lab', 'containers.conf'))
    return subprocess.run(['podman'] + list(args), env=env, capture_output=True, text=True, check=False)


def assert_nothing_made():
    assert podman('network', 'exists', NAME).returncode != 0
    assert not podman('ps', '-a', '--filter', 'label=gpucluster.lab=' + NAME, '--format', '{{.Names}}').stdout.strip()
    assert not os.path.exists(os.path.join(ROOT, '.lab', NAME))


def test_fewer_than_one_node_is_refused():
    rc, out = lab('-e', 'lab_nodes=0')
    assert rc != 0
    assert 'lab_nodes must be at least 1 (got 0)' in out
    assert_nothing_made()


def test_a_subnet_of_another_podman_network_is_refused():
    other = 'gpucluster-inputtest-other'
    podman('network', 'rm', '-f', other)
    assert podman('network', 'create', '--subnet', '10.213.250.0/24', other).returncode == 0
    try:
        rc, out = lab('-e', 'lab_subnet=10.213.250.128/25')
    finally:
        podman('network', 'rm', '-f', other)
    assert rc != 0
    assert 'lab_subnet 10.213.250.128/25 overlaps 10.213.250.0/24' in out
    assert_nothing_made()


def test_a_subnet_that_holds_a_host_route_is_refused():
    routes = json.loads(subprocess.run(['ip', '-json', 'route', 'show'], capture_output=True,
                                       text=True, check=True).stdout)
    own = [r['dst'] for r in routes if r.get('dst') not in (None, 'default') and '/' in r['dst']
           and not r.get('dev', '').startswith(('podman', 'cni', 'veth'))]
    if not own:
        pytest.skip('this machine has no host route with a prefix to clash with')
    rc, out = lab('-e', 'lab_subnet=' + own[0])
    assert rc != 0
    assert 'lab_subnet %s overlaps %s' % (own[0], own[0]) in out
    assert_nothing_made()


def test_more_nodes_than_the_inotify_limit_allows_are_refused():
    # systemd in a container takes inotify instances from the host's per-user limit; past it, a new
    # node hangs at boot with no error. The lab counts them before it makes anything.
    with open('/proc/sys/fs/inotify/max_user_instances') as f:
        limit = int(f.read())
    rc, out = lab('-e', 'lab_nodes=2', '-e', 'lab_inotify_per_node=%d' % (limit // 2 + 1))
    assert rc != 0
    assert 'lab %s: starting 2 more node(s) needs about' % NAME in out
    assert 'the host allows %d (fs.inotify.max_user_instances)' % limit in out
    assert 'Nothing was started' in out
    assert_nothing_made()


def test_the_collection_tarball_leaves_the_lab_and_the_tests_out(tmp_path):
    """The lab and the scenarios are development only: the built collection holds none of them
    and does not depend on containers.podman."""
    import tarfile
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1')
    proc = subprocess.run(['ansible-galaxy', 'collection', 'build', '--output-path', str(tmp_path), ROOT],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [tarball] = list(tmp_path.glob('gpucluster-multinode-*.tar.gz'))
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile('MANIFEST.json'))
    top = {n.split('/')[0] for n in names}
    assert not top & {'lab', 'molecule', 'tests', 'benchmarks', 'scripts', '.lab', '.config', '.pytest_cache'}, sorted(top)
    assert 'playbooks/lab.yml' not in names
    assert not [n for n in names if n.startswith('inventories/lab')]
    assert 'roles/node_tools/tasks/main.yml' in names and 'playbooks/site.yml' in names
    assert 'containers.podman' not in manifest['collection_info']['dependencies']
