"""The supervision loop of the core (plugins/module_utils/training/supervision.py Loop) driven by a fake
platform through every decision: a fault restarted on every node, a lost node replaced by a spare, a job
shrunk, the budget or the minimum spent, a blind read, a missed read confirmed or not, a fault only the
platform knows, a stop that failed, an unreadable checkpoint, a restart that did not start, a recovery half
done when the supervisor ended, the job done and the bound passed. The events are the story a user reads."""

from __future__ import annotations

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import supervision as core

NODES = ['head', 'w1', 'w2']


def _obs(state='running', step=10, failed=(), unreachable=(), stalled=(), why='', **more):
    return dict({'state': state, 'step': step, 'last_step_time': 100.0, 'why': why, 'failed_nodes': list(failed),
                 'unreachable_nodes': list(unreachable), 'stalled_nodes': list(stalled)}, **more)


class Fake:
    """A platform whose reads are a script (one observation a look; the last repeats) and whose acts are kept."""

    def __init__(self, reads, restarts=3, min_nodes=2, spares=(), bad=(), ckpt=(20, None), stop=None, start='',
                 memory=None, confirm=None, platform=None, checkpoint_dir='/ckpt', back=None, **settings):
        self.reads = list(reads)
        self.settings = dict({'restarts': restarts, 'min_nodes': min_nodes, 'spares': list(spares),
                              'checkpoint_dir': checkpoint_dir}, **settings)
        self.back = back
        self.state = {'nodes': list(NODES), 'restarts': 0, 'failures': [], 'spares_used': []}
        self.attempt = 1
        self.memory = dict({'until': None, 'phase': None}, **(memory or {}))
        self.events, self.acts, self.notes = [], [], []
        self.bad, self.ckpt, self.stop_answer, self.start_answer = list(bad), ckpt, stop, start
        self.confirm_answer, self.platform = confirm, platform
        self.fenced = {}

    # the record
    def event(self, kind, **fields):
        assert kind in core.EVENT_KINDS, kind
        self.events.append(dict({'attempt': self.attempt}, **fields, event=kind))

    def remember(self, **changes):
        self.memory.update(changes)
        self.acts.append(('remember', dict(changes)))

    def heartbeat(self, what):
        pass

    def note(self, text):
        self.notes.append(text)

    def begin(self):
        self.event('supervising', nodes=self.state['nodes'])

    def bound(self):
        return 'the bound (5)'

    # the reads
    def look(self):
        if not self.reads:
            raise AssertionError('the loop read once more than the story has')
        return self.reads.pop(0) if len(self.reads) > 1 else dict(self.reads[0])

    look_half_started = look

    def platform_fault(self, obs):
        if self.platform and obs['state'] != 'unknown':
            answer, self.platform = self.platform, None
            return answer
        return None

    def confirm(self, obs):
        self.acts.append(('confirm', list(obs['unreachable_nodes'])))
        return self.confirm_answer(obs)

    def reached(self):
        pass

    def between(self):
        self.acts.append(('wait',))

    def after_restart(self):
        pass

    def fault_fields(self, obs):
        return {}

    # the acts
    def stop(self, obs, act, lost):
        self.acts.append(('stop', list(lost)))
        return self.stop_answer or {'why': 'every rank stopped', 'unstopped': {}}

    def check(self, nodes, spares, act, lost):
        self.acts.append(('check', list(nodes), list(spares)))
        bad = [n for n in nodes + spares if n in self.bad] + list(lost)
        return {'bad': bad, 'why': 'failing: %s' % ', '.join(bad) if bad else 'every node passed'}

    def checkpoint(self):
        return self.ckpt

    def no_checkpoint_why(self):
        return 'no checkpoint directory declared'

    def fault_kind(self, obs, act):
        return {'failed': 'exit', 'unreachable': 'unreachable', 'stalled': 'stalled'}.get(act['seen'], 'restarted'), \
            obs.get('exit_code')

    def wait_back(self, left_out):
        if self.back is None:
            return None
        self.acts.append(('wait_back', list(left_out)))
        return {'back': self.back, 'why': 'on the same nodes (%s answered again)' % ', '.join(left_out) if self.back
                else '%s did not answer again' % ', '.join(left_out)}

    def restart_fields(self, plan, why):
        return {}

    def restart_extra(self, plan, ckpt):
        return {'attempt': self.attempt, 'resume': ckpt}

    def start(self, plan, extra):
        self.acts.append(('start', list(plan['nodes']), extra))
        return self.start_answer

    def stop_part(self, nodes):
        self.acts.append(('stop_part', list(nodes)))
        return {}

    def fence_later(self, nodes, attempt):
        self.fenced.update((n, attempt) for n in nodes)

    def gave_up(self, why):
        self.acts.append(('gave_up',))


def _kinds(fake):
    return [e['event'] for e in fake.events]


def _one(fake, kind):
    found = [e for e in fake.events if e['event'] == kind]
    assert len(found) == 1, (kind, fake.events)
    return found[0]


def _starts(fake):
    return [a for a in fake.acts if a[0] == 'start']


def test_a_killed_rank_is_a_fault_the_job_stopped_checked_and_restarted_on_every_node_then_training_then_done():
    fake = Fake([_obs(step=10), _obs('failed', step=23, failed=['w1'], why='w1 exited 1'), _obs(step=21),
                 _obs('succeeded', step=40)])
    assert core.Loop(fake).run() == 'done'
    assert _kinds(fake) == ['supervising', 'fault', 'job_stopped', 'checked', 'restart', 'training', 'done']
    fault = _one(fake, 'fault')
    assert fault['seen'] == 'failed' and fault['nodes'] == ['w1'] and fault['step'] == 23
    restart = _one(fake, 'restart')
    assert restart['nodes'] == NODES and restart['left_out'] == [] and restart['resume_step'] == 20
    assert restart['lost_steps'] == 3 and restart['attempt'] == 2 and fault['attempt'] == 1  # the one it begins
    assert _starts(fake) == [('start', NODES, {'attempt': 2, 'resume': 20})]
    assert fake.attempt == 2 and fake.state['restarts'] == 1
    assert _one(fake, 'training')['step'] == 21 and fake.memory['ended'] == 'done'
    # each phase was remembered before it was acted on, and the recovery ended with none
    phases = [a[1]['phase']['phase'] for a in fake.acts if a[0] == 'remember' and a[1].get('phase')]
    assert phases == ['stopping', 'checking', 'restarting'] and fake.memory['phase'] is None


def test_a_lost_node_is_neither_stopped_nor_checked_and_a_ready_spare_takes_its_place_and_its_old_ranks_are_fenced():
    lost = _obs('unreachable', step=30, unreachable=['w2'])
    fake = Fake([_obs(), lost, _obs('succeeded', step=40)], spares=['s1'],
                confirm=lambda obs: (dict(obs, lost=['w2'], why='w2 did not answer'),
                                     {'action': 'stop', 'seen': 'unreachable', 'nodes': ['w2'], 'why': 'w2 lost'}))
    assert core.Loop(fake).run() == 'done'
    assert ('confirm', ['w2']) in fake.acts and ('stop', ['w2']) in fake.acts
    assert ('check', ['head', 'w1'], ['s1']) in fake.acts
    restart = _one(fake, 'restart')
    assert restart['nodes'] == ['head', 'w1', 's1'] and restart['left_out'] == ['w2'] and restart['spares'] == ['s1']
    assert 'spare s1 in its place' in restart['why']
    assert fake.fenced == {'w2': 2} and fake.state['spares_used'] == ['s1']


def test_a_read_missed_that_the_second_read_does_not_confirm_stops_nothing():
    missed = _obs('unreachable', unreachable=['w1'])
    fake = Fake([missed, _obs('succeeded', step=40)],
                confirm=lambda obs: (_obs(), {'action': 'wait', 'why': 'a read missed w1'}))
    assert core.Loop(fake).run() == 'done'
    assert _kinds(fake) == ['supervising', 'done'] and not _starts(fake)
    assert not any(a[0] == 'stop' for a in fake.acts)


def test_a_node_failing_its_check_is_left_out_and_the_job_shrinks_without_a_spare():
    fake = Fake([_obs('failed', failed=['w2']), _obs('succeeded')], bad=['w2'])
    assert core.Loop(fake).run() == 'done'
    restart = _one(fake, 'restart')
    assert restart['nodes'] == ['head', 'w1'] and restart['left_out'] == ['w2'] and 'without w2' in restart['why']
    assert fake.fenced == {'w2': 2}


@pytest.mark.parametrize('story,why', [
    ({'restarts': 0}, 'training_restarts is 0'),
    ({'min_nodes': 3, 'bad': ['w2']}, "2 node(s) would remain (head, w1) and training_min_nodes is 3"),
    ({'bad': ['head']}, 'the head head failed its check'),
])
def test_no_restart_left_or_possible_gives_up_and_says_why(story, why):
    fake = Fake([_obs('failed', failed=['w1'])], **story)
    assert core.Loop(fake).run() == 'gave_up'
    assert _kinds(fake)[-1] == 'gave_up' and why in _one(fake, 'gave_up')['why']
    assert not _starts(fake) and ('gave_up',) in fake.acts and fake.memory['ended'] == 'gave_up'


def test_the_same_step_failing_twice_from_the_same_checkpoint_gives_up():
    fake = Fake([_obs('failed', step=23, failed=['w1']), _obs(step=21), _obs('failed', step=23, failed=['w1'])])
    assert core.Loop(fake).run() == 'gave_up'
    assert 'step 24 failed twice with no progress' in _one(fake, 'gave_up')['why']
    assert len(_starts(fake)) == 1


def test_reads_that_say_nothing_stop_nothing():
    blind = _obs('unknown', step=None, why='the read failed')
    fake = Fake([blind, blind, blind, _obs('succeeded')])
    assert core.Loop(fake).run() == 'done'
    assert _kinds(fake) == ['supervising', 'done'] and [a for a in fake.acts if a == ('wait',)] == [('wait',)] * 3


def test_a_job_stopped_by_someone_else_ends_the_supervision_as_stopped_never_as_finished():
    fake = Fake([_obs(step=10), _obs('stopped', step=12)])
    assert core.Loop(fake).run() == 'ended'
    assert _kinds(fake) == ['supervising', 'stopped'] and fake.memory['ended'] == 'stopped'
    assert not _starts(fake)
    summary = core.summarize(fake.events)
    assert (summary['outcome'], summary['why']) == ('stopped', 'the job was stopped (not by its supervisor): nothing '
                                                    'to restart')


def test_a_stall_is_a_fault_of_the_stalled_ranks_nodes():
    fake = Fake([_obs('stalled', stalled=['w1'], why='no step for 60 s'), _obs('succeeded')])
    assert core.Loop(fake).run() == 'done'
    assert _one(fake, 'fault')['seen'] == 'stalled' and _one(fake, 'fault')['nodes'] == ['w1']


def test_a_fault_only_the_platform_knows_is_recovered_as_any_other():
    why = 'the job ended with the reboot of head'
    act = {'action': 'stop', 'seen': 'rebooted', 'nodes': ['head'], 'why': why}
    fake = Fake([_obs('stopped'), _obs('succeeded')], platform=(_obs('failed', why=why), act))
    assert core.Loop(fake).run() == 'done'
    assert _one(fake, 'fault')['seen'] == 'rebooted' and _one(fake, 'restart')['nodes'] == NODES


def test_a_stop_that_left_the_job_running_somewhere_is_not_restarted_on():
    fake = Fake([_obs('failed', failed=['w1'])],
                stop={'why': 'it failed on w1', 'unstopped': {'w1': 'a rank survived'}, 'fields': {'collective': 'x'}})
    assert core.Loop(fake).run() == 'gave_up'
    assert _one(fake, 'job_stopped')['collective'] == 'x'
    assert 'the stop failed on w1' in _one(fake, 'gave_up')['why'] and not _starts(fake)


def test_a_checkpoint_directory_that_cannot_be_read_is_never_a_restart_from_step_0():
    fake = Fake([_obs('failed', failed=['w1'])], ckpt=(None, 'checkpoint directory /ckpt cannot be read'))
    assert core.Loop(fake).run() == 'gave_up'
    assert 'a restart would begin again from step 0' in _one(fake, 'gave_up')['why']


@pytest.mark.parametrize('directory,said', [('/ckpt', 'no complete checkpoint under /ckpt yet'),
                                            ('', 'no checkpoint directory declared')])
def test_without_a_checkpoint_the_restart_begins_at_step_0_and_says_why(directory, said):
    fake = Fake([_obs('failed', step=7, failed=['w1']), _obs('succeeded')], ckpt=(None, None), checkpoint_dir=directory)
    assert core.Loop(fake).run() == 'done'
    restart = _one(fake, 'restart')
    assert restart['resume_step'] == 0 and restart['lost_steps'] == 7 and said in restart['why']


def test_a_restart_that_did_not_start_is_said_and_the_reads_go_on():
    fake = Fake([_obs('failed', failed=['w1']), _obs('succeeded')], start='train.yml started ended with rc 2')
    assert core.Loop(fake).run() == 'done'
    assert _one(fake, 'restart_failed')['why'] == 'train.yml started ended with rc 2'


def test_a_recovery_half_done_goes_again_from_the_stop_without_a_second_fault_event():
    fault = _obs('failed', step=23, failed=['w1'])
    act = {'action': 'stop', 'seen': 'failed', 'nodes': ['w1'], 'why': 'w1 exited 1'}
    fake = Fake([_obs('succeeded')], memory={'phase': {'phase': 'checking', 'obs': fault, 'act': act}})
    assert core.Loop(fake).run() == 'done'
    assert _kinds(fake) == ['supervising', 'job_stopped', 'checked', 'restart', 'done']


def test_a_restart_decided_but_not_seen_started_is_stopped_where_it_may_have_half_started_then_started():
    plan = {'nodes': ['head', 'w1'], 'resume_step': 20}
    fake = Fake([_obs('unknown', step=None), _obs('succeeded')],
                memory={'phase': {'phase': 'restarting', 'plan': plan, 'extra': {'x': 1}}})
    assert core.Loop(fake).run() == 'done'
    acted = [a for a in fake.acts if a[0] in ('stop_part', 'start')]
    assert acted == [('stop_part', ['head', 'w1']), ('start', ['head', 'w1'], {'x': 1})]
    # one that a read shows running is not started again
    fake = Fake([_obs(step=22), _obs('succeeded')],
                memory={'phase': {'phase': 'restarting', 'plan': plan, 'extra': {'x': 1}}})
    assert core.Loop(fake).run() == 'done'
    assert not _starts(fake) and 'not started again' in fake.notes[0]


def test_the_bound_ends_the_supervision_and_the_job_runs_on(monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 99.0, 99.0])
    monkeypatch.setattr(core.time, 'time', lambda: next(clock))
    fake = Fake([_obs()], memory={'until': 50.0})
    assert core.Loop(fake).run() == 'stopped'
    assert _kinds(fake)[-1] == 'stopped' and 'the bound (5) ended' in _one(fake, 'stopped')['why']
    assert fake.memory['ended'] == 'stopped'


def test_the_failure_policy_decides_before_the_check_fail_ends_it_and_an_uncounted_restart_keeps_the_budget():
    policy = [{'on': ['exit'], 'exit_codes': [3], 'action': 'fail'},
              {'on': ['signal'], 'action': 'restart_uncounted'}]
    fake = Fake([_obs('failed', failed=['w1'], exit_code=3)], failure_policy=policy,
                policy_variable='train.failure_policy')
    assert core.Loop(fake).run() == 'gave_up'
    assert _kinds(fake) == ['supervising', 'fault', 'job_stopped', 'gave_up']  # no check: nothing to restart
    assert _one(fake, 'gave_up')['why'] == 'train.failure_policy[0] fails the job on a exit failure'
    assert _one(fake, 'fault')['failure'] == 'exit' and _one(fake, 'fault')['exit_code'] == 3

    class Signalled(Fake):
        def fault_kind(self, obs, act):
            return 'signal', -9
    fake = Signalled([_obs('failed', failed=['w1']), _obs('succeeded')], restarts=0, failure_policy=policy)
    assert core.Loop(fake).run() == 'done'
    restart = _one(fake, 'restart')
    assert restart['counted'] is False and restart['restarts_used'] == 0 and fake.state['restarts'] == 0


def test_too_few_nodes_wait_for_those_left_out_and_restart_on_the_same_nodes_when_they_answer_again():
    fake = Fake([_obs('failed', failed=['w2']), _obs('succeeded')], bad=['w2'], min_nodes=3, back=True)
    assert core.Loop(fake).run() == 'done'
    assert ('wait_back', ['w2']) in fake.acts
    restart = _one(fake, 'restart')
    assert restart['nodes'] == NODES and restart['left_out'] == [] and \
        restart['why'].startswith('on the same nodes (w2 answered again)')
    # not back: the job ends, saying both
    fake = Fake([_obs('failed', failed=['w2'])], bad=['w2'], min_nodes=3, back=False)
    assert core.Loop(fake).run() == 'gave_up'
    assert _one(fake, 'gave_up')['why'] == ('2 node(s) would remain (head, w1) and training_min_nodes is 3; left out: '
                                            'w2; w2 did not answer again')


def test_a_job_stopped_by_someone_while_it_was_being_stopped_ends_the_supervision():
    fake = Fake([_obs('failed', failed=['w1'])], stop={'why': 'stopped', 'ended': 'stopped by the user meanwhile'})
    assert core.Loop(fake).run() == 'stopped'
    assert _kinds(fake)[-2:] == ['job_stopped', 'stopped'] and not _starts(fake)


def test_where_a_restart_that_did_not_start_ends_the_supervision_it_gives_up_naming_why():
    fake = Fake([_obs('failed', failed=['w1'])], start='pod w1: no answer', failed_start='give_up')
    assert core.Loop(fake).run() == 'gave_up'
    assert _kinds(fake)[-3:] == ['restart', 'restart_failed', 'gave_up']
    assert _one(fake, 'gave_up')['why'] == 'restart failed: pod w1: no answer'
