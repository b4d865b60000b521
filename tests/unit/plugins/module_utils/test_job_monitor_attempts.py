"""A job restarted by the supervisor as a new attempt with fewer ranks: the progress files of the old
attempt left in the job directory are no ranks of the job (job_monitor.fence_attempts on a node,
job_view.fence_rows on the controller), and are reported as stale."""

import os

from ansible_collections.gpucluster.multinode.plugins.filter.training_monitor import training_progress_view
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import report as jr
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_state as js

NOW = 1795600000.0
# attempt 1 ran 4 ranks on head, w1, w2 and died two hours ago; attempt 2 runs 3 ranks (w2 was left out)
ATTEMPT_1 = {0: 'head', 1: 'head', 2: 'w1', 3: 'w2'}
ATTEMPT_2 = {0: 'head', 1: 'head', 2: 'w1'}
HOSTS = ['head', 'w1', 'w2']


def progress_text(rank, host, world, attempt, first, last, end):
    """A rank's progress file: steps first..last, one a second, the last one at end; attempt None
    writes the header of an example before attempts were counted."""
    words = '# gpucluster-progress rank=%d host=%s pid=%d world=%d%s time=%.3f\n' % (
        rank, host, 4000 + rank, world, '' if attempt is None else ' attempt=%d' % attempt, end - (last - first) - 5)
    steps = ''.join('step=%d loss=%.4f time=%.3f wait=0.0100\n' % (s, 1.0 / s, end - (last - s))
                    for s in range(first, last + 1))
    return words + steps


def job_dir(tmp_path, second=True):
    """The job directory as both attempts left it: attempt 1's four files, then attempt 2's three
    written over ranks 0-2 (each attempt opens its ranks' files anew); rank-3.log stays attempt 1's."""
    folder = tmp_path / 'job' / jm.PROGRESS_DIR
    folder.mkdir(parents=True)
    for rank, host in ATTEMPT_1.items():
        (folder / ('rank-%d.log' % rank)).write_text(progress_text(rank, host, 4, 1, 1, 50, NOW - 7200))
    if second:
        for rank, host in ATTEMPT_2.items():
            (folder / ('rank-%d.log' % rank)).write_text(progress_text(rank, host, 3, 2, 41, 80, NOW - 1))
    return str(tmp_path / 'job')


def read(job):
    return {rank: jm.parse_progress(text) for rank, text in jm.read_progress_files(job).items()}


def procs_of(node, ranks, attempt):
    return {rank: {'pid': 100 + rank, 'state': 'S', 'local_rank': rank % 2, 'visible_devices': None,
                   'started_at': NOW - 600, 'attempt': attempt}
            for rank, host in ranks.items() if host == node}


def node_result(node, progress, procs):
    """What training_progress answers on node (its rows, attempt and stale list)."""
    fenced = jm.fence_attempts(progress, procs, host=node)
    rows = jm.node_ranks(node, node, fenced['procs'], fenced['progress'], {}, {}, {}, NOW)
    return {'ranks': rows, 'attempt': fenced['attempt'], 'stale': fenced['stale']}


def test_the_stale_file_of_attempt_1_is_left_out_of_the_ranks_and_the_world_size(tmp_path):
    progress = read(job_dir(tmp_path))
    assert sorted(progress) == [0, 1, 2, 3]  # what is on the storage
    fenced = jm.fence_attempts(progress)
    assert fenced['attempt'] == 2 and sorted(fenced['progress']) == [0, 1, 2]
    assert fenced['stale'] == [{'rank': 3, 'attempt': 1, 'kind': 'progress file', 'host': 'w2'}]
    assert jm.world_size(fenced['progress']) == 3
    assert jm.world_size(progress) == 3  # attempt 1's world=4 never counts, fenced or not
    text = jm.textfile_records(jm.node_ranks('head', 'head', procs_of('head', ATTEMPT_2, 2), fenced['progress'],
                                             {}, {}, {}, NOW), 'j-1', NOW, world=jm.world_size(progress))
    assert 'gpucluster_training_world_size{job_id="j-1",node="head"} 3' in text


def test_the_view_shows_three_ranks_running_and_names_the_stale_file(tmp_path):
    progress = read(job_dir(tmp_path))
    results = [node_result(node, progress, procs_of(node, ATTEMPT_2, 2)) for node in HOSTS]
    assert results[2]['ranks'] == []  # w2 runs nothing of attempt 2, and its old file is no rank
    view = training_progress_view(results, HOSTS, 600, 'j-1')
    assert view['state'] == 'running' and not view['stall']['stalled']
    assert [(r['rank'], r['node'], r['attempt'], r['last_step']) for r in view['ranks']] == [
        (0, 'head', 2, 80), (1, 'head', 2, 80), (2, 'w1', 2, 80)]
    assert view['nodes'] == {'head': 'running', 'w1': 'running', 'w2': 'no ranks'}
    assert view['attempt'] == 2
    # every node read the same stale file: it is listed once
    assert view['stale'] == [{'rank': 3, 'attempt': 1, 'kind': 'progress file', 'host': 'w2'}]
    assert 'left out, of older attempts than attempt 2: rank 3 of attempt 1 (progress file, w2)' in view['lines']
    assert not any(line.startswith('w2 rank 3') for line in view['lines'])
    assert [r['rank'] for r in view['summary']['ranks']] == [0, 1, 2]


def test_without_the_fence_the_same_files_made_the_job_look_failed(tmp_path):
    # what the stale file did before: w2 read it as its rank 3, exited, beside ranks that run
    progress = read(job_dir(tmp_path))
    rows = []
    for node in HOSTS:
        rows += jm.node_ranks(node, node, procs_of(node, ATTEMPT_2, 2), progress, {}, {}, {}, NOW)
    assert [r['rank'] for r in rows] == [0, 1, 2, 3]
    # the rows of a node that read without the fence say their attempt: the view leaves rank 3 out
    view = js.progress_verdict(rows, 600)
    assert view['state'] == 'running' and [r['rank'] for r in view['ranks']] == [0, 1, 2]
    assert view['stale'] == [{'rank': 3, 'attempt': 1, 'kind': 'progress file', 'host': 'w2'}]
    unfenced = js.progress_verdict([dict(r, attempt=None) for r in rows], 600)
    assert unfenced['state'] == 'failed'  # the same rows without attempts: the fixture would show the bug


def test_a_new_attempt_still_loading_is_not_stalled_by_the_old_attempt_s_steps(tmp_path):
    # attempt 2's ranks run (DeepSpeed builds its ops, the rendezvous waits) but wrote no file yet: every
    # file is attempt 1's, its last step two hours old; head's processes say GPUCLUSTER_ATTEMPT=2
    progress = read(job_dir(tmp_path, second=False))
    head = node_result('head', progress, procs_of('head', ATTEMPT_2, 2))
    assert head['attempt'] == 2 and [s['rank'] for s in head['stale']] == [0, 1, 2, 3]
    assert [(r['rank'], r['alive'], r['last_step'], r['attempt']) for r in head['ranks']] == [
        (0, True, None, 2), (1, True, None, 2)]
    # w1 and w2 read before their attempt 2 ranks started: they still see attempt 1's files as the job's
    w1 = node_result('w1', progress, {})
    w2 = node_result('w2', progress, {})
    assert [(r['rank'], r['alive'], r['attempt']) for r in w1['ranks']] == [(2, False, 1)]
    view = training_progress_view([head, w1, w2], HOSTS, 600, 'j-1')
    assert view['state'] == 'running' and not view['stall']['stalled']
    assert [r['rank'] for r in view['ranks']] == [0, 1] and view['attempt'] == 2
    assert [(s['rank'], s['attempt']) for s in view['stale']] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    # read without the fence, attempt 1's old steps would have been taken for attempt 2's: stalled
    old = jm.node_ranks('head', 'head', procs_of('head', ATTEMPT_2, 2), progress, {}, {}, {}, NOW)
    assert js.progress_verdict([dict(r, attempt=None) for r in old], 600)['state'] == 'stalled'


def test_one_attempt_and_headers_without_attempt_keep_the_old_behaviour(tmp_path):
    folder = tmp_path / 'job' / jm.PROGRESS_DIR
    folder.mkdir(parents=True)
    for rank, host in ATTEMPT_1.items():
        (folder / ('rank-%d.log' % rank)).write_text(progress_text(rank, host, 4, None, 1, 50, NOW - 1))
    progress = read(str(tmp_path / 'job'))
    fenced = jm.fence_attempts(progress, procs_of('head', ATTEMPT_1, None))
    assert fenced['attempt'] == 1 and fenced['stale'] == [] and fenced['progress'] == progress
    assert sorted(fenced['procs']) == [0, 1] and jm.world_size(progress) == 4
    results = [node_result(node, progress, procs_of(node, ATTEMPT_1, None)) for node in HOSTS]
    view = training_progress_view(results, HOSTS, 600, 'j-1')
    assert view['state'] == 'running' and [r['rank'] for r in view['ranks']] == [0, 1, 2, 3]
    assert view['stale'] == [] and not any(line.startswith('left out') for line in view['lines'])
    assert {r['attempt'] for r in view['ranks']} == {1}


def test_a_lingering_process_of_an_older_attempt_is_no_rank(tmp_path):
    progress = read(job_dir(tmp_path))
    procs = dict(procs_of('head', ATTEMPT_2, 2))
    procs[3] = dict(procs_of('w2', ATTEMPT_1, 1)[3], pid=999)  # attempt 1's rank 3, hung in I/O on this node
    fenced = jm.fence_attempts(progress, procs, host='head')
    assert sorted(fenced['procs']) == [0, 1]
    assert {'rank': 3, 'attempt': 1, 'kind': 'process', 'pid': 999, 'host': 'head'} in fenced['stale']


def test_attempt_numbers_from_headers_and_the_environment():
    assert [jm.attempt_number(v) for v in (2, '3', ' 4 ', None, '', 'x', 0, -2, '1.5', True)] == [
        2, 3, 4, 1, 1, 1, 1, 1, 1, 1]
    header = '# gpucluster-progress rank=1 host=node-2 pid=4242 world=4 attempt=2 time=1764000000.0\n'
    assert jm.progress_attempt(jm.parse_progress(header)) == 2
    assert jm.progress_attempt(jm.parse_progress(header.replace(' attempt=2', ''))) == 1


def test_the_examples_header_is_read_with_its_attempt(tmp_path, monkeypatch):
    import importlib.util
    examples = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')
    spec = importlib.util.spec_from_file_location('gpucluster_progress', os.path.join(examples, 'gpucluster_progress.py'))
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    monkeypatch.setenv('GPUCLUSTER_ATTEMPT', '2')
    progress = helper.Progress(3, 3, str(tmp_path), tensorboard_dir='')
    progress.step(1, 0.5)
    progress.done(1)
    parsed = jm.parse_progress((tmp_path / 'rank-3.log').read_text())
    assert (parsed['header']['world'], jm.progress_attempt(parsed)) == (3, 2)


def test_the_report_page_counts_the_newest_attempt_only(tmp_path):
    progress, _events, _summary, _layout, earlier = jr.read_job(job_dir(tmp_path))
    assert sorted(progress) == [0, 1, 2] and jm.world_size(progress) == 3
    # the older attempt's file a rank of the newest has not (rank 3 of world 4) is that attempt's, for the plots
    assert sorted(earlier) == [1] and 3 in earlier[1]


def test_a_read_of_nothing_names_no_attempt(tmp_path):
    # no file, no process (the restarted job has not begun here): the supervisor takes the read as it is
    assert jm.fence_attempts({}, {}) == {'attempt': None, 'progress': {}, 'procs': {}, 'stale': []}
    view = training_progress_view([node_result(node, {}, {}) for node in HOSTS], HOSTS, 600, 'j-1')
    assert view['attempt'] is None and view['stale'] == [] and view['state'] == 'not running'
    # attempt 1's files only (attempt 2 not started anywhere yet): the view says attempt 1, the supervisor
    # of attempt 2 takes it for a read of the earlier attempt
    progress = read(job_dir(tmp_path, second=False))
    view = training_progress_view([node_result(node, progress, {}) for node in HOSTS], HOSTS, 600, 'j-1')
    assert view['attempt'] == 1 and view['stale'] == []
