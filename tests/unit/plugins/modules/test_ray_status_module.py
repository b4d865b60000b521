"""ray_status run as Ansible runs it, against a ray that replays the outputs recorded on the ray scenario
(fixtures/ray: ``ray status -v`` and ``ray list nodes --format json`` of three nodes, and of the same
cluster 8 s after worker 2's Ray was stopped)."""

from __future__ import annotations

import json
import os
import sys
import textwrap

from module_run import run_module

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'ray_status.py')
RECORDED = os.path.join(ROOT, 'tests', 'unit', 'fixtures', 'ray')
HEAD, WORKER_1, WORKER_2 = '10.236.0.10', '10.236.0.11', '10.236.0.12'

# cfg: which recording to replay ('three-nodes' or 'worker-stopped'), or a command to fail (rc, stderr)
FAKE = textwrap.dedent('''\
    #!%(python)s
    import json, os, sys
    cfg = json.load(open(%(cfg)r))
    args = sys.argv[1:]
    open(%(log)r, 'a').write(' '.join(args) + '\\n')
    command = 'status' if args[0] == 'status' else 'list' if args[:2] == ['list', 'nodes'] else None
    if command in cfg.get('fail', {}):
        rc, err = cfg['fail'][command]
        sys.stderr.write(err); sys.exit(rc)
    name = {'status': 'status-v-%%s.txt', 'list': 'list-nodes-%%s.json'}[command] %% cfg['recording']
    sys.stdout.write(open(os.path.join(%(recorded)r, name)).read())
''')


def make_ray(tmp_path, recording='three-nodes', fail=None):
    (tmp_path / 'cfg.json').write_text(json.dumps({'recording': recording, 'fail': fail or {}}))
    fake = tmp_path / 'ray'
    fake.write_text(FAKE % {'python': sys.executable, 'cfg': str(tmp_path / 'cfg.json'),
                            'log': str(tmp_path / 'calls.log'), 'recorded': RECORDED})
    fake.chmod(0o755)
    return str(fake)


def run(tmp_path, ray, check=False, **args):
    args = dict({'ray': ray, 'address': HEAD + ':6379', 'dashboard_url': 'http://%s:8265' % HEAD}, **args)
    return run_module(MODULE, tmp_path, args, check=check)


def test_three_alive_nodes_are_reported_and_none_missing(tmp_path):
    out = run(tmp_path, make_ray(tmp_path), expect_addresses=[HEAD, WORKER_1, WORKER_2])
    assert out.get('failed') is not True, out
    assert out['changed'] is False
    assert out['error'] == ''
    assert out['missing'] == []
    assert sorted((n['node_ip'], n['state'], n['is_head']) for n in out['nodes']) == [
        (HEAD, 'ALIVE', True), (WORKER_1, 'ALIVE', False), (WORKER_2, 'ALIVE', False)]
    assert len(out['status']['active']) == 3
    assert out['status_text'].startswith('======== Autoscaler status')
    calls = (tmp_path / 'calls.log').read_text().splitlines()
    assert calls == ['status -v --address %s:6379' % HEAD,
                     'list nodes --format json --limit 10000 --timeout 30 --address http://%s:8265' % HEAD]


def test_a_stopped_worker_is_missing(tmp_path):
    out = run(tmp_path, make_ray(tmp_path, 'worker-stopped'), expect_addresses=[HEAD, WORKER_1, WORKER_2])
    assert out.get('failed') is not True, out
    assert out['missing'] == [WORKER_2]
    assert [n['state'] for n in out['nodes'] if n['node_ip'] == WORKER_2] == ['DEAD']
    assert len(out['status']['active']) == 2
    assert out['waited'] < 3       # wait_timeout 0: read once


def test_a_head_that_does_not_answer_is_an_error_naming_ray_status_not_a_failure(tmp_path):
    err = ('ConnectionError: Could not find any running Ray instance. Please specify the one to connect to by '
           'setting `--address` flag or `RAY_ADDRESS` environment variable.\n')
    ray = make_ray(tmp_path, fail={'status': [1, 'Traceback (most recent call last):\n  ...\n' + err]})
    out = run(tmp_path, ray, expect_addresses=[HEAD])
    assert out.get('failed') is not True, out
    assert out['error'] == 'ray status exited 1: Traceback (most recent call last):   ... ' + err.strip()
    assert out['nodes'] == [] and out['status'] is None
    assert out['missing'] == [HEAD]
    # the list of nodes is not asked when the status failed
    assert (tmp_path / 'calls.log').read_text().splitlines() == ['status -v --address %s:6379' % HEAD]


def test_a_dashboard_that_does_not_answer_is_an_error_naming_ray_list_nodes(tmp_path):
    refusal = ('requests.exceptions.ConnectionError: Failed to connect to API server. Please check the API server '
               'log for details.\n')
    ray = make_ray(tmp_path, fail={'list': [1, refusal]})
    out = run(tmp_path, ray)
    assert out.get('failed') is not True, out
    assert out['error'] == ('ray list nodes exited 1: requests.exceptions.ConnectionError: Failed to connect to '
                            'API server. Please check the API server log for details.')
    assert len(out['status']['active']) == 3
    assert out['nodes'] == []


def test_check_mode_reads_the_same(tmp_path):
    out = run(tmp_path, make_ray(tmp_path), check=True, expect_addresses=[HEAD])
    assert out.get('failed') is not True, out
    assert out['missing'] == [] and len(out['nodes']) == 3
