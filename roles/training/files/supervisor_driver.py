# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The SSH and Slurm drivers of the supervision loop (supervision.Loop, the core, decides; these read and
act): Supervisor reads the job and acts through the collection's playbooks (its parts: Reads, Glances, Runs,
Record, each in a module beside this one), SlurmSupervisor heals the way Slurm does.

Each start of the job is an attempt: the first is settings.json's attempt, each restart the next (passed to
train.yml as training_attempt). A node confirmed lost is left out of the stop and of the health run (neither
waits out its SSH timeout), and its ranks are killed once it answers again (a fenced event). A stop that failed
on a node that answered (failed_hosts of its output: a process of the job it could not end there) is never
followed by a restart, which would start beside what it left: it gives up at once. When the job is done or it
gives up, it writes the job's report page (train.yml -e training_state=report); a report run that fails is an
event (report_failed), never a crash.

With the slurm launcher (SlurmSupervisor) the stop requeues and holds the Slurm job (training_slurm_hold:
scontrol requeuehold), the health run drains the nodes that fail it (health_slurm_drain, reason
'gpucluster-health: <checks>'), and the restart releases the same Slurm job id on the nodes the plan keeps (the
left-out excluded; the ranks see SLURM_RESTART_COUNT + 1 as their attempt); when it gives up, the held job is
cancelled."""

import json
import os
import re
import subprocess
import sys
import time
import traceback

# the supervision core (plugins/module_utils/training/supervision.py), the reader of the flight recorder's dumps
# (plugins/module_utils/training/flight_recorder.py) and the job's files (gpucluster_progress.py: their formats,
# and how root reads and writes them safely), installed beside this module (the training role's
# __training_supervisor_files): Python puts a program's own directory first on its path
import flight_recorder
import gpucluster_progress as progress
import supervision as core
from ansible_output import failed_hosts, last_line
from supervisor_glance import GLANCE_EVERY, Glances
from supervisor_reads import Reads
from supervisor_record import EXIT_ENDED, LOG, MEMORY, START_WINDOW, Record, state_dir_of, when
from supervisor_runs import Runs, as_account


CKPT_TIMEOUT = 60      # the read of the checkpoint directory (as the training account)


class Supervisor(Reads, Glances, Runs, Record):
    """The SSH driver of supervision.Loop: one job's supervisor (the loop's driver methods below; its reads,
    glances, runs and record in the parts it is made of)."""

    def __init__(self, settings):
        self.s = settings
        self.job = settings['job_id']
        self.job_dir = settings['job_dir']  # the job's directory on the shared storage: named to the playbooks only
        self.dir = state_dir_of(settings)
        self.attempt = int(settings.get('attempt', 1))
        # False after a restart that failed: the new attempt may never write, so reads of the earlier one count
        self.attempt_began = True
        self.blind_reads = max(1, int(settings.get('blind_reads', 3)))
        # spares_used: the spares that ran this job (those it started on, job_spares, and those a restart took);
        # none is taken again in a left-out node's place, and each still among the job's nodes is passed to
        # every restart as training_spares (else train.yml would lay the job out without it)
        self.state = {'nodes': list(settings['nodes']), 'restarts': 0, 'failures': [],
                      'spares_used': [n for n in settings.get('job_spares') or [] if n in settings['nodes']]}
        self.child = None
        self.seen_step = None  # the last step a read saw: a read that reaches no rank (a node hangs) keeps it
        self.seen_step_time = None  # and when the ranks logged it
        self.doing = None
        self.failed_reads = 0  # reads in a row that failed
        self.blind = None      # why the supervisor cannot read the job (None: it can)
        self.blind_since = None
        self.last_good = None  # time of the last read that worked
        self.read_seconds = None
        self.quick_seconds = None  # the last quick read's (a failed exit sign's nodes and the head only)
        self.read_rc = None
        self.run_offset = 0    # where the output of the run in progress (or the last) begins in ansible.log
        self.missed = None     # the nodes of the read_missed event of this episode (no event again for them)
        self.unread = {}       # node: confirmations in a row whose reads missed it though it answered a ping
        self.to_fence = {}     # left-out node: the attempt whose start left it out (its older ranks are killed)
        self.fencing = None    # the fence run in progress: (Popen, output path, hosts, started)
        self.fence_next = 0.0
        self.metrics_failed = False
        self.started = time.time()
        # the glance at the job's files on the shared storage between two reads (glance_seconds: 0 is none)
        self.glance_every = float(settings.get('glance_seconds', GLANCE_EVERY) or 0)
        self.glance = None       # the Glance, made at the first wait
        self.glance_off = None   # why the glances cannot be made now (None: they can)
        self.glance_seconds = None
        self.sign = None         # the sign that ended the last wait ({time, kind, nodes, why}), for the fault event
        self.signs_read = set()  # the signs a read already judged: not read for again while they last
        # what it decided, on its host's disk (memory.json): a supervisor that starts again goes on from there
        self.memory = {}
        self.resumed = None      # the memory this run went on from (None: the supervision's first start)
        self.rebooted = None     # its host booted since its memory was last written: (host, boot time)
        self.fence_said = False  # a fence run that could not start was said (once, until one starts)

    def event(self, kind, **fields):
        """An event of the attempt in progress (fields may name another attempt)."""
        return core.append_event(self.dir, kind, **dict({'attempt': self.attempt}, **fields))

    def hang_verdict(self):
        """What the flight recorder's dumps of this attempt say of a stall (flight_recorder.stall_verdict): the
        collective the ranks wait in and the rank that never entered it; None where there is no dump (a job
        without NCCL) or it cannot be read."""
        try:
            return flight_recorder.stall_verdict(self.job_dir, self.attempt)
        except Exception:  # pylint: disable=broad-except  # an explanation that cannot be read is only missing
            return None

    def health(self, nodes):
        """(the quick tier's report, rc of its run); the report is None when the run wrote none."""
        report_dir = self.s['health_report_dir']
        try:
            os.unlink(os.path.join(report_dir, 'latest-quick.json'))
        except OSError:
            pass
        extra = dict({'health_tier': 'quick', 'health_report_dir': report_dir}, **self.check_extra())
        rc = self.playbook(self.s['health_playbook'], extra, limit=nodes)
        try:
            with open(os.path.join(report_dir, 'latest-quick.json')) as handle:
                return json.load(handle), rc
        except (OSError, ValueError):
            return None, rc

    def checkpoint(self):
        """(step, None) of the checkpoint a restart resumes from, as the start's own resume check finds it
        (gpucluster_progress.py --resume-point: the newest complete one, else the newest a script saved without
        the marker), read as the training account (it owns the directory; root on a root_squash export reads
        nothing there, and root parses nothing it writes), bounded by CKPT_TIMEOUT; (None, None) when the job
        declares no checkpoint directory or none is saved yet; (None, why) when the directory cannot be read."""
        directory = self.s.get('checkpoint_dir')
        if not directory:
            return None, None
        user = self.s.get('training_user') if os.geteuid() == 0 else None
        who = user or 'the supervisor'
        cmd = [sys.executable, os.path.abspath(progress.__file__), '--resume-point', directory]
        try:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 timeout=CKPT_TIMEOUT, cwd='/', universal_newlines=True, **as_account(user)).stdout
        except subprocess.TimeoutExpired:
            return None, ('checkpoint directory %s gave no answer within %d s, read as %s (a hung mount?)'
                          % (directory, CKPT_TIMEOUT, who))
        except (OSError, KeyError, ValueError, subprocess.SubprocessError) as exc:
            return None, 'checkpoint directory %s could not be read as %s: %s' % (directory, who, exc)
        try:
            point = json.loads(out.strip().splitlines()[-1][:65536])
        except (ValueError, IndexError):
            point = None
        if not isinstance(point, dict):
            return None, 'checkpoint directory %s could not be read as %s: %s' % (directory, who, last_line(out))
        if point.get('tag') is None:
            note = point.get('note') or ''
            if 'cannot be read' in note:
                return None, '%s, read as %s' % (note, who)
            return None, None
        step = point.get('step')
        if not isinstance(step, int):
            numbers = re.findall(r'(\d+)', str(point['tag']))
            step = int(numbers[-1]) if numbers else 0
        return step, None

    def run(self):
        """recall() its memory, then supervise(): the exit code (0, EXIT_ENDED; 1 after an unexpected error,
        which is a supervisor_error event first: the unit starts it again and it goes on from its memory)."""
        try:
            code = self.recall()
            return code if code is not None else self.supervise()
        except Exception as exc:  # pylint: disable=broad-except  # said, then the unit restarts it
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            why = ('%s: %s (%s line %d, in %s); it starts again and goes on from its memory (%s)'
                   % (type(exc).__name__, exc, os.path.basename(frame.filename), frame.lineno, frame.name,
                      os.path.join(self.dir, MEMORY)))
            traceback.print_exc()
            try:
                self.event('supervisor_error', why=why)
            except Exception:  # pylint: disable=broad-except  # its disk refuses even this: the journal has it
                pass
            return 1
        finally:
            self.metrics_gone()

    def supervise(self):
        """The supervision loop (supervision.Loop, this supervisor its driver: the methods below), then the
        job's report page where it ended: 0, or EXIT_ENDED when it gave up."""
        outcome = core.Loop(self).run()
        if outcome in ('done', 'ended', 'gave_up'):
            self.write_report()
        return EXIT_ENDED if outcome == 'gave_up' else 0

    @property
    def settings(self):
        return self.s

    def begin(self):
        until = self.memory.get('until')
        if self.resumed:
            phase = self.resumed.get('phase') or {}
            self.event('resumed', nodes=self.state['nodes'], why=(
                'the supervisor started again (start %d of its last %d s): attempt %d, %d of %d restart(s) used, '
                '%s%s' % (len(self.memory['starts']), START_WINDOW, self.attempt, self.state['restarts'],
                          self.s['restarts'], ('until %s' % when(until)) if until else 'until the job ends',
                          ('; a recovery was half done (%s): it is finished now' % phase.get('phase'))
                          if phase else '')
                + ('; the run it left (pid %d) was ended' % self.resumed['leftover']
                   if self.resumed.get('leftover') else '')
                + ('; %s rebooted (up since %s)' % (self.rebooted[0], when(self.rebooted[1])) if self.rebooted else '')))
        else:
            self.event('supervising', nodes=self.state['nodes'], why='restarts %d, min nodes %d, %s'
                       % (self.s['restarts'], self.s['min_nodes'],
                          'for %d s' % self.s['seconds'] if until else 'until the job ends'))

    def bound(self):
        return 'training_supervise_seconds (%d)' % self.s['seconds']

    def platform_fault(self, obs):
        """Its host rebooted (recall): once a read says something, a job that ended with the reboot is a fault
        of the rebooted host, not of the first of the other nodes' ranks to exit after it."""
        if not self.rebooted or obs['state'] == 'unknown':
            return None
        host, booted = self.rebooted
        self.rebooted = None
        nodes = [n for n in self.state['nodes'] if n == host or (self.s.get('hosts') or {}).get(n) == host]
        # the job's ranks on the rebooted host ended with it; the other nodes' ranks then fail on their own
        # (a collective whose peer is gone): the fault is the reboot, not the first of them to exit
        if obs['state'] == 'stopped' or (obs['state'] == 'failed' and nodes):
            why = ('the job ended with the reboot of %s (up since %s): ' % (host, when(booted))
                   + ('nothing of it runs and no part of it exited' if obs['state'] == 'stopped' else
                      'its ranks there ended with it, then the others failed (%s)' % obs.get('why')))
            act = {'action': 'stop', 'seen': 'rebooted', 'nodes': nodes, 'why': why}
            return dict(obs, state='failed', why=why), act
        return None

    def reached(self):
        self.missed = None  # a read that reached every node ends an episode of missed reads
        self.unread = {}

    def between(self):
        self.fence_step()
        self.sign = self.wait_next_read()

    def after_restart(self):
        self.seen_step = self.seen_step_time = None  # the restarted job's steps start again from its checkpoint
        self.sign, self.signs_read = None, set()

    def look_half_started(self):
        self.attempt_began = True  # a read of an earlier attempt is stale: nothing of this one was read
        return self.look()

    def fault_fields(self, obs):
        more = {'step_read': obs['step_read']} if obs.get('step_read') else {}
        if self.sign:  # the glance that ended the wait for this read
            more.update(sign=self.sign['why'], sign_time=self.sign['time'])
        if obs.get('quick_read'):  # seen by the quick read of the sign's nodes and the head
            more.update(quick_read=obs['quick_read'], quick_seconds=self.quick_seconds)
        return more

    def fault_kind(self, obs, act):
        """The failure policy's kind of a fault: its host rebooted (the parts there started again), a node lost,
        a stall, a rank killed by a signal or another exit."""
        kinds = {'rebooted': 'restarted', 'unreachable': 'unreachable', 'stalled': 'stalled'}
        if act['seen'] in kinds:
            return kinds[act['seen']], None
        # a failed rank: the core's reading of its exit (a negative code is a signal's, -9 for SIGKILL)
        code = obs.get('exit_code')
        return core.failure_kind({'state': 'failed', 'reason': obs.get('why') or '', 'exit_code': code}), code

    def stop(self, obs, act, lost):
        """train.yml stopped on every node that answers (the lost are told to it, left out of its --limit)."""
        stalled = act['seen'] == 'stalled'
        answering = [n for n in self.state['nodes'] if n not in lost]
        # a stall: the ranks are asked for their NCCL flight recorder's dump before anything is signalled
        extra = {}
        if stalled:
            extra['training_flight_dump'] = True
        extra.update(self.stop_extra())
        if lost:  # the stop's --limit leaves them out: train.yml is told they may be
            extra['training_lost_nodes'] = [self.host_of(n) for n in lost]
        rc = self.train('stopped', limit=answering if lost else None, **extra)
        # nodes that answered and where the stop failed (processes of the job it could not end): the job may run
        # on there, and a restart would start beside it
        unstopped = failed_hosts(self.run_output()) if rc != 0 else {}
        if lost:
            why = ('every rank, container and launcher stopped on %s; %s lost: its ranks are killed when it answers '
                   'again' % (', '.join(answering), ', '.join(lost)) if rc == 0 else
                   'stop on %s ended with rc %d' % (', '.join(answering), rc))
        else:
            why = ('every rank, container and launcher stopped' if rc == 0 else
                   'stop ended with rc %d (a node that does not answer keeps its frozen ranks)' % rc)
        hang = self.hang_verdict() if stalled else None
        if unstopped:
            why += '; it failed on %s' % '; '.join('%s (%s)' % item for item in sorted(unstopped.items()))
        return {'why': why + ('; %s' % hang['why'] if hang else ''), 'unstopped': unstopped,
                'fields': {'collective': hang.get('collective'), 'missing_ranks': hang.get('missing_ranks')}
                if hang else {}}

    def check(self, nodes, spares, act, lost):
        """health.yml's quick tier on the nodes that answer and the ready spares."""
        report, rc = self.health(nodes + spares)
        if report is None:
            # no verdict was read: no node is called failing for it; the fault's own culprits are judged
            bad = list(act['nodes']) + spares  # an unchecked spare is not taken
            return {'bad': bad, 'why': 'the quick health tier wrote no report (health.yml rc %d; its output in %s): '
                                       'judged by the fault alone: %s'
                                       % (rc, os.path.join(self.dir, LOG), ', '.join(bad) or 'no node named')}
        bad = lost + core.bad_nodes(report, nodes + spares)
        why = 'quick health tier: %s' % (('failing or not answering: ' + ', '.join(bad)) if bad
                                         else 'every node passed')
        if lost:
            why += ' (%s lost: not checked)' % ', '.join(lost)
        return {'bad': bad, 'why': why}

    def no_checkpoint_why(self):
        return 'no checkpoint directory declared (training_supervise_checkpoint_dir)'

    def wait_back(self, left_out):
        return None  # a node left out is replaced or done without; the job is never held for it

    def restart_fields(self, plan, why):
        return {}

    def fence_later(self, nodes, attempt):
        for node in nodes:
            self.to_fence[node] = attempt  # the restart begins the next attempt: its events carry it

    def restart_extra(self, plan, ckpt):
        extra = {'training_wait': 'first_step', 'training_attempt': self.attempt,
                 # the spares the job runs on now (those it started on and those taken since, still among its nodes)
                 'training_spares': [self.host_of(n) for n in self.state['spares_used'] if n in plan['nodes']]}
        if ckpt is not None:
            extra.update(training_resume_from=self.s['checkpoint_dir'], training_resume_if_present=True)
        return extra

    def start(self, plan, extra):
        """train.yml started on the plan's nodes: '' or why it did not start."""
        rc = self.train('started', limit=plan['nodes'], **extra)
        self.attempt_began = rc == 0
        if rc == 0:
            return ''
        error = self.last_error()
        what = ('train.yml started did not end within %d s (action_timeout)' % self.s['action_timeout']
                if rc == 124 else 'train.yml started ended with rc %d' % rc)
        return '%s: %s' % (what, error) if error else \
            '%s (no fatal or ERROR line in its output; %s)' % (what, os.path.join(self.dir, LOG))

    def stop_part(self, nodes):
        rc = self.train('stopped', limit=nodes)
        return failed_hosts(self.run_output()) if rc != 0 else {}

    def stop_extra(self):
        return {}

    def check_extra(self):
        return {}

    def gave_up(self, why):
        pass

    def write_report(self):
        """The job's report page (train.yml -e training_state=report), bounded in time; a run that fails is an
        event (report_failed), never the supervisor's end."""
        try:
            rc = self.train('report', timeout=self.s.get('report_timeout', 300), training_report_fetch=False)
            if rc != 0:
                error = self.last_error()
                self.event('report_failed', why='train.yml report ended with rc %d (its output in %s)%s'
                           % (rc, os.path.join(self.dir, LOG), (': %s' % error) if error else ''))
        except Exception as exc:  # pylint: disable=broad-except  # the supervision ended already: only say so
            try:
                self.event('report_failed', why='the report page was not written: %s' % exc)
            except OSError:
                pass


class SlurmSupervisor(Supervisor):
    """The Slurm driver (the slurm launcher): the job heals the way Slurm does. The stop requeues and holds the
    Slurm job (training_slurm_hold: scontrol requeuehold), the quick tier drains the nodes that fail it
    (health_slurm_drain, reason 'gpucluster-health: <checks>'), the restart releases the same Slurm job id on
    the nodes the plan keeps (train.yml started: the left-out excluded), and giving up cancels the held job."""

    def stop_extra(self):
        return {'training_slurm_hold': True}

    def check_extra(self):
        return {'health_slurm_drain': True}

    def gave_up(self, why):
        # the Slurm job waits requeued and held: nothing will release it now
        rc = self.train('stopped')
        self.event('job_stopped', why='the held Slurm job cancelled' if rc == 0 else
                   'cancelling the held Slurm job ended with rc %d (scancel it by hand)' % rc)


def driver_for(settings):
    """The supervisor of a job's platform: Slurm's with the slurm launcher, else the SSH one."""
    return (SlurmSupervisor if settings.get('launcher') == 'slurm' else Supervisor)(settings)
