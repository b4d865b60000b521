# -*- coding: utf-8 -*-
"""The long waits of a training job in slices, a line after each (plugin_utils/training/job_wait.py)."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.training import job_wait as jw

ARGS = {'state': 'finished', 'job_id': 'tiny-001', 'watch_timeout': 900, 'progress_seconds': 60}


class Module:
    """Stands for the module's slices: each returns the next of results, or ends once steps ran out."""

    def __init__(self, results):
        self.results = list(results)
        self.calls = []

    def __call__(self, args):
        self.calls.append(args)
        return self.results.pop(0)


def running(step='lab-head: step 40 loss 0.1200'):
    return {'ended': False, 'timed_out': True, 'elapsed': 60.0, 'last_step': step}


def test_a_wait_of_three_slices_says_how_it_goes_after_each_but_the_last():
    last = {'ended': True, 'job_failed': False, 'timed_out': False, 'elapsed': 12.5,
            'last_step': 'lab-head: step 100 loss 0.0100'}
    module = Module([running(None), running(), last])
    lines = []
    out = jw.run_wait(ARGS, module, lines.append)
    assert [c['watch_timeout'] for c in module.calls] == [60, 60, 60]
    assert lines == ['job tiny-001: running for 1 min 00 s (waits at most 14 min 00 s more); no step line yet',
                     'job tiny-001: running for 2 min 00 s (waits at most 13 min 00 s more); '
                     'last step: lab-head: step 40 loss 0.1200']
    assert out['ended'] and not out['timed_out'] and out['elapsed'] == 132.5


def test_the_wait_is_bounded_by_watch_timeout_and_its_last_slice_is_cut_to_what_is_left():
    module = Module([running(), running(), {'ended': False, 'timed_out': True, 'elapsed': 30.0, 'last_step': None}])
    lines = []
    out = jw.run_wait(dict(ARGS, watch_timeout=150), module, lines.append)
    assert [c['watch_timeout'] for c in module.calls] == [60, 60, 30]
    assert out['timed_out'] and out['elapsed'] == 150.0 and len(lines) == 2


def test_the_first_step_wait_names_the_logs_last_line_and_ends_on_a_failure_at_once():
    slow = {'first_step': None, 'timed_out': True, 'elapsed': 60.0, 'failures': [], 'log': '/shared/jobs/t/logs/h.log',
            'log_tail': ['h: Building extension module shm_comm...', '']}
    failed = {'first_step': None, 'timed_out': False, 'elapsed': 3.0,
              'failures': [{'node': 'w1', 'cause': 'its ranks exited with code 1'}]}
    lines = []
    out = jw.run_wait(dict(ARGS, state='first_step'), Module([slow, failed]), lines.append)
    assert lines == ['job tiny-001: no step yet after 1 min 00 s (waits at most 14 min 00 s more); last line of '
                     '/shared/jobs/t/logs/h.log: h: Building extension module shm_comm...']
    assert out['failures'] and out['elapsed'] == 63.0 and not out['timed_out']


def test_a_slice_that_finds_the_first_step_ends_the_wait_with_the_whole_time():
    lines = []
    out = jw.run_wait(dict(ARGS, state='first_step'), Module([
        {'first_step': None, 'timed_out': True, 'elapsed': 60.0, 'failures': [], 'log_tail': []},
        {'first_step': 'h: step 1 loss 2.3', 'timed_out': False, 'elapsed': 7.3, 'failures': []}]), lines.append)
    assert out['first_step'] == 'h: step 1 loss 2.3' and out['elapsed'] == 67.3
    assert lines[0].endswith('nothing logged yet in the log')


def test_a_failed_module_run_is_returned_at_once_and_no_progress_means_one_call():
    module = Module([{'failed': True, 'msg': 'node h: job_dir missing'}])
    assert jw.run_wait(ARGS, module, print) == {'failed': True, 'msg': 'node h: job_dir missing'}
    module = Module([{'ended': True, 'elapsed': 5.0}])
    jw.run_wait(dict(ARGS, progress_seconds=0), module, print)
    assert module.calls == [dict(ARGS, progress_seconds=0)]   # one wait of watch_timeout


def test_durations_read_as_a_person_says_them():
    assert [jw.duration(s) for s in (0, 59.4, 60, 200, 3600, 7500)] == [
        '0 s', '59 s', '1 min 00 s', '3 min 20 s', '1 h 00 min', '2 h 05 min']


class Clock:
    """The controller's clock: each slice takes its own seconds and a login and module start of `overhead`."""

    def __init__(self, module, overhead):
        self.module, self.overhead, self.now = module, overhead, 1000.0

    def __call__(self):
        return self.now

    def call(self, args):
        result = self.module(args)
        self.now += float(result.get('elapsed') or 0) + self.overhead
        return result


def test_the_logins_of_the_slices_count_so_the_wait_ends_within_watch_timeout_of_the_controllers_clock():
    # on a loaded head each slice's login and module start took about 7 s: a wait of 150 s counted in the
    # slices' own seconds would have lasted 3 slices and 21 s more; it ends at 150 s of the clock
    module = Module([running(), running(), {'ended': False, 'timed_out': True, 'elapsed': 16.0, 'last_step': None}])
    clock = Clock(module, overhead=7.0)
    lines = []
    out = jw.run_wait(dict(ARGS, watch_timeout=150), clock.call, lines.append, clock=clock)
    assert [c['watch_timeout'] for c in module.calls] == [60, 60, 16]
    assert lines[0].startswith('job tiny-001: running for 1 min 07 s (waits at most 1 min 23 s more)')
    assert out['timed_out'] and out['elapsed'] == 157.0 and clock.now - 1000.0 == 157.0
