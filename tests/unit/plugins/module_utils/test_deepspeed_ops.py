"""The DeepSpeed ops probe: parsing its line, what the role builds, what a job would build, the stamp."""

import json
import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import deepspeed_ops as dso

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'deepspeed_ops')


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


def probe(name):
    return dso.parse_probe_output(fixture(name))


def test_probe_of_a_cpu_node_before_any_build():
    info = probe('cpu-probe-not-built.txt')
    assert dso.version_key(info) == {'python': '3.11.7', 'torch': '2.13.0+cpu', 'deepspeed': '0.19.8',
                                     'accelerator': 'cpu'}
    assert info['extensions_dir'].endswith('/.cache/torch_extensions/py311_cpu')
    assert [(op['name'], op['built']) for op in info['ops']] == [('deepspeed_shm_comm', False)]


def test_a_fresh_node_builds_the_shm_op_and_a_job_would_too():
    info = probe('cpu-probe-not-built.txt')
    assert dso.ops_to_build(info, {}) == ['deepspeed_shm_comm']
    assert dso.ops_the_job_builds(info, {}) == ['deepspeed_shm_comm']
    line = dso.preflight_message(['deepspeed_shm_comm'], None, info)
    assert 'builds DeepSpeed ops deepspeed_shm_comm before step 1' in line and 'no build recorded' in line


def test_build_output_records_the_seconds_and_a_second_run_builds_nothing():
    built = probe('cpu-build.txt')
    assert built['ops'][0]['built'] is True and built['ops'][0]['seconds'] > 0
    stamp = dso.updated_stamp({}, built, '2026-11-23T16:30:00Z')
    assert stamp['key'] == dso.version_key(built)
    assert stamp['ops']['deepspeed_shm_comm']['seconds'] == built['ops'][0]['seconds']
    after = probe('cpu-probe-built.txt')
    assert dso.ops_to_build(after, stamp) == []
    assert dso.ops_the_job_builds(after, stamp) == []
    assert 'no build before step 1' in dso.preflight_message([], None, after)


def test_a_version_change_rebuilds_and_the_preflight_says_how_long_it_took_last_time():
    built = probe('cpu-build.txt')
    stamp = dso.updated_stamp({}, built, '2026-11-23T16:30:00Z')
    newer = probe('cpu-probe-built.txt')
    newer['deepspeed'] = '0.19.9'
    assert dso.ops_to_build(newer, stamp) == ['deepspeed_shm_comm']
    todo = dso.ops_the_job_builds(newer, stamp)
    assert todo == ['deepspeed_shm_comm']
    seconds = dso.last_seconds(stamp, todo)
    assert seconds == built['ops'][0]['seconds']
    assert 'the last build here took %.0f s' % seconds in dso.preflight_message(todo, seconds, newer)
    # the new build replaces the old versions' records
    rebuilt = dict(newer, ops=[dict(newer['ops'][0], seconds=7.5)])
    assert dso.updated_stamp(stamp, rebuilt, 'later') == {
        'key': dso.version_key(newer), 'dist': None,
        'ops': {'deepspeed_shm_comm': {'builder': 'ShareMemCommBuilder', 'seconds': 7.5, 'built_at': 'later'}}}


def test_the_file_only_read_says_ready_only_for_the_recorded_versions_and_ops():
    stamp = dso.updated_stamp({}, dict(probe('cpu-build.txt'), dist={'python': '3.11.7', 'torch': '2.13.0+cpu',
                                                                     'deepspeed': '0.19.8'}), 'then')
    quick = {'dist': dict(stamp['dist']), 'ds_accelerator': None, 'extensions_dir': '/x', 'stamp': stamp,
             'present': {'deepspeed_shm_comm': True}}
    wanted = {'cpu': ['ShareMemCommBuilder'], 'cuda': ['FusedAdamBuilder']}
    assert dso.read_without_import(quick, wanted)[0] == 'ready'
    assert 'no build before step 1' in dso.ready_message(stamp, quick, wanted)
    assert dso.read_without_import(dict(quick, dist=dict(quick['dist'], deepspeed='0.19.9')), wanted)[0] == 'stale'
    assert dso.read_without_import(dict(quick, present={'deepspeed_shm_comm': False}), wanted)[0] == 'stale'
    assert dso.read_without_import(dict(quick, ds_accelerator='cuda'), wanted)[0] == 'stale'
    assert dso.read_without_import(quick, {'cpu': ['ShareMemCommBuilder', 'CPUAdamBuilder']})[0] == 'stale'
    assert dso.read_without_import(dict(quick, stamp=None), wanted)[0] == 'unknown'
    assert 'the last build here took 182 s' in dso.unread_message('stale', stamp, wanted)


def test_an_op_built_by_a_job_but_not_recorded_is_built_once_by_the_role_but_does_not_delay_a_job():
    after = probe('cpu-probe-built.txt')
    assert dso.ops_to_build(after, {}) == ['deepspeed_shm_comm']
    assert dso.ops_the_job_builds(after, {}) == []


def test_ops_in_the_wheel_or_incompatible_are_never_built():
    info = probe('cpu-probe-not-built.txt')
    info['ops'] = [dict(info['ops'][0], installed=True),
                   {'builder': 'FusedAdamBuilder', 'name': 'fused_adam', 'compatible': False,
                    'installed': False, 'built': False},
                   {'builder': 'NoSuchBuilder', 'name': None, 'compatible': False, 'installed': False,
                    'built': False, 'error': 'no such op builder for accelerator cpu'}]
    assert dso.ops_to_build(info, {}) == []
    assert dso.unusable_ops(info) == ['FusedAdamBuilder: not compatible with this node (DeepSpeed says so)',
                                      'NoSuchBuilder: no such op builder for accelerator cpu']


def test_a_failed_build_is_named_with_its_error():
    info = probe('cpu-probe-not-built.txt')
    info['ops'][0]['error'] = 'RuntimeError: Error building extension'
    assert dso.build_errors(info) == ['deepspeed_shm_comm: RuntimeError: Error building extension']
    assert dso.updated_stamp({}, info, 'now')['ops'] == {}


def test_no_ops_for_this_accelerator():
    info = probe('cpu-probe-not-built.txt')
    info['ops'] = []
    assert dso.preflight_message([], None, info) == 'no DeepSpeed op to build for accelerator cpu'


def test_output_without_the_result_line_is_an_error():
    with pytest.raises(dso.ProbeError, match='printed no'):
        dso.parse_probe_output("ModuleNotFoundError: No module named 'deepspeed'\n")
    with pytest.raises(dso.ProbeError, match='lacks ops'):
        dso.parse_probe_output(dso.MARKER + json.dumps({'python': '3', 'torch': '2', 'deepspeed': '0',
                                                        'accelerator': 'cpu', 'extensions_dir': '/x'}))


def test_stamp_round_trip_and_unreadable_stamps(tmp_path):
    assert dso.read_stamp(str(tmp_path / 'missing.json')) == {}
    bad = tmp_path / 'bad.json'
    bad.write_text('{not json')
    assert dso.read_stamp(str(bad)) == {}
    good = tmp_path / dso.STAMP_NAME
    good.write_text(json.dumps({'key': {'python': '3.11.7'}, 'ops': {}}))
    assert dso.read_stamp(dso.stamp_path(str(tmp_path)))['key'] == {'python': '3.11.7'}


# ----- ops built into a container image ---------------------------------------------------------
FAKE_PROBE = r'''
import json, os, sys
acc = os.environ['DS_ACCELERATOR']
wanted = json.loads(sys.argv[2])[acc]
ops = []
for cls in wanted:
    name = {'ShareMemCommBuilder': 'shm_comm', 'FusedAdamBuilder': 'fused_adam'}[cls]
    ok = acc == 'cpu'
    ops.append({'builder': cls, 'name': name, 'compatible': ok, 'installed': False, 'built': ok, 'seconds': 41.5})
    if ok:
        os.makedirs(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], name), exist_ok=True)
print('GPUCLUSTER_DS_OPS ' + json.dumps({'python': '3.11.2', 'torch': '2.13.0', 'deepspeed': '0.19.8',
                                         'accelerator': acc, 'extensions_dir': os.environ['TORCH_EXTENSIONS_DIR'],
                                         'ops': ops}))
'''


def test_the_image_build_records_what_it_built_per_accelerator(tmp_path):
    import subprocess
    import sys
    script = dso.image_build_script()
    assert script.startswith('# Built from gpucluster.multinode deepspeed_ops') and 'PROBE = ' in script
    compile(script, 'build_deepspeed_ops.py', 'exec')
    # the real probe imports torch and DeepSpeed: a stand-in answers as a CPU-only image build does
    fake = tmp_path / 'build.py'
    fake.write_text('PROBE = %r\n' % FAKE_PROBE + dso.IMAGE_BUILD_MAIN)
    ops_dir, stamp = tmp_path / 'opt' / 'ext', tmp_path / 'etc' / 'deepspeed-ops.json'
    out = subprocess.run([sys.executable, str(fake), json.dumps({'cpu': ['ShareMemCommBuilder'],
                                                                 'cuda': ['FusedAdamBuilder']}),
                          str(ops_dir), str(stamp)], capture_output=True, text=True, check=True).stdout
    assert 'deepspeed ops for cpu: built shm_comm' in out
    assert 'deepspeed ops for cuda: built none; not built: FusedAdamBuilder: not compatible with the image' in out
    record = json.loads(stamp.read_text())
    assert record['accelerators']['cpu']['ops'] == {'shm_comm': {'builder': 'ShareMemCommBuilder', 'seconds': 41.5}}
    assert record['accelerators']['cpu']['key'] == {'python': '3.11.2', 'torch': '2.13.0', 'deepspeed': '0.19.8',
                                                    'accelerator': 'cpu'}
    ready, lines = dso.image_ops_lines(stamp.read_text(), {'cpu': ['ShareMemCommBuilder']}, 'cpu', 'train:1')
    assert ready and lines == ['image train:1 carries the DeepSpeed ops for cpu (shm_comm, built for DeepSpeed '
                               '0.19.8, torch 2.13.0): no build before step 1']
    ready, lines = dso.image_ops_lines(stamp.read_text(), {'cpu': [], 'cuda': ['FusedAdamBuilder']}, None, 'train:1')
    assert not ready and lines == ['image train:1 lacks the DeepSpeed op(s) FusedAdamBuilder for cuda '
                                   '(FusedAdamBuilder: not compatible with the image): a job on cuda builds them in '
                                   'its container before step 1, every run']


def test_an_image_without_a_record_is_said_to_build_at_every_start():
    ready, lines = dso.image_ops_lines('', {'cpu': ['ShareMemCommBuilder'], 'cuda': []}, None, 'train:0')
    assert not ready and lines == ['image train:0 carries no record of DeepSpeed ops (built by an older recipe): a '
                                   'DeepSpeed job builds ShareMemCommBuilder for cpu in its container before step 1, '
                                   'every run; rebuild the image (site.yml --tags container)']
    assert dso.image_ops_lines('', {'cpu': []}, None, 'train:0') == (True, ['image train:0: no DeepSpeed op to build'])
