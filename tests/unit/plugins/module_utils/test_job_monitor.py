"""job_monitor on recorded progress files, a recorded /proc tree and recorded nvidia-smi output."""

import os
import shutil

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpucluster.multinode.plugins.module_utils import job_monitor as jm
from ansible_collections.gpucluster.multinode.plugins.module_utils import nvidia_smi as ns

FIX = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'job_monitor')
NVSMI = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'nvidia_smi')
# the SIGSTOP sample: rank 1 (pid 15469) was stopped after step 95; the files were copied at this time
SIGSTOP_READ_AT = 1795589350.0


def read(*parts):
    with open(os.path.join(FIX, *parts)) as handle:
        return handle.read()


def progress(*parts):
    return jm.parse_progress(read(*parts))


# ----- progress files ----------------------------------------------------------------------------
def test_parse_progress_reads_header_steps_and_done_line():
    parsed = progress('slow-rank-2', 'rank-2.log')
    assert parsed['header']['rank'] == 2 and parsed['header']['world'] == 3
    assert [s['step'] for s in parsed['steps']] == list(range(1, 61))
    assert parsed['done']['step'] == 60 and parsed['done']['peak_rss_kib'] > 100000


def test_parse_progress_skips_a_half_written_line_and_notes():
    text = read('slow-rank-2', 'rank-0.log') + 'a note of the script\nstep=61 loss=0.1 ti'
    parsed = jm.parse_progress(text)
    assert parsed['steps'][-1]['step'] == 60


def test_the_injected_delay_shows_as_compute_time_of_the_slow_rank():
    figures = {}
    for rank in (0, 1, 2):
        parsed = progress('slow-rank-2', 'rank-%d.log' % rank)
        figures[rank] = jm.progress_figures(parsed, parsed['steps'][-1]['time'] + 0.5)
    # rank 2 slept 0.1 s before every step; ranks 0 and 1 waited for it at the synchronisation point
    assert figures[2]['compute_s'] > 0.09
    assert figures[0]['compute_s'] < 0.05 and figures[0]['wait_s'] > 0.07
    assert figures[0]['steps_per_s'] == pytest.approx(figures[2]['steps_per_s'], rel=0.05)  # synchronous


def test_steps_per_second_fall_to_zero_when_no_step_came_in_the_window():
    parsed = progress('sigstop-rank-0.log')
    later = parsed['steps'][-1]['time'] + 600
    figures = jm.progress_figures(parsed, later)
    assert figures['seconds_since_step'] == pytest.approx(600, abs=0.2)
    assert figures['steps_per_s'] < 0.01


def test_a_file_without_steps_gives_no_figures():
    figures = jm.progress_figures(jm.parse_progress('# gpucluster-progress rank=0 host=a pid=1 world=1\n'), 100.0)
    assert figures['last_step'] is None and figures['steps_per_s'] is None


# ----- /proc -------------------------------------------------------------------------------------
@pytest.fixture
def proc(tmp_path):
    root = tmp_path / 'proc'
    shutil.copytree(os.path.join(FIX, 'proc'), str(root))
    return root


def uid_of(root):
    for line in (root / '15468' / 'status').read_text().splitlines():
        if line.startswith('Uid:'):
            return int(line.split()[1])
    raise AssertionError('no Uid line')


def test_rank_processes_are_the_job_processes_with_rank(proc):
    ranks = jm.rank_processes('rec-1', uid_of(proc), str(proc))
    assert sorted(ranks) == [0, 1]
    assert ranks[0]['pid'] == 15468 and ranks[1]['pid'] == 15469
    assert ranks[1]['local_rank'] == 1 and ranks[1]['state'] in ('S', 'R')


def test_another_job_has_no_ranks_here(proc):
    assert jm.rank_processes('rec-2', uid_of(proc), str(proc)) == {}


def test_memory_from_recorded_status(proc):
    mem = jm.memory(15468, str(proc))
    assert mem['rss_kib'] > 50000 and mem['peak_rss_kib'] >= mem['rss_kib']
    assert jm.memory(99999, str(proc)) == {'rss_kib': None, 'peak_rss_kib': None}


def test_cpu_sample_measures_the_ticks_between_two_reads(tmp_path):
    stat = (tmp_path / '7')
    stat.mkdir()
    before = read('proc', '15468', 'stat')
    after = read('proc', '15468', 'stat.after-1s')
    (stat / 'stat').write_text(before)

    def swap(_interval):
        (stat / 'stat').write_text(after)
    cpu = jm.cpu_sample([7], str(tmp_path), sleep=swap, interval=1.0, ticks_per_s=100)
    expected = jm.parse_cpu_ticks(after)['ticks'] - jm.parse_cpu_ticks(before)['ticks']
    assert cpu[7] == pytest.approx(float(expected))
    assert jm.cpu_sample([8], str(tmp_path), sleep=None)[8] is None


def test_the_stopped_rank_is_held(proc):
    shutil.copy(str(proc / '15469' / 'stat.sigstop'), str(proc / '15469' / 'stat'))
    ranks = jm.rank_processes('rec-1', uid_of(proc), str(proc))
    assert ranks[1]['state'] == 'T'


# ----- GPUs --------------------------------------------------------------------------------------
def h100_gpus():
    with open(os.path.join(NVSMI, 'h100-sxm-x1-driver580', 'query-gpu.csv')) as handle:
        return jm.gpu_rows_by_index(ns.parse_query_csv(handle.read()))


def test_gpu_figures_from_recorded_nvidia_smi():
    gpus = h100_gpus()
    assert list(gpus) == [0]
    assert gpus[0]['memory_total_mib'] == 81559
    assert isinstance(gpus[0]['utilization_pct'], int)


def test_rank_gpu_follows_cuda_visible_devices():
    gpus = h100_gpus()
    assert jm.rank_gpu(0, None, gpus)['index'] == 0
    assert jm.rank_gpu(0, '0', gpus)['index'] == 0
    assert jm.rank_gpu(0, gpus[0]['uuid'], gpus)['index'] == 0
    assert jm.rank_gpu(1, '0', gpus) is None
    assert jm.rank_gpu(0, None, {}) is None


# ----- the cluster's view ------------------------------------------------------------------------
def rows_from(folder, hosts, now_offset=0.5, held=None):
    rows = []
    for rank, node in hosts.items():
        parsed = progress(folder, 'rank-%d.log' % rank) if folder else progress('sigstop-rank-%d.log' % rank)
        now = (parsed['steps'][-1]['time'] + now_offset) if folder else SIGSTOP_READ_AT + now_offset
        row = {'node': node, 'rank': rank, 'alive': True, 'held': None}
        row.update(jm.progress_figures(parsed, now))
        if held and rank in held:
            row['held'] = jm.HELD_STATES['T']
        rows.append(row)
    return rows


def test_the_node_of_the_slow_rank_is_named_slowest():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    node, why = jm.slowest_node(rows)
    assert node == 'worker-2', why


def test_no_node_is_named_when_all_compute_alike():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'worker-1'})
    node, why = jm.slowest_node(rows)
    assert node is None and 'no node' in why


def test_a_stopped_rank_makes_the_job_stalled_naming_its_node():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=60, held={1})
    result = jm.verdict(rows, stall_seconds=30)
    assert result['state'] == 'stalled'
    assert result['stall']['nodes'] == ['worker-1'] and result['stall']['ranks'] == [1]
    assert any('rank 1 on worker-1' in line for line in result['lines'])


def test_not_stalled_before_the_bound():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=0, held={1})
    assert jm.verdict(rows, stall_seconds=30)['state'] == 'running'


def test_a_stall_without_held_rank_names_the_lowest_step():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=60)
    rows[1]['last_step'] -= 1
    st = jm.stall(rows, 30)
    assert st['stalled'] and st['nodes'] == ['worker-1']


def test_an_exited_rank_beside_live_ones_is_failed_and_all_finished_is_finished():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    rows[2].update(alive=False, exit='exited')
    assert jm.verdict(rows, 300)['state'] == 'failed'
    for r in rows:
        r.update(alive=False, exit='finished')
    assert jm.verdict(rows, 300)['state'] == 'finished'


def test_textfile_parses_as_prometheus_text_and_carries_every_rank():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    rows[0].update(cpu_pct=97.5, rss_kib=300000, peak_rss_kib=320000, gpu=dict(h100_gpus()[0], index=0))
    text = jm.textfile_records(rows, 'job "a"', 1795589350.0, node='head', world=3)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    steps = families['gpucluster_training_rank_step']
    assert sorted((s.labels['node'], s.labels['rank'], s.value) for s in steps.samples) == [
        ('head', '0', 60.0), ('head', '1', 60.0), ('worker-2', '2', 60.0)]
    assert steps.samples[0].labels['job_id'] == 'job "a"'
    assert families['gpucluster_training_rank_resident_memory_bytes'].samples[0].value == 300000 * 1024
    assert families['gpucluster_training_rank_gpu_memory_used_bytes'].samples[0].labels['gpu'] == '0'
    # ratios 0-1, not percent
    assert families['gpucluster_training_rank_cpu_ratio'].samples[0].value == pytest.approx(0.975)
    assert families['gpucluster_training_rank_gpu_utilization_ratio'].samples[0].value <= 1
    # the time of the last step, not an age frozen at the read
    last = families['gpucluster_training_rank_last_step_timestamp_seconds'].samples[0]
    assert last.value == rows[0]['last_step_time']
    assert families['gpucluster_training_world_size'].samples[0].value == 3
    assert families['gpucluster_training_last_read_timestamp_seconds'].samples[0].labels == {
        'job_id': 'job "a"', 'node': 'head'}


def test_textfile_names_follow_the_naming_guide():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    rows[0].update(cpu_pct=97.5, rss_kib=300000, peak_rss_kib=320000, gpu=dict(h100_gpus()[0], index=0))
    text = jm.textfile_records(rows, 'j', 1795589350.0, world=3)
    families = list(text_string_to_metric_families(text))
    assert sorted(f.name for f in families) == sorted(jm.metric_names())
    for f in families:
        assert f.documentation and f.type == 'gauge'
        assert 'percent' not in f.name and 'since' not in f.name
        assert all('job' not in s.labels for s in f.samples)


def test_the_job_ended_here_when_no_rank_of_it_runs_here():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    assert not jm.ended_here(rows)
    rows[0].update(alive=False, exit='exited')
    assert not jm.ended_here(rows)
    for r in rows:
        r.update(alive=False, exit='finished')
    assert jm.ended_here(rows) and jm.ended_here([])


def test_a_strict_parser_refuses_a_broken_textfile():
    with pytest.raises(ValueError):
        list(text_string_to_metric_families('gpucluster_training_rank_step{job_id="a",rank=0} 1\n'))


def test_summary_has_steps_rates_slowest_and_peak_memory():
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head', 2: 'worker-2'})
    for r in rows:
        r.update(alive=False, exit='finished')
    record = jm.summary(rows, 'job-1', 'finished', 'worker-2', 1.0)
    assert record['steps'] == 60 and record['slowest_node'] == 'worker-2'
    assert 5 < record['mean_steps_per_s'] < 12
    assert all(r['peak_rss_kib'] > 100000 for r in record['ranks'])


# ----- heartbeats, steps from a log, stalls before the first step, unknown nodes ----------------
EXAMPLES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')


def live_row(text, now, node='head', rank=0, **extra):
    """A row of a live rank from the text of its progress file, read at now."""
    row = {'node': node, 'rank': rank, 'alive': True, 'held': None}
    row.update(jm.progress_figures(jm.parse_progress(text), now))
    row.update(extra)
    return row


def test_a_checkpoint_save_longer_than_the_stall_bound_is_not_a_stall_and_shows_its_phase():
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=2 time=1000.0\n'
            'step=140 loss=0.5 time=1100.0\n'
            '# heartbeat phase=checkpoint step=140 time=1100.1\n')
    # read 700 s after the last step and the heartbeat that opened the save, with a 600 s bound
    rows = [live_row(text, 1800.0, rank=0), live_row(text, 1800.0, node='worker', rank=1)]
    assert rows[0]['phase'] == 'checkpoint' and rows[0]['phase_s'] == pytest.approx(699.9)
    assert jm.verdict(rows, 600)['state'] == 'stalled'  # the save's heartbeat itself is 700 s old
    # the saving rank writes a heartbeat every few minutes while it saves: held
    text += '# heartbeat phase=checkpoint step=140 time=1500.0\n'
    rows = [live_row(text, 1800.0, rank=0), live_row(text.split('# heartbeat')[0], 1800.0, node='worker', rank=1)]
    view = jm.verdict(rows, 600)
    assert view['state'] == 'running', view['lines']
    assert any('saving checkpoint since 700 s' in line for line in view['lines']), view['lines']


def test_a_heartbeat_within_the_bound_holds_the_clock_and_a_step_ends_the_phase():
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=1 time=1000.0\n'
            'step=5 loss=0.5 time=1010.0\n# heartbeat phase=eval step=5 time=1590.0\n')
    row = live_row(text, 1700.0)
    assert jm.stall([row], 600)['stalled'] is False
    assert 'evaluating since 110 s' in jm.rank_line(row)
    stepped = live_row(text + 'step=6 loss=0.4 time=1600.0\n', 1700.0)
    assert stepped['phase'] is None and 'since' not in jm.rank_line(stepped)
    back = live_row(text + '# heartbeat phase=train step=5 time=1595.0\n', 1700.0)
    assert back['phase'] is None and back['seconds_since_heartbeat'] == pytest.approx(105.0)


def test_a_stale_phase_is_named_in_the_stall():
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=1 time=1000.0\n'
            'step=5 loss=0.5 time=1010.0\n# heartbeat phase=checkpoint step=5 time=1020.0\n')
    st = jm.stall([live_row(text, 2000.0)], 600)
    assert st['stalled'] and 'rank 0 on head has been saving checkpoint for 980 s' in st['why']


def test_a_start_up_hang_is_a_stall_before_the_first_step():
    header = '# gpucluster-progress rank=%d host=%s pid=1 world=2 time=1000.0\n'
    rows = [live_row(header % (0, 'head'), 1000.0 + 700, node='head', rank=0),
            live_row(header % (1, 'worker'), 1000.0 + 700, node='worker', rank=1)]
    for row in rows:
        row['seconds_since_start'] = 700.0
    view = jm.verdict(rows, 600)
    assert view['state'] == 'stalled' and 'start-up hang' in view['stall']['why']
    assert view['stall']['nodes'] == ['head', 'worker']
    for row in rows:
        row['seconds_since_start'] = 30.0
    assert jm.verdict(rows, 600)['state'] == 'running'


def test_every_rank_at_the_same_step_is_named_as_a_collective_hang_with_room_for_the_collectives():
    rows = rows_from(None, {0: 'head', 1: 'worker-1'}, now_offset=60)
    assert rows[0]['last_step'] == rows[1]['last_step']
    st = jm.stall(rows, 30)
    assert st['stalled'] and 'every rank stopped after step' in st['why'] and st['ranks'] == [0, 1]
    assert st['collectives'] is None


def test_a_node_whose_read_failed_makes_the_state_unknown_never_not_running():
    view = jm.verdict([], 600, {'worker-1': 'node worker-1: sample_seconds must be 0 to 30, got 60.0'})
    assert view['state'] == 'unknown'
    assert view['lines'][0].startswith('state: unknown (the read failed on worker-1')
    assert 'worker-1: read failed: node worker-1: sample_seconds must be 0 to 30, got 60.0' in view['lines']
    rows = rows_from('slow-rank-2', {0: 'head', 1: 'head'})
    assert jm.verdict(rows, 600, {'worker-2': 'Permission denied'})['state'] == 'unknown'
    assert jm.node_states(rows, ['head', 'worker-2'], {'worker-2': 'x'}) == {'head': 'running', 'worker-2': 'unknown'}


def test_steps_from_a_log_with_named_groups_give_rates_and_a_stall():
    t0 = 1764000000.0
    log = ''.join('worker: it %d | loss %.2f | t %.1f\n' % (i, 1.0 / i, t0 + i) for i in range(1, 11))
    parsed = jm.parse_log(log + 'saving...\n', r'it (?P<step>\d+) \| loss (?P<loss>[0-9.]+) \| t (?P<time>[0-9.]+)',
                          mtime=t0 + 11)
    assert parsed['steps'][-1] == {'step': 10, 'loss': 0.1, 'time': t0 + 10, 'dated': True}
    figures = jm.progress_figures(parsed, t0 + 10.5)
    assert figures['tracked'] == 'log' and figures['steps_per_s'] == pytest.approx(1.0)
    rows = jm.node_ranks('n', 'n', {0: {'pid': 5, 'state': 'S', 'local_rank': 0, 'visible_devices': None,
                                        'started_at': t0}}, {}, {}, {}, {}, t0 + 1000, log=parsed)
    assert rows[0]['last_step'] == 10 and 'steps from its log' in jm.rank_line(rows[0])
    assert jm.verdict(rows, 600)['state'] == 'stalled'


def test_the_default_step_regex_takes_the_first_number_and_dates_by_the_log_s_last_write():
    log = 'node-1: step 1 loss 0.900000 elapsed 2.0\nnode-1: step 2 loss 0.800000 elapsed 3.0\n'
    parsed = jm.parse_log(log, 'step [0-9]+ loss', mtime=5000.0)
    assert [s['step'] for s in parsed['steps']] == [1, 2]
    figures = jm.progress_figures(parsed, 5030.0)
    assert figures['last_step'] == 2 and figures['seconds_since_step'] == pytest.approx(30.0)
    assert figures['steps_per_s'] is None  # no time group: no rate made up


def test_a_plain_heartbeat_in_a_log_holds_the_clock():
    log = 'step 7 loss 0.5\n[rank0] gpucluster-heartbeat phase=checkpoint step=7\n'
    parsed = jm.parse_log(log, 'step [0-9]+ loss', mtime=3000.0)
    assert parsed['heartbeats'][0]['phase'] == 'checkpoint'
    figures = jm.progress_figures(parsed, 3100.0)
    assert figures['phase'] == 'checkpoint' and figures['phase_s'] == pytest.approx(100.0)


def test_nothing_tracked_is_said_plainly_and_stall_detection_is_off():
    procs = {0: {'pid': 5, 'state': 'S', 'local_rank': 0, 'visible_devices': None, 'started_at': 1.0}}
    untracked = jm.parse_log('loading data\nwarming up\n', 'step [0-9]+ loss', mtime=1.0)
    rows = jm.node_ranks('n', 'n', procs, {}, {}, {}, {}, 99999.0, log=untracked)
    view = jm.verdict(rows, 600, step_regex='step [0-9]+ loss')
    assert view['state'] == 'running' and view['stall']['off']
    assert ('no steps tracked: the script writes no progress file and no log line matches '
            'training_progress_regex (step [0-9]+ loss); stall detection is off for this job') in view['lines']
    assert 'no steps tracked' in jm.rank_line(rows[0])


def test_the_process_start_dates_a_rank_from_the_boot_time(tmp_path, proc):
    (proc / 'stat').write_text('cpu  1 2 3\nbtime 1795500000\n')
    assert jm.boot_time(str(proc)) == 1795500000
    ranks = jm.rank_processes('rec-1', uid_of(proc), str(proc), booted=1795500000, ticks_per_s=100)
    start = jm.pr.read_stat(15468, str(proc))['start_time']
    assert ranks[0]['started_at'] == pytest.approx(1795500000 + start / 100.0, abs=0.1)


def test_the_examples_write_heartbeats_around_their_checkpoint_saves(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location('gpucluster_progress', os.path.join(EXAMPLES, 'gpucluster_progress.py'))
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    progress = helper.Progress(0, 1, str(tmp_path), tensorboard_dir='')
    progress.step(1, 0.5)
    progress.heartbeat('checkpoint', 1)
    progress.handle.flush()
    parsed = jm.parse_progress((tmp_path / 'rank-0.log').read_text())
    assert isinstance(parsed['header']['time'], float) and parsed['heartbeats'][0]['step'] == 1
    assert jm.progress_figures(parsed, parsed['heartbeats'][0]['time'] + 5)['phase'] == 'checkpoint'
    assert helper.heartbeat_line('eval', 3, now=7.0) == 'gpucluster-heartbeat phase=eval step=3 time=7.000'
    with open(os.path.join(EXAMPLES, 'train_tiny.py')) as handle:
        tiny = [line.strip() for line in handle]
    # DeepSpeed's save_checkpoint is called once, in save(); both calls of save() (every --save-every
    # steps and at the end) are between a checkpoint and a train heartbeat
    assert len([line for line in tiny if 'engine.save_checkpoint(' in line]) == 1
    saves = [i for i, line in enumerate(tiny) if line.startswith('save(engine, args, ')]
    assert len(saves) == 2
    for i in saves:
        assert tiny[i - 1].startswith("progress.heartbeat('checkpoint'") and tiny[i + 1].startswith("progress.heartbeat('train'")
    with open(os.path.join(EXAMPLES, 'train_fsdp.py')) as handle:
        fsdp = handle.read()
    body = fsdp[fsdp.index('def save('):fsdp.index('def main(')]
    assert body.index("progress.heartbeat('checkpoint'") < body.index('dcp.save(') < body.index("progress.heartbeat('train'")
