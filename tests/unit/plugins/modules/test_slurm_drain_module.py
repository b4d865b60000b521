"""slurm_drain run as Ansible runs it, against a stand-in scontrol that keeps node states in a file
and prints them in the form recorded from Slurm 22.05 (fixtures/slurm/scontrol_show_node_drained.txt)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')
RECORDED = os.path.join(ROOT, 'tests', 'unit', 'fixtures', 'slurm', 'scontrol_show_node_drained.txt')

FAKE = textwrap.dedent('''\
    #!%(python)s
    import json, re, sys
    state_file, log = %(state)r, %(log)r
    nodes = json.load(open(state_file))
    args = sys.argv[1:]
    open(log, 'a').write(' '.join(args) + '\\n')
    template = [l for l in open(%(recorded)r).read().splitlines() if 'Reason=' in l][0]
    if args == ['ping']:
        print('Slurmctld(primary) at head is %%s' %% ('DOWN' if nodes.get('_down') else 'UP'))
        sys.exit(1 if nodes.get('_down') else 0)
    if args == ['show', 'node', '-o']:
        for name, n in nodes.items():
            if name.startswith('_'):
                continue
            line = re.sub(r'NodeName=\\S+', 'NodeName=' + name, template.partition(' Reason=')[0])
            line = re.sub(r'State=\\S+', 'State=' + n['state'], line)
            print(line + (' Reason=%%s [root@2026-11-23T08:00:00]' %% n['reason'] if n.get('reason') else ''))
        sys.exit(0)
    if args[0] == 'update':
        kv = dict(a.split('=', 1) for a in args[1:])
        n = nodes[kv['NodeName']]
        if kv['State'] == 'DRAIN':
            n['state'] = n['state'].split('+')[0] + '+DRAIN'; n['reason'] = kv['Reason']
        elif kv['State'] == 'RESUME':
            n['state'] = n['state'].split('+')[0]; n['reason'] = ''
        json.dump(nodes, open(state_file, 'w'))
        sys.exit(0)
    sys.exit(2)
''')


@pytest.fixture
def cluster(tmp_path):
    state = tmp_path / 'nodes.json'
    state.write_text(json.dumps({
        'n1': {'state': 'IDLE'}, 'n2': {'state': 'IDLE+DRAIN', 'reason': 'gpucluster-health: gpu'},
        'n3': {'state': 'IDLE+DRAIN', 'reason': 'PSU replaced, burn-in'}, 'n4': {'state': 'ALLOCATED'}}))
    fake = tmp_path / 'scontrol'
    fake.write_text(FAKE % {'python': sys.executable, 'state': str(state), 'log': str(tmp_path / 'calls.log'),
                            'recorded': RECORDED})
    fake.chmod(0o755)
    return tmp_path


def run(tmp_path, check=False, **args):
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, scontrol=str(tmp_path / 'scontrol'), _ansible_check_mode=check,
                                           _ansible_tmpdir=str(tmp_path))}
    (tmp_path / 'args.json').write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'plugins', 'modules', 'slurm_drain.py'),
                           str(tmp_path / 'args.json')], capture_output=True, text=True, env=env, check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))


def states(tmp_path):
    nodes = json.loads((tmp_path / 'nodes.json').read_text())
    return dict((k, (v['state'], v.get('reason', ''))) for k, v in nodes.items() if not k.startswith('_'))


def test_drain_resume_and_leave_the_administrators_drain(cluster):
    out = run(cluster, failing={'n4': 'version.torch'}, checked=['n1', 'n2', 'n3', 'n4'])
    assert out['changed'] is True, out
    assert out['drained'] == {'n4': 'gpucluster-health: version.torch'} and out['resumed'] == ['n2']
    assert out['foreign'] == ['n3']
    assert states(cluster) == {'n1': ('IDLE', ''), 'n2': ('IDLE', ''), 'n3': ('IDLE+DRAIN', 'PSU replaced, burn-in'),
                               'n4': ('ALLOCATED+DRAIN', 'gpucluster-health: version.torch')}
    again = run(cluster, failing={'n4': 'version.torch'}, checked=['n1', 'n2', 'n3', 'n4'])
    assert again['changed'] is False and again['kept'] == ['n4'] and again['drained'] == {}
    healed = run(cluster, failing={}, checked=['n1', 'n2', 'n3', 'n4'])
    assert healed['resumed'] == ['n4'] and states(cluster)['n4'] == ('ALLOCATED', '')
    assert states(cluster)['n3'] == ('IDLE+DRAIN', 'PSU replaced, burn-in')


def test_check_mode_changes_nothing(cluster):
    before = states(cluster)
    out = run(cluster, check=True, failing={'n1': 'gpu'}, checked=['n1', 'n2'])
    assert out['changed'] is True and out['drained'] == {'n1': 'gpucluster-health: gpu'} and out['resumed'] == ['n2']
    assert states(cluster) == before
    assert 'update' not in (cluster / 'calls.log').read_text()


def test_half_the_cluster_failing_drains_nothing(cluster):
    out = run(cluster, failing={'n1': 'reachable', 'n4': 'reachable', 'n2': 'reachable'},
              checked=['n1', 'n2', 'n3', 'n4'])
    assert out['drained'] == {}
    assert out['held'].startswith('3 of 4 node(s) failed, more than 50%')
    assert states(cluster)['n1'] == ('IDLE', '')


def test_validate_names_a_controller_that_does_not_answer(cluster):
    assert run(cluster, validate_only=True).get('failed') is not True
    nodes = json.loads((cluster / 'nodes.json').read_text())
    nodes['_down'] = True
    (cluster / 'nodes.json').write_text(json.dumps(nodes))
    out = run(cluster, validate_only=True)
    assert out['failed'] is True and 'the Slurm controller does not answer' in out['msg'] and 'DOWN' in out['msg']


def test_no_scontrol_is_a_clear_error(tmp_path):
    out = run(tmp_path, failing={}, checked=['n1'])
    assert out['failed'] is True and out['msg'].startswith('scontrol not found')
