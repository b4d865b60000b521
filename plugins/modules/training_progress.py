#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: training_progress
short_description: Read what a running training job does on this node, without touching it
version_added: 0.1.0
description:
  - Finds the job's ranks on this node in C(/proc) (processes of the account that carry
    C(GPUCLUSTER_JOB_ID) and a C(RANK) variable) and reads, per rank, its process state, CPU use over
    O(sample_seconds), resident and peak memory, its GPU's utilisation and memory (C(nvidia-smi),
    where there is one) and its progress file C(<job_dir>/progress/rank-<RANK>.log).
  - A rank with a process here and no progress file takes its steps from the node's log
    C(<job_dir>/logs/<node>.log), the lines O(step_regex) matches (a script of one's own that writes
    no progress file); a line holding C(gpucluster-heartbeat phase=NAME) there is a heartbeat (its
    optional C(since=) is when the phase began; C(phase_s) counts from it).
  - When the progress files (their header's C(attempt=)) or the ranks' processes (their
    C(GPUCLUSTER_ATTEMPT)) are of several attempts of the job (the supervisor restarted it), only the
    newest attempt's count. The files and processes of older ones are no ranks of the job, no part of
    its world size or its figures, and are listed in RV(stale).
  - Nothing is signalled, attached to or slowed down; the progress files are only read.
  - With O(textfile) the figures are written in node_exporter's textfile format (written to a
    temporary file and renamed, so the collector never reads half a file). When no rank of the job
    runs on this node any more (it finished, failed or was stopped here), the textfile is removed
    instead, so the job's series end with it.
  - With O(logs) the last lines of the node's launcher log, of each rank's progress file and of
    torchrun's per-rank logs of this node are returned too, and the Python tracebacks in those logs
    (C(errors)), each rank's own error told from the follow-on errors of ranks whose peer died.
author: gpucluster.multinode contributors (!UNKNOWN)
options:
  job_id:
    description: Id of the job.
    type: str
    required: true
  node:
    description: Name of this node in the job (the inventory name).
    type: str
    required: true
  job_dir:
    description: Directory of the job on the shared storage.
    type: path
    required: true
  owner:
    description: Account that runs the job; default the account the module runs as.
    type: str
  sample_seconds:
    description: Seconds between the two reads of C(/proc/PID/stat) that give the CPU use (0 = no CPU figure).
    type: float
    default: 1.0
  window:
    description: Seconds of progress that the steps per second cover.
    type: float
    default: 60.0
  nvidia_smi:
    description: The nvidia-smi binary; a node without it reports that it has no GPU figures.
    type: str
    default: nvidia-smi
  step_regex:
    description:
      - Regular expression (Python, searched in each line) of a step line in the node's log
        C(<job_dir>/logs/<node>.log), for ranks that write no progress file. Named groups C(step)
        (else the first number of the match), optional C(loss) and C(time) (seconds since the epoch).
      - Empty reads no log.
    type: str
    default: ''
  textfile:
    description: Write the figures to this node_exporter textfile (C(.prom)); empty writes none.
    type: path
  logs:
    description: Return the last O(log_lines) lines of the node's logs (C(log_tails)).
    type: bool
    default: false
  log_lines:
    description: Lines per log with O(logs).
    type: int
    default: 20
attributes:
  check_mode:
    support: full
    details: Only reads; with O(textfile) in check mode it reports whether the file would change.
    description: Can run in check mode and return changed status prediction without writing.
  diff_mode:
    support: none
    description: Returns no diff (the textfile is rewritten whole on each read).
'''

EXAMPLES = r'''
- name: Read the job's figures on every node and write them for node_exporter
  gpucluster.multinode.training_progress:
    job_id: tiny-001
    node: "{{ inventory_hostname }}"
    job_dir: /shared/jobs/tiny-001
    textfile: /var/lib/node_exporter/textfile_collector/gpucluster_training.prom
  become: true
  become_user: train
  register: progress
'''

RETURN = r'''
ranks:
  description: One row per rank of the job on this node (a process here, or a progress file written from this host).
  returned: always
  type: list
  elements: dict
  sample:
    - {node: lab-head, rank: 0, alive: true, state: S, held: null, last_step: 120, last_loss: 0.02,
       steps_per_s: 4.1, seconds_since_step: 0.3, compute_s: 0.05, wait_s: 0.19, cpu_pct: 98.0,
       rss_kib: 412000, peak_rss_kib: 420000, gpu: null, gpu_note: "no GPU: nvidia-smi not found",
       tracked: progress file, phase: checkpoint, phase_s: 40.2, seconds_since_heartbeat: 40.2,
       started_at: 1764000000.0, seconds_since_start: 300.5, attempt: 2}
attempt:
  description:
    - The job's attempt the ranks are read of, the newest that any progress file (its header's C(attempt=), 1 without
      it) or rank process (its C(GPUCLUSTER_ATTEMPT), 1 without it) names; null when there is neither (the read names
      no attempt). The supervisor takes a read of an earlier attempt than the one it started for one that the new
      attempt has not written yet.
  returned: always
  type: int
stale:
  description:
    - The progress files and rank processes of older attempts than RV(attempt), left out of RV(ranks), the world size
      and the figures (a rank the older attempt had and the newer has not leaves its file behind). Every node reads
      the same progress directory, so each lists every stale file; a process is listed by the node it runs on.
  returned: always
  type: list
  elements: dict
  sample:
    - {rank: 3, attempt: 1, kind: progress file, host: node-4}
gpu_note:
  description: Why a rank has no GPU figures (no nvidia-smi, nvidia-smi failed), empty when GPUs were read.
  returned: always
  type: str
hostname:
  description: This node's host name (how the progress files name it).
  returned: always
  type: str
read_at:
  description: Wall clock of the read, seconds since the epoch.
  returned: always
  type: float
textfile:
  description: The textfile written by this read; empty when none was written.
  returned: always
  type: str
textfile_removed:
  description: The textfile this read removed because no rank of the job runs here any more; empty when none.
  returned: textfile is set and no rank of the job runs here
  type: str
flight:
  description:
    - What the NCCL flight recorder's dumps of RV(attempt) in C(<job_dir>/flight/) (attempt N in
      C(<job_dir>/flight/attempt-N/); the newest there when RV(attempt) is null) say (written by every rank when a
      collective timed out, or when a stop asked for them), per rank its last started and completed collective, the
      collective the others wait in and the ranks that did not enter it (C(not_entered)), C(attempt), and
      C(lines) to print. Empty when there are no dumps.
  returned: always
  type: dict
  sample: {not_entered: [1], lines: ["process group 0: rank(s) 0 wait in nccl:all_reduce #5; not entered by rank 1 (last started nccl:broadcast #4)"]}
step_regex:
  description: The regular expression the node's log was read with (empty when none).
  returned: always
  type: str
log_tails:
  description: "{path: [last lines]} of the node's launcher log, its ranks' progress files and torchrun's per-rank logs."
  returned: logs is true
  type: dict
errors:
  description:
    - The Python tracebacks in the last 4 MiB (at most 2000 lines) of each of the node's launcher log and torchrun's
      per-rank logs, at most 4 for the node (the earliest root errors first kept, then the last follow-ons), each
      ending in its last 15 lines; the same rank's same error read in two logs is kept once.
    - The keys of training_job's C(errors) (C(error), C(type), C(follow_on), C(why), C(rank), C(local_rank),
      C(host), C(line), C(lines), C(root_cause) where torchrun's report names it) and C(log), the log it was read from.
  returned: logs is true
  type: list
  elements: dict
  sample:
    - {error: "PermissionError: [Errno 13] Permission denied: '/shared/checkpoints/run/step-3'", type: PermissionError,
       follow_on: false, why: "", rank: 0, local_rank: 0, host: null, line: 13,
       log: /shared/jobs/run/logs/lab-head.log,
       lines: ["Traceback (most recent call last):", "  File \"<frozen os>\", line 225, in makedirs",
               "PermissionError: [Errno 13] Permission denied: '/shared/checkpoints/run/step-3'"]}
'''

import glob
import os
import pwd
import re
import socket
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpucluster.multinode.plugins.module_utils import flight_recorder as fr
from ansible_collections.gpucluster.multinode.plugins.module_utils import job_monitor as jm
from ansible_collections.gpucluster.multinode.plugins.module_utils import nvidia_smi as ns
from ansible_collections.gpucluster.multinode.plugins.module_utils import processes as pr
from ansible_collections.gpucluster.multinode.plugins.module_utils import rank_errors as re_


ARGUMENT_SPEC = dict(
    job_id=dict(type='str', required=True),
    node=dict(type='str', required=True),
    job_dir=dict(type='path', required=True),
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
    own = jm.parse_log(read[0], regex, read[1]) if read else None
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
        mine = jm.parse_log('\n'.join(line for line in text.splitlines() if line.startswith(prefix)), regex, mtime)
        if mine['steps']:
            return dict(mine, source='log of %s' % name)
        parsed = jm.parse_log(text, regex, mtime)
        if parsed['steps'] and (latest is None or parsed['steps'][-1]['time'] > latest['steps'][-1]['time']):
            latest = dict(parsed, source='log of %s' % name)
    return latest or own


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
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
    progress = {rank: jm.parse_progress(text) for rank, text in jm.read_progress_files(p['job_dir']).items()}
    # only the newest attempt's files and processes are the job's ranks; an older one's are reported as stale
    fenced = jm.fence_attempts(progress, procs, host=p['node'])
    progress, procs = fenced['progress'], fenced['procs']
    log = read_node_log(p['job_dir'], p['node'], p['step_regex']) if set(procs) - set(progress) else None
    rows = jm.node_ranks(p['node'], hostname, procs, progress, cpu, mem, gpus, now, p['window'], gpu_note, log)
    result = dict(changed=False, ranks=rows, gpu_note=gpu_note, hostname=hostname, read_at=now, textfile='',
                  step_regex=p['step_regex'], attempt=fenced['attempt'], stale=fenced['stale'])
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
    module.exit_json(**result)


if __name__ == '__main__':
    main()
