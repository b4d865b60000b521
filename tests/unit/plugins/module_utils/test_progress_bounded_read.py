"""A node's read of the job's progress files costs the same on the job's first minute and its seventh day
(monitor.read_progress): every file's beginning (its header: host, attempt, world), and the end of this node's
ranks only; the figures a read gives of a long file are those of the whole file."""

import os

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm

T0 = 1795589360.0


def _write(path, rank, host, steps, gap=0.5, done=False, beats=0, attempt=1):
    lines = ['# gpucluster-progress rank=%d host=%s pid=%d world=4 attempt=%d time=%.3f'
             % (rank, host, 1000 + rank, attempt, T0)]
    lines += ['step=%d loss=%.6f time=%.3f wait=0.0010' % (s, 10.0 / s, T0 + s * gap) for s in range(1, steps + 1)]
    lines += ['# heartbeat phase=checkpoint time=%.3f since=%.3f' % (T0 + steps * gap + b + 1, T0 + steps * gap + 1)
              for b in range(beats)]
    if done:
        lines.append('# done step=%d time=%.3f peak_rss_kib=315480' % (steps, T0 + steps * gap))
    with open(path, 'w') as handle:
        handle.write('\n'.join(lines) + '\n')


def _job(tmp_path, steps, ranks=(('a', 0), ('a', 1), ('b', 2), ('b', 3)), **kw):
    folder = tmp_path / 'progress'
    folder.mkdir()
    for host, rank in ranks:
        _write(str(folder / ('rank-%d.log' % rank)), rank, host, steps, **kw)
    return str(tmp_path)


def _mine_on(host):
    return lambda header, rank: header.get('host') == host


def test_a_long_file_of_this_nodes_rank_gives_the_figures_of_the_whole_file(tmp_path):
    job = _job(tmp_path, 20000, beats=3)
    now = T0 + 20000 * 0.5 + 5
    whole = dict((rank, jm.parse_progress(text)) for rank, text in jm.read_progress_files(job).items())
    bounded = jm.read_progress(job, _mine_on('a'))
    assert bounded[0]['skipped'] > 1000000 and whole[0]['steps'][-1]['step'] == 20000
    for key in ('last_step', 'last_step_time', 'last_loss', 'steps_per_s', 'step_s', 'wait_s', 'compute_s',
                'mean_steps_per_s', 'phase', 'phase_s', 'seconds_since_heartbeat', 'started_at', 'done'):
        assert jm.progress_figures(bounded[0], now)[key] == jm.progress_figures(whole[0], now)[key], key
    assert bounded[0]['tail'] == whole[0]['tail'] and bounded[0]['header'] == whole[0]['header']
    # another node's rank: its header only (its host, attempt and world), none of its end
    assert bounded[2]['header'] == whole[2]['header'] and bounded[2]['steps'][-1]['step'] < 100
    assert jm.world_size(bounded) == 4
    assert jm.fence_attempts(bounded)['attempt'] == 1


def test_a_finished_file_says_done_and_a_short_one_is_read_whole(tmp_path):
    job = _job(tmp_path, 30000, done=True)
    rank = jm.read_progress(job, _mine_on('a'))[1]
    assert rank['done']['step'] == 30000 and rank['steps'][-1]['step'] == 30000
    short = tmp_path / 'short'
    short.mkdir()
    job = _job(short, 20)
    parsed = jm.read_progress(job, _mine_on('a'))
    assert parsed[0]['skipped'] == 0 and [s['step'] for s in parsed[0]['steps']] == list(range(1, 21))
    assert [s['step'] for s in parsed[2]['steps']] == list(range(1, 21))  # short: the beginning is all of it


def test_a_link_or_a_fifo_at_a_rank_s_name_is_not_followed_and_holds_nothing(tmp_path):
    job = _job(tmp_path, 10, ranks=(('a', 0),))
    secret = tmp_path / 'secret'
    secret.write_text('# gpucluster-progress rank=1 host=a world=4\nstep=1 loss=1 time=1\n')
    os.symlink(str(secret), str(tmp_path / 'progress' / 'rank-1.log'))
    os.mkfifo(str(tmp_path / 'progress' / 'rank-2.log'))
    parsed = jm.read_progress(job, _mine_on('a'))
    assert parsed[0]['steps'][-1]['step'] == 10
    assert parsed[1]['header'] == {} and parsed[1]['steps'] == [] and parsed[2]['header'] == {}


def test_a_line_cut_by_the_ends_is_never_taken_for_a_step(tmp_path):
    path = str(tmp_path / 'rank-0.log')
    _write(path, 0, 'a', 5000)
    text, skipped = jm.read_bounded(path, tail_bytes=1000)
    assert skipped > 0
    for line in text.splitlines():
        assert line.startswith(('# gpucluster-progress', 'step=')) and (line.startswith('#') or line.endswith('0.0010'))
