"""The whole run in the morning: each attempt's progress files are kept when a restart begins the next one
(gpucluster_progress.keep_earlier_attempt, which every rank runs as it starts), and the report page spans every
attempt: the run's start, one loss line an attempt, the attempts' table; status reads the newest only."""

import os
import sys
import time

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import report as jr

FILES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')
sys.path.insert(0, FILES)
import gpucluster_progress as gp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_fixtures as rf  # noqa: E402


def test_a_restarted_jobs_page_spans_both_attempts_and_status_reads_the_newest(tmp_path):
    folder = str(tmp_path / 'progress')
    rf.write_attempt(folder, 1, range(1, 24))
    time.sleep(0.01)
    rf.write_attempt(folder, 2, range(21, 41), done=True)
    assert sorted(os.listdir(folder)) == ['attempt-1', 'rank-0.log', 'rank-1.log']
    assert sorted(os.listdir(os.path.join(folder, 'attempt-1'))) == ['rank-0.log', 'rank-1.log']
    # status: the newest attempt's files only
    now = jm.read_progress(str(tmp_path), lambda header, rank: True)
    assert sorted(now) == [0, 1] and [jm.progress_attempt(p) for p in now.values()] == [2, 2]
    assert now[0]['steps'][0]['step'] == 21

    progress, events, summary, layout, earlier = jr.read_job(str(tmp_path))
    assert sorted(earlier) == [1] and earlier[1][0]['steps'][-1]['step'] == 23
    data = jr.job_data('j-1', progress, events, summary, layout, earlier=earlier)
    assert [(a['attempt'], a['first_step'], a['last_step']) for a in data['attempts']] == [(1, 1, 23), (2, 21, 40)]
    assert data['summary']['started_at'] == earlier[1][0]['header']['time']
    assert [s['attempt'] for s in data['loss']['attempts']] == [1, 2]
    steps = [p[0] for p in data['loss']['points']]
    assert steps[:23] == list(range(1, 24)) and steps[23:] == list(range(21, 41))
    page = jr.render(data, str(tmp_path))
    assert 'id="loss-attempts"' in page and '2 attempts, one line each' in page and 'class="attempts"' in page
    assert 'The progress files of the attempts before' not in page


def test_a_new_start_of_the_job_id_leaves_nothing_of_an_earlier_starts_attempts(tmp_path):
    folder = str(tmp_path / 'progress')
    rf.write_attempt(folder, 1, range(1, 10))
    rf.write_attempt(folder, 2, range(5, 12))
    rf.write_attempt(folder, 1, range(1, 4))  # the user started the job id again
    assert os.listdir(os.path.join(folder, 'attempt-1')) == []
    progress, events, summary, layout, earlier = jr.read_job(str(tmp_path))
    assert earlier == {}
    data = jr.job_data('j-1', progress, events, summary, layout, earlier=earlier)
    assert [a['attempt'] for a in data['attempts']] == [1]
    assert [p[0] for p in data['loss']['points']] == [1, 2, 3]


def test_the_same_attempt_started_again_starts_its_file_again_and_a_link_is_not_followed(tmp_path):
    folder = tmp_path / 'progress'
    folder.mkdir()
    canary = tmp_path / 'canary'
    canary.write_text('# gpucluster-progress rank=0 host=x attempt=1\n')
    os.symlink(str(canary), str(folder / 'rank-0.log'))
    assert gp.keep_earlier_attempt(str(folder), 0, 2) is None  # a link planted there is neither read nor moved
    assert canary.read_text().startswith('# gpucluster-progress') and not (folder / 'attempt-1').exists()


def test_each_fault_costs_from_its_last_step_to_the_step_the_next_attempt_passes_it_again(tmp_path):
    folder = str(tmp_path / 'progress')
    rf.write_attempt(folder, 1, range(1, 24))
    time.sleep(0.01)
    rf.write_attempt(folder, 2, range(21, 41), done=True)
    progress, _, summary, layout, earlier = jr.read_job(str(tmp_path))
    one = dict((s['step'], s['time']) for s in earlier[1][0]['steps'])
    two = dict((s['step'], s['time']) for s in progress[0]['steps'])
    events = [{'event': 'supervising', 'time': one[1] - 1},
              {'event': 'fault', 'seen': 'failed', 'nodes': ['w1'], 'step': 23, 'last_step_time': one[23],
               'time': one[23] + 5},
              {'event': 'restart', 'attempt': 2, 'resume_step': 20, 'lost_steps': 3, 'time': one[23] + 9},
              {'event': 'training', 'step': 21, 'time': two[21]},
              {'event': 'fault', 'seen': 'stalled', 'nodes': ['w2'], 'step': 40, 'last_step_time': two[40],
               'time': two[40] + 30},
              {'event': 'gave_up', 'time': two[40] + 40, 'why': 'training_restarts (1) used up'}]
    data = jr.job_data('j-1', progress, events, summary, layout, earlier=earlier)
    first, second = data['faults']
    # the cost runs to step 24 of attempt 2 (past the fault's step 23), not to its first step (21, recomputed)
    assert (first['attempt'], first['resume_step'], first['passed_at']) == (2, 20, two[24])
    assert first['cost_s'] == round(two[24] - one[23], 1)
    assert (second['seen'], second['passed_at'], second['cost_s']) == ('stalled', None, None)
    page = jr.render(data, str(tmp_path))
    assert 'class="faults"' in page and 'not passed again' in page
