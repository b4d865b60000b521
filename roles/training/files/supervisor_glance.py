# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The glance: between two reads (settings' interval) the supervisor glances every glance_seconds (2; 0:
never) at the job's files on the shared storage, read only, in a thread bounded by GLANCE_TIMEOUT: every
node's exit file (<job_dir>/exit/<node>) and the first line and end of every rank's progress file
(gpucluster_progress.rank_file_marks). A sign (a node's part exited, ranks of the attempt wrote done, one wrote
nothing for stall_seconds, or one that logged a step is late: it wrote nothing for late_seconds or LATE_PACE
times its longest gap) ends the wait: the read comes at once and decides (a sign is never a fault by itself;
the fault event keeps it: sign, sign_time). A sign a read judged is not read for again while it lasts. A
glance that fails or hangs turns the glances off (a glance event, the heartbeat's glance) until one works
again; the reads go on at their interval.

Glances is the part of the supervisor (supervisor_driver.Supervisor) that glances; it uses the supervisor's
s (settings), job_dir, state, attempt, glance, glance_off, glance_every, glance_seconds, signs_read and its
event()."""

import os
import re
import threading
import time

import gpucluster_progress as progress


GLANCE_EVERY = 2       # seconds between two glances at the job's files (settings' glance_seconds)


GLANCE_TIMEOUT = 10    # a glance that takes longer says the shared storage does not answer


LATE_PACE = 3          # a rank is late past late_seconds or this many times its longest gap between two lines


def read_exit_codes(job_dir, nodes):
    """{node: {code, mtime}} of the nodes whose exit file (<job_dir>/exit/<node>, written by the part of the
    job started there when it ends, removed by its start) holds a number. Only a regular file is read, and only
    its first 64 bytes (progress.open_regular: the training account writes the directory)."""
    out = {}
    for node in nodes:
        path = os.path.join(job_dir, 'exit', node)
        try:
            with os.fdopen(progress.open_regular(path), 'rb') as handle:
                first = handle.read(64).decode('ascii', 'replace').split('\n')[0].strip()
                mtime = os.fstat(handle.fileno()).st_mtime
        except OSError:
            continue
        if first.lstrip('-').isdigit():
            out[node] = {'code': int(first), 'mtime': mtime}
    return out


def read_rank_marks(job_dir, marks_of):
    """[rank_file_marks of each progress file under <job_dir>/progress]; marks_of reads one file."""
    folder = os.path.join(job_dir, 'progress')
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if re.match(r'^rank-\d+\.log$', name):
            marks = marks_of(os.path.join(folder, name))
            if marks is not None:
                out.append(marks)
    return out


def node_of_host(host, nodes):
    """The job's node a rank's progress header names (host=: the rank's hostname), by its name or short name;
    None when none is (an inventory whose names are not the nodes' hostnames)."""
    if not host:
        return None
    if host in nodes:
        return host
    short = host.split('.')[0]
    found = [n for n in nodes if n.split('.')[0] == short]
    return found[0] if len(found) == 1 else None


def glance_signs(exits, ranks, nodes, attempt, stall_seconds, now, late_seconds=0):
    """What one glance at the job's files saw that a read should judge now rather than at its interval:
    [{kind, nodes, since, why}], kind exit (the part of the job on a node ended, with its code; failed: true
    when a code is not 0, nodes then those, the first to end first), done (ranks of
    this attempt wrote their done line), quiet (a rank of this attempt wrote nothing for stall_seconds) or late
    (a rank of this attempt that logged a step wrote nothing for late_seconds, or LATE_PACE times its longest
    gap between two lines when that is longer, and is not quiet yet: nodes, those its header's host names, or
    none when one cannot be told; a frozen node's ranks write nothing); since: when what it shows began (the
    file's time; for quiet and late, its last write and the bound). Only the job's nodes now and the ranks of
    its attempt count. A sign decides nothing: the read does."""
    signs = []
    ended = sorted(((exits[n]['mtime'], n) for n in nodes if n in exits))
    failed = [n for _, n in ended if exits[n]['code'] != 0]
    if failed:
        signs.append({'kind': 'exit', 'nodes': failed, 'since': min(exits[n]['mtime'] for n in failed), 'failed': True,
                      'why': 'the job on %s exited with %s (its exit file%s)' % (
                          ', '.join(failed), ', '.join('code %d' % exits[n]['code'] for n in failed),
                          's' if len(failed) > 1 else '')})
    elif ended:
        signs.append({'kind': 'exit', 'nodes': [n for _, n in ended], 'since': ended[0][0],
                      'why': 'the job on %s ended with code 0' % ', '.join(n for _, n in ended)})
    mine = [r for r in ranks if r.get('attempt') == attempt]
    done = sorted((r['rank'], r['mtime']) for r in mine if r.get('done') is not None)
    if done:
        signs.append({'kind': 'done', 'nodes': [], 'since': min(t for _, t in done),
                      'why': 'rank(s) %s wrote done' % ', '.join(str(r) for r, _ in done)})
    if stall_seconds:
        quiet = sorted((r['rank'], r['mtime']) for r in mine
                       if r.get('done') is None and now - r['mtime'] > stall_seconds)
        if quiet:
            signs.append({'kind': 'quiet', 'nodes': [], 'since': min(t for _, t in quiet) + stall_seconds,
                          'why': 'rank(s) %s wrote nothing for more than %d s' % (
                              ', '.join(str(r) for r, _ in quiet), stall_seconds)})
    if late_seconds:
        late = []
        for r in sorted(mine, key=lambda r: (r['rank'] is None, r['rank'])):
            bound = max(float(late_seconds), LATE_PACE * (r.get('gap') or 0.0))
            silent = now - r['mtime']
            if (r.get('done') is None and r.get('step') is not None and silent > bound
                    and not (stall_seconds and silent > stall_seconds)):
                late.append((r, bound, node_of_host(r.get('host'), nodes)))
        if late:
            named = [n for _, _, n in late]
            late_nodes = [] if None in named else sorted(set(named), key=named.index)
            signs.append({'kind': 'late', 'nodes': late_nodes, 'since': min(r['mtime'] + b for r, b, _ in late),
                          'why': 'rank(s) late: %s' % '; '.join(
                              '%s on %s wrote nothing for %.0f s (its bound %.0f s)'
                              % (r['rank'], n or r.get('host') or '?', now - r['mtime'], b) for r, b, n in late)})
    return signs


class Glance:
    """The glance of one job's files on the shared storage, in a thread of its own so that a hung mount never
    holds the supervisor: start() begins one (never while one still runs), result() is (signs, seconds) once it
    ended, hung(now) the seconds the one in progress has run past its bound. off: why the glance cannot be
    made (a job directory the supervisor host cannot read), None while it can."""

    def __init__(self, job_dir, marks_of, timeout=GLANCE_TIMEOUT):
        self.job_dir, self.marks_of, self.timeout = job_dir, marks_of, timeout
        self.thread = None
        self.began = None
        self.done = None
        self.off = None

    def start(self, nodes, attempt, stall_seconds, late_seconds=0):
        if self.thread is not None and self.thread.is_alive():
            return False
        self.done = None
        self.began = time.time()

        def run():
            try:
                os.stat(self.job_dir)
                exits = read_exit_codes(self.job_dir, nodes)
                ranks = read_rank_marks(self.job_dir, self.marks_of)
                result = (glance_signs(exits, ranks, nodes, attempt, stall_seconds, time.time(), late_seconds), None)
            except OSError as exc:
                result = (None, '%s: %s' % (getattr(exc, 'filename', None) or self.job_dir, exc.strerror or exc))
            self.done = result + (round(time.time() - self.began, 3),)

        self.thread = threading.Thread(target=run, name='gpucluster-glance', daemon=True)
        self.thread.start()
        return True

    def wait(self, seconds):
        """The glance's (signs, error, seconds) once it ended within seconds, else None."""
        if self.thread is not None:
            self.thread.join(max(0.0, seconds))
            if not self.thread.is_alive():
                self.thread = None
        return self.done

    def running_for(self, now):
        return now - self.began if self.thread is not None and self.thread.is_alive() else 0.0


class Glances:
    """The glances between two reads and during a read."""

    def glance_once(self, until, wanted=None):
        """One glance at the job's files (begun now unless one still runs), waited for until `until`: the first
        sign no read judged yet (and that wanted(sign) takes, where given), else None. A glance that fails or runs past GLANCE_TIMEOUT turns the glances off
        (a glance event with why; the reads go on at their interval), the next one that works on again."""
        if self.glance is None:
            self.glance = Glance(self.job_dir, progress.rank_file_marks)
        stall = int(self.s.get('stall_seconds') or 0)
        self.glance.start(list(self.state['nodes']), self.attempt, stall, float(self.s.get('late_seconds') or 0))
        done = self.glance.wait(until - time.time())
        if done is None:
            late = self.glance.running_for(time.time())
            if late > GLANCE_TIMEOUT and self.glance_off is None:
                self.glance_off = 'the job directory %s did not answer within %g s' % (self.job_dir, GLANCE_TIMEOUT)
                self.event('glance', why='glances off: %s (the reads go on every %s s)'
                           % (self.glance_off, self.s['interval']))
            return None
        signs, error, seconds = done
        self.glance.done = None
        self.glance_seconds = seconds
        if error is not None:
            if self.glance_off is None:
                self.glance_off = error
                self.event('glance', why='glances off: %s (the reads go on every %s s)' % (error, self.s['interval']))
            return None
        if self.glance_off is not None:
            self.event('glance', why='glances on again (they were off: %s)' % self.glance_off)
            self.glance_off = None
        keys = set((g['kind'], tuple(g['nodes'])) for g in signs)
        self.signs_read &= keys  # a sign that went and comes again is read for again
        for sign in signs:
            key = (sign['kind'], tuple(sign['nodes']))
            if key not in self.signs_read and (wanted is None or wanted(sign)):
                self.signs_read.add(key)
                return dict(sign, time=time.time())
        return None

    def sign_during_read(self, began):
        """A glance while a read runs: a sign no read judged yet of what began after `began` (the read in
        progress may not see it), else None. A sign of what began before the read is left to the wait after
        it (a read at once if this one did not judge it a fault)."""
        return self.glance_once(time.time() + min(1.0, self.glance_every),
                                wanted=lambda sign: sign.get('since', 0) > began)

    def wait_next_read(self):
        """Sleep until the next read (settings' interval); every glance_seconds of it, a glance at the job's
        files: a sign no read judged yet ends the wait at once (returned; the read judges it)."""
        end = time.time() + self.s['interval']
        while True:
            now = time.time()
            if now >= end:
                return None
            if not self.glance_every:
                time.sleep(end - now)
                return None
            step_end = min(end, now + self.glance_every)
            sign = self.glance_once(step_end)
            if sign is not None:
                return sign
            rest = step_end - time.time()
            if rest > 0:
                time.sleep(rest)
