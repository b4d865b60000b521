# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""What a job's ranks do on this node, read without touching them: their processes in /proc, CPU over a
sample, memory, their GPU (nvidia-smi), their progress files, the node's log for a script that writes
none, the flight recorder's dumps, the node_exporter textfile. The read of the training_progress module,
and of training_job's status where it reads the figures in the same pass (a supervisor's read: one task
on every node, not two)."""

from __future__ import annotations

import glob
import os
import pwd
import re
import socket
import time

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import flight_recorder as fr
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import monitor as jm
from ansible_collections.gpucluster.multinode.plugins.module_utils import nvidia_smi as ns
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import rank_errors as re_

# The options of the read (training_progress's, and training_job's progress suboptions but for job_id,
# node and job_dir, which training_job has of its own)
READ_OPTIONS = dict(
    owner=dict(type='str'),
    sample_seconds=dict(type='float', default=1.0),
    window=dict(type='float', default=60.0),
    step_regex=dict(type='str', default=''),
    nvidia_smi=dict(type='str', default='nvidia-smi'),
    textfile=dict(type='path'),
    logs=dict(type='bool', default=False),
    log_lines=dict(type='int', default=20),
)


def read_gpus(module, binary):
    """({index: figures}, note) from nvidia-smi; note says why there are none."""
    path = binary if os.sep in binary else module.get_bin_path(binary, opt_dirs=['/usr/bin', '/usr/local/bin'])
    if not path or not os.access(path, os.X_OK):
        return {}, 'no GPU: nvidia-smi not found'
    reader = ns.Reader(module, path, 20)
    try:
        rows, _dropped, error = reader.query(jm.GPU_FIELDS)
    except ns.ParseError as exc:
        return {}, 'no GPU figures: %s' % exc
    if rows is None:
        return {}, 'no GPU figures: %s' % error
    return jm.gpu_rows_by_index(rows), ''


def write_textfile(module, path, text):
    try:
        with open(path) as handle:
            if handle.read() == text:
                return False
    except (IOError, OSError):
        pass
    if module.check_mode:
        return True
    folder = os.path.dirname(path) or '.'
    if not os.path.isdir(folder):
        module.fail_json(msg='textfile %s: its directory %s does not exist (node_exporter\'s '
                             '--collector.textfile.directory)' % (path, folder))
    tmp = '%s.%d.tmp' % (path, os.getpid())
    with open(tmp, 'w') as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)
    return True


def remove_textfile(module, path):
    """Remove the textfile of a job that no longer runs here; True when there was one."""
    if not os.path.lexists(path):
        return False
    if not module.check_mode:
        try:
            os.unlink(path)
        except OSError as exc:
            module.fail_json(msg='textfile %s: cannot remove it: %s' % (path, exc))
    return True


def log_tails(job_dir, node, hostname, ranks, lines):
    """({path: last lines}, errors) of the node's launcher log, its ranks' progress files and torchrun's
    per-rank logs; errors: the tracebacks of the launcher and per-rank logs (rank_errors, bounded)."""
    out = {}
    paths = [os.path.join(job_dir, 'logs', '%s.log' % node)]
    paths += [os.path.join(job_dir, jm.PROGRESS_DIR, 'rank-%d.log' % r['rank']) for r in ranks]
    for name in sorted({node, hostname}):
        paths += sorted(glob.glob(os.path.join(job_dir, 'logs', 'ranks', name, '*', 'attempt_*', '*', '*.log')))
    for path in paths:
        if os.path.isfile(path) and path not in out:
            out[path] = pr.tail(path, lines)
    progress = os.path.join(job_dir, jm.PROGRESS_DIR) + os.sep
    errors = re_.log_errors([path for path in out if not path.startswith(progress)], hosts=[node, hostname])
    return out, errors


def read(module, p):
    """The node's read of job p['job_id'] (p: job_id, node, job_dir and READ_OPTIONS): the result
    training_progress returns. Bad options fail the module naming the node."""
    uid = os.geteuid()
    if p['owner']:
        try:
            uid = pwd.getpwnam(p['owner']).pw_uid
        except KeyError:
            module.fail_json(msg='node %s: owner %s is not an account here' % (p['node'], p['owner']))
    if not os.path.isdir(p['job_dir']):
        module.fail_json(msg='node %s: job_dir %s does not exist (is job %s on this cluster, and the shared '
                             'storage mounted here?)' % (p['node'], p['job_dir'], p['job_id']))
    if p['sample_seconds'] < 0 or p['sample_seconds'] > 30:
        module.fail_json(msg='node %s: sample_seconds must be 0 to 30, got %s' % (p['node'], p['sample_seconds']))
    if p['window'] <= 0:
        module.fail_json(msg='node %s: window must be above 0, got %s' % (p['node'], p['window']))
    try:
        re.compile(p['step_regex'] or '')
    except re.error as exc:
        module.fail_json(msg='node %s: step_regex %r is not a regular expression: %s' % (p['node'], p['step_regex'], exc))
    hostname = socket.gethostname()
    ticks = os.sysconf('SC_CLK_TCK')
    procs = jm.rank_processes(p['job_id'], uid, booted=jm.boot_time(), ticks_per_s=ticks)
    pids = [item['pid'] for item in procs.values()]
    cpu = {}
    if p['sample_seconds'] > 0 and pids:
        cpu = jm.cpu_sample(pids, sleep=time.sleep, interval=p['sample_seconds'], ticks_per_s=ticks)
    mem = {pid: jm.memory(pid) for pid in pids}
    gpus, gpu_note = read_gpus(module, p['nvidia_smi'])
    now = time.time()
    # every rank's header (its host, attempt, world), and the end of this node's ranks only: a read costs the
    # same whatever the job's age and the other nodes' ranks
    progress = jm.read_progress(p['job_dir'], lambda header, rank: rank in procs or header.get('host') in (
        hostname, p['node']))
    # only the newest attempt's files and processes are the job's ranks; an older one's are reported as stale
    fenced = jm.fence_attempts(progress, procs, host=p['node'])
    progress, procs = fenced['progress'], fenced['procs']
    log = jm.read_node_log(p['job_dir'], p['node'], p['step_regex']) if set(procs) - set(progress) else None
    rows = jm.node_ranks(p['node'], hostname, procs, progress, cpu, mem, gpus, now, p['window'], gpu_note, log)
    result = dict(changed=False, ranks=rows, gpu_note=gpu_note, hostname=hostname, read_at=now, textfile='',
                  step_regex=p['step_regex'], attempt=fenced['attempt'], stale=fenced['stale'])
    if not procs and not progress and p['step_regex']:
        # a job that ended (no rank here) and writes no progress file: its last step from the logs, so an ended
        # job of a script of one's own still says where it got to (status: failed at step N)
        ended = jm.read_node_log(p['job_dir'], p['node'], p['step_regex'])
        result['log_last_step'] = ended['steps'][-1]['step'] if ended and ended['steps'] else None
    if p['textfile'] and jm.ended_here(rows):
        # no rank runs here any more (finished, failed, stopped): the job's series end with it
        result['changed'] = remove_textfile(module, p['textfile'])
        result['textfile'] = ''
        result['textfile_removed'] = p['textfile'] if result['changed'] else ''
    elif p['textfile']:
        text = jm.textfile_records(rows, p['job_id'], now, node=p['node'], world=jm.world_size(progress))
        result['changed'] = write_textfile(module, p['textfile'], text)
        result['textfile'] = p['textfile']
    # the NCCL flight recorder's dumps of the attempt read (<job_dir>/flight/, attempt N: flight/attempt-N/),
    # where a collective timed out or the stop asked for them
    result['flight'] = fr.read_job(p['job_dir'], fenced['attempt'])
    if p['logs']:
        result['log_tails'], result['errors'] = log_tails(p['job_dir'], p['node'], hostname, rows, p['log_lines'])
    return result
