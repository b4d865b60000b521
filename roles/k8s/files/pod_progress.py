# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A part's progress, read from its own output: the steps its ranks log (train.progress_regex, the training
role's default 'step [0-9]+ loss') and the heartbeats they print between two steps (``gpucluster-heartbeat
phase=checkpoint step=12 since=...``, gpucluster_progress.heartbeat_line), kept by the pod's agent as the
lines go by; and the rows the supervision core's stall rule (supervision.stall) reads, the same rule the
controller applies over SSH. The ages are the agent's own (its clock), so pods whose clocks differ compare.
Standard library only; mounted beside the pod entrypoint."""

import os
import re
import threading
import time

DEFAULT_REGEX = 'step [0-9]+ loss'
HEARTBEAT = 'gpucluster-heartbeat'


def step_in(match):
    """The step of a line the regex matched: its group named step, else its first group of digits, else the
    first number in what it matched; None when there is none."""
    if 'step' in match.re.groupindex and match.group('step') and match.group('step').isdigit():
        return int(match.group('step'))
    for group in match.groups():
        if group and group.isdigit():
            return int(group)
    found = re.search(r'\d+', match.group(0))
    return int(found.group(0)) if found else None


def fields_of(text):
    """{key: value} of 'key=value' words."""
    return dict(word.split('=', 1) for word in text.split() if '=' in word)


class Progress:
    """What one part's output said of its steps, updated line by line (its reader thread) and read by the
    agent's status (any thread)."""

    def __init__(self, regex=None, clock=time.time):
        self.pattern = re.compile(regex or DEFAULT_REGEX)
        self.clock = clock
        self.lock = threading.Lock()
        self.started = clock()
        self.step = self.step_time = None
        self.beat_time = self.phase = self.phase_since = None

    def saw(self, line):
        """One line of the part's output."""
        now = self.clock()
        with self.lock:
            if HEARTBEAT in line:
                words = fields_of(line.split(HEARTBEAT, 1)[1])
                phase = words.get('phase')
                self.beat_time = now
                self.phase = None if phase in (None, 'train') else phase
                try:
                    self.phase_since = float(words['since']) if self.phase else None
                except (KeyError, ValueError):
                    self.phase_since = now if self.phase else None
                return
            match = self.pattern.search(line)
            step = step_in(match) if match else None
            if step is not None:
                self.step, self.step_time = step, now
                self.beat_time = self.phase = self.phase_since = None

    def report(self):
        """{tracked, last_step, seconds_since_step, seconds_since_heartbeat, seconds_since_start, phase, phase_s}:
        tracked once a step or a heartbeat was read (before that, nothing says the part logs steps)."""
        now = self.clock()
        with self.lock:
            return {'tracked': self.step is not None or self.beat_time is not None, 'last_step': self.step,
                    'seconds_since_step': None if self.step_time is None else round(now - self.step_time, 3),
                    'seconds_since_heartbeat': None if self.beat_time is None else round(now - self.beat_time, 3),
                    'seconds_since_start': round(now - self.started, 3), 'phase': self.phase,
                    'phase_s': None if self.phase_since is None else round(max(0.0, now - self.phase_since), 3)}


def held_in_group(pgid, proc='/proc'):
    """'stopped (pid N)' when a process of the part's process group is stopped or traced by the kernel (state T
    or t: SIGSTOP, a debugger), else ''. A rank held so holds every other rank in its next collective."""
    try:
        names = os.listdir(proc)
    except OSError:
        return ''
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, 'stat')) as handle:
                fields = handle.read().rsplit(')', 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] in ('T', 't'):
            return 'stopped (pid %s)' % name
    return ''


def stall_rows(states, now):
    """The rows supervision.stall reads, one per pod part (its node rank as the rank, the pod as the node):
    alive while its part runs; the ages of its status' progress. last_step_time on pod 0's clock."""
    rows = []
    for st in states:
        prog = st.get('progress') or {}
        since_step = prog.get('seconds_since_step')
        rows.append({'rank': st.get('node_rank', 0), 'node': st['pod'], 'alive': st.get('state') == 'running',
                     'tracked': bool(prog.get('tracked')), 'last_step': prog.get('last_step'),
                     'last_step_time': None if since_step is None else now - since_step,
                     'seconds_since_step': since_step, 'seconds_since_heartbeat': prog.get('seconds_since_heartbeat'),
                     'seconds_since_start': prog.get('seconds_since_start'), 'phase': prog.get('phase'),
                     'phase_s': prog.get('phase_s'), 'held': st.get('held') or None})
    return rows
