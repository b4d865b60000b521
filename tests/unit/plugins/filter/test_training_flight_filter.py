"""The flight recorder in the controller's views: the stop's lines name the dumps the ranks wrote (and the
ranks that gave none), and the monitor's view takes the dumps of the newest attempt any node read."""

from ansible_collections.gpucluster.multinode.plugins.filter.training import training_stopped_lines
from ansible_collections.gpucluster.multinode.plugins.filter.training_monitor import training_progress_view

ROW = {'node': 'head', 'rank': 0, 'alive': True, 'held': None, 'tracked': 'progress file', 'last_step': 10,
       'last_step_time': 1.0, 'seconds_since_step': 120.0, 'steps_per_s': 2.0}


def test_the_stop_names_each_ranks_dump_and_why_a_rank_gave_none():
    # as Ansible registers the module's result: the ranks as strings
    lines = training_stopped_lines([
        dict(node='head', stopped_pids=[800, 801], flight_dumps={'1': '/j/flight/attempt-2/rank_1',
                                                                 '0': '/j/flight/attempt-2/rank_0'},
             flight_dump_missing=[]),
        dict(node='w1', stopped_pids=[900], flight_dumps={},
             flight_dump_missing=[{'rank': 2, 'why': 'no process reads its pipe /j/flight/attempt-2/rank_2.pipe'}])],
        'j1')
    assert lines == ['job j1 stopped; nothing of it runs on any node',
                     'head: signalled process(es) 800, 801',
                     'head: rank 0 dumped its flight recorder to /j/flight/attempt-2/rank_0',
                     'head: rank 1 dumped its flight recorder to /j/flight/attempt-2/rank_1',
                     'w1: signalled process(es) 900',
                     'w1: rank 2 gave no flight recorder dump: no process reads its pipe /j/flight/attempt-2/rank_2.pipe']


def test_the_view_takes_the_dumps_of_the_newest_attempt_a_node_read():
    old = {'attempt': 1, 'lines': ['process group 0: rank(s) 0 wait in nccl:all_reduce #5; not entered by rank 1']}
    new = {'attempt': 2, 'lines': ['process group 0: rank(s) 1 wait in nccl:all_reduce #9; not entered by rank 0']}
    rows = [dict(ROW), dict(ROW, node='w1', rank=1)]
    for results in ([{'ranks': rows[:1], 'flight': old}, {'ranks': rows[1:], 'flight': new}],
                    [{'ranks': rows[:1], 'flight': new}, {'ranks': rows[1:], 'flight': old}]):
        view = training_progress_view(results, ['head', 'w1'], 60, 'j-1')
        assert view['state'] == 'stalled' and view['stall']['collectives'] == new['lines']
    # a read from before attempts (no attempt in it) still counts
    view = training_progress_view([{'ranks': rows[:1], 'flight': {'lines': old['lines']}}, {'ranks': rows[1:]}],
                                  ['head', 'w1'], 60, 'j-1')
    assert view['stall']['collectives'] == old['lines']
