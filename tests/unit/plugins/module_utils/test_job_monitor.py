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
