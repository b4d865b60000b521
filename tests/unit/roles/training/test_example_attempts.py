"""Attempts of a job fenced from each other in the examples' helper (roles/training/files/gpucluster_progress.py):
the attempt in the progress header, the checkpoint directory claimed by the newest attempt, an older
attempt's save refused with exit code 75, and the attempt in the completion marker. The examples run as
two ranks in test_example_attempts_torch.py."""

import json
import os
import sys

import pytest

FILES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')
sys.path.insert(0, FILES)

import gpucluster_progress as gp  # noqa: E402


@pytest.fixture(autouse=True)
def job_env(monkeypatch):
    monkeypatch.delenv('GPUCLUSTER_ATTEMPT', raising=False)
    monkeypatch.setenv('GPUCLUSTER_JOB_ID', 'job-a')


def test_the_attempt_comes_from_gpucluster_attempt_and_is_1_without_a_good_one(monkeypatch):
    assert gp.attempt({'GPUCLUSTER_ATTEMPT': '3'}) == 3
    assert gp.attempt({'GPUCLUSTER_ATTEMPT': ' 2 '}) == 2
    for bad in ('', 'two', '0', '-1', '1.5'):
        assert gp.attempt({'GPUCLUSTER_ATTEMPT': bad}) == 1, bad
    assert gp.attempt({}) == 1 and gp.attempt() == 1
    monkeypatch.setenv('GPUCLUSTER_ATTEMPT', '4')
    assert gp.attempt() == 4


def test_the_progress_header_names_the_attempt(tmp_path, monkeypatch):
    monkeypatch.setenv('GPUCLUSTER_ATTEMPT', '2')
    progress = gp.Progress(1, 3, str(tmp_path), tensorboard_dir='')
    progress.done(0)
    header = (tmp_path / 'rank-1.log').read_text().splitlines()[0].split()
    assert header[:2] == ['#', 'gpucluster-progress']
    fields = dict(word.split('=', 1) for word in header[2:])
    assert (fields['rank'], fields['world'], fields['attempt']) == ('1', '3', '2')
    gp.Progress(0, 3, str(tmp_path), tensorboard_dir='', attempt=5).done(0)
    assert ' attempt=5 ' in (tmp_path / 'rank-0.log').read_text().splitlines()[0]


def test_the_newest_attempt_claims_the_directory_and_an_older_one_does_not(tmp_path, capsys):
    ckpt = tmp_path / 'ckpt'
    assert gp.claim_checkpoints(str(ckpt), 1) == 1  # the directory is made
    assert (ckpt / 'ATTEMPT').read_text() == '1\njob=job-a\n'
    assert gp.claim_checkpoints(str(ckpt), 2) == 2
    assert (ckpt / 'ATTEMPT').read_text() == '2\njob=job-a\n'
    assert gp.claim_checkpoints(str(ckpt), 2) == 2  # the same attempt again (a rank 0 restarted by torchrun)
    capsys.readouterr()
    # attempt 1 started again after attempt 2: the directory stays attempt 2's
    assert gp.claim_checkpoints(str(ckpt), 1) == 2
    assert (ckpt / 'ATTEMPT').read_text() == '2\njob=job-a\n'
    assert capsys.readouterr().out == 'attempt 1 starts after attempt 2 claimed %s: its saves will be refused\n' % ckpt
    assert sorted(os.listdir(str(ckpt))) == ['ATTEMPT']  # written through a temporary file, none left
    assert (gp.checkpoint_owner(str(ckpt)), gp.checkpoint_claim(str(ckpt))) == (2, (2, 'job-a'))


def test_another_job_that_resumes_from_the_directory_takes_it_over(tmp_path, capsys):
    # job-a was restarted twice; a new job (its attempt 1) resumes from its checkpoints and saves there
    ckpt = tmp_path / 'ckpt'
    gp.claim_checkpoints(str(ckpt), 3)
    assert gp.claim_checkpoints(str(ckpt), 1, job='job-b') == 1
    assert (ckpt / 'ATTEMPT').read_text() == '1\njob=job-b\n'
    assert gp.checkpoint_fence(str(ckpt), 1, job='job-b') == 1
    # and job-a's attempt 3, still running somewhere, is fenced off it
    with pytest.raises(SystemExit) as stop:
        gp.checkpoint_fence(str(ckpt), 3)
    assert stop.value.code == 75
    assert capsys.readouterr().out.endswith('attempt 3 is fenced: attempt 1 of job job-b owns %s; not saving\n' % ckpt)


def test_an_older_attempt_refuses_to_save_with_exit_code_75(tmp_path, capsys):
    ckpt = tmp_path / 'ckpt'
    assert gp.checkpoint_fence(str(ckpt), 1) is None  # nothing claimed it: a run before attempts were fenced
    gp.claim_checkpoints(str(ckpt), 2)
    assert gp.checkpoint_fence(str(ckpt), 2) == 2 and gp.checkpoint_fence(str(ckpt), 3) == 2
    assert capsys.readouterr().out == ''
    with pytest.raises(SystemExit) as stop:
        gp.checkpoint_fence(str(ckpt), 1)
    assert stop.value.code == gp.FENCED_EXIT == 75
    assert capsys.readouterr().out == 'attempt 1 is fenced: attempt 2 owns %s; not saving\n' % ckpt
    assert gp.fenced(str(ckpt), 1) == 'attempt 1 is fenced: attempt 2 owns %s; not saving' % ckpt
    assert gp.fenced(str(ckpt), 2) is None


def test_the_marker_records_the_attempt_and_a_fenced_attempt_never_moves_latest(tmp_path, capsys, monkeypatch):
    ckpt = tmp_path / 'ckpt'
    monkeypatch.setenv('GPUCLUSTER_ATTEMPT', '1')
    gp.claim_checkpoints(str(ckpt))
    (ckpt / 'step10').mkdir()
    record = gp.commit_checkpoint(str(ckpt), 'step10', 10, 4)
    assert record['attempt'] == 1
    assert json.loads((ckpt / 'step10' / gp.CHECKPOINT_DONE).read_text())['attempt'] == 1
    # attempt 2 starts and claims the directory while attempt 1 writes step20: its commit is refused
    gp.claim_checkpoints(str(ckpt), 2)
    (ckpt / 'step20').mkdir()
    with pytest.raises(SystemExit) as stop:
        gp.commit_checkpoint(str(ckpt), 'step20', 20, 4)
    assert stop.value.code == 75
    assert capsys.readouterr().out.endswith('attempt 1 is fenced: attempt 2 owns %s; not saving\n' % ckpt)
    assert not (ckpt / 'step20' / gp.CHECKPOINT_DONE).exists()
    assert (ckpt / 'latest').read_text() == 'step10\n'
    assert gp.commit_checkpoint(str(ckpt), 'step20', 20, 3, attempt=2)['attempt'] == 2
    tag, record, _note = gp.latest_complete_checkpoint(str(ckpt))
    assert (tag, record['attempt'], record['world_size']) == ('step20', 2, 3)


def test_a_directory_without_a_readable_attempt_file_fences_nobody(tmp_path):
    (tmp_path / 'ATTEMPT').write_text('not a number\n')
    assert gp.checkpoint_claim(str(tmp_path)) == (None, None)
    assert gp.checkpoint_fence(str(tmp_path), 1) is None
    assert gp.claim_checkpoints(str(tmp_path), 1) == 1 and (tmp_path / 'ATTEMPT').read_text() == '1\njob=job-a\n'


def test_without_a_process_group_rank_0_s_own_choice_is_said(tmp_path, capsys):
    (tmp_path / 'step4').mkdir()
    gp.commit_checkpoint(str(tmp_path), 'step4', 4, 1)
    tag, record, note = gp.agreed_checkpoint(str(tmp_path), 0, None)
    assert (tag, record['step'], note) == ('step4', 4, None)
    assert capsys.readouterr().out == 'resuming from step4 (step 4), chosen by rank 0\n'
    assert gp.resume_line('global_step40', {}) == 'resuming from global_step40 (step 40), chosen by rank 0'
