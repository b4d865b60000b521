#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: training_job
short_description: Start, watch and stop a multi-node training job through its real launcher
version_added: 0.1.0
description:
  - Runs on every node of the job (head first in O(nodes)). Each node does its own part of the job
    for the launcher chosen. C(deepspeed) starts the deepspeed launcher on the head, which starts
    the ranks on every node over pdsh; C(torchrun) starts one torchrun agent per node with a c10d
    rendezvous on the head; C(mpirun) starts Open MPI's mpirun on the head; C(slurm) renders an
    sbatch script on the head, submits it and returns the Slurm job id.
  - Every process of the job carries C(GPUCLUSTER_JOB_ID) in its environment. O(state=status)
    and O(state=stopped) find the job's processes on a node by that variable, never by matching
    command names, and stop them by process group.
  - O(state=checked) is the launch preflight of one node; it changes nothing.
author:
  - gpucluster.multinode contributors (!UNKNOWN)
options:
  state:
    description:
      - C(checked) verifies this node can take part (launcher installed, script present, master port
        free on the head, no process of the same job, and for C(deepspeed) and C(mpirun) the head
        reaches every node over SSH as the account, BatchMode and pinned keys) and reports the
        versions of its environment.
      - C(started) starts this node's part; C(status) reports it; C(stopped) stops it.
      - C(first_step) (head only) waits for the first step line in the head's log, and returns as soon
        as a node's launcher or agent exits non-zero or the launcher reports a node it cannot reach
        (O(watch_timeout) bounds it).
      - C(finished) (head only) waits for the job's end - the head's part no longer runs and, where every
        node starts its own part (torchrun), every node's exit status is written - and returns as soon as a
        node's part exits non-zero or the launcher on the head names a failed node (O(watch_timeout) bounds it).
      - The two waits say how they go once every O(progress_seconds) on the controller (the action of this
        module runs the wait in slices of that length and prints a line after each); they never fail only
        because the time ran out (RV(timed_out)).
    type: str
    choices: [checked, started, status, stopped, first_step, finished]
    default: started
  job_id:
    description: Id of the job, the same on every node; letters, digits, C(.), C(_) and C(-).
    type: str
    required: true
  launcher:
    description: Launcher that starts the ranks.
    type: str
    choices: [deepspeed, torchrun, mpirun, slurm]
    default: deepspeed
  script:
    description: Training script, at the same path on every node (shared storage is simplest).
    type: path
    required: true
  script_args:
    description: Arguments of the script.
    type: list
    elements: str
    default: []
  env_path:
    description: Prefix of the Python environment (venv or conda env); its C(bin) holds python, deepspeed, torchrun.
    type: path
    required: true
  env:
    description:
      - Extra environment variables of the job (for example C(DS_ACCELERATOR=cpu) on CPU nodes, or
        tokens). Written to C(<job_dir>/job.env) mode C(0600), sourced by every node; never returned.
      - A value whose name has a secret word in it (C(HF_TOKEN), C(WANDB_API_KEY)), and any value of six
        characters or more of a name that is not a launcher or library setting (C(DS_*), C(NCCL_*),
        C(GLOO_*), C(TORCH_*), ...), is masked wherever it would appear in the task's output.
    type: dict
    default: {}
  master_addr:
    description: Address of the head on the cluster network (rank 0 and the rendezvous).
    type: str
    required: true
  master_port:
    description: Rendezvous port on the head.
    type: int
    default: 29500
  nproc_per_node:
    description:
      - Ranks on every node, the same count everywhere; default each node's own O(nodes[].slots)
        (torchrun then gets each node's own C(--nproc-per-node)). Must not exceed the slots of any node.
    type: int
  job_dir:
    description: Directory of the job, on storage every node sees (hostfile, config, launcher log, per-rank logs).
    type: path
    required: true
  state_dir:
    description:
      - Private local directory for the pid file and exit status of this node's part (created 0700,
        its parents checked - owned by root or the account, not writable by others).
      - Default C(~/.local/state/gpucluster/jobs) of the account, C(/var/lib/gpucluster/jobs) for root.
    type: path
  hostfile:
    description: Hostfile for C(deepspeed) and C(mpirun); default C(<job_dir>/hostfile), written from O(nodes).
    type: path
  deepspeed_launcher:
    description: How the deepspeed launcher reaches the other nodes.
    type: str
    choices: [pdsh, openmpi]
    default: pdsh
  slurm_partition:
    description: Slurm partition; it must exist.
    type: str
  slurm_time:
    description: Slurm time limit.
    type: str
    default: "01:00:00"
  slurm_gpus_per_node:
    description: GPUs per node asked from Slurm (0 on CPU nodes).
    type: int
    default: 0
  slurm_cpus_per_task:
    description: CPUs per node asked from Slurm.
    type: int
    default: 1
  slurm_requeue:
    description:
      - The Slurm job may be requeued (C(#SBATCH --requeue)); its batch script reads the launch line from
        C(<job_dir>/job.launch) at each run, exports C(GPUCLUSTER_ATTEMPT) as C(SLURM_RESTART_COUNT + 1) and
        writes each attempt's output to its own file (C(<job>-<slurm id>.attempt<N>.out)).
      - With O(state=started), a job whose recorded Slurm job is pending and held (a stop with O(slurm_hold))
        is not submitted again. C(scontrol update) puts it on O(nodes) (C(NumNodes), C(ReqNodeList)), makes it
        eligible at once (C(StartTime=now); Slurm holds a requeued job about two minutes otherwise) and keeps
        the nodes it ran on before and runs on no more out (C(ExcNodeList)), then C(scontrol release)
        starts it under the same Slurm job id.
    type: bool
    default: false
  slurm_hold:
    description:
      - With O(state=stopped), requeue the Slurm job and hold it (C(scontrol requeuehold)) instead of
        cancelling it, so that a start with O(slurm_requeue) releases it under the same id. A job Slurm cannot
        requeue is cancelled.
    type: bool
    default: false
  owner:
    description:
      - Account whose processes are the job's (status, stop); default the account the module runs as.
        A stop run as root with O(owner) reaches that account's processes only, never another user's
        job of the same id. O(state=started) must run as the owner.
    type: str
  ssh_check:
    description: >-
      With C(deepspeed) and C(mpirun), O(state=checked) and O(state=started) on the head refuse the nodes
      it cannot reach over SSH; with V(false) the start goes on and O(state=first_step) names such a node.
    type: bool
    default: true
  ssh_connect_timeout:
    description: >-
      Seconds the head's SSH to a node may take to connect (ssh's C(ConnectTimeout)): the SSH check before a
      start (each login bounded at twice this plus 5 s), pdsh's ssh under C(deepspeed) and mpirun's C(plm_rsh_args).
    type: int
    default: 5
  watch_timeout:
    description: Seconds O(state=first_step) waits for the first step, O(state=finished) for the end.
    type: int
    default: 900
  progress_seconds:
    description:
      - Seconds between two progress lines of O(state=first_step) and O(state=finished), printed on the
        controller while the wait goes on (what the wait saw last - the head log's last line, or the last step).
      - 0 prints none (one wait of O(watch_timeout)).
    type: int
    default: 60
  step_regex:
    description: Regular expression of a step line in the head's log.
    type: str
    default: 'step [0-9]+ loss'
  log_lines:
    description: Lines of log returned with O(state=status).
    type: int
    default: 20
  stop_timeout:
    description: Seconds between SIGTERM and SIGKILL when stopping.
    type: int
    default: 10
  flight_dump:
    description:
      - With O(state=stopped), before anything is signalled, ask each of the job's ranks on this node for the
        dump of its NCCL flight recorder, through its debug-info pipe C(<job_dir>/flight/rank_<RANK>.pipe)
        (C(flight/attempt-<N>/) for attempt N of a supervised job, the attempt the ranks' processes carry), and
        wait for the dumps C(rank_<RANK>) beside them (RV(flight_dumps), RV(flight_dump_missing)).
      - The job must have been started with the flight recorder (a job on GPUs gets it with
        C(TORCH_NCCL_DEBUG_INFO_PIPE_FILE) and C(TORCH_NCCL_ASYNC_ERROR_HANDLING=3)). One line is written to each
        pipe, opened without blocking; a pipe no process reads (the rank is gone) is skipped and named; nothing
        else is signalled. The dumps tell the collective the ranks wait in and the rank that never entered it.
    type: bool
    default: false
  flight_dump_timeout:
    description: Seconds O(flight_dump) waits at most for the ranks' dumps, all ranks together (0 to 600).
    type: int
    default: 20
  progress:
    description:
      - With O(state=status), also read what the job's ranks do on this node in the same pass, as
        M(gpucluster.multinode.training_progress) reads it with these options (its O(job_id), O(node) and
        O(job_dir) are this module's); the read is returned as RV(progress). One task on every node where a
        read of the state and of the figures would take two (a supervisor's read of a large cluster).
    type: dict
    suboptions:
      owner:
        description: Account whose processes are the job's ranks (default the account the module runs as).
        type: str
      sample_seconds:
        description: Seconds of CPU use sampled per rank (0 to 30; 0 samples none).
        type: float
        default: 1.0
      window:
        description: Seconds over which the step rate is taken.
        type: float
        default: 60.0
      step_regex:
        description: Steps in the node's log for a script that writes no progress file.
        type: str
        default: ''
      nvidia_smi:
        description: The nvidia-smi to read the GPUs with.
        type: str
        default: nvidia-smi
      textfile:
        description: node_exporter textfile of the job's figures on this node (removed once no rank runs here).
        type: path
      logs:
        description: Also return the last lines of the node's logs.
        type: bool
        default: false
      log_lines:
        description: Lines of each log with O(progress.logs).
        type: int
        default: 20
  container:
    description:
      - Run every node's part of the job in a container image (C(runtime=none), the default, runs on the host).
      - C(podman) wraps each node's launch command in C(podman run) with host network and IPC, the GPUs
        through CDI (O(container.gpus)), C(/dev/infiniband) where the node has it, memlock as O(container.memlock)
        decides, O(container.mounts) and the job directory at the same path, the env files read-only at their own
        path and the labels C(gpucluster.job=<job_id>) and C(gpucluster.node=<node>). With C(deepspeed) every node
        then runs its own launcher (C(--no_ssh --node_rank)); with C(mpirun) Open MPI starts on the hosts and each
        rank runs in a container. O(state=stopped) removes the job's containers by the job label.
      - C(apptainer) and C(singularity) wrap it in C(apptainer exec --no-home --writable-tmpfs --nv --bind);
        O(container.image) is a SIF file every node sees. C(enroot) runs under C(slurm) only, through pyxis
        (C(srun --container-image --no-container-mount-home --container-writable), no container name, so every run
        imports the image again), with C(srun --gpus-per-node) and C(NVIDIA_VISIBLE_DEVICES),
        C(NVIDIA_DRIVER_CAPABILITIES=compute,utility) when O(slurm_gpus_per_node) is set.
      - Sealed - no runtime mounts the account's home. Inside, C(HOME), C(XDG_CACHE_HOME), C(TRITON_CACHE_DIR),
        C(PIP_CACHE_DIR) and C(TORCHINDUCTOR_CACHE_DIR) are under C(<job_dir>/cache/<node>), C(TORCH_EXTENSIONS_DIR)
        is the image's prebuilt C(/opt/gpucluster/torch_extensions) (the job's own copy), and
        C(GPUCLUSTER_EXPECT_GPUS=<n>) is set when the job has GPUs (the examples then refuse to run on the CPU).
    type: dict
    suboptions:
      runtime:
        description: Container runtime.
        type: str
        choices: [none, podman, apptainer, singularity, enroot]
        default: none
      image:
        description: Image reference (podman), SIF path (apptainer), squashfs path or image (enroot).
        type: str
        default: ''
      digest:
        description: Image id or digest the node's image must have (podman); the check refuses another.
        type: str
        default: ''
      mounts:
        description: Host paths mounted at the same path (the shared storage).
        type: list
        elements: path
        default: []
      gpus:
        description:
          - Give the container every GPU (CDI C(nvidia.com/gpu=all), C(--nv)). Unset - where the node offers
            them (a CDI spec in C(/etc/cdi) or C(/var/run/cdi) for podman, C(/dev/nvidiactl) for apptainer).
        type: bool
      devices:
        description: More devices for C(podman run --device).
        type: list
        elements: str
        default: []
      memlock:
        description:
          - C(--ulimit memlock=-1:-1) for podman (RDMA needs it). C(true) - refused before the start, naming the
            node and the limit, where the account's hard memlock limit (read as the account, as the job gets it)
            is not unlimited; C(auto) - only where it is unlimited, otherwise the default limit with a warning
            naming node and limit; C(false) - never.
        type: raw
        default: auto
      extra_args:
        description: More arguments of the runtime, before the image.
        type: list
        elements: str
        default: []
attributes:
  check_mode:
    support: full
    details: C(checked) and C(status) only read; C(started) and C(stopped) report what they would do.
    description: Can run in check mode and return changed status prediction without modifying the node.
notes:
  - The job runs as the user the module runs as (use C(become_user) for the cluster user).
  - Ranks started by pdsh or mpirun on other nodes are found there by their environment, so
    O(state=stopped) must run on every node of the job.
  - A job's processes are those of the account the module runs as that carry the job's id; the pid
    file of the local part is trusted only while the process it names has the same start time,
    owner and job id, and never once the exit status was written.
extends_documentation_fragment: [gpucluster.multinode.launch_env, gpucluster.multinode.launch_env.nodes, gpucluster.multinode.attributes.no_diff]
'''

EXAMPLES = r'''
# Every node of the play runs each task (hosts: cluster); the nodes and the head's address come from
# the inventory (head first, each node with its own slots).
- name: Start a DeepSpeed job across the cluster
  gpucluster.multinode.training_job:
    state: started
    job_id: tiny-001
    launcher: deepspeed
    node: "{{ inventory_hostname }}"
    nodes: "{{ job_nodes }}"
    script: /shared/jobs/train_tiny.py
    script_args: [--steps, "50"]
    env_path: /opt/gpucluster/env
    env: {DS_ACCELERATOR: cpu, WANDB_API_KEY: "{{ lookup('ansible.builtin.env', 'WANDB_API_KEY') }}"}  # job.env, 0600; never returned
    master_addr: "{{ job_master }}"
    job_dir: /shared/jobs/tiny-001
  vars:
    job_nodes: "{{ groups | gpucluster.multinode.cluster_job_nodes(hostvars) }}"
    job_master: "{{ (groups | gpucluster.multinode.cluster_manifest(hostvars)).master_addr }}"
  become: true
  become_user: train

- name: Stop it on every node (the job's id, launcher, nodes and directory as at its start)
  gpucluster.multinode.training_job:
    state: stopped
    job_id: tiny-001
    launcher: deepspeed
    node: "{{ inventory_hostname }}"
    nodes: "{{ groups | gpucluster.multinode.cluster_job_nodes(hostvars) }}"
    script: /shared/jobs/train_tiny.py
    env_path: /opt/gpucluster/env
    master_addr: "{{ (groups | gpucluster.multinode.cluster_manifest(hostvars)).master_addr }}"
    job_dir: /shared/jobs/tiny-001
  become: true
  become_user: train
'''

RETURN = r'''
job_id:
  description: Id of the job.
  returned: always
  type: str
  sample: tiny-001
launcher:
  description: The job's launcher; its rules read this result on the controller (what the exit codes and the
    rank failure report say of the job).
  returned: always
  type: str
  sample: deepspeed
role:
  description: What this node does in the job (C(launcher), C(agent), C(ranks)).
  returned: always
  type: str
  sample: launcher
command:
  description: Command line this node started (empty where the launcher on the head starts the ranks).
  returned: state is started or checked
  type: str
  sample: /opt/gpucluster/env/bin/deepspeed --hostfile /shared/jobs/tiny-001/hostfile ...
pid:
  description: Pid (and process group) of what this node started.
  returned: state is started and something was started
  type: int
log:
  description: Log of this node's launcher or agent.
  returned: always
  type: str
  sample: /shared/jobs/tiny-001/logs/lab-head.log
world_size:
  description: Ranks of the job, the sum of the nodes' slots.
  returned: always
  type: int
  sample: 5
slots:
  description: Ranks this node runs.
  returned: always
  type: int
ranks:
  description: First and last global rank this node runs.
  returned: always
  type: list
  elements: int
  sample: [0, 1]
first_step:
  description: The first step line seen in the head's log, the whole line (null when none came).
  returned: state is first_step
  type: str
  sample: "lab-head: step 1 loss 2.3026 time 1764000000.125"
elapsed:
  description: Seconds the wait lasted (all its slices).
  returned: state is first_step or finished
  type: float
  sample: 107.3
timed_out:
  description: Whether the wait ran out of O(watch_timeout) before what it waited for came.
  returned: state is first_step or finished
  type: bool
ended:
  description: Whether the job ended (every part done, or a node failed).
  returned: state is finished
  type: bool
job_failed:
  description: Whether a node's part exited non-zero or the launcher on the head named a failed node (the read after the wait names it).
  returned: state is finished
  type: bool
last_step:
  description:
    - The last step line of the head's log when the wait returned (null when none).
    - With O(state=first_step), when a node failed after the job logged steps (it started, then failed at that step).
  returned: state is finished, or state is first_step and a node failed
  type: str
  sample: "lab-head: step 120 loss 0.4120"
failed_at_step:
  description:
    - The step number of RV(last_step) when a node failed after the job logged steps (null when it failed before
      its first step line, or the line holds no number).
  returned: state is first_step and a node failed
  type: int
  sample: 25
failures:
  description: The nodes that failed or could not be reached while the job started, with the cause.
  returned: state is first_step
  type: list
  elements: dict
  sample: [{node: bravo-2, cause: "head cannot reach bravo-2 over SSH as train: ssh: connect to host 10.99.0.14 port 22: Connection timed out"}]
launcher_unreachable:
  description:
    - Nodes the launcher on the head could not reach over SSH (pdsh or mpirun's ssh lines), with the line.
    - Not named C(unreachable), which Ansible reads as the module's own node being unreachable.
  returned: state is status and launcher is deepspeed or mpirun
  type: list
  elements: dict
refused:
  description: Processes the kernel refused to signal (another account's), with the reason.
  returned: state is stopped
  type: list
  elements: dict
rank_log_dir:
  description: Directory of the per-rank logs (torchrun); the deepspeed launcher prefixes every rank's lines with its node in the head's log.
  returned: always
  type: str
running:
  description: Whether a process of the job runs on this node.
  returned: state is status or stopped
  type: bool
exit_code:
  description: Exit status of what this node started, once it ended.
  returned: state is status
  type: int
node_exit_codes:
  description:
    - Exit status per node as the launcher on the head saw it, the node that failed first first
      (pdsh's "ssh exited" lines, mpirun's failure report, srun's error lines with torchrun's report).
  returned: state is status and launcher is deepspeed, mpirun or slurm
  type: dict
  sample: {lab-worker-1: 1}
node_log_tails:
  description: Last lines each node's ranks printed, from the launcher's log on the head.
  returned: state is status and launcher is deepspeed
  type: dict
rank_failure:
  description:
    - torchrun - the first observed rank failure in torchrun's report on this node (time, host, rank, exit code, signal).
    - deepspeed (on the head) - the node whose launcher first reported a rank's non-zero exit, from the pdsh lines
      (time, host as pdsh names it, node, exit code, signal); the culprit when the other nodes' ranks fail after it.
  returned: state is status and launcher is torchrun, or deepspeed on the head
  type: dict
  sample: {time: "2026-11-22_14:36:36", host: lab-worker-1, rank: 1, exit_code: -9, signal: SIGKILL}
errors:
  description:
    - The Python tracebacks in the last 4 MiB (at most 2000 lines) of this node's log (with deepspeed, the head's
      holds every node's lines through pdsh; with Slurm, the batch log), at most 4, each ending in its last 15 lines.
    - "C(error) is the exception line (C(Type: message); of a chained group its first root exception), C(follow_on)
      whether it is a follow-on of another rank's failure (C(why) - a peer that closed or reset its connection, an
      NCCL network error, C(DistBackendError), a collective timeout, torchrun's C(ChildFailedError)) or the rank's
      own error; C(rank) from torch's C([rankN]:) prefix or torchrun's report, C(local_rank) from torchrun's
      C([defaultN]:) prefix, C(host) and C(node) the pdsh host, C(line) its first line in the log read,
      C(root_cause) where torchrun's report names it as the first observed failure."
    - The earliest root errors are kept first, then the last follow-ons.
  returned: state is status
  type: list
  elements: dict
  sample:
    - {error: "PermissionError: [Errno 13] Permission denied: '/shared/checkpoints/run/step-3'", type: PermissionError,
       follow_on: false, why: "", rank: 0, local_rank: null, host: lab-head, node: lab-head, line: 11,
       log: /shared/jobs/run/logs/lab-head.log,
       lines: ["Traceback (most recent call last):", "  File \"/shared/jobs/train.py\", line 13, in save_checkpoint",
               "    os.makedirs(path, exist_ok=True)",
               "PermissionError: [Errno 13] Permission denied: '/shared/checkpoints/run/step-3'"]}
progress:
  description: What the job's ranks do on this node (M(gpucluster.multinode.training_progress)'s result), with O(progress).
  returned: state is status and progress is set
  type: dict
log_tail:
  description: Last lines of this node's log.
  returned: state is status
  type: list
  elements: str
loss_line:
  description: The last loss line of this node's log (the last C(final loss) line, else the last with C( loss )), read
    from its last 64 KiB, or null; the job's C(last loss line) comes from it.
  returned: state is status
  type: str
containers:
  description: The job's containers on this node (podman, by the job label), with id, name, image, image_id, state,
    exit_code (null until it exited) and node.
  returned: state is status and a container runtime is set
  type: list
  elements: dict
removed_containers:
  description: Names of the job's containers the stop removed on this node.
  returned: state is stopped
  type: list
  elements: str
stopped_pids:
  description: Pids that were signalled.
  returned: state is stopped
  type: list
  elements: int
flight_dumps:
  description: "{rank: path} of the flight recorder dumps the ranks on this node wrote when O(flight_dump) asked."
  returned: state is stopped and flight_dump is true
  type: dict
  sample: {"0": /shared/jobs/run/flight/rank_0, "1": /shared/jobs/run/flight/rank_1}
flight_dump_missing:
  description:
    - The ranks of the job on this node that gave no dump, each with why (no pipe, no process reads it, not
      written within O(flight_dump_timeout)).
  returned: state is stopped and flight_dump is true
  type: list
  elements: dict
  sample: [{rank: 2, why: "asked through its pipe, but no new dump came within 20 s"}]
flight_attempt:
  description: The attempt whose dumps were asked for (the newest the ranks' processes carry).
  returned: state is stopped and flight_dump is true
  type: int
slurm_job_id:
  description: Slurm's id of the submitted job.
  returned: launcher is slurm and state is started or status
  type: str
requeued:
  description: The Slurm job held by a stop with O(slurm_hold) was released under its id, not submitted again.
  returned: launcher is slurm, state is started and a held job was released
  type: bool
slurm_attempt:
  description: The attempt the released Slurm job runs (its C(Restarts) + 1, C(SLURM_RESTART_COUNT) + 1 inside).
  returned: launcher is slurm, state is started and a held job was released
  type: int
excluded:
  description: Nodes the released Slurm job is kept off (C(ExcNodeList)).
  returned: launcher is slurm, state is started and a held job was released
  type: list
  elements: str
slurm_held:
  description: With O(slurm_hold), true when the Slurm job waits requeued and held, false when Slurm could not
    requeue it and it was cancelled.
  returned: launcher is slurm, state is stopped, slurm_hold is true and a Slurm job was recorded
  type: bool
slurm_state:
  description: Slurm's state of the job (squeue while queued or running, then scontrol show job, then sacct).
  returned: launcher is slurm and state is status
  type: str
versions:
  description:
    - Versions of the environment on this node that the launcher needs the same on every node (keys of
      module_utils/env_versions) - python, torch, its CUDA and NCCL, the NCCL wheel, and deepspeed for the
      deepspeed launcher; Ray matters to none of them.
  returned: state is checked
  type: dict
  sample: {python: 3.11.2, torch: 2.13.0+cpu, torch_cuda: null, torch_nccl: null, nccl_wheel: null, deepspeed: 0.19.8}
'''

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import ranks as job_ranks
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import launchers
from ansible_collections.gpucluster.multinode.plugins.module_utils.training.job import Job, Runner
from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as training


def main():
    node_spec = dict(name=dict(type='str', required=True), address=dict(type='str', required=True),
                     slots=dict(type='int', default=1), host=dict(type='str'))
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type='str', default='started',
                       choices=['checked', 'started', 'status', 'stopped', 'first_step', 'finished']),
            job_id=dict(type='str', required=True),
            launcher=dict(type='str', default='deepspeed', choices=sorted(launchers.LAUNCHERS)),
            node=dict(type='str', required=True),
            nodes=dict(type='list', elements='dict', required=True, options=node_spec),
            script=dict(type='path', required=True),
            script_args=dict(type='list', elements='str', default=[]),
            env_path=dict(type='path', required=True),
            # masked below: secrets only (training.secret_env_values), so versions such as 2.13.0+cpu stay readable
            env=dict(type='dict', default={}, no_log=False),
            env_files=dict(type='list', elements='path', default=[cluster_defaults.NCCL_PROFILE]),
            master_addr=dict(type='str', required=True),
            master_port=dict(type='int', default=cluster_defaults.MASTER_PORT),
            nproc_per_node=dict(type='int'),
            job_dir=dict(type='path', required=True),
            state_dir=dict(type='path'),
            hostfile=dict(type='path'),
            deepspeed_launcher=dict(type='str', default='pdsh', choices=list(launchers.DEEPSPEED_LAUNCHERS)),
            slurm_partition=dict(type='str'),
            slurm_time=dict(type='str', default='01:00:00'),
            slurm_gpus_per_node=dict(type='int', default=0),
            slurm_cpus_per_task=dict(type='int', default=1),
            slurm_requeue=dict(type='bool', default=False),
            slurm_hold=dict(type='bool', default=False),
            ssh_check=dict(type='bool', default=True),
            ssh_connect_timeout=dict(type='int', default=5),
            owner=dict(type='str'),
            watch_timeout=dict(type='int', default=900),
            progress_seconds=dict(type='int', default=60),
            step_regex=dict(type='str', default='step [0-9]+ loss'),
            log_lines=dict(type='int', default=20),
            stop_timeout=dict(type='int', default=10),
            flight_dump=dict(type='bool', default=False),
            flight_dump_timeout=dict(type='int', default=20),
            progress=dict(type='dict', options=job_ranks.READ_OPTIONS),
            container=dict(type='dict', options=dict(
                runtime=dict(type='str', default='none', choices=['none', 'podman', 'apptainer', 'singularity', 'enroot']),
                image=dict(type='str', default=''),
                digest=dict(type='str', default=''),
                mounts=dict(type='list', elements='path', default=[]),
                gpus=dict(type='bool'),
                devices=dict(type='list', elements='str', default=[]),
                memlock=dict(type='raw', default='auto'),
                extra_args=dict(type='list', elements='str', default=[]),
            )),
        ),
        supports_check_mode=True,
    )
    for value in training.secret_env_values(module.params['env']):
        module.no_log_values.add(value)
    state = module.params['state']
    try:
        job = Job(module.params, Runner(module))
        if module.params['ssh_connect_timeout'] < 1:
            job.fail('node %s: ssh_connect_timeout must be 1 or more seconds, got %d'
                     % (job.me, module.params['ssh_connect_timeout']))
        if state == 'checked':
            problems, versions, cmd = job.check()
            if problems:
                job.fail('node %s: %s' % (job.me, '; '.join(problems)), versions=versions, command=cmd)
            result = job.result(changed=False, versions=versions, command=cmd)
        elif state == 'started':
            result = job.start()
        elif state == 'status':
            if not os.path.isdir(module.params['job_dir']):
                # a node without the job's directory cannot be read (its shared storage is not mounted): the
                # job's state there is unknown, never stopped
                job.fail('node %s: the job directory %s does not exist here (is the shared storage of '
                         'training_jobs_dir mounted?)' % (job.me, module.params['job_dir']))
            result = job.status()
            if module.params['progress'] is not None:
                result['progress'] = job_ranks.read(module, dict(module.params['progress'], job_id=job.job_id,
                                                                 node=job.me, job_dir=module.params['job_dir']))
        elif state in ('first_step', 'finished'):
            if not job.is_head:
                job.fail('node %s: state=%s runs on the head (%s) only' % (job.me, state, job.nodes[0]['name']))
            wait = job.watch if state == 'first_step' else job.wait_end
            result = wait(module.params['watch_timeout'], module.params['step_regex'])
        else:
            if not 0 <= module.params['flight_dump_timeout'] <= 600:
                job.fail('node %s: flight_dump_timeout must be 0 to 600 seconds, got %d'
                         % (job.me, module.params['flight_dump_timeout']))
            result = job.stop(flight_dump=module.params['flight_dump'],
                              flight_dump_timeout=module.params['flight_dump_timeout'],
                              slurm_hold=module.params['slurm_hold'])
    except launchers.JobError as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
