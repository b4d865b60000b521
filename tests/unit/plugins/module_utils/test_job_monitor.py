"""job_monitor on recorded progress files, a recorded /proc tree and recorded nvidia-smi output."""

import os
import shutil

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm
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


# ----- rows of several nodes (test_job_view.py reads the job's view of them) ---------------------
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


# ----- heartbeats, steps from a log, the process start, the examples' heartbeats -----------------
EXAMPLES = os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', 'roles', 'training', 'files')


def live_row(text, now, node='head', rank=0, **extra):
    """A row of a live rank from the text of its progress file, read at now."""
    row = {'node': node, 'rank': rank, 'alive': True, 'held': None}
    row.update(jm.progress_figures(jm.parse_progress(text), now))
    row.update(extra)
    return row


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
        tiny = [line.rstrip() for line in handle]
    # DeepSpeed's save_checkpoint is called once, in save(); both calls of save() (every --save-every
    # steps and at the end) run inside progress.saving(), which beats while they save
    assert len([line for line in tiny if 'engine.save_checkpoint(' in line]) == 1
    saves = [i for i, line in enumerate(tiny) if line.strip().startswith('save(engine, args, ')]
    assert len(saves) == 2
    for i in saves:
        indent = len(tiny[i]) - len(tiny[i].lstrip())
        assert tiny[i - 1].strip().startswith('with progress.saving(')
        assert len(tiny[i - 1]) - len(tiny[i - 1].lstrip()) == indent - 4  # save() is the with's body
    assert "progress.heartbeat('checkpoint'" not in '\n'.join(tiny)
    with open(os.path.join(EXAMPLES, 'train_fsdp.py')) as handle:
        fsdp = handle.read()
    body = fsdp[fsdp.index('def save('):fsdp.index('def main(')]
    lines = body.splitlines()
    opening = next(i for i, line in enumerate(lines) if line.strip().startswith('with progress.saving('))
    inside = [line for line in lines[opening + 1:] if line.strip()]
    assert all(line.startswith(' ' * 8) for line in inside)  # the whole save, its barriers too
    assert any('dcp.save(' in line for line in inside) and any('dist.barrier()' in line for line in inside)


def test_the_heartbeats_of_a_save_date_its_phase_from_its_start(tmp_path):
    text = ('# gpucluster-progress rank=0 host=head pid=1 world=2 time=1000.0\n'
            'step=140 loss=0.5 time=1100.0\n'
            '# heartbeat phase=checkpoint step=140 since=1100.500 time=1100.500\n'
            '# heartbeat phase=checkpoint step=140 since=1100.500 time=1110.500\n')
    figures = jm.progress_figures(jm.parse_progress(text), 1120.5)
    assert figures['phase'] == 'checkpoint' and figures['phase_s'] == pytest.approx(20.0)
    assert figures['seconds_since_heartbeat'] == pytest.approx(10.0)
    # the heartbeats before the read may have been cut (only the last kept): since still dates the save
    last = text.splitlines()
    figures = jm.progress_figures(jm.parse_progress('\n'.join(last[:2] + last[3:]) + '\n'), 1120.5)
    assert figures['phase_s'] == pytest.approx(20.0)
    # the same words in a log, without time: dated by the log's last write, the save by since
    log = 'step 140 loss 0.5\n[rank0] gpucluster-heartbeat phase=checkpoint step=140 since=1100.500\n'
    figures = jm.progress_figures(jm.parse_log(log, 'step [0-9]+ loss', mtime=1110.0), 1120.5)
    assert figures['phase'] == 'checkpoint' and figures['phase_s'] == pytest.approx(20.0)
    # the line the examples write, read back by the node side
    import importlib.util
    spec = importlib.util.spec_from_file_location('gpucluster_progress', os.path.join(EXAMPLES, 'gpucluster_progress.py'))
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    line = helper.heartbeat_line('checkpoint', 140, now=1110.5, since=1100.5)
    assert line == 'gpucluster-heartbeat phase=checkpoint step=140 since=1100.500 time=1110.500'
    beats = jm.parse_progress('step=140 loss=0.5 time=1100.0\n# %s\n' % line[len('gpucluster-'):])['heartbeats']
    assert beats == [{'phase': 'checkpoint', 'step': 140, 'since': 1100.5, 'time': 1110.5}]


def test_the_supervisors_glance_and_the_node_side_read_a_progress_file_alike(tmp_path):
    """The progress format has one writer (gpucluster_progress.Progress) and two readers: the node side's
    parse_progress (status, watch, the report page) and the supervisor's glance (rank_file_marks, the first
    line and the end of the file only). Both read the same rank, attempt, last step and its time, and done."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('gpucluster_progress', os.path.join(EXAMPLES, 'gpucluster_progress.py'))
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    progress = helper.Progress(3, 4, str(tmp_path), tensorboard_dir='', attempt=2)
    for step in range(1, 400):  # longer than the glance's tail: it reads the end only
        progress.step(step, 1.0 / step, wait=0.01)
    progress.heartbeat('checkpoint', 399)
    progress.handle.flush()
    path = str(tmp_path / 'rank-3.log')

    def both():
        with open(path) as handle:
            parsed = jm.parse_progress(handle.read())
        return parsed, helper.rank_file_marks(path)

    parsed, marks = both()
    assert os.path.getsize(path) > 4096
    assert (marks['rank'], marks['attempt']) == (parsed['header']['rank'], jm.progress_attempt(parsed)) == (3, 2)
    assert (marks['step'], marks['step_time']) == (parsed['steps'][-1]['step'], parsed['steps'][-1]['time'])
    assert marks['step'] == 399 and marks['done'] is None and parsed['done'] is None
    progress.done(399)  # closes the file
    parsed, marks = both()
    assert marks['done'] == parsed['done']['step'] == 399
