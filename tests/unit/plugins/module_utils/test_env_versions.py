"""The environment's versions: one key set, read on disk or by the environment's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import env_versions

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'python_env')


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


def dist(site, name, version, files=None):
    """A minimal installed distribution (dist-info with METADATA) in site."""
    info = site / ('%s-%s.dist-info' % (name.replace('-', '_'), version))
    info.mkdir(parents=True)
    (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: %s\nVersion: %s\n' % (name, version))
    for rel, text in (files or {}).items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def make_venv(tmp_path, cfg='home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n',
              cuda=None, nccl=None, ray=None):
    root = tmp_path / 'env'
    (root / 'bin').mkdir(parents=True)
    python = root / 'bin' / 'python'
    python.write_text('#!/bin/sh\nexit 3\n')
    python.chmod(0o755)
    (root / 'pyvenv.cfg').write_text(cfg)
    site = root / 'lib' / 'python3.11' / 'site-packages'
    site.mkdir(parents=True)
    version_py = "__version__ = '2.13.0+%s'\ncuda: Optional[str] = %s\n" % (
        'cu130' if cuda else 'cpu', repr(cuda))
    dist(site, 'torch', '2.13.0+%s' % ('cu130' if cuda else 'cpu'), {'torch/version.py': version_py})
    dist(site, 'deepspeed', '0.19.8')
    if nccl:
        dist(site, 'nvidia-nccl-cu13', nccl)
    if ray:
        dist(site, 'ray', ray)
    return str(python), str(site)


class FakeModule:
    """run_command recorded; the answer given."""

    def __init__(self, answer=(0, '', '')):
        self.answer, self.calls = answer, []

    def get_bin_path(self, name):
        return '/usr/bin/' + name

    def run_command(self, cmd, environ_update=None):
        self.calls.append((cmd, environ_update))
        return self.answer


def test_the_documented_key_set():
    assert env_versions.KEYS == ('python', 'torch', 'torch_cuda', 'torch_nccl', 'nccl_wheel', 'deepspeed', 'ray')
    assert env_versions.empty() == dict.fromkeys(env_versions.KEYS)


def test_cpu_venv_read_on_disk_without_starting_python(tmp_path):
    python, site = make_venv(tmp_path)
    module = FakeModule()
    versions, error = env_versions.read(module, python)
    assert error is None and module.calls == []   # the fake interpreter would exit 3
    assert versions == {'python': '3.11.2', 'torch': '2.13.0+cpu', 'torch_cuda': None, 'torch_nccl': None,
                        'nccl_wheel': None, 'deepspeed': '0.19.8', 'ray': None}
    assert env_versions.site_dirs(python) == [site]


def test_cuda_venv_with_nccl_wheel_and_ray(tmp_path):
    python, _ = make_venv(tmp_path, cuda='13.0', nccl='2.28.9', ray='2.50.0')
    versions, _ = env_versions.read(FakeModule(), python)
    assert versions['torch'] == '2.13.0+cu130'
    assert versions['torch_cuda'] == '13.0'
    assert versions['nccl_wheel'] == '2.28.9'
    assert versions['torch_nccl'] is None   # known only by importing torch
    assert versions['ray'] == '2.50.0'


def test_python_version_from_uv_version_info_and_from_the_path(tmp_path):
    python, site = make_venv(tmp_path, cfg='home = /usr/bin\nversion_info = 3.12.3\n')
    assert env_versions.read(FakeModule(), python)[0]['python'] == '3.12.3'
    (tmp_path / 'env' / 'pyvenv.cfg').write_text('home = /usr/bin\n')
    assert env_versions.from_site_dirs([site])['python'] == '3.11'


def test_a_venv_that_sees_system_packages_asks_the_interpreter(tmp_path):
    python, _ = make_venv(tmp_path, cfg='include-system-site-packages = true\n')
    assert env_versions.site_dirs(python) is None
    answer = fixture('cpu-deepspeed-0.19.8.txt').split('\n', 1)[1]
    module = FakeModule((0, answer, ''))
    versions, error = env_versions.read(module, python, timeout=20)
    assert error is None and versions['deepspeed'] == '0.19.8' and versions['python'] == '3.11.7'
    cmd = module.calls[0][0]
    assert cmd[:4] == ['/usr/bin/timeout', '20', python, '-c']
    assert 'IMPORTS = False' in cmd[4]


def test_a_system_interpreter_is_run(tmp_path):
    assert env_versions.site_dirs('/usr/bin/python3') is None


def test_imports_run_the_interpreter_even_when_on_disk_would_do(tmp_path):
    python, _ = make_venv(tmp_path)
    module = FakeModule((0, fixture('cuda-h100-torch-2.11.txt'), ''))
    versions, error = env_versions.read(module, python, imports=True, environ={'DS_ACCELERATOR': 'cpu'})
    assert error is None
    assert versions['torch_nccl'] == '2.28.9' and versions['cuda_available'] is True
    assert 'IMPORTS = True' in module.calls[0][0][-1]
    assert module.calls[0][1] == {'DS_ACCELERATOR': 'cpu'}


def test_an_import_error_is_the_error(tmp_path):
    python, _ = make_venv(tmp_path)
    versions, error = env_versions.read(FakeModule((1, fixture('no-torch.txt'), '')), python, imports=True)
    assert error == "ModuleNotFoundError: No module named 'torch'"
    assert versions['python'] == '3.11.2' and versions['torch'] is None


def test_a_hung_import_is_reported_as_a_timeout(tmp_path):
    python, _ = make_venv(tmp_path)
    versions, error = env_versions.read(FakeModule((124, '', '')), python, imports=True, timeout=7)
    assert versions == {} and error == '%s did not answer within 7 s' % python


def test_a_crash_names_the_last_line(tmp_path):
    python, _ = make_venv(tmp_path)
    _, error = env_versions.read(FakeModule((139, '', 'boom\nSegmentation fault\n')), python, imports=True)
    assert error == 'the probe printed no result line (Segmentation fault)'


def test_missing_interpreter(tmp_path):
    assert env_versions.read(FakeModule(), str(tmp_path / 'nope')) == (
        {}, '%s does not exist or is not executable' % (tmp_path / 'nope'))
    assert env_versions.read(FakeModule(), '') == ({}, None)


@pytest.mark.parametrize('raw, expected', [((2, 28, 9), '2.28.9'), ([2, 21, 5], '2.21.5'),
                                           (21805, '2.18.5'), (2708, '2.7.8'), (None, None)])
def test_nccl_version_forms(raw, expected):
    assert env_versions.format_nccl_version(raw) == expected


def test_output_without_result_line_or_not_json():
    with pytest.raises(env_versions.ProbeError, match='no result line'):
        env_versions.parse_probe_output('Segmentation fault\n')
    with pytest.raises(env_versions.ProbeError, match='not JSON'):
        env_versions.parse_probe_output(env_versions.MARKER + '{oops\n')


def test_the_probe_script_run_by_a_real_interpreter_reads_the_same(tmp_path):
    """The script the environment's interpreter runs and the on-disk reader give the same versions."""
    python, site = make_venv(tmp_path, cuda='12.8', nccl='2.27.5')
    env = dict(os.environ, PYTHONPATH=site)
    for imports in (False, True):
        proc = subprocess.run([sys.executable, '-c', env_versions.probe_script(imports)], capture_output=True,
                              text=True, env=env, check=False, timeout=60)
        got = env_versions.parse_probe_output(proc.stdout)
        if imports:   # the fake torch has no code: the import error is reported, not raised
            assert 'torch' in got['error']
            continue
        on_disk = env_versions.from_site_dirs([site])
        for key in ('torch', 'torch_cuda', 'nccl_wheel', 'deepspeed'):
            assert got[key] == on_disk[key], key
        assert got['python'] == '%d.%d.%d' % sys.version_info[:3]
        assert got['torch_cuda'] == '12.8' and got['nccl_wheel'] == '2.27.5'
