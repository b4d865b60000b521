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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import ranks as jr


ARGUMENT_SPEC = dict(
    job_id=dict(type='str', required=True),
    node=dict(type='str', required=True),
    job_dir=dict(type='path', required=True),
    **jr.READ_OPTIONS
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(**jr.read(module, module.params))


if __name__ == '__main__':
    main()
