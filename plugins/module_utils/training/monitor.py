# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""What a running job does on one node, read without touching it (the training_progress module).
The cluster's view of every node's rows is plugin_utils/training/job_view.py, on the controller.

The ranks of the job are found in /proc the way processes.py finds a job (owned by the account,
GPUCLUSTER_JOB_ID in the environment) and told apart by their RANK variable. For each rank: its
state letter, CPU % over a short sample of /proc/PID/stat, resident and peak memory from
/proc/PID/status, its GPU (LOCAL_RANK through CUDA_VISIBLE_DEVICES) with nvidia-smi's figures, and
its progress file. Nothing is signalled, attached to or waited on.

The progress file, one per rank, is ``<job_dir>/progress/rank-<RANK>.log`` (the shipped examples
write it; any script may):

    # gpucluster-progress rank=1 host=node-2 pid=4242 world=4 attempt=2 time=1764000000.0
    step=12 loss=0.4321 time=1764000000.125 wait=0.012
    # heartbeat phase=checkpoint step=12 since=1764000000.200 time=1764000000.200
    # heartbeat phase=checkpoint step=12 since=1764000000.200 time=1764000010.201
    # heartbeat phase=train step=12 time=1764000030.9
    # done step=100 time=1764000060.5

``time`` is the wall clock (seconds since the epoch) when the step ended; ``wait`` the seconds the
rank spent waiting for the others at the step's synchronisation point (optional). A rank that
waits least while the others wait for it is the one that holds the job back.

A heartbeat says what the rank does between two steps (``phase``: ``checkpoint``, ``eval``,
``load`` or any word; ``train`` when it goes back to steps) and holds the stall clock: a rank
whose last step is old but whose last heartbeat is recent is not stalled. ``since`` (optional)
is when the phase began: the examples write a checkpoint heartbeat every few seconds while a save
runs, each with the save's start, so the view judges a save by its own age
(training_checkpoint_seconds) rather than by the age of its heartbeats. A script without a
progress file prints the same words after ``gpucluster-heartbeat`` to its log (``time`` optional
there), and its step lines are found with a regular expression (parse_log).

``attempt`` is the job's attempt (GPUCLUSTER_ATTEMPT: the supervisor starts a failed job again with
the same id as attempt 2, 3...; a header without it is attempt 1). A new attempt writes its ranks'
files over the old ones, but a rank the old attempt had and the new one has not (fewer nodes) leaves
its file behind, and a rank of the new attempt still loading has not written its own yet. When the
files (or the ranks' processes, their GPUCLUSTER_ATTEMPT) are of several attempts, only the newest
attempt's count (fence_attempts): the older ones are not ranks of the job, its world size, its stall
rule or its figures, and are returned as ``stale`` so that a reader sees they were left out.
"""

from __future__ import annotations

import glob
import os
import re
import stat

from ansible_collections.gpucluster.multinode.plugins.module_utils import nvidia_smi as ns
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr
from ansible_collections.gpucluster.multinode.plugins.module_utils.health_reports import gauge_lines

PROGRESS_DIR = 'progress'
PROGRESS_RE = re.compile(r'^rank-(\d+)\.log$')
RANK_ENV = 'RANK'
ATTEMPT_ENV = 'GPUCLUSTER_ATTEMPT'
# A rank whose process is in one of these states makes no progress whatever its peers do.
HELD_STATES = {'T': 'stopped (SIGSTOP or a debugger)', 't': 'stopped by a tracer', 'D': 'in uninterruptible I/O wait'}
HEARTBEAT = '# heartbeat'
LOG_HEARTBEAT = 'gpucluster-heartbeat'
# heartbeat phases that mean "back to steps": no phase is shown
STEP_PHASES = ('train', 'step', 'steps')


def _number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return int(value) if re.match(r'^-?\d+$', str(text)) else value


def parse_fields(line):
    """{key: value} of the key=value words of one line (numbers converted)."""
    out = {}
    for word in line.split():
        key, sep, value = word.partition('=')
        if sep and key:
            number = _number(value)
            out[key] = value if number is None else number
    return out


def _heartbeat(fields, default_time=None):
    """A heartbeat's fields, or None when it names no phase or has no time."""
    if not fields.get('phase'):
        return None
    if not isinstance(fields.get('time'), (int, float)):
        if default_time is None:
            return None
        fields = dict(fields, time=default_time, dated=False)
    fields['phase'] = str(fields['phase'])
    return fields


def parse_progress(text):
    """{header, steps: [{step, loss, time, wait}], heartbeats, done, tail} of a rank's progress file.

    heartbeats are those written after the last step (a step ends any phase). Lines that are
    neither the header, a step, a heartbeat nor the done line (a half-written last line, a note of
    the script) are skipped."""
    header, steps, heartbeats, done = {}, [], [], None
    for line in (text or '').splitlines():
        line = line.strip()
        if line.startswith('# gpucluster-progress'):
            header = parse_fields(line)
        elif line.startswith('# done'):
            done = parse_fields(line)
        elif line.startswith(HEARTBEAT):
            beat = _heartbeat(parse_fields(line[len(HEARTBEAT):]))
            if beat:
                heartbeats.append(beat)
        elif line.startswith('step='):
            fields = parse_fields(line)
            if isinstance(fields.get('step'), int) and isinstance(fields.get('time'), (int, float)):
                steps.append(fields)
                heartbeats = []
    tail = [line for line in (text or '').splitlines() if line.strip()][-3:]
    return {'header': header, 'steps': steps, 'heartbeats': heartbeats, 'done': done, 'tail': tail,
            'source': 'progress file'}


def attempt_number(value):
    """An attempt from a header's attempt= or a GPUCLUSTER_ATTEMPT variable: a whole number of 1 or
    more; 1 when missing or anything else (a job started before attempts were counted)."""
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return value if value >= 1 else 1
    text = str(value or '').strip()
    return int(text) if text.isdigit() and int(text) >= 1 else 1


def progress_attempt(parsed):
    """The attempt that wrote a parsed progress file (its header's attempt=, 1 without one)."""
    return attempt_number((parsed.get('header') or {}).get('attempt'))


def fence_attempts(progress, procs=None, host=None):
    """{attempt, progress, procs, stale} of the progress files ({rank: parsed}) and this node's rank
    processes ({rank: {pid, attempt...}}, rank_processes) when they are of several attempts: attempt is
    the newest any of them names (None when there is neither a file nor a process: the read names no
    attempt); progress and procs keep only that attempt's; stale lists what was left out, [{rank,
    attempt, kind: progress file, host}] and [{rank, attempt, kind: process, pid, host}] (host: this
    node's for a process), by rank. One attempt: everything is kept, stale is []."""
    procs = procs or {}
    numbers = [progress_attempt(p) for p in progress.values()] + [attempt_number(p.get('attempt')) for p in procs.values()]
    newest = max(numbers) if numbers else None
    if newest is None:
        return {'attempt': None, 'progress': {}, 'procs': {}, 'stale': []}
    kept, live, stale = {}, {}, []
    for rank in sorted(progress):
        number = progress_attempt(progress[rank])
        if number < newest:
            stale.append({'rank': rank, 'attempt': number, 'kind': 'progress file',
                          'host': (progress[rank].get('header') or {}).get('host')})
        else:
            kept[rank] = progress[rank]
    for rank in sorted(procs):
        number = attempt_number(procs[rank].get('attempt'))
        if number < newest:
            stale.append({'rank': rank, 'attempt': number, 'kind': 'process', 'pid': procs[rank].get('pid'),
                          'host': host})
        else:
            live[rank] = procs[rank]
    stale.sort(key=lambda item: (item['rank'], item['kind']))
    return {'attempt': newest, 'progress': kept, 'procs': live, 'stale': stale}


def _group(match, name):
    try:
        return match.group(name)
    except IndexError:  # the regex has no such group
        return None


def step_of(match):
    """The step of a line the regex matched: the group named step, else the first group that is a
    whole number, else the first whole number of the matched text; None when there is none."""
    text = _group(match, 'step')
    if text is None:
        text = next((g for g in match.groups() if g and g.isdigit()), None)
    if text is None:
        found = re.search(r'\d+', match.group(0))
        text = found.group(0) if found else None
    return int(text) if text and text.isdigit() else None


def parse_log(text, regex, mtime):
    """The steps of a log whose script writes no progress file, in parse_progress's form.

    regex finds a step line anywhere in a line (a launcher's "host: " prefix does not matter);
    groups: step (else the first number), loss and time (seconds since the epoch), optional. A step
    without time is dated by the log's last write (mtime: the latest it can be, so the stall clock
    never runs fast); steps per second need a time group. Lines holding gpucluster-heartbeat are
    heartbeats (time optional, dated the same way)."""
    pattern = re.compile(regex) if regex else None
    steps, heartbeats = [], []
    for line in (text or '').splitlines():
        if LOG_HEARTBEAT in line:
            beat = _heartbeat(parse_fields(line.split(LOG_HEARTBEAT, 1)[1]), mtime)
            if beat:
                heartbeats.append(beat)
            continue
        match = pattern.search(line) if pattern else None
        if not match:
            continue
        step = step_of(match)
        if step is None:
            continue
        entry = {'step': step}
        loss = _number(_group(match, 'loss'))
        if loss is not None:
            entry['loss'] = loss
        when = _number(_group(match, 'time'))
        dated = isinstance(when, (int, float)) and when > 1e9
        entry.update(time=when if dated else mtime, dated=dated)
        steps.append(entry)
        heartbeats = []
    tail = [line for line in (text or '').splitlines() if line.strip()][-3:]
    return {'header': {}, 'steps': steps, 'heartbeats': heartbeats, 'done': None, 'tail': tail, 'source': 'log'}


LOG_READ_BYTES = 4 * 1024 * 1024


def read_node_log(job_dir, node, regex):
    """The steps of this node's ranks for a script that writes no progress file, None without a regex.

    The node's own log (<job dir>/logs/<node>.log) when it holds steps. Otherwise the job's other logs:
    first the lines of one prefixed with this node's name (the deepspeed launcher's log on the head holds
    every node's lines as '<node>: ...'), else the log with the latest step - in synchronous training one
    rank's steps are every rank's (a script that prints on rank 0 only). source says whose log it was."""
    if not regex:
        return None
    folder = os.path.join(job_dir, 'logs')
    read = pr.tail_text(os.path.join(folder, '%s.log' % node), LOG_READ_BYTES)
    own = parse_log(read[0], regex, read[1]) if read else None
    if own and (own['steps'] or own['heartbeats']):
        return own
    prefix = '%s: ' % node
    latest = None
    for path in sorted(glob.glob(os.path.join(folder, '*.log'))):
        name = os.path.basename(path)[:-len('.log')]
        read = pr.tail_text(path, LOG_READ_BYTES) if name != node else None
        if not read:
            continue
        text, mtime = read
        mine = parse_log('\n'.join(line for line in text.splitlines() if line.startswith(prefix)), regex, mtime)
        if mine['steps']:
            return dict(mine, source='log of %s' % name)
        parsed = parse_log(text, regex, mtime)
        if parsed['steps'] and (latest is None or parsed['steps'][-1]['time'] > latest['steps'][-1]['time']):
            latest = dict(parsed, source='log of %s' % name)
    return latest or own


def phase_figures(progress, now):
    """{phase, phase_s, seconds_since_heartbeat} from the heartbeats after the last step: the phase
    of the last one (none when it went back to steps), since the time its since= field names (when
    the phase began), else since the first heartbeat of that phase."""
    beats = progress.get('heartbeats') or []
    out = {'phase': None, 'phase_s': None, 'seconds_since_heartbeat': None}
    if not beats:
        return out
    last = beats[-1]
    out['seconds_since_heartbeat'] = round(max(0.0, now - last['time']), 1)
    if last['phase'] in STEP_PHASES:
        return out
    since = last['time']
    for beat in reversed(beats):
        if beat['phase'] != last['phase']:
            break
        since = beat['time']
    began = last.get('since')
    if isinstance(began, (int, float)) and not isinstance(began, bool):
        since = min(since, began)
    out.update(phase=last['phase'], phase_s=round(max(0.0, now - since), 1))
    return out


def progress_figures(progress, now, window=60.0):
    """The figures of one rank from its parsed progress file (or log) at time now.

    steps_per_s and the means cover the steps of the last window seconds (at least the last two
    steps when the window holds fewer): a rank that stopped has 0 steps per second in the window.
    Steps without a time of their own (a log without a time group) give no rates."""
    steps = progress['steps']
    dated = [s for s in steps if s.get('dated', True)]
    tracked = bool(progress.get('header') or steps or progress.get('heartbeats'))
    out = {'last_step': None, 'last_step_time': None, 'last_loss': None, 'seconds_since_step': None,
           'steps_per_s': None, 'step_s': None, 'wait_s': None, 'compute_s': None, 'steps_logged': len(steps),
           'mean_steps_per_s': None, 'done': progress['done'] is not None,
           'final_peak_rss_kib': (progress['done'] or {}).get('peak_rss_kib'),
           'tracked': progress.get('source') if tracked else None,
           'started_at': progress.get('header', {}).get('time')}
    out.update(phase_figures(progress, now))
    if not steps:
        return out
    last = steps[-1]
    out.update(last_step=last['step'], last_step_time=last['time'], last_loss=last.get('loss'),
               seconds_since_step=round(max(0.0, now - last['time']), 1))
    steps = dated
    if not steps:
        return out
    if len(steps) >= 2 and steps[-1]['time'] > steps[0]['time']:
        out['mean_steps_per_s'] = round((steps[-1]['step'] - steps[0]['step']) / (steps[-1]['time'] - steps[0]['time']), 3)
    recent = [s for s in steps if s['time'] >= now - window]
    if len(recent) >= 2:
        span = recent[-1]['time'] - recent[0]['time']
        out['steps_per_s'] = round((recent[-1]['step'] - recent[0]['step']) / span, 3) if span > 0 else None
    elif len(steps) >= 2 and not out['done']:
        # fewer than two steps in the window: the rate up to now, which falls while no step comes
        span = now - steps[-2]['time']
        out['steps_per_s'] = round((steps[-1]['step'] - steps[-2]['step']) / span, 3) if span > 0 else None
    timed = recent if len(recent) >= 2 else steps[-2:]
    if len(timed) >= 2:
        gaps = [(b['time'] - a['time']) / max(1, b['step'] - a['step']) for a, b in zip(timed, timed[1:])]
        out['step_s'] = round(sum(gaps) / len(gaps), 4)
        waits = [s['wait'] for s in timed[1:] if isinstance(s.get('wait'), (int, float))]
        if len(waits) == len(gaps):
            out['wait_s'] = round(sum(waits) / len(waits), 4)
            out['compute_s'] = round(max(0.0, out['step_s'] - out['wait_s']), 4)
    return out


LOSS_TAIL_BYTES = 65536  # a log's end read for its last loss line (a launcher's shutdown lines come after it)


def last_loss_line(lines, last=None):
    """The loss line a log's lines end with: the last `final loss` line, else the last line with ` loss `;
    last: the line found so far (of other lines, other nodes), which a `final loss` line it holds keeps."""
    for line in lines or []:
        if 'final loss' in line or (last is None or 'final loss' not in last) and ' loss ' in line:
            last = line.strip()
    return last


def log_loss_line(path, max_bytes=LOSS_TAIL_BYTES):
    """last_loss_line of the last max_bytes of a log (None where it cannot be read or holds none)."""
    read = pr.tail_text(path, max_bytes)
    return last_loss_line(read[0].splitlines()) if read else None


def median(values):
    values = sorted(values)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0


def slowest_node(rows, ratio=1.25, min_gap_s=0.005):
    """(node, why) of the node that holds the job back, or (None, why not), from rows of ranks (alive, node,
    compute_s or steps_per_s): the job view on the controller and the report page read it here.

    With wait figures: the node whose ranks compute longest per step (step time less the wait for
    the others) when that is ratio times the median of the other nodes and min_gap_s above it.
    Without them: the node whose steps per second are below the others' median by that ratio."""
    alive = [r for r in rows if r.get('alive')]
    nodes = sorted({r['node'] for r in alive})
    if len(nodes) < 2:
        return None, 'one node runs ranks: nothing to compare'

    def per_node(key):
        out = {}
        for node in nodes:
            values = [r[key] for r in alive if r['node'] == node and isinstance(r.get(key), (int, float))]
            if values:
                out[node] = sum(values) / len(values)
        return out if len(out) == len(nodes) else None

    compute = per_node('compute_s')
    if compute:
        node = max(compute, key=compute.get)
        others = median([v for n, v in compute.items() if n != node])
        if compute[node] >= others * ratio and compute[node] - others >= min_gap_s:
            return node, ('%s computes %.3f s per step, the other nodes %.3f s (they wait for it)'
                          % (node, compute[node], others))
        return None, 'no node computes clearly longer per step (%s)' % ', '.join(
            '%s %.3f s' % (n, compute[n]) for n in nodes)
    rate = per_node('steps_per_s')
    if rate:
        node = min(rate, key=rate.get)
        others = median([v for n, v in rate.items() if n != node])
        if others and rate[node] * ratio <= others:
            return node, '%s makes %.2f steps/s, the other nodes %.2f' % (node, rate[node], others)
        return None, 'no node is clearly slower (%s steps/s)' % ', '.join('%s %.2f' % (n, rate[n]) for n in nodes)
    return None, 'no step figures yet'


# ----- /proc -----------------------------------------------------------------------------------
def parse_cpu_ticks(text):
    """utime + stime (clock ticks) and the thread count from the text of /proc/PID/stat."""
    if not text or ')' not in text:
        return None
    fields = text.rpartition(')')[2].split()
    try:
        return {'ticks': int(fields[11]) + int(fields[12]), 'threads': int(fields[17])}
    except (ValueError, IndexError):
        return None


def parse_status_memory(text):
    """{rss_kib, peak_rss_kib} (VmRSS, VmHWM) from the text of /proc/PID/status."""
    out = {'rss_kib': None, 'peak_rss_kib': None}
    for line in (text or '').splitlines():
        key, _, value = line.partition(':')
        parts = value.split()
        if key == 'VmRSS' and parts:
            out['rss_kib'] = int(parts[0])
        elif key == 'VmHWM' and parts:
            out['peak_rss_kib'] = int(parts[0])
    return out


def boot_time(proc='/proc'):
    """Seconds since the epoch when the machine booted (btime of /proc/stat), None when unknown."""
    for line in (pr._read(os.path.join(proc, 'stat')) or '').splitlines():
        if line.startswith('btime '):
            try:
                return int(line.split()[1])
            except (ValueError, IndexError):
                return None
    return None


def rank_processes(job_id, uid, proc='/proc', leaders=(), booted=None, ticks_per_s=100):
    """{rank: {pid, local_rank, visible_devices, state, started_at, attempt}} of the job's ranks on this
    node: the job's processes (processes.job_processes) that carry RANK, the topmost one per rank (a
    data loader worker inherits its parent's RANK), of the newest attempt (GPUCLUSTER_ATTEMPT, 1
    without it) where a rank of an older one lingers. started_at (seconds since the epoch) needs the
    boot time (boot_time)."""
    found = {}
    for item in pr.job_processes(job_id, uid, proc, leaders):
        env = pr.read_environ(item['pid'], proc)
        rank = env.get(RANK_ENV, '')
        if not rank.isdigit():
            continue
        stat = pr.read_stat(item['pid'], proc) or {}
        entry = {'pid': item['pid'], 'ppid': stat.get('ppid'), 'state': stat.get('state'),
                 'local_rank': int(env['LOCAL_RANK']) if env.get('LOCAL_RANK', '').isdigit() else None,
                 'visible_devices': env.get('CUDA_VISIBLE_DEVICES'),
                 'attempt': attempt_number(env.get(ATTEMPT_ENV)),
                 'started_at': (round(booted + float(stat['start_time']) / ticks_per_s, 1)
                                if booted is not None and stat.get('start_time') is not None else None)}
        found.setdefault(int(rank), []).append(entry)
    out = {}
    for rank, entries in found.items():
        pids = {e['pid'] for e in entries}
        top = [e for e in entries if e['ppid'] not in pids] or entries
        newest = max(e['attempt'] for e in top)
        out[rank] = min((e for e in top if e['attempt'] == newest), key=lambda e: e['pid'])
    return out


def cpu_sample(pids, proc='/proc', sleep=None, interval=1.0, ticks_per_s=100):
    """{pid: cpu %} over interval seconds (100 = one core busy); None for a process that ended."""
    first = {pid: parse_cpu_ticks(pr._read(os.path.join(proc, str(pid), 'stat'))) for pid in pids}
    if sleep:
        sleep(interval)
    out = {}
    for pid in pids:
        second = parse_cpu_ticks(pr._read(os.path.join(proc, str(pid), 'stat')))
        if first[pid] is None or second is None:
            out[pid] = None
        else:
            out[pid] = round(100.0 * (second['ticks'] - first[pid]['ticks']) / ticks_per_s / interval, 1)
    return out


def memory(pid, proc='/proc'):
    return parse_status_memory(pr._read(os.path.join(proc, str(pid), 'status')))


# ----- GPUs ------------------------------------------------------------------------------------
GPU_FIELDS = ('index', 'uuid', 'utilization.gpu', 'memory.used', 'memory.total')


def gpu_rows_by_index(rows):
    """{index: {utilization_pct, memory_used_mib, memory_total_mib, uuid}} from nvidia_smi.parse_query_csv rows."""
    out = {}
    for row in rows or []:
        index = ns.convert(row.get('index'), 'int')
        if index is None:
            continue
        out[index] = {'uuid': ns.convert(row.get('uuid'), 'str'),
                      'utilization_pct': ns.convert(row.get('utilization.gpu'), 'int'),
                      'memory_used_mib': ns.convert(row.get('memory.used'), 'int'),
                      'memory_total_mib': ns.convert(row.get('memory.total'), 'int')}
    return out


def rank_gpu(local_rank, visible_devices, gpus):
    """The nvidia-smi figures of a rank's GPU: CUDA_VISIBLE_DEVICES[LOCAL_RANK] (an index or a
    UUID), else the GPU numbered LOCAL_RANK; None when it cannot be told."""
    if local_rank is None or not gpus:
        return None
    if visible_devices:
        items = [v.strip() for v in visible_devices.split(',') if v.strip()]
        if local_rank >= len(items):
            return None
        item = items[local_rank]
        if item.isdigit():
            found = gpus.get(int(item))
            return dict(found, index=int(item)) if found else None
        for index, gpu in gpus.items():
            if gpu.get('uuid') and (gpu['uuid'] == item or gpu['uuid'].startswith(item)):
                return dict(gpu, index=index)
        return None
    found = gpus.get(local_rank)
    return dict(found, index=local_rank) if found else None


# ----- one node --------------------------------------------------------------------------------
HEAD_BYTES = 4096        # a progress file's beginning read by every node: its header and first steps
TAIL_BYTES = 32768       # and the end of one of this node's ranks: its last steps, heartbeats and done line


def read_bounded(path, tail_bytes=TAIL_BYTES, head_bytes=HEAD_BYTES):
    """(text, skipped) of a file read without reading all of it: its first head_bytes, then (tail_bytes > 0)
    its last tail_bytes from the first whole line, joined; skipped: the bytes left out between them (0: the
    whole file). A regular file only (O_NOFOLLOW|O_NONBLOCK); (None, 0) when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_NONBLOCK', 0))
    except OSError:
        return None, 0
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, 0
        head = os.read(fd, head_bytes)
        if len(head) < head_bytes or not tail_bytes:
            return head.decode('utf-8', 'replace'), max(0, info.st_size - len(head)) if not tail_bytes else 0
        start = max(len(head), info.st_size - tail_bytes)
        os.lseek(fd, start, os.SEEK_SET)
        tail = b''
        while len(tail) < tail_bytes:
            chunk = os.read(fd, tail_bytes - len(tail))
            if not chunk:
                break
            tail += chunk
    except OSError:
        return None, 0
    finally:
        os.close(fd)
    skipped = start - len(head)
    if skipped > 0:  # both ends at whole lines: a line cut in two is no step
        head = head[:head.rfind(b'\n') + 1]
        tail = tail[tail.find(b'\n') + 1:] if b'\n' in tail else b''
    return (head + tail).decode('utf-8', 'replace'), skipped


def read_progress(job_dir, mine):
    """{rank: parsed} of every progress file of the job, read so that a read costs the same on a job's first
    minute and its seventh day: every file's beginning (HEAD_BYTES: its header, which names its host, attempt and
    world, and its first steps), and the end too (TAIL_BYTES) of the ranks mine(header, rank) says are this
    node's. A parsed file read in part has `skipped` (bytes not read) above 0; its steps are the first and the
    last ones, so the mean rate from the first step and the window's figures are those of the whole file."""
    folder = os.path.join(job_dir, PROGRESS_DIR)
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    out = {}
    for name in names:
        match = PROGRESS_RE.match(name)
        if not match:
            continue
        rank, path = int(match.group(1)), os.path.join(folder, name)
        head, skipped = read_bounded(path, tail_bytes=0)
        parsed = parse_progress(head or '')
        if mine(parsed['header'], rank) and skipped:
            text, skipped = read_bounded(path)
            parsed = parse_progress(text or '')
        parsed['skipped'] = skipped
        out[rank] = parsed
    return out


def read_progress_files(job_dir, subdir=PROGRESS_DIR):
    """{rank: text} of every progress file of the job, whole (the report page's read, once at the end);
    subdir '': the rank files of job_dir itself (an earlier attempt's folder)."""
    folder = os.path.join(job_dir, subdir) if subdir else job_dir
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    out = {}
    for name in names:
        match = PROGRESS_RE.match(name)
        if match:
            out[int(match.group(1))] = pr._read(os.path.join(folder, name)) or ''
    return out


def node_ranks(node, hostname, procs, progress, cpu, mem, gpus, now, window=60.0, gpu_note=None, log=None):
    """The rows of this node's ranks: those with a process here, and the ranks whose progress
    file names this host but have no process any more (they exited). procs and progress are those of
    the job's current attempt (fence_attempts); each row says its attempt.

    A rank with a process here and no progress file takes the steps of the node's log (log, from
    parse_log) when that holds any: in synchronous training one rank that prints is enough. tracked
    says where the steps come from (progress file, log), None when nothing tracks them."""
    rows = []
    mine = set(procs)
    for rank, parsed in progress.items():
        if parsed['header'].get('host') in (hostname, node):
            mine.add(rank)
    empty = {'header': {}, 'steps': [], 'heartbeats': [], 'done': None, 'tail': []}
    usable_log = log if log and (log['steps'] or log['heartbeats']) else None
    for rank in sorted(mine):
        parsed = progress.get(rank)
        if parsed is None:
            parsed = usable_log if rank in procs and usable_log else empty
        row = {'node': node, 'rank': rank, 'last_lines': parsed.get('tail', [])}
        row.update(progress_figures(parsed, now, window))
        proc_row = procs.get(rank)
        row['attempt'] = (attempt_number(proc_row.get('attempt')) if proc_row
                          else progress_attempt(parsed) if parsed.get('header') else None)
        if proc_row:
            row.update(alive=True, pid=proc_row['pid'], state=proc_row['state'],
                       held=HELD_STATES.get(proc_row['state']), cpu_pct=cpu.get(proc_row['pid']),
                       local_rank=proc_row['local_rank'])
            row.update(mem.get(proc_row['pid'], {}))
            gpu = rank_gpu(proc_row['local_rank'], proc_row['visible_devices'], gpus)
            row['gpu'] = gpu
            # the stall clock of a rank without a step runs from its header, else its process start
            row['started_at'] = row.get('started_at') or proc_row.get('started_at')
        else:
            row.update(alive=False, pid=parsed['header'].get('pid'), state=None, held=None, cpu_pct=None,
                       rss_kib=None, peak_rss_kib=None, gpu=None,
                       exit='finished' if parsed['done'] else 'exited')
        row['seconds_since_start'] = (round(max(0.0, now - row['started_at']), 1)
                                      if isinstance(row.get('started_at'), (int, float)) else None)
        if gpu_note and not row.get('gpu'):
            row['gpu_note'] = gpu_note
        rows.append(row)
    return rows


# ----- node_exporter textfile -------------------------------------------------------------------
# Names after Prometheus' naming guide: base units (seconds, bytes), ratios 0-1, timestamps instead
# of ages (an age written at a read would stay frozen in the file until the next read), and the
# job in a job_id label (a scrape renames a target's own `job` label to `exported_job`).
# row key: (metric name after gpucluster_training_rank_, help text, factor to the metric's unit)
METRIC_PREFIX = 'gpucluster_training_'
METRICS = {
    'last_step': ('step', 'Last step the rank logged.', 1),
    'last_step_time': ('last_step_timestamp_seconds', 'When the rank logged its last step (seconds since the epoch).', 1),
    'steps_per_s': ('steps_per_second', 'Steps per second over the window.', 1),
    'step_s': ('step_seconds', 'Seconds per step over the window.', 1),
    'last_loss': ('loss', 'Loss of the last step the rank logged.', 1),
    'compute_s': ('compute_seconds', 'Seconds per step the rank computes (step time less its wait for the others).', 1),
    'wait_s': ('wait_seconds', 'Seconds per step the rank waits for the others.', 1),
    'cpu_pct': ('cpu_ratio', 'CPU use of the rank process over the sample (1 = one core busy).', 0.01),
    'rss_kib': ('resident_memory_bytes', 'Resident memory of the rank process.', 1024),
    'peak_rss_kib': ('peak_resident_memory_bytes', 'Peak resident memory of the rank process.', 1024),
    'alive': ('up', 'Whether the rank process runs (1) or not (0).', 1),
}
GPU_METRICS = {
    'utilization_pct': ('gpu_utilization_ratio', "Utilisation of the rank's GPU (0-1).", 0.01),
    'memory_used_mib': ('gpu_memory_used_bytes', "Memory used on the rank's GPU.", 1048576),
}
JOB_METRICS = {
    'world_size': ('world_size', 'Ranks the job was started with (from the progress files).'),
    'read': ('last_read_timestamp_seconds', "When this node's figures were read (seconds since the epoch)."),
}


def metric_names():
    """Every metric name textfile_records can write."""
    names = [METRIC_PREFIX + 'rank_' + name for name, _, _ in list(METRICS.values()) + list(GPU_METRICS.values())]
    return names + [METRIC_PREFIX + name for name, _ in JOB_METRICS.values()]


def world_size(progress):
    """The job's world size from the headers of the parsed progress files (the largest one), or None.
    Only the files of the newest attempt count: an older attempt's left behind may name another size."""
    newest = max([progress_attempt(p) for p in progress.values()] or [1])
    sizes = [p['header'].get('world') for p in progress.values() if progress_attempt(p) == newest]
    sizes = [s for s in sizes if isinstance(s, int) and not isinstance(s, bool) and s > 0]
    return max(sizes) if sizes else None


def _value(value, factor):
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return round(value * factor, 6) if factor != 1 else value
    return None


def textfile_records(rows, job_id, timestamp_s, node=None, world=None):
    """The rows in node_exporter's textfile format, written by health_reports' gauge writer.

    Every sample carries job_id and node; node defaults to the rows' node."""
    node = node or (rows[0]['node'] if rows else '')
    lines = []
    for key, (name, text, factor) in METRICS.items():
        samples = [([('job_id', job_id), ('node', r['node']), ('rank', r['rank'])], float(_value(r.get(key), factor)))
                   for r in rows if _value(r.get(key), factor) is not None]
        lines += gauge_lines(METRIC_PREFIX + 'rank_' + name, text, samples)
    for key, (name, text, factor) in GPU_METRICS.items():
        samples = [([('job_id', job_id), ('node', r['node']), ('rank', r['rank']), ('gpu', r['gpu'].get('index'))],
                    float(_value(r['gpu'].get(key), factor)))
                   for r in rows if r.get('gpu') and _value(r['gpu'].get(key), factor) is not None]
        lines += gauge_lines(METRIC_PREFIX + 'rank_' + name, text, samples)
    if world:
        name, text = JOB_METRICS['world_size']
        lines += gauge_lines(METRIC_PREFIX + name, text, [([('job_id', job_id), ('node', node)], int(world))])
    name, text = JOB_METRICS['read']
    lines += gauge_lines(METRIC_PREFIX + name, text, [([('job_id', job_id), ('node', node)], float(timestamp_s))])
    return '\n'.join(lines) + '\n'


def ended_here(rows):
    """Whether no rank of the job runs on this node: it finished, failed or was stopped here (or
    never ran here). Its textfile is then removed, so its series do not outlive the job."""
    return not any(r.get('alive') for r in rows)
