"""The examples' checkpoints are atomic: `latest` moves last, and a restart never picks a tag whose
save did not finish (roles/training/files/gpucluster_progress.py, used by train_tiny.py)."""

import json
import os
import sys

FILES = os.path.join(os.path.dirname(__file__), '..', '..', 'roles', 'training', 'files')
sys.path.insert(0, FILES)

import gpucluster_progress as gp  # noqa: E402


def _tag(directory, name, complete, step=None, world=3):
    """A DeepSpeed tag directory as its ranks leave it; complete adds the marker rank 0 writes last."""
    path = directory / name
    path.mkdir()
    (path / 'mp_rank_00_model_states.pt').write_bytes(b'model')
    (path / 'zero_pp_rank_0_mp_rank_00_optim_states.pt').write_bytes(b'optim')
    if complete:
        gp.commit_checkpoint(str(directory), name, step, world)


def test_a_save_commits_the_marker_then_moves_latest(tmp_path):
    _tag(tmp_path, 'step10', True, 10)
    assert (tmp_path / 'latest').read_text() == 'step10\n'
    record = json.loads((tmp_path / 'step10' / gp.CHECKPOINT_DONE).read_text())
    assert record['step'] == 10 and record['world_size'] == 3
    _tag(tmp_path, 'step20', True, 20, world=2)
    assert (tmp_path / 'latest').read_text() == 'step20\n'
    tag, record, note = gp.latest_complete_checkpoint(str(tmp_path))
    assert (tag, record['step'], record['world_size'], note) == ('step20', 20, 2, None)
    # nothing of the temporary files is left beside them
    assert sorted(os.listdir(tmp_path)) == ['latest', 'step10', 'step20']


def test_a_node_lost_in_the_middle_of_a_save_resumes_from_the_previous_complete_tag(tmp_path):
    _tag(tmp_path, 'step10', True, 10)
    _tag(tmp_path, 'step20', True, 20)
    # step30: the ranks wrote part of their files, then a node died: no marker, latest not moved
    _tag(tmp_path, 'step30', False)
    tag, record, note = gp.latest_complete_checkpoint(str(tmp_path))
    assert (tag, record['step'], note) == ('step20', 20, None)


def test_a_latest_that_names_an_unfinished_tag_is_passed_over_and_said(tmp_path):
    # a tag saved again after a resume from an older step: its marker is removed before the save,
    # and latest still names it while the new save is cut short
    _tag(tmp_path, 'step10', True, 10)
    _tag(tmp_path, 'step20', True, 20)
    os.unlink(str(tmp_path / 'step20' / gp.CHECKPOINT_DONE))
    tag, record, note = gp.latest_complete_checkpoint(str(tmp_path))
    assert (tag, record['step']) == ('step10', 10)
    assert note == ('latest names step20, which is not complete (no gpucluster.json: its save did not finish); '
                    'resuming from step10 (step 10), the newest complete one')


def test_no_complete_checkpoint_is_none_with_the_reason(tmp_path):
    _tag(tmp_path, 'step30', False)
    assert gp.latest_complete_checkpoint(str(tmp_path)) == (
        None, None, 'no latest file under %s, and no complete checkpoint' % tmp_path)
    assert gp.latest_complete_checkpoint(str(tmp_path / 'missing'))[0] is None


def test_a_checkpoint_saved_before_the_marker_existed_is_loaded_as_deepspeed_would(tmp_path):
    _tag(tmp_path, 'step40', False)
    (tmp_path / 'latest').write_text('step40')
    tag, record, note = gp.latest_complete_checkpoint(str(tmp_path))
    assert (tag, record) == ('step40', {})
    assert note == 'latest names step40, saved without gpucluster.json (an older save): loaded as it is'


def test_a_marker_that_is_not_a_record_does_not_make_a_tag_complete(tmp_path):
    _tag(tmp_path, 'step10', True, 10)
    _tag(tmp_path, 'step20', False)
    (tmp_path / 'step20' / gp.CHECKPOINT_DONE).write_text('{"step": ')  # cut short
    (tmp_path / 'latest').write_text('step20\n')
    assert gp.latest_complete_checkpoint(str(tmp_path))[0] == 'step10'
