"""container_image_info run as Ansible runs it, against a podman that replays the outputs recorded on
the lab (fixtures/containers: podman_image_inspect.json of the base image, podman_image_inspect_missing.txt
for an image that is not there) and the OCI archive saved from the same image."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from module_run import run_module

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'container_image_info.py')
RECORDED = os.path.join(ROOT, 'tests', 'unit', 'fixtures', 'containers')
IMAGE = 'localhost/gpucluster-base:bookworm'
IMAGE_ID = 'sha256:9dfd6d3a179af5b2df2578547dc36bede86f77b848d7d56450d80a94db1868f3'

# podman image inspect --format json IMAGE: the recorded image, the recorded "image not known" for any
# other, and a storage error when told so
FAKE = textwrap.dedent('''\
    #!%(python)s
    import os, sys
    args = sys.argv[1:]
    open(%(log)r, 'a').write(' '.join(args) + '\\n')
    if os.path.exists(%(broken)r):
        sys.stderr.write(open(%(broken)r).read()); sys.exit(125)
    if args[:4] != ['image', 'inspect', '--format', 'json']:
        sys.exit(2)
    if args[4] == %(image)r:
        sys.stdout.write(open(os.path.join(%(recorded)r, 'podman_image_inspect.json')).read()); sys.exit(0)
    out, err, rc = open(os.path.join(%(recorded)r, 'podman_image_inspect_missing.txt')).read().splitlines()
    print(out)
    sys.stderr.write(err.replace('localhost/nosuch:latest', args[4]) + '\\n')
    sys.exit(int(rc.split('=')[1]))
''')


@pytest.fixture
def podman(tmp_path):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    fake = bin_dir / 'podman'
    fake.write_text(FAKE % {'python': sys.executable, 'log': str(tmp_path / 'calls.log'), 'recorded': RECORDED,
                            'image': IMAGE, 'broken': str(tmp_path / 'broken')})
    fake.chmod(0o755)
    return tmp_path


def run(tmp_path, check=False, **args):
    env = dict(os.environ, PATH=os.pathsep.join([str(tmp_path / 'bin'), os.environ.get('PATH', '')]))
    return run_module(MODULE, tmp_path, args, check=check, env=env)


def test_an_image_on_the_node_is_reported_with_its_id_and_digest(podman):
    out = run(podman, image=IMAGE)
    assert out.get('failed') is not True, out
    assert out['changed'] is False
    assert out['present'] is True
    assert out['id'] == IMAGE_ID
    assert out['digest'] == 'sha256:00ed614ba92f11152340eb52eea7d602d341735552de8afef908748848063ff4'
    assert out['repo_digests'] == ['localhost/gpucluster-base@sha256:'
                                   '00ed614ba92f11152340eb52eea7d602d341735552de8afef908748848063ff4']
    assert out['labels'] == {}
    assert out['archive_id'] is None
    assert (podman / 'calls.log').read_text() == 'image inspect --format json %s\n' % IMAGE


def test_an_image_that_is_not_there_is_absent_not_a_failure(podman):
    out = run(podman, image='localhost/gpucluster-train:torch2.13.0-ds0.19.8')
    assert out.get('failed') is not True, out
    assert out['present'] is False
    assert out['id'] == '' and out['digest'] == '' and out['repo_digests'] == []


def test_the_archive_holds_the_id_podman_shows_after_loading_it(podman):
    out = run(podman, image=IMAGE, archive=os.path.join(RECORDED, 'oci_archive_without_layer.tar'))
    assert out.get('failed') is not True, out
    assert out['archive_id'] == out['id'] == IMAGE_ID
    assert out['archive_name'] == IMAGE


def test_an_archive_not_written_yet_is_none(podman):
    out = run(podman, image=IMAGE, archive=str(podman / 'images' / 'train.oci.tar'))
    assert out.get('failed') is not True, out
    assert out['archive_id'] is None and out['archive_name'] is None


def test_a_file_that_is_no_oci_archive_fails_naming_it(podman):
    bad = podman / 'train.oci.tar'
    bad.write_text('not a tar')
    out = run(podman, image=IMAGE, archive=str(bad))
    assert out['failed'] is True
    assert out['msg'].startswith('%s is not an OCI archive of one image' % bad)


def test_podman_failing_for_another_reason_fails_naming_the_image_and_what_podman_said(podman):
    (podman / 'broken').write_text('Error: database static dir "/home/train/.local/share/containers/storage/'
                                   'libpod" does not match our static dir\n')
    out = run(podman, image=IMAGE)
    assert out['failed'] is True
    assert out['msg'] == ('podman cannot inspect image %s: Error: database static dir "/home/train/.local/share/'
                          'containers/storage/libpod" does not match our static dir' % IMAGE)


def test_check_mode_reads_the_same(podman):
    out = run(podman, check=True, image=IMAGE)
    assert out.get('failed') is not True, out
    assert out['present'] is True and out['id'] == IMAGE_ID
