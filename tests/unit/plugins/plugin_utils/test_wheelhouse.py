"""An offline wheelhouse read from its file names: what the supervisor, python_env and ray steps would miss."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import wheelhouse

# As `pip download` / `pip wheel` name them (ansible-core 2.19.14 and its requirements, torch's CPU build).
LAB = ['ansible_core-2.19.14-py3-none-any.whl', 'jinja2-3.1.6-py3-none-any.whl',
       'MarkupSafe-3.0.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl',
       'PyYAML-6.0.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl',
       'cryptography-46.0.3-cp311-abi3-manylinux_2_34_x86_64.whl', 'cffi-2.0.0-cp311-cp311-manylinux2014_x86_64.whl',
       'pycparser-2.23-py3-none-any.whl', 'packaging-25.0-py3-none-any.whl', 'resolvelib-1.2.0-py3-none-any.whl',
       'torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl', 'deepspeed-0.19.8.tar.gz',
       'ninja-1.13.2-1-py3-none-manylinux1_x86_64.whl', '.requirements', 'README']
SUPERVISOR = ['ansible-core==2.19.14', 'jinja2', 'markupsafe', 'pyyaml', 'cryptography', 'cffi', 'pycparser',
              'packaging', 'resolvelib']


def test_the_file_names_are_read_as_the_wheel_format_has_them():
    assert wheelhouse.distribution_of('ansible_core-2.19.14-py3-none-any.whl') == ('ansible-core', '2.19.14')
    assert wheelhouse.distribution_of('/opt/wheelhouse/PyYAML-6.0.2-cp311-cp311-manylinux2014_x86_64.whl') == (
        'pyyaml', '6.0.2')
    # a build tag, and a source archive whose name has dots
    assert wheelhouse.distribution_of('ninja-1.13.2-1-py3-none-manylinux1_x86_64.whl') == ('ninja', '1.13.2')
    assert wheelhouse.distribution_of('zope.interface-7.2.tar.gz') == ('zope-interface', '7.2')
    assert wheelhouse.distribution_of('.requirements') is None and wheelhouse.distribution_of('torch.whl') is None


def test_a_full_wheelhouse_lacks_nothing_and_torch_s_local_label_is_the_pin():
    assert wheelhouse.missing(LAB, SUPERVISOR) == []
    assert wheelhouse.missing(LAB, ['torch==2.13.0', 'deepspeed==0.19.8', 'ninja==1.13.2', 'ray[default]']) == [
        'ray[default]']
    # a pin with its own local label needs that build
    assert wheelhouse.missing(LAB, ['torch==2.13.0+cu128']) == ['torch==2.13.0+cu128']


def test_a_wheelhouse_without_ansible_core_or_at_another_version_lacks_it():
    without = [f for f in LAB if not f.startswith(('ansible_core', 'cffi'))]
    assert wheelhouse.missing(without, SUPERVISOR) == ['ansible-core==2.19.14', 'cffi']
    older = without + ['ansible_core-2.18.3-py3-none-any.whl']
    assert wheelhouse.missing(older, ['Ansible_Core==2.19.14', 'deepspeed==0.19.9']) == [
        'Ansible_Core==2.19.14', 'deepspeed==0.19.9']


def test_the_refusal_is_one_line_naming_host_variable_directory_what_lacks_and_the_command():
    line = wheelhouse.refusal(['ansible-core==2.19.14'], 'gpu-master', ['/opt/wheelhouse'], 'supervisor')
    assert line.startswith('host gpu-master: cluster_pip_find_links /opt/wheelhouse holds no wheel of '
                           'ansible-core==2.19.14 (the supervisor step installs it offline, cluster_pip_offline); '
                           'add it: pip download -d /opt/wheelhouse ansible-core==2.19.14 (')
    assert '\n' not in line
    two = wheelhouse.refusal(['torch==2.13.0', 'ninja==1.13.2'], 'w1', ['/a', '/b'], 'python_env')
    assert ('cluster_pip_find_links /a, /b hold no wheel of torch==2.13.0, ninja==1.13.2 (the python_env step '
            'installs them offline' in two and 'pip download -d /a torch==2.13.0 ninja==1.13.2' in two)
    # what to download may be the top of what lacks (pip brings the dependencies)
    assert 'pip download -d /w ansible-core==2.19.14 (' in wheelhouse.refusal(
        ['cffi'], 'sup', ['/w'], 'supervisor', ['ansible-core==2.19.14'])
    assert wheelhouse.refusal([], 'w1', ['/a'], 'python_env') == ''
    # extras are quoted for the shell
    assert "pip download -d /w 'ray[default]==2.60.0' (" in wheelhouse.refusal(['ray[default]==2.60.0'], 'w1', ['/w'], 'ray')
