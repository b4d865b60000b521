"""The flight recorder of a job: its variables (both generations of torch's names), the dumps of each
attempt in their own directory, the dump asked through a rank's debug-info pipe (real FIFOs, a reader
thread standing in for the rank's monitor thread), and the stall verdict the supervisor reads."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import flight_recorder as fr

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'flight', 'gloo-rank1-stopped')
FR_FILE = fr.__file__


def fixture_bytes(rank):
    with open(os.path.join(FIX, 'rank_%d' % rank), 'rb') as handle:
        return handle.read()


def entry(seq, state, name='nccl:all_reduce', pg=('0', 'default_pg')):
    return {'collective_seq_id': seq, 'profiling_name': name, 'state': state, 'retired': state == 'completed',
            'process_group': pg, 'is_p2p': False, 'input_sizes': [[1024]]}


CONFIG = {'0': {'name': '0', 'desc': 'default_pg', 'ranks': '[0, 1, 2, 3]'}}


def write_dumps(folder, dumps):
    import pickle
    os.makedirs(str(folder), exist_ok=True)
    for rank, dump in dumps.items():
        (folder / ('rank_%d' % rank)).write_bytes(pickle.dumps(dump))


def rank2_stalls():
    """Four ranks: 0, 1 and 3 entered all_reduce #8, rank 2 stopped after broadcast #7."""
    waiting = {'entries': [entry(7, 'completed', 'nccl:broadcast'), entry(8, 'started')], 'pg_config': CONFIG}
    return {0: waiting, 1: waiting, 3: waiting,
            2: {'entries': [entry(7, 'completed', 'nccl:broadcast')], 'pg_config': CONFIG}}


# ----- the variables -------------------------------------------------------------------------------
def test_the_recorder_is_set_with_both_generations_of_names_and_error_handling_3(tmp_path):
    env = fr.job_env(str(tmp_path))
    prefix = str(tmp_path / 'flight' / 'rank_')
    assert env == {'TORCH_FR_BUFFER_SIZE': '2000', 'TORCH_NCCL_TRACE_BUFFER_SIZE': '2000',
                   'TORCH_NCCL_DUMP_ON_TIMEOUT': '1',
                   'TORCH_FR_DUMP_TEMP_FILE': prefix, 'TORCH_NCCL_DEBUG_INFO_TEMP_FILE': prefix,
                   'TORCH_NCCL_DEBUG_INFO_PIPE_FILE': prefix, 'TORCH_FR_DEBUG_INFO_PIPE_FILE': prefix,
                   'TORCH_NCCL_ASYNC_ERROR_HANDLING': '3'}
    later = fr.job_env(str(tmp_path), 3)
    assert set(later) == set(env)
    assert later['TORCH_FR_DUMP_TEMP_FILE'] == later['TORCH_NCCL_DEBUG_INFO_PIPE_FILE'] == \
        str(tmp_path / 'flight' / 'attempt-3' / 'rank_')


def test_each_attempt_has_its_own_place(tmp_path):
    job = str(tmp_path)
    assert fr.attempt_dir(job, 1) == fr.attempt_dir(job, None) == fr.attempt_dir(job, 'junk') == str(tmp_path / 'flight')
    assert fr.dump_path(job, 2, 5) == str(tmp_path / 'flight' / 'attempt-2' / 'rank_5')
    assert fr.pipe_path(job, 2, 5) == str(tmp_path / 'flight' / 'attempt-2' / 'rank_5.pipe')
    assert fr.newest_attempt(job) == 1
    os.makedirs(str(tmp_path / 'flight' / 'attempt-2'))
    os.makedirs(str(tmp_path / 'flight' / 'attempt-10'))
    os.makedirs(str(tmp_path / 'flight' / 'attempt-x'))
    assert fr.newest_attempt(job) == 10


def test_the_readers_read_the_current_attempts_dumps_only(tmp_path):
    # attempt 1 stalled (rank 2 never entered all_reduce #8); attempt 2 is in step so far
    write_dumps(tmp_path / 'flight', rank2_stalls())
    in_step = {'entries': [entry(3, 'completed')], 'pg_config': CONFIG}
    write_dumps(tmp_path / 'flight' / 'attempt-2', {r: in_step for r in range(4)})
    assert fr.read_job(str(tmp_path), 1)['not_entered'] == [2]
    assert fr.read_job(str(tmp_path), 1)['attempt'] == 1
    second = fr.read_job(str(tmp_path), 2)
    assert second['not_entered'] == [] and second['attempt'] == 2 and sorted(second['ranks']) == [0, 1, 2, 3]
    assert fr.read_job(str(tmp_path))['attempt'] == 2          # no attempt named: the newest
    assert fr.read_job(str(tmp_path), 3) == {}                 # an attempt that dumped nothing
    assert fr.stall_verdict(str(tmp_path), 1)['missing_ranks'] == [2]
    assert fr.stall_verdict(str(tmp_path), 2) is None and fr.stall_verdict(str(tmp_path)) is None


def test_a_start_sets_aside_the_dumps_an_earlier_run_of_the_same_attempt_left(tmp_path):
    write_dumps(tmp_path / 'flight', rank2_stalls())
    (tmp_path / 'flight' / 'rank_0.pipe').write_text('')
    moved = fr.set_aside(str(tmp_path), 1)
    assert sorted(os.path.basename(p) for p in moved) == ['rank_0', 'rank_1', 'rank_2', 'rank_3']
    assert fr.read_job(str(tmp_path), 1) == {}
    assert (tmp_path / 'flight' / 'rank_2.previous').exists() and (tmp_path / 'flight' / 'rank_0.pipe').exists()
    assert fr.set_aside(str(tmp_path / 'nothing'), 4) == []


# ----- asking for a dump through the pipe ------------------------------------------------------------
class Rank(threading.Thread):
    """A rank's monitor thread as torch has it: the FIFO <prefix><rank>.pipe made and opened O_RDONLY |
    O_NONBLOCK, polled; a line read makes it write its dump to <prefix><rank> (in two parts, a while apart,
    as a large dump lands), unless it is told to write none."""

    def __init__(self, job_dir, rank, attempt=1, dump=True, poll=0.05):
        super().__init__(daemon=True)
        self.pipe, self.path = fr.pipe_path(job_dir, attempt, rank), fr.dump_path(job_dir, attempt, rank)
        os.makedirs(os.path.dirname(self.pipe), exist_ok=True)
        os.mkfifo(self.pipe)
        self.fd = os.open(self.pipe, os.O_RDONLY | os.O_NONBLOCK)
        self.dump, self.poll, self.lines, self.stop = dump, poll, [], threading.Event()
        self.start()

    def run(self):
        while not self.stop.is_set():
            try:
                data = os.read(self.fd, 128)
            except BlockingIOError:
                data = b''
            if data:
                self.lines.append(data)
                if self.dump:
                    payload = fixture_bytes(0)
                    with open(self.path, 'wb') as handle:
                        handle.write(payload[:100])
                        handle.flush()
                        time.sleep(0.3)
                        handle.write(payload[100:])
            time.sleep(self.poll)

    def close(self):
        self.stop.set()
        self.join(2)
        os.close(self.fd)


@pytest.fixture
def ranks():
    made = []
    yield lambda *a, **kw: made.append(Rank(*a, **kw)) or made[-1]
    for rank in made:
        rank.close()


def test_a_rank_reading_its_pipe_dumps_and_the_dump_is_returned_once_it_stops_growing(tmp_path, ranks):
    job = str(tmp_path)
    rank0, rank1 = ranks(job, 0), ranks(job, 1)
    start = time.monotonic()
    out = fr.request_dumps(job, 1, [0, 1], timeout=10)
    assert out == {'flight_dumps': {0: fr.dump_path(job, 1, 0), 1: fr.dump_path(job, 1, 1)}, 'flight_dump_missing': []}
    assert rank0.lines == [b'1\n'] and rank1.lines == [b'1\n']
    with open(fr.dump_path(job, 1, 0), 'rb') as handle:
        assert handle.read() == fixture_bytes(0)   # whole: not taken while it was still growing
    assert time.monotonic() - start < 5


def test_a_pipe_nobody_reads_is_skipped_at_once_and_so_is_anything_not_a_fifo(tmp_path):
    job = str(tmp_path)
    os.makedirs(fr.attempt_dir(job, 2))
    os.mkfifo(fr.pipe_path(job, 2, 0))                        # its rank is gone: no reader
    with open(fr.pipe_path(job, 2, 1), 'w') as handle:        # a plain file of that name
        handle.write('keep')
    start = time.monotonic()
    out = fr.request_dumps(job, 2, [0, 1, 2], timeout=10)
    assert time.monotonic() - start < 1                       # never blocks, and waits for no one
    assert out['flight_dumps'] == {}
    why = dict((m['rank'], m['why']) for m in out['flight_dump_missing'])
    assert why[0].startswith('no process reads its pipe') and why[1].endswith('is not a FIFO')
    assert why[2].startswith('no debug-info pipe')
    with open(fr.pipe_path(job, 2, 1)) as handle:
        assert handle.read() == 'keep'


def test_the_wait_is_bounded_and_an_earlier_dump_is_not_taken_for_a_new_one(tmp_path, ranks):
    job = str(tmp_path)
    silent = ranks(job, 0, dump=False)
    with open(fr.dump_path(job, 1, 0), 'wb') as handle:      # from a timeout an hour ago
        handle.write(fixture_bytes(1))
    start = time.monotonic()
    out = fr.request_dumps(job, 1, [0], timeout=0.6)
    assert time.monotonic() - start < 2.5
    assert silent.lines == [b'1\n'] and out['flight_dumps'] == {}
    assert out['flight_dump_missing'] == [{'rank': 0, 'why': 'asked through its pipe, but no new dump came within 0.6 s'}]


# ----- the verdict ---------------------------------------------------------------------------------
def test_the_stall_verdict_names_the_collective_and_the_rank_that_never_entered_it(tmp_path):
    write_dumps(tmp_path / 'flight' / 'attempt-2', rank2_stalls())
    assert fr.stall_verdict(str(tmp_path), 2) == {
        'collective': 'nccl:all_reduce', 'seq': 8, 'process_group': 'default_pg', 'process_group_id': '0',
        'missing_ranks': [2], 'waiting_ranks': [0, 1, 3], 'no_dump': [], 'last_entered': {2: 'nccl:broadcast #7'},
        'attempt': 2,
        'why': 'rank 2 never entered nccl:all_reduce #8 of process group default_pg (the other 3 ranks wait in it; '
               'rank 2 last entered nccl:broadcast #7)'}
    assert fr.stall_verdict(str(tmp_path), 1) is None          # attempt 1 dumped nothing


def test_the_verdict_of_dumps_torch_wrote(tmp_path):
    # gloo-rank1-stopped: recorded with torch 2.13.0+cpu, rank 1 stopped before all_reduce #5
    os.makedirs(str(tmp_path / 'flight'))
    for rank in (0, 1):
        shutil.copy(os.path.join(FIX, 'rank_%d' % rank), str(tmp_path / 'flight'))
    verdict = fr.stall_verdict(str(tmp_path))
    assert verdict['collective'] == 'gloo:all_reduce' and verdict['seq'] == 5 and verdict['missing_ranks'] == [1]
    assert verdict['why'] == ('rank 1 never entered gloo:all_reduce #5 of process group default_pg (the other rank '
                              'waits in it; rank 1 last entered gloo:broadcast #4)')


def test_ranks_without_a_dump_are_named_and_ranks_in_step_give_no_verdict(tmp_path):
    dumps = rank2_stalls()
    del dumps[2], dumps[3]
    write_dumps(tmp_path / 'flight', dumps)
    verdict = fr.stall_verdict(str(tmp_path))
    assert verdict['missing_ranks'] == [] and verdict['no_dump'] == [2, 3] and verdict['waiting_ranks'] == [0, 1]
    assert verdict['why'] == 'ranks 0, 1 wait in nccl:all_reduce #8 of process group default_pg; ranks 2, 3 left no dump'
    in_step = {'entries': [entry(8, 'completed')], 'pg_config': CONFIG}
    write_dumps(tmp_path / 'flight', {r: in_step for r in range(4)})
    assert fr.stall_verdict(str(tmp_path)) is None
    assert fr.stall_verdict(str(tmp_path / 'no-job')) is None


def test_a_group_of_its_own_is_named_by_its_description(tmp_path):
    config = {'0': CONFIG['0'], '3': {'name': '3', 'desc': 'dp_shard', 'ranks': '[0, 1]'}}
    pg = ('3', 'dp_shard')
    write_dumps(tmp_path / 'flight', {
        0: {'entries': [entry(1, 'completed'), entry(4, 'completed', 'nccl:_allgather_base', pg),
                        entry(5, 'scheduled', 'nccl:_allgather_base', pg)], 'pg_config': config},
        1: {'entries': [entry(1, 'completed'), entry(4, 'completed', 'nccl:_allgather_base', pg)], 'pg_config': config}})
    verdict = fr.stall_verdict(str(tmp_path))
    assert (verdict['collective'], verdict['seq'], verdict['process_group'], verdict['missing_ranks']) == \
        ('nccl:_allgather_base', 5, 'dp_shard', [1])


# ----- what the supervisor imports ---------------------------------------------------------------------
def test_the_module_imports_the_standard_library_only_and_runs_without_ansible(tmp_path):
    with open(FR_FILE) as handle:
        tree = ast.parse(handle.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split('.')[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or '').split('.')[0])
    assert names <= set(sys.stdlib_module_names) | {'__future__'}, names
    write_dumps(tmp_path / 'flight', rank2_stalls())
    # -S: no site-packages (no Ansible), the file loaded by its path as the supervisor does
    code = ('import importlib.util, sys; spec = importlib.util.spec_from_file_location("flight_recorder", sys.argv[1]); '
            'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); '
            'print(m.stall_verdict(sys.argv[2])["why"]); print("ansible" in sys.modules)')
    out = subprocess.run([sys.executable, '-S', '-c', code, FR_FILE, str(tmp_path)], capture_output=True, text=True,
                         check=True, timeout=60).stdout.splitlines()
    assert out == ['rank 2 never entered nccl:all_reduce #8 of process group default_pg (the other 3 ranks wait in it; '
                   'rank 2 last entered nccl:broadcast #7)', 'False']
