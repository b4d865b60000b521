"""python_env refuses what cannot work before it changes anything, and drives conda as documented.

Runs the role against the controller itself (connection local) in a scratch directory: no
containers and no package index are needed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_INSTALLER = os.path.join(ROOT, 'tests', 'integration', 'files', 'fake-miniforge.sh')

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which('ansible-playbook') is None, reason='needs ansible-playbook (make setup)')]

PLAYBOOK = """
- hosts: cluster
  gather_facts: false
  roles:
    - role: gpucluster.multinode.python_env
"""

INVENTORY = """
all:
  children:
    cluster:
      children:
        head:
          hosts:
            ctl-head: {ansible_connection: local, ansible_python_interpreter: %s}
        workers:
          hosts: {}
"""


def run_role(tmp_path, **extra):
    (tmp_path / 'play.yml').write_text(PLAYBOOK)
    (tmp_path / 'hosts.yml').write_text(INVENTORY % shutil.which('python3'))
    owner = subprocess.run(['id', '-un'], capture_output=True, text=True, check=True).stdout.strip()
    settings = dict(python_env_create_user='false', python_env_install_system_packages='false',
                    python_env_owner=owner, python_env_path=str(tmp_path / 'envs' / 'train'))
    settings.update(extra)
    args = []
    for key, value in settings.items():
        args += ['-e', '%s=%s' % (key, value)]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, '.build', 'collections'),
               PIP_CONFIG_FILE=os.devnull)   # only the sources the role is given
    env.pop('PIP_FIND_LINKS', None)
    proc = subprocess.run(['ansible-playbook', '-i', str(tmp_path / 'hosts.yml'), str(tmp_path / 'play.yml')] + args,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_an_offline_wheelhouse_that_lacks_a_pin_is_refused_in_the_checks_naming_the_directory_and_the_pins(tmp_path):
    wheelhouse = tmp_path / 'wheelhouse'
    wheelhouse.mkdir()
    # DeepSpeed is there (a source archive), torch only as another version, ninja not at all
    for name in ('deepspeed-0.19.8.tar.gz', 'torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl'):
        (wheelhouse / name).write_text('')
    rc, out = run_role(tmp_path, python_env_torch_version='2.13.0', python_env_deepspeed_version='0.19.8',
                       python_env_ninja_version='1.13.2', python_env_offline='true', python_env_find_links=str(wheelhouse))
    assert rc != 0
    assert ('host ctl-head: cluster_pip_find_links %s holds no wheel of torch==2.13.0, ninja==1.13.2 (the python_env '
            'step installs them offline, cluster_pip_offline); add them: pip download -d %s torch==2.13.0 ninja==1.13.2'
            % (wheelhouse, wheelhouse)) in ' '.join(out.split())
    # refused in the checks: the node was not prepared, nothing was installed
    assert 'TASK [gpucluster.multinode.python_env : Pick the system packages for this OS]' not in out
    assert not (tmp_path / 'envs').exists()


def test_credentials_in_an_index_url_never_show(tmp_path):
    """python_env_no_log is false (the default): the failure names the index, its password masked."""
    url = 'https://build-bot:s3cret-t0ken@127.0.0.1:9/simple'
    rc, out = run_role(tmp_path, python_env_torch_version='2.13.0', python_env_index_url=url,
                       python_env_pip_timeout='3', python_env_extra_index_urls='["https://tok3n-only@127.0.0.1:9/x"]')
    assert rc != 0
    assert 'cluster_torch_version 2.13.0 is not offered by https://****@127.0.0.1:9/simple' in ' '.join(out.split())
    assert 's3cret' not in out and 'build-bot' not in out and 'tok3n-only' not in out
    assert not (tmp_path / 'envs').exists()


def test_offline_without_a_wheelhouse_is_refused(tmp_path):
    rc, out = run_role(tmp_path, python_env_offline='true')
    assert rc != 0
    assert 'host ctl-head: cluster_pip_offline needs cluster_pip_find_links' in out
    assert not (tmp_path / 'envs').exists()


def conda_settings(tmp_path, sha256):
    (tmp_path / 'wheelhouse').mkdir(exist_ok=True)
    # the pins the environment installs offline, as file names (the checks read names only; the fake conda installs nothing)
    for name in ('torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl', 'deepspeed-0.19.8.tar.gz',
                 'deepspeed-0.19.7.tar.gz', 'ninja-1.13.2-py3-none-manylinux_2_12_x86_64.whl'):
        (tmp_path / 'wheelhouse' / name).write_text('')
    return dict(python_env_backend='conda', python_env_conda_installer_file=FAKE_INSTALLER,
                python_env_conda_installer_sha256=sha256, python_env_conda_prefix=str(tmp_path / 'miniforge'),
                python_env_conda_cache_dir=str(tmp_path / 'cache'), python_env_check_torch_available='false',
                python_env_verify='false', python_env_deepspeed_ops_cache='false',
                python_env_find_links=str(tmp_path / 'wheelhouse'), python_env_offline='true')


def test_a_conda_installer_with_another_checksum_is_refused_before_any_change(tmp_path):
    rc, out = run_role(tmp_path, **conda_settings(tmp_path, '0' * 64))
    assert rc != 0
    assert 'host ctl-head: python_env_conda_installer_sha256 %s does not match python_env_conda_installer_file' \
        % ('0' * 64) in ' '.join(out.split())
    assert not (tmp_path / 'cache').exists() and not (tmp_path / 'miniforge').exists()


def test_conda_backend_installs_in_batch_mode_and_creates_the_env_from_the_spec(tmp_path):
    with open(FAKE_INSTALLER, 'rb') as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    settings = conda_settings(tmp_path, sha)
    rc, out = run_role(tmp_path, **settings)
    assert rc == 0, out
    prefix, env = tmp_path / 'miniforge', tmp_path / 'envs' / 'train'
    spec = str(env) + '.environment.yml'
    calls = (tmp_path / 'miniforge.calls').read_text().splitlines()
    assert calls == [
        'installer -b -p %s' % prefix,
        'conda env create --quiet --prefix %s --file %s' % (env, spec),
    ]
    text = open(spec).read()
    body = text[text.index('channels:'):]
    assert body == ('channels:\n  - conda-forge\n  - nodefaults\n'
                    'dependencies:\n  - python=3.11\n  - pip\n  - pip:\n'
                    '      - --find-links %s\n      - --no-index\n' % (tmp_path / 'wheelhouse')
                    + '      - torch==2.13.0\n      - deepspeed==0.19.8\n      - ninja==1.13.2\n')
    # A second run changes nothing; a changed spec updates the environment.
    rc, out = run_role(tmp_path, **settings)
    assert rc == 0 and 'changed=0' in out, out
    rc, out = run_role(tmp_path, python_env_deepspeed_version='0.19.7', **settings)
    assert rc == 0, out
    assert (tmp_path / 'miniforge.calls').read_text().splitlines()[-1] == \
        'conda env update --quiet --prune --prefix %s --file %s' % (env, spec)
