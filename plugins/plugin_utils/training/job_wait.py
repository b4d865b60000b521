# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A training job's long waits (the first step, the end) in slices, with a line after each.

The training_job action runs the module's wait (state first_step or finished) for at most
progress_seconds at a time and prints what the slice saw, so a wait of many minutes says how it goes
once a minute instead of staying silent (a retried task would print FAILED - RETRYING instead).
Controller only: the training_job action uses it."""

from __future__ import annotations

import time

WAITS = ('first_step', 'finished')
LINE_CHARS = 200


def duration(seconds):
    """'45 s', '3 min 20 s', '2 h 05 min' of a number of seconds."""
    seconds = int(round(max(0.0, float(seconds))))
    if seconds < 60:
        return '%d s' % seconds
    if seconds < 3600:
        return '%d min %02d s' % (seconds // 60, seconds % 60)
    return '%d h %02d min' % (seconds // 3600, (seconds % 3600) // 60)


def _cut(line):
    line = (line or '').strip()
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS - 3] + '...'


def progress_line(state, job_id, elapsed, total, result):
    """The line printed after a slice of the wait that did not end it."""
    left = 'waits at most %s more' % duration(max(0.0, total - elapsed))
    if state == 'first_step':
        tail = [line for line in result.get('log_tail') or [] if line.strip()]
        seen = ('last line of %s: %s' % (result.get('log', 'the log'), _cut(tail[-1])) if tail
                else 'nothing logged yet in %s' % result.get('log', 'the log'))
        return 'job %s: no step yet after %s (%s); %s' % (job_id, duration(elapsed), left, seen)
    step = result.get('last_step')
    seen = 'last step: %s' % _cut(step) if step else 'no step line yet'
    return 'job %s: running for %s (%s); %s' % (job_id, duration(elapsed), left, seen)


def done(state, result):
    """Whether a slice's result ends the wait (what it waited for came, or a node failed)."""
    if result.get('failures'):
        return True
    if state == 'first_step':
        return not result.get('timed_out')
    return bool(result.get('ended'))


def run_wait(args, call, say, clock=time.monotonic):
    """Run the wait of args (training_job's arguments, state first_step or finished) in slices.

    call(args) runs the module once and returns its result; say(line) prints a line. Each slice waits
    at most progress_seconds; the whole wait at most watch_timeout of the controller's clock: each slice's
    login and module start count too (on a loaded head they took seconds a slice, and a wait that counted
    the slices' own seconds alone outlived the task's bound). Returns the last slice's result with elapsed
    (the whole wait) and timed_out of the whole wait; a failed module run (a node that cannot be read, a bad
    input) is returned as it is, at once."""
    state = args.get('state')
    total = float(args.get('watch_timeout', 900))
    every = int(args.get('progress_seconds') or 0)
    job_id = args.get('job_id', '?')
    if every <= 0 or every >= total:
        return call(dict(args))
    start = clock()
    elapsed = 0.0
    while True:
        this = min(float(every), total - elapsed)
        result = call(dict(args, watch_timeout=max(1, int(round(this)))))
        if result.get('failed') or result.get('unreachable'):
            return result
        # the slices' own seconds, or the clock's when more went by (logins, module starts)
        elapsed = round(max(elapsed + float(result.get('elapsed') or this), clock() - start), 1)
        if done(state, result) or elapsed >= total:
            return dict(result, elapsed=elapsed, timed_out=bool(result.get('timed_out')) and elapsed >= total)
        say(progress_line(state, job_id, elapsed, total, result))
