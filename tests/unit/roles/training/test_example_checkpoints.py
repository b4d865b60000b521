"""The examples' checkpoints are atomic: `latest` moves last, and a restart never picks a tag whose
save did not finish (roles/training/files/gpucluster_progress.py, used by train_tiny.py)."""

import json
import os
import sys

FILES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')
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


# ----- heartbeats while a save runs (Progress.saving) ---------------------------------------------
def _beats(path):
    return [line for line in path.read_text().splitlines() if line.startswith('# heartbeat ')]


def _fields(line):
    return dict(word.split('=', 1) for word in line.split()[2:])


def test_saving_beats_while_a_slow_save_runs_and_leaves_no_thread(tmp_path):
    import threading
    import time
    progress = gp.Progress(0, 2, str(tmp_path), tensorboard_dir='')
    progress.step(12, 0.5)
    before = set(threading.enumerate())
    with progress.saving(12, interval=0.1) as began:
        alive = [t for t in threading.enumerate() if t not in before]
        assert [t.name for t in alive] == ['gpucluster-heartbeat'] and alive[0].daemon
        time.sleep(0.35)  # the blocking save
        during = len(_beats(tmp_path / 'rank-0.log'))
    assert set(threading.enumerate()) == before and not alive[0].is_alive()
    beats = _beats(tmp_path / 'rank-0.log')
    # one on the way in, about one every 0.1 s while it saved, then train once it ended
    assert during >= 3, beats
    assert all(_fields(b)['phase'] == 'checkpoint' for b in beats[:-1])
    assert all(_fields(b)['step'] == '12' and float(_fields(b)['since']) == round(began, 3) for b in beats[:-1])
    times = [float(_fields(b)['time']) for b in beats]
    assert times == sorted(times) and times[-2] - times[0] >= 0.2
    assert _fields(beats[-1]) == {'phase': 'train', 'step': '12', 'time': _fields(beats[-1])['time']}
    time.sleep(0.25)
    assert len(_beats(tmp_path / 'rank-0.log')) == len(beats)  # no heartbeat after the save
    progress.done(12)
    assert (tmp_path / 'rank-0.log').read_text().splitlines()[-1].startswith('# done step=12 ')


def test_a_save_that_raises_stops_the_thread_and_says_no_train(tmp_path):
    import threading
    import time
    progress = gp.Progress(0, 1, str(tmp_path), tensorboard_dir='')
    before = set(threading.enumerate())
    try:
        with progress.saving(3, interval=0.05):
            time.sleep(0.12)
            raise OSError('No space left on device')
    except OSError:
        pass
    assert set(threading.enumerate()) == before
    beats = _beats(tmp_path / 'rank-0.log')
    assert len(beats) >= 2 and all(_fields(b)['phase'] == 'checkpoint' for b in beats)


def test_saving_without_a_progress_file_writes_nothing_and_still_ends_its_thread(tmp_path):
    import threading
    progress = gp.Progress(1, 2, '', tensorboard_dir='')
    before = set(threading.enumerate())
    with progress.saving(5, interval=0.01):
        pass
    assert set(threading.enumerate()) == before and not os.listdir(str(tmp_path))


def test_the_heartbeat_interval_is_an_option_of_the_examples():
    import argparse
    parser = argparse.ArgumentParser()
    gp.add_arguments(parser)
    assert parser.parse_args([]).heartbeat_seconds == gp.HEARTBEAT_SECONDS == 10.0
    assert parser.parse_args(['--heartbeat-seconds', '2.5']).heartbeat_seconds == 2.5
    assert gp.heartbeat_line('checkpoint', 12, now=7.0, since=5.0) == \
        'gpucluster-heartbeat phase=checkpoint step=12 since=5.000 time=7.000'


def test_both_examples_save_inside_progress_saving():
    import ast
    for name, save_call in (('train_tiny.py', 'save'), ('train_fsdp.py', 'dcp.save')):
        with open(os.path.join(FILES, name)) as handle:
            tree = ast.parse(handle.read())
        inside, outside = 0, 0
        savings = [w for w in ast.walk(tree) if isinstance(w, ast.With)
                   and any(ast.unparse(i.context_expr).startswith('progress.saving(') for i in w.items)]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or ast.unparse(node.func) != save_call:
                continue
            wrapped = any(any(c is node for c in ast.walk(w)) for w in savings)
            inside, outside = inside + wrapped, outside + (not wrapped)
        assert inside >= 1 and outside == 0, (name, inside, outside)
        with open(os.path.join(FILES, name)) as handle:
            text = handle.read()
        assert "heartbeat('checkpoint'" not in text and 'heartbeat_seconds' in text, name


# ----- resume_point: what the training role asks the head before a start with training_resume_from -----
def test_the_roles_resume_point_is_the_checkpoint_the_examples_load(tmp_path):
    _tag(tmp_path, 'step10', True, 10)
    _tag(tmp_path, 'step20', True, 20)
    _tag(tmp_path, 'step30', False)  # cut short: the examples skip it, and so does the role
    point = gp.resume_point(str(tmp_path))
    assert (point['tag'], point['step'], point['complete']) == ('step20', 20, True)
    assert (point['tag'], point['step']) == (gp.latest_complete_checkpoint(str(tmp_path))[0], 20)


def test_a_script_that_writes_no_marker_resumes_from_its_newest_directory_by_name(tmp_path):
    # a user's script saving checkpoint-<step>/ without gpucluster.json or latest: the newest by its number
    for name in ('checkpoint-500', 'checkpoint-1500', 'checkpoint-1000'):
        (tmp_path / name).mkdir()
    (tmp_path / 'notes.txt').write_text('not a checkpoint')
    point = gp.resume_point(str(tmp_path))
    assert (point['tag'], point['step'], point['complete']) == ('checkpoint-1500', None, False)
    assert point['note'].endswith('checkpoint-1500, the newest by its name, was saved without gpucluster.json '
                                  '(the script that resumes from it decides whether it is whole)')


def test_a_directory_with_no_checkpoint_or_none_at_all_has_no_resume_point(tmp_path):
    (tmp_path / 'notes.txt').write_text('not a checkpoint')
    assert gp.resume_point(str(tmp_path)) == {
        'tag': None, 'step': None, 'complete': False,
        'note': 'no latest file under %s, and no complete checkpoint' % tmp_path}
    missing = gp.resume_point(str(tmp_path / 'missing'))
    assert missing['tag'] is None and missing['note'].endswith('cannot be read (No such file or directory)')


def test_the_resume_point_is_one_json_line_on_the_command_line_as_the_role_runs_it(tmp_path):
    import subprocess
    _tag(tmp_path, 'step10', True, 10)
    out = subprocess.run([sys.executable, os.path.join(FILES, 'gpucluster_progress.py'), '--resume-point',
                          str(tmp_path)], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == {'tag': 'step10', 'step': 10, 'complete': True, 'note': None}
    bad = subprocess.run([sys.executable, os.path.join(FILES, 'gpucluster_progress.py')], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and 'usage: gpucluster_progress.py --resume-point' in bad.stderr
