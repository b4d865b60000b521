"""training_job state=stopped with flight_dump, run as Ansible runs the module: the options, what a stop
returns of the dumps, and a timeout out of bounds refused; training_progress reads the dumps of the
attempt its ranks are of."""

from test_training_job_module import base, run  # noqa: F401 (base is a fixture)


def test_a_stop_with_flight_dump_returns_the_dumps_and_the_ranks_without_one(tmp_path, base):
    out, _ = run(tmp_path, state='stopped', flight_dump=True, flight_dump_timeout=2, **base)
    assert out.get('failed') is not True, out.get('msg')
    assert out['flight_dumps'] == {} and out['flight_dump_missing'] == [] and out['flight_attempt'] == 1
    out, _ = run(tmp_path, state='stopped', **base)
    assert 'flight_dumps' not in out


def test_a_flight_dump_timeout_out_of_bounds_is_refused_naming_the_node(tmp_path, base):
    out, _ = run(tmp_path, state='stopped', flight_dump=True, flight_dump_timeout=601, **base)
    assert out['failed'] is True and out['msg'] == 'node solo: flight_dump_timeout must be 0 to 600 seconds, got 601'


def test_the_progress_read_takes_the_dumps_of_the_attempt_its_ranks_are_of(tmp_path):
    # attempt 1 timed out and dumped into flight/; attempt 2 (the supervisor's restart) runs, and dumped
    # into flight/attempt-2/ when the stop asked: the read of attempt 2 names attempt 2's stall only
    import os
    import pickle
    import socket
    from module_run import ROOT, run_module
    module = os.path.join(ROOT, 'plugins', 'modules', 'training_progress.py')
    job = tmp_path / 'job'
    (job / 'progress').mkdir(parents=True)
    host = socket.gethostname()
    for rank in range(2):
        (job / 'progress' / ('rank-%d.log' % rank)).write_text(
            '# gpucluster-progress rank=%d host=%s pid=1 world=2 attempt=2 time=1795600000.0\n'
            'step=8 loss=0.4 time=1795600020.0\n' % (rank, host))

    def dumps(folder, seq, behind):
        os.makedirs(str(folder), exist_ok=True)
        for rank in range(2):
            entries = [{'collective_seq_id': seq - 1, 'profiling_name': 'nccl:broadcast', 'state': 'completed',
                        'process_group': ('0', 'default_pg')}]
            if rank != behind:
                entries.append({'collective_seq_id': seq, 'profiling_name': 'nccl:all_reduce', 'state': 'started',
                                'process_group': ('0', 'default_pg')})
            (folder / ('rank_%d' % rank)).write_bytes(pickle.dumps({'entries': entries}))
    dumps(job / 'flight', 5, behind=1)
    dumps(job / 'flight' / 'attempt-2', 9, behind=0)
    out = run_module(module, tmp_path, {'job_id': 't-fr', 'node': 'node-a', 'job_dir': str(job), 'sample_seconds': 0,
                                        'nvidia_smi': '/nonexistent'})
    assert out.get('failed') is not True, out
    assert out['attempt'] == 2 and out['flight']['attempt'] == 2 and out['flight']['not_entered'] == [0]
    assert out['flight']['lines'][0].startswith('process group 0: rank(s) 1 wait in nccl:all_reduce #9')
