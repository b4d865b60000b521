import hashlib
import tarfile
from pathlib import Path

from ansible_collections.gpucluster.multinode.plugins.lookup import collection_bundle as cb

ROOT = Path(__file__).resolve().parents[4]


def test_the_collection_is_packed_without_tests_lab_or_caches_and_with_what_its_playbooks_need(tmp_path):
    out = cb.bundle(str(tmp_path), root=str(ROOT))
    with tarfile.open(out['path']) as tar:
        names = tar.getnames()
    assert 'galaxy.yml' in names
    assert 'playbooks/train.yml' in names and 'playbooks/health.yml' in names
    assert 'roles/training/files/gpucluster_supervise.py' in names
    assert 'plugins/modules/training_job.py' in names
    assert not [n for n in names if n.startswith(('tests/', 'molecule/', 'lab/', '.venv/')) or '__pycache__' in n]
    assert 'playbooks/lab.yml' not in names
    assert not [n for n in names if n.endswith('.md')]  # a README changed on the controller is no other copy
    assert out['files'] == len(names)
    assert out['version'] == cb.collection_version(str(ROOT))


def test_the_same_files_give_the_same_bytes_and_digest_and_a_changed_file_another(tmp_path):
    tree = tmp_path / 'c'
    (tree / 'roles/r/tasks').mkdir(parents=True)
    (tree / 'galaxy.yml').write_text('namespace: gpucluster\nname: multinode\nversion: 1.2.3\n')
    (tree / 'roles/r/tasks/main.yml').write_text('---\n')
    first = cb.bundle(str(tmp_path / 'cache1'), root=str(tree))
    second = cb.bundle(str(tmp_path / 'cache2'), root=str(tree))
    assert first['digest'] == second['digest'] and first['version'] == '1.2.3'
    assert hashlib.sha256(Path(first['path']).read_bytes()).hexdigest() == \
        hashlib.sha256(Path(second['path']).read_bytes()).hexdigest()
    (tree / 'roles/r/tasks/main.yml').write_text('---\n- name: changed\n')
    third = cb.bundle(str(tmp_path / 'cache1'), root=str(tree))
    assert third['digest'] != first['digest'] and third['path'] != first['path']
