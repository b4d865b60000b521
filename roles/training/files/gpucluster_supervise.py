# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Supervise one training job from the supervisor host: stop it when a rank fails, a node stops answering
or the job stalls, judge its nodes with the quick health tier, restart it from its latest complete
checkpoint.

    gpucluster_supervise.py <state dir>/settings.json   # supervise (the unit gpucluster-supervise@<job id>)
    gpucluster_supervise.py --report <state dir>        # who supervises it (or that it cannot read the
                                                         # job), the summary and the last events
    gpucluster_supervise.py --probe <state dir>/settings.json
        # one bounded check that the supervisor, as it will run, can do its reads: prints
        # {"problems": ["host X: ...", ...]}; exit 0 when there is none, 1 otherwise

Runs as root from root's own disk (/usr/local/lib/gpucluster, supervision.py, flight_recorder.py and
gpucluster_progress.py beside it) and keeps all its state in its state directory on the supervisor host's own
disk (settings.json's state_dir, e.g. /var/lib/gpucluster/supervise/<job id>; made by the role), never on the
shared storage:

    settings.json, vars.json   written by the role (mode 0600: vars.json may hold tokens)
    lock                       an exclusive lock held for the supervisor's life: one supervisor per job
    events.jsonl               what it saw and did, one JSON object a line (mode 0644); every event of
                               an attempt of the job carries its number (attempt)
    supervisor.json            its heartbeat (mode 0644): pid, host, unit, doing, time, attempt, restarts,
                               step, failed_reads, read_seconds, quick_seconds (the last quick read's),
                               last_read, glance (on, none or off: why),
                               glance_seconds, and blind/blind_since while it cannot read the job
    supervisor.prom            its figures in Prometheus' text format (mode 0644), written on every read
                               and heartbeat; also <metrics_dir>/gpucluster_supervisor_<job id>.prom when
                               settings.json names a node_exporter textfile directory (metrics_dir),
                               removed there when the supervision ends
    status.json                the last status read; ansible.log: the output of every run (mode 0600)
    memory.json                what it decided (mode 0600), written before it acts: attempt, restarts used,
                               the job's nodes and spares, the nodes to fence, the recovery in progress
                               (phase: stopping, checking, restarting with its plan), the run in progress
                               (child: pid and start time), its starts, its bound (until) and how the
                               supervision ended (ended). A supervisor that starts again (its own error:
                               the unit restarts it; its host's reboot: the unit is enabled) goes on from
                               there: the same attempt and budget, the run it left ended, a recovery half
                               done finished once (recall, finish_half_done)
Its files are written by gpucluster_progress.write_atomic (a temporary file of a random name, made with
O_CREAT|O_EXCL|O_NOFOLLOW, renamed over the file): metrics_dir is the training account's, and root never makes,
truncates, chmods or follows a name there. What it reads of the job's files (exit and progress files, the
checkpoint directory, the flight recorder's dumps) is a regular file only, opened with O_NOFOLLOW|O_NONBLOCK
and read up to a bound: a link planted there is not followed, a FIFO never holds it.
The quick health tier reports to settings.json's health_report_dir. The job's directory on the shared
storage (job_dir) is only named to the playbooks; the supervisor writes nothing there.

settings.json: job_id, job_dir, state_dir, unit, nodes, hosts (node: inventory host), addresses (node: address
for the direct probe; else its host), restarts, min_nodes, seconds, interval, action_timeout, read_timeout
(300), blind_reads (3), attempt (1), ssh_port (22), checkpoint_dir, ansible_playbook, ansible (default: the
ansible beside ansible_playbook), inventory, train_playbook, health_playbook, vars_file, health_report_dir,
metrics_dir (''), training_user (--probe, when vars.json names none), environment, launcher (''),
glance_seconds (2), stall_seconds (0: no quiet sign), late_seconds (0: no late sign), spares (the inventory's spares group less the job's
nodes), job_spares (the job's nodes of the spares group, from its start: every restart keeps them in its
layout).

Every read and action is a run of the collection's own playbooks (train.yml status/stopped/started,
health.yml quick tier), the same reads `status` and `watch` make; between two reads it glances at the job's
files on the shared storage (supervisor_glance), and a sign brings the next read at once (supervisor_reads).
With the slurm launcher the job heals the way Slurm does (supervisor_driver.SlurmSupervisor).

Exit codes: 0 (done, stopped, or an ended supervision started again), 1 (an unexpected error: a supervisor_error
event first; the unit restarts it), EXIT_HELD 3 (another supervisor holds the job), EXIT_ENDED 4 (it gave up, or
its memory cannot be read); the unit restarts on 1 only. After START_LIMIT starts within START_WINDOW s it gives
up (gave_up, saying so); the job runs on. Its tools gone (a program that cannot be run) make a run that failed
(rc 127), so a supervisor without its venv is blind, not dead.

Events (each with time, event, attempt): supervising, resumed, supervisor_error, read_missed {nodes}, late {nodes}, blind {failed_reads},
sighted {failed_reads}, glance (off or on again), fault {seen, nodes, step, last_step_time, step_read, sign,
sign_time; seen: failed, unreachable, stalled, or rebooted: after the supervisor host's reboot the job was read
stopped with no part exited), job_stopped, checked {nodes},
restart {nodes, left_out, resume_step, lost_steps}, restart_failed {nodes; why: the failing task's message
from ansible.log}, training {step}, done {step}, gave_up {step}, stopped, report_failed, metrics_failed;
each with its why.

Where things are: the job's state is decided on the controller, where the status read runs
(plugins/plugin_utils/training/job_state.py: the status file's job); what to do about it, the loop and the
restart are decided by the supervision core (supervision.py, installed beside it;
plugins/module_utils/training/supervision.py, shared with the pod agent on Kubernetes): decide(), the
culprits' order, restart_decision(), plan_restart(), Loop, the events' vocabulary and writer, and the summary.
This program only starts the driver of the job's platform; the driver and its parts, installed beside it:
    supervisor_driver.py   Supervisor (SSH) and SlurmSupervisor: the loop's driver methods, the stop, the check,
                           the checkpoint read, the start
    supervisor_reads.py    the status reads, quick reads, blind and sighted, a missed node confirmed
    supervisor_glance.py   the glances at the job's files between two reads, and their signs
    supervisor_runs.py     the runs of ansible, the direct probe, the fence, --probe
    supervisor_record.py   its lock, memory, heartbeat, figures and --report
    ansible_output.py      what it reads of ansible's output
"""

import json
import os
import signal
import sys
import time

from supervisor_driver import driver_for
from supervisor_record import LOCK, lock, report, state_dir_of
from supervisor_runs import probe

EXIT_HELD = 3


def main(argv):
    if len(argv) == 3 and argv[1] == '--report':
        print('\n'.join(report(argv[2])))
        return 0
    if len(argv) == 3 and argv[1] == '--probe':
        try:
            with open(argv[2]) as handle:
                settings = json.load(handle)
            problems = probe(settings) if isinstance(settings, dict) else ['%s is not a JSON object' % argv[2]]
        except (OSError, ValueError) as exc:
            problems = ['settings %s cannot be read: %s' % (argv[2], getattr(exc, 'strerror', None) or exc)]
        print(json.dumps({'problems': problems}), flush=True)
        return 1 if problems else 0
    if len(argv) != 2:
        print('usage: gpucluster_supervise.py <settings.json> | --report <state dir> | --probe <settings.json>',
              file=sys.stderr)
        return 2
    with open(argv[1]) as handle:
        settings = json.load(handle)
    path = os.path.join(state_dir_of(settings), LOCK)
    held = lock(path)
    for wait in (0.5, 1.0):  # a --report looks at the lock for an instant
        if held is not None:
            break
        time.sleep(wait)
        held = lock(path)
    if held is None:
        print('job %s is supervised already (the lock %s is held): this supervisor does nothing'
              % (settings['job_id'], path), flush=True)
        return EXIT_HELD
    sup = driver_for(settings)

    def stopped(signum, _frame):
        # systemctl stop (training_state=stopped does it first, and disables the unit), its host shutting
        # down, or RuntimeMaxSec: the playbook run in progress ends with it (a restart half done is stopped by
        # training_state=stopped next, or finished when the supervisor starts again: its memory is kept);
        # the job's own processes are not touched here
        sup.end_child()
        sup.event('stopped', why='the supervisor was stopped (signal %d: systemctl stop, or its host shutting '
                  'down); the job itself is stopped by training_state=stopped, or runs on unsupervised until the '
                  'supervisor starts again' % signum)
        sys.exit(0)  # through run(): its figures leave node_exporter's directory
    signal.signal(signal.SIGTERM, stopped)
    return sup.run()


if __name__ == '__main__':
    sys.exit(main(sys.argv))
