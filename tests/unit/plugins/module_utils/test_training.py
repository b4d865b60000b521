import os
import subprocess
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as tr
from ansible_collections.gpucluster.multinode.plugins.filter.training import training_verdict

NODES = [{'name': 'gpu-master', 'address': '192.168.1.100', 'slots': 8},
         {'name': 'gpu-worker-1', 'address': '192.168.1.101', 'slots': 8}]


def test_deepspeed_line_uses_hostfile_pdsh_master_and_rank_logs():
    argv = tr.deepspeed_command('/opt/env', '/shared/jobs/j/hostfile', '192.168.1.100', 29500, '/shared/train.py',
                                ['--steps', '10'], rank_log_dir='/shared/jobs/j/logs/ranks', num_nodes=2)
    assert argv[:9] == ['/opt/env/deepspeed', '--hostfile', '/shared/jobs/j/hostfile', '--launcher', 'pdsh',
                        '--master_addr', '192.168.1.100', '--master_port', '29500']
    assert argv[argv.index('--enable_each_rank_log') + 1] == '/shared/jobs/j/logs/ranks'
    assert argv[-3:] == ['/shared/train.py', '--steps', '10']


def test_torchrun_line_has_c10d_rendezvous_on_the_head_and_the_node_address():
    argv = tr.torchrun_command('/opt/env/', 3, 1, '192.168.1.100', 29600, 'job-1', 'train.py',
                               local_addr='192.168.1.102')
    line = tr.join(argv)
    assert line.startswith('/opt/env/torchrun --nnodes 3 --nproc-per-node 1 --rdzv-backend c10d')
    assert '--rdzv-endpoint 192.168.1.100:29600 --rdzv-id job-1 --max-restarts 0 --local-addr 192.168.1.102' in line


def test_mpirun_forwards_nccl_and_master_variables():
    env = {'PATH': '/x', 'NCCL_SOCKET_IFNAME': 'eth0', 'MASTER_ADDR': 'a', 'HOME': '/root', 'GPUCLUSTER_JOB_ID': 'j'}
    argv = tr.mpirun_command('/opt/env', 'hf', 5, tr.forwarded_env_names(env), 'train.py',
                             ssh_args='-o BatchMode=yes')
    # -np is the sum of the hostfile's slots, filled node after node (2+1+1+1: no fixed count per node)
    assert argv[:8] == ['mpirun', '--hostfile', 'hf', '-np', '5', '--map-by', 'slot', '--bind-to']
    assert argv[argv.index('plm_rsh_args') + 1] == '-o BatchMode=yes'
    forwarded = [argv[i + 1] for i, a in enumerate(argv) if a == '-x']
    assert forwarded == ['GPUCLUSTER_JOB_ID', 'MASTER_ADDR', 'NCCL_SOCKET_IFNAME', 'PATH']
    assert argv[-2:] == ['/opt/env/python', 'train.py']


def test_sbatch_script_takes_hostfile_from_scontrol_and_runs_torchrun_through_srun():
    launch = tr.slurm_launch_line('torchrun', '/opt/env/bin', 8, 'job-7', '/shared/train.py', ['--steps', '5'],
                                  log_dir='/shared/jobs/job-7/logs/ranks')
    script = tr.sbatch_script('job-7', 4, 8, '02:00:00', '/shared/jobs/job-7/logs', '/shared/jobs/job-7/hostfile',
                              29500, launch, partition='gpu', env_file='/shared/jobs/job-7/job.env')
    assert '#SBATCH --nodes=4\n' in script
    assert '#SBATCH --gpus-per-node=8\n' in script
    assert '#SBATCH --partition=gpu\n' in script
    assert '#SBATCH --output=/shared/jobs/job-7/logs/%x-%j.out' in script
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" > /shared/jobs/job-7/hostfile' in script
    assert 'export GPUCLUSTER_JOB_ID=job-7' in script
    # the job's environment (tokens) is sourced from its 0600 file, never written into the script
    assert 'set -a; . /shared/jobs/job-7/job.env; set +a' in script
    assert ('srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 '
            "bash -c 'exec /opt/env/bin/torchrun --nnodes \"$SLURM_NNODES\"") in script
    assert '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"' in script
    # every node advertises its own NodeAddr and logs its ranks under its own name
    assert '--local-addr "$(node_addr "$SLURMD_NODENAME")"' in script
    assert '--log-dir /shared/jobs/job-7/logs/ranks/"$SLURMD_NODENAME"' in script
    assert 'MASTER_ADDR=$(node_addr "$(head -n 1 /shared/jobs/job-7/hostfile)")' in script
    cpu = tr.sbatch_script('j', 2, 0, '00:10:00', '/l', '/h', 29500, 'true')
    assert '--gpus-per-node' not in cpu and '--partition' not in cpu


@pytest.mark.parametrize('time_limit,partition', [('01:00:00\n#SBATCH --uid=0', None), ('1:00; rm -rf /', None),
                                                  ('01:00:00', 'gpu\nhostname'), ('01:00:00', 'gpu;id')])
def test_sbatch_refuses_a_time_or_partition_that_would_escape_its_line(time_limit, partition):
    with pytest.raises(tr.TrainingError, match='slurm_(time|partition)'):
        tr.sbatch_script('j', 2, 0, time_limit, '/l', '/h', 29500, 'true', partition=partition)


def test_env_file_quotes_values_and_refuses_bad_names(tmp_path):
    text = tr.env_file_text({'WANDB_API_KEY': 'abc;rm -rf ~', 'NOTE': "two\nlines 'q'"})
    (tmp_path / 'job.env').write_text(text)
    out = subprocess.run(['bash', '-c', 'set -a; . %s; printf "%%s|" "$WANDB_API_KEY" "$NOTE"' % (tmp_path / 'job.env')],
                         capture_output=True, text=True, check=True)
    assert out.stdout == "abc;rm -rf ~|two\nlines 'q'|"
    with pytest.raises(tr.TrainingError, match='not a valid variable name'):
        tr.env_file_text({'A;id': 'x'})


def test_deepspeed_config_needs_json_and_batch_settings():
    assert tr.load_deepspeed_config('{"train_batch_size": 32}') == {'train_batch_size': 32}
    with pytest.raises(tr.TrainingError, match='not valid JSON'):
        tr.load_deepspeed_config('{"train_batch_size": 32,}')
    with pytest.raises(tr.TrainingError, match='no batch settings'):
        tr.load_deepspeed_config({'zero_optimization': {'stage': 2}})


def test_job_ids_are_safe_names():
    assert tr.check_job_id('tiny-20261122.1') == 'tiny-20261122.1'
    for bad in ('', '-x', 'a b', 'a;rm', 'x' * 65):
        with pytest.raises(tr.TrainingError):
            tr.check_job_id(bad)


def test_pdsh_exit_lines_name_the_failed_node():
    text = ('lab-head: step 3 loss 1.0\n'
            'lab-worker-1: Traceback (most recent call last):\n'
            'lab-worker-1: RuntimeError: boom\n'
            'pdsh@lab-head: lab-worker-1: ssh exited with exit code 1\n')
    assert tr.pdsh_exit_codes(text) == {'lab-worker-1': 1}
    tails = tr.pdsh_node_tails(text, ['lab-head', 'lab-worker-1'])
    assert tails['lab-worker-1'][-2:] == ['RuntimeError: boom', 'pdsh@lab-head: lab-worker-1: ssh exited with exit code 1']


def test_verdict_names_the_worker_that_failed_while_others_run():
    results = [
        {'node': 'gpu-master', 'role': 'launcher', 'job_id': 'j', 'running': True, 'exit_code': None,
         'log': '/shared/jobs/j/logs/gpu-master.log', 'node_exit_codes': {'gpu-worker-1': 1},
         'node_log_tails': {'gpu-worker-1': ['RuntimeError: boom']}},
        {'node': 'gpu-worker-1', 'role': 'ranks', 'running': False, 'exit_code': None, 'log': 'x'},
    ]
    verdict = training_verdict(results)
    assert verdict['state'] == 'failed'
    assert verdict['failed_nodes'] == ['gpu-worker-1']
    assert verdict['first_failure']['log_tail'] == ['RuntimeError: boom']
    assert verdict['running_nodes'] == ['gpu-master']


def test_verdict_success_running_and_stopped():
    ok = [{'node': 'a', 'running': False, 'exit_code': 0}, {'node': 'b', 'running': False, 'exit_code': 0}]
    assert training_verdict(ok)['state'] == 'succeeded'
    assert training_verdict([{'node': 'a', 'running': True, 'exit_code': None}])['state'] == 'running'
    assert training_verdict([{'node': 'a', 'running': False, 'exit_code': None}])['state'] == 'stopped'
    agent_failed = [{'node': 'a', 'running': False, 'exit_code': 0}, {'node': 'b', 'running': False, 'exit_code': 1}]
    assert training_verdict(agent_failed)['failed_nodes'] == ['b']


TORCHRUN_REPORT = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/shared/jobs/train_tiny.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_14:36:36
  host      : lab-worker-1
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 698)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 698
============================================================
"""


def test_torchrun_report_is_read_and_the_first_failure_is_the_culprit():
    failure = tr.torchrun_failure(TORCHRUN_REPORT)
    assert failure == {'time': '2026-11-22_14:36:36', 'host': 'lab-worker-1', 'rank': 1, 'exit_code': -9,
                       'signal': 'SIGKILL'}
    head_report = TORCHRUN_REPORT.replace('14:36:36', '14:36:47').replace('lab-worker-1', 'lab-head').replace(
        '-9 (pid: 698)  (SIGKILL)', '1 (pid: 719) ')
    results = [
        {'node': 'lab-head', 'running': False, 'exit_code': 1, 'rank_failure': tr.torchrun_failure(head_report)},
        {'node': 'lab-worker-1', 'running': False, 'exit_code': 1, 'rank_failure': failure, 'log_tail': ['x']},
        {'node': 'lab-worker-2', 'running': False, 'exit_code': 1, 'rank_failure': None},
    ]
    verdict = training_verdict(results)
    assert verdict['state'] == 'failed'
    assert verdict['failed_nodes'][0] == 'lab-worker-1'
    assert verdict['first_failure']['node'] == 'lab-worker-1'
    assert tr.torchrun_failure('no report here') is None


def test_recorded_torchrun_agent_logs():
    here = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'torchrun')
    with open(os.path.join(here, 'agent-rank-killed.log')) as f:
        killed = tr.torchrun_failure(f.read())
    with open(os.path.join(here, 'agent-peer-failed.log')) as f:
        peer = tr.torchrun_failure(f.read())
    assert (killed['host'], killed['signal'], killed['exit_code']) == ('lab-worker-1', 'SIGKILL', -9)
    assert (peer['host'], peer['signal'], peer['exit_code']) == ('lab-head', None, 1)
    assert killed['time'] < peer['time']


def test_verdict_reports_the_final_loss_line():
    results = [{'node': 'h', 'running': False, 'exit_code': 0,
                'log_tail': ['h: step 49 loss 0.5', 'h: step 50 loss 0.4', 'h: final loss 0.41 steps 50 world 3 backend gloo',
                             'h: [INFO] exiting']}]
    verdict = training_verdict(results)
    assert verdict['last_loss_line'] == 'h: final loss 0.41 steps 50 world 3 backend gloo'
    assert 'last loss line: h: final loss 0.41 steps 50 world 3 backend gloo' in verdict['lines']


def test_sbatch_script_runs_under_bash_with_each_node_its_own_address(tmp_path):
    """The rendered script, run by bash with scontrol and srun standing in for Slurm's: srun runs the
    per-node line once per node, and torchrun (here: echo) gets that node's address and log dir."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'scontrol').write_text(
        '#!/bin/bash\n'
        'case "$1 $2" in\n'
        '  "show hostnames") printf "n1\\nn2\\n" ;;\n'
        '  "show node") echo "NodeName=$3 Arch=x86_64 NodeAddr=10.0.0.${3#n} NodeHostName=$3 Version=22.05.8" ;;\n'
        'esac\n')
    # srun's four options (nodes and tasks from the allocation, one per node, kill on a bad exit) dropped
    (bin_dir / 'srun').write_text('#!/bin/bash\nshift 4\nfor n in n1 n2; do SLURMD_NODENAME=$n "$@"; done\n')
    (bin_dir / 'torchrun').write_text('#!/bin/bash\necho "torchrun $*"\n')
    for name in ('scontrol', 'srun', 'torchrun'):
        (bin_dir / name).chmod(0o755)
    launch = tr.slurm_launch_line('torchrun', str(bin_dir), {'n1': 2, 'n2': 1}, 'job 7', '/shared/my train.py',
                                  ['--steps', '5'], log_dir=str(tmp_path / 'ranks'))
    (tmp_path / 'job.env').write_text("export DS_ACCELERATOR=cpu\n")
    script = tr.sbatch_script('job-7', 2, 0, '00:10:00', str(tmp_path), str(tmp_path / 'hostfile'), 29500, launch,
                              env_file=str(tmp_path / 'job.env'))
    (tmp_path / 'job.sbatch').write_text(script)
    env = dict(os.environ, PATH='%s:%s' % (bin_dir, os.environ['PATH']), SLURM_JOB_NODELIST='n[1-2]',
               SLURM_NNODES='2', SLURM_JOB_NUM_NODES='2', SLURM_JOB_ID='42')
    out = subprocess.run(['bash', str(tmp_path / 'job.sbatch')], env=env, capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == 'job job-7: slurm job 42 on n1,n2, master 10.0.0.1:29500'
    assert len(lines) == 3
    for node, nproc, line in zip(('n1', 'n2'), (2, 1), lines[1:]):
        # mixed slots: each node's agent gets its own --nproc-per-node
        assert '--nnodes 2 --nproc-per-node %d ' % nproc in line
        assert '--rdzv-endpoint 10.0.0.1:29500 --rdzv-id job 7 ' in line
        assert '--local-addr 10.0.0.%s ' % node[1] in line
        assert '--log-dir %s/ranks/%s ' % (tmp_path, node) in line
        assert line.endswith('/shared/my train.py --steps 5')


def test_mpirun_ranks_get_torch_rank_variables_and_node_env_files(tmp_path):
    """The rank wrapper mpirun starts, run by bash with Open MPI's variables set."""
    env_file = tmp_path / 'nccl.sh'
    env_file.write_text('GLOO_SOCKET_IFNAME=eth7\n')
    prefix = 'set -a; [ -r %s ] && . %s; set +a; ' % (env_file, env_file)
    argv = tr.mpirun_command('/usr', 'hf', 2, [], '-c', ['import os; print(os.environ["RANK"], '
                                                         'os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"], '
                                                         'os.environ["GLOO_SOCKET_IFNAME"])'], node_prefix=prefix)
    wrapper = argv[argv.index('/bin/bash'):]
    wrapper[3] = sys.executable
    env = dict(os.environ, OMPI_COMM_WORLD_RANK='1', OMPI_COMM_WORLD_SIZE='2', OMPI_COMM_WORLD_LOCAL_RANK='0',
               OMPI_COMM_WORLD_LOCAL_SIZE='1')
    out = subprocess.run(wrapper, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ['1', '2', '0', 'eth7']


def test_verdict_of_slurm_jobs_reads_slurms_state():
    nodes = ['h', 'w']
    done = [{'node': 'h', 'launcher': 'slurm', 'role': 'launcher', 'running': False, 'exit_code': 0, 'slurm_job_id': '5',
             'slurm_state': 'COMPLETED', 'node_exit_codes': {}}, {'node': 'w', 'role': 'ranks', 'running': False}]
    assert training_verdict(done, nodes)['state'] == 'succeeded'
    # scancel: srun reports the tasks it killed, but the job was stopped, not failed
    cancelled = [dict(done[0], exit_code=143, slurm_state='CANCELLED', node_exit_codes={'h': 143, 'w': 143}), done[1]]
    assert training_verdict(cancelled, nodes)['state'] == 'stopped'
    running = [dict(done[0], running=True, exit_code=None, slurm_state='RUNNING'), dict(done[1], running=True)]
    assert training_verdict(running, nodes)['state'] == 'running'
    # a rank killed on w: srun names both tasks, torchrun's report names w first
    failed = [dict(done[0], exit_code=1, slurm_state='FAILED', node_exit_codes={'w': 1, 'h': 137},
                   rank_failure={'time': '2026-11-23_05:00:00', 'host': 'w', 'rank': 1, 'exit_code': -9,
                                 'signal': 'SIGKILL'}), done[1]]
    verdict = training_verdict(failed, nodes)
    assert verdict['state'] == 'failed' and verdict['failed_nodes'][0] == 'w'
    assert verdict['first_failure']['node'] == 'w'


def test_verdict_puts_the_node_the_launcher_names_before_the_head():
    results = [{'node': 'h', 'role': 'launcher', 'running': False, 'exit_code': 1, 'node_exit_codes': {'w': 137}},
               {'node': 'w', 'role': 'ranks', 'running': False}]
    verdict = training_verdict(results, ['h', 'w'])
    assert verdict['failed_nodes'] == ['w', 'h']
    assert verdict['first_failure']['node'] == 'w'


def _openmpi(name):
    with open(os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'openmpi', name)) as handle:
        return handle.read()


def test_mpirun_reports_name_the_failed_rank_and_its_node():
    assert tr.mpirun_failure(_openmpi('mpirun-rank-killed.txt')) == {'rank': 1, 'node': 'mol-slurm-worker-1',
                                                                     'exit_code': 137}
    assert tr.mpirun_failure(_openmpi('mpirun-rank-exit3.txt')) == {'rank': 1, 'node': None, 'exit_code': 3}
    assert tr.mpirun_failure('step 1 loss 0.5\n') is None


def test_secret_env_values_masks_secrets_and_long_unknown_values_but_never_a_setting():
    from ansible_collections.gpucluster.multinode.plugins.module_utils.training import commands as tr
    env = {'DS_ACCELERATOR': 'cpu', 'NCCL_SOCKET_IFNAME': 'enp26s0np0', 'GLOO_SOCKET_IFNAME': 'eth0',
           'TOKENIZERS_PARALLELISM': 'false', 'HF_TOKEN': 'hf_S3cretTokenValue', 'WANDB_API_KEY': 'abc',
           'MY_ENDPOINT': 'https://user:pw@example.com/x', 'RUN_TAG': 'a1', 'NCCL_IB_AUTH_KEY': 'k3y-v4lue'}
    assert tr.secret_env_values(env) == {'hf_S3cretTokenValue', 'abc', 'https://user:pw@example.com/x', 'k3y-v4lue'}


def _fixture(*parts):
    with open(os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', *parts)) as handle:
        return handle.read()


def test_the_node_whose_deepspeed_launcher_reported_first_is_read_from_a_recorded_head_log():
    # recorded: worker-1's rank killed (SIGKILL) on a 2+1+1 lab; worker-2 and the head failed 3 s later
    text = _fixture('pdsh', 'deepspeed-head-log-rank-killed-on-worker-1.txt')
    assert tr.deepspeed_rank_failure(text) == {'time': '2026-11-25 22:52:37,123', 'host': 'lab-worker-1',
                                               'exit_code': -9, 'signal': 'SIGKILL'}
    assert tr.deepspeed_rank_failure('') is None


def test_a_signal_wins_a_tie_between_deepspeed_launcher_reports():
    line = '%s: [2026-11-25 22:52:40,625] [ERROR] [launch.py:259:sigkill_handler] [\'python\'] exits with return code = %d\n'
    text = line % ('w2', 1) + line % ('w1', -6) + line % ('w3', 0)
    assert tr.deepspeed_rank_failure(text)['host'] == 'w1'
    assert tr.deepspeed_rank_failure(text)['signal'] == 'SIGABRT'
    assert tr.deepspeed_rank_failure(line % ('w3', 0)) is None
