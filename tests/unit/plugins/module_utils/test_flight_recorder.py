"""The NCCL flight recorder's dumps: which rank did not enter the collective the others wait in.

The fixture gloo-rank1-stopped was recorded with torch 2.13.0+cpu on two gloo ranks (its record.py):
both made collectives 1-4, then rank 1 stopped while rank 0 entered all_reduce #5."""

from __future__ import annotations

import os
import pickle
import shutil

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import flight_recorder as fr

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'flight', 'gloo-rank1-stopped')


@pytest.fixture
def job_dir(tmp_path):
    os.makedirs(str(tmp_path / 'flight'))
    for rank in (0, 1):
        shutil.copy(os.path.join(FIX, 'rank_%d' % rank), str(tmp_path / 'flight'))
    return tmp_path


def test_the_rank_that_did_not_enter_the_collective_is_named(job_dir):
    out = fr.read_job(str(job_dir))
    assert out['not_entered'] == [1]
    group = out['groups'][0]
    assert group['waiting_in'] == {'seq': 5, 'name': 'gloo:all_reduce'} and group['waiting_ranks'] == [0]
    assert out['ranks'][0]['last_started'] == {'seq': 5, 'name': 'gloo:all_reduce'}
    assert out['ranks'][0]['last_completed'] == {'seq': 4, 'name': 'gloo:broadcast'}
    assert out['ranks'][1]['last_started'] == {'seq': 4, 'name': 'gloo:broadcast'}
    assert out['lines'][0] == ('process group 0: rank(s) 0 wait in gloo:all_reduce #5; '
                               'not entered by rank 1 (last started gloo:broadcast #4)')


def test_ranks_all_in_step_name_no_one(job_dir):
    os.unlink(str(job_dir / 'flight' / 'rank_0'))
    shutil.copy(os.path.join(FIX, 'rank_1'), str(job_dir / 'flight' / 'rank_0'))
    out = fr.read_job(str(job_dir))
    assert out['not_entered'] == [] and out['groups'] == []
    assert out['lines'] == ['rank 0: last started gloo:broadcast #4, last completed gloo:broadcast #4',
                            'rank 1: last started gloo:broadcast #4, last completed gloo:broadcast #4']


def test_nccl_states_count_and_a_missing_dump_is_said(tmp_path):
    def entry(seq, state, name='nccl:all_reduce'):
        return {'collective_seq_id': seq, 'profiling_name': name, 'state': state, 'retired': state == 'completed',
                'process_group': ('0', 'default_pg'), 'is_p2p': False, 'input_sizes': [[1024]]}
    config = {'0': {'name': '0', 'desc': 'default_pg', 'ranks': '[0, 1, 2, 3]'}}
    dumps = {0: {'entries': [entry(7, 'completed'), entry(8, 'started')], 'pg_config': config},
             1: {'entries': [entry(7, 'completed'), entry(8, 'started')], 'pg_config': config},
             2: {'entries': [entry(7, 'completed', 'nccl:broadcast')], 'pg_config': config}}
    out = fr.analyse(dumps)
    group = out['groups'][0]
    assert group['waiting_ranks'] == [0, 1] and [b['rank'] for b in group['not_entered']] == [2]
    assert group['no_dump'] == [3] and 'no dump from rank(s) 3' in out['lines'][0]


def test_a_dump_that_asks_for_a_class_is_refused_not_run(tmp_path):
    os.makedirs(str(tmp_path / 'flight'))
    (tmp_path / 'flight' / 'rank_0').write_bytes(pickle.dumps({'entries': [os.getcwd]}))
    (tmp_path / 'flight' / 'rank_1').write_bytes(b'not a pickle')
    (tmp_path / 'flight' / 'notes.txt').write_text('ignored')
    dumps, errors = fr.read_dir(str(tmp_path))
    assert dumps == {} and sorted(os.path.basename(p) for p in errors) == ['rank_0', 'rank_1']
    assert 'plain values only' in errors[str(tmp_path / 'flight' / 'rank_0')]
    assert errors[str(tmp_path / 'flight' / 'rank_1')].startswith('not a pickle')
    lines = fr.read_job(str(tmp_path))['lines']
    assert lines == ['%s: not read (%s)' % (path, error) for path, error in sorted(errors.items())]


def test_no_flight_directory_reads_as_nothing(tmp_path):
    assert fr.read_job(str(tmp_path)) == {}


def test_a_dump_that_is_a_fifo_or_a_link_is_not_read_and_the_read_does_not_wait(job_dir):
    # the supervisor reads the dumps as root from the job's directory, which the training account writes
    import threading
    fifo = job_dir / 'flight' / 'rank_2'
    os.mkfifo(str(fifo))
    os.symlink(str(job_dir / 'flight' / 'rank_0'), str(job_dir / 'flight' / 'rank_3'))
    box = {}
    reader = threading.Thread(target=lambda: box.setdefault('read', fr.read_dir(str(job_dir))), daemon=True)
    reader.start()
    reader.join(5)
    hung = reader.is_alive()
    try:
        os.close(os.open(str(fifo), os.O_WRONLY | os.O_NONBLOCK))  # lets go of a reader waiting in open()
    except OSError:
        pass
    reader.join(5)
    assert not hung, 'read_dir waited on a FIFO'
    dumps, errors = box['read']
    assert sorted(dumps) == [0, 1] and sorted(os.path.basename(p) for p in errors) == ['rank_2', 'rank_3']
