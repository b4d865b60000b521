"""The nvidia_driver role's choices: packages per OS from its vars files, settings, repository answers."""

import os

import pytest
import yaml

from ansible_collections.gpucluster.multinode.plugins.plugin_utils import nvidia_driver as nd

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
VARS = os.path.join(ROOT, 'roles', 'nvidia_driver', 'vars')
FIXTURES = os.path.join(ROOT, 'tests', 'unit', 'fixtures', 'nvidia_driver')

H100 = {'kernel': '6.8.0-49-generic', 'gpu_device_ids': ['0x2330'] * 8, 'nvswitch_count': 4}
RTX4070 = {'kernel': '6.8.0-49-generic', 'gpu_device_ids': ['0x2786'], 'nvswitch_count': 0}
V100 = {'kernel': '5.14.0-427.el9.x86_64', 'gpu_device_ids': ['0x1db1'], 'nvswitch_count': 0}


def os_vars(name):
    with open(os.path.join(VARS, name + '.yml')) as f:
        return yaml.safe_load(f)['__nvidia_driver_os']


def settings(**over):
    base = {'nvidia_driver_branch': '580', 'nvidia_driver_version': '', 'nvidia_driver_source': 'distro',
            'nvidia_driver_open': 'auto', 'nvidia_driver_kernel_headers': True, 'nvidia_driver_persistenced': True,
            'nvidia_driver_fabricmanager': 'auto', 'nvidia_driver_cuda_toolkit': False,
            'nvidia_driver_cuda_toolkit_version': '13.0'}
    base.update(over)
    return base


def test_ubuntu_24_h100_board_takes_canonical_open_server_driver_and_fabric_manager():
    plan = nd.package_plan(os_vars('Ubuntu_24'), settings(), H100)
    assert plan['errors'] == []
    assert plan['open'] is True
    assert plan['driver'] == ['nvidia-driver-580-server-open', 'nvidia-utils-580-server']
    assert plan['headers'] == ['linux-headers-6.8.0-49-generic']
    assert plan['fabricmanager'] == ['nvidia-fabricmanager-580']
    assert plan['persistenced'] == []   # Canonical's driver ships nvidia-persistenced


def test_ubuntu_22_pinned_proprietary_from_the_cuda_repo():
    plan = nd.package_plan(os_vars('Ubuntu_22'), settings(nvidia_driver_source='cuda_repo', nvidia_driver_open=False,
                                                          nvidia_driver_version='580.95.05'), RTX4070)
    assert plan['errors'] == []
    assert plan['driver'] == ['cuda-drivers-580=580.95.05*']
    assert plan['fabricmanager'] == []
    assert 'ubuntu2204' in plan['repository']


def test_debian_12_distro_is_branch_535_proprietary_by_default():
    plan = nd.package_plan(os_vars('Debian_12'), settings(nvidia_driver_branch='535'), RTX4070)
    assert plan['errors'] == []
    assert plan['open'] is False   # Debian's open modules lag its proprietary ones
    assert plan['driver'] == ['nvidia-driver', 'nvidia-kernel-dkms', 'nvidia-smi', 'firmware-nvidia-gsp']
    assert plan['persistenced'] == ['nvidia-persistenced']
    pinned = nd.package_plan(os_vars('Debian_12'), settings(nvidia_driver_branch='535', nvidia_driver_open=True,
                                                            nvidia_driver_version='535.261.03'), RTX4070)
    assert pinned['driver'] == ['nvidia-driver=535.261.03*', 'nvidia-open-kernel-dkms=535.261.03*',
                                'nvidia-smi=535.261.03*', 'firmware-nvidia-gsp=535.261.03*']


def test_debian_12_distro_refuses_another_branch_and_an_nvswitch_board():
    plan = nd.package_plan(os_vars('Debian_12'), settings(nvidia_driver_branch='580'), H100)
    assert any("nvidia_driver_branch 580 is not offered by Debian's archive" in e for e in plan['errors'])
    assert any('needs nvidia-fabricmanager' in e for e in plan['errors'])
    assert os_vars('Debian_12')['default_source'] == 'cuda_repo'


@pytest.mark.parametrize('name', ['RedHat_8', 'RedHat_9'])
def test_el_takes_the_dnf_module_stream_or_pinned_packages(name):
    v = os_vars(name)
    plan = nd.package_plan(v, settings(nvidia_driver_source='cuda_repo'), H100)
    assert plan['errors'] == []
    assert plan['dnf_module'] == '580-open'.join(['nvidia-driver:', ''])
    assert plan['driver'] == []
    assert plan['fabricmanager'] == ['nvidia-fabric-manager']
    assert plan['headers'] == ['kernel-devel-6.8.0-49-generic', 'kernel-headers-6.8.0-49-generic']
    old = nd.package_plan(v, settings(nvidia_driver_source='cuda_repo', nvidia_driver_branch='570'), V100)
    assert old['dnf_module'] == 'nvidia-driver:570-dkms'   # a V100 needs the proprietary modules
    pinned = nd.package_plan(v, settings(nvidia_driver_source='cuda_repo', nvidia_driver_version='580.95.05'), V100)
    assert pinned['dnf_module'] == ''
    assert pinned['driver'] == ['nvidia-driver-580.95.05', 'nvidia-driver-cuda-580.95.05',
                                'kmod-nvidia-latest-dkms-580.95.05']


def test_el_has_no_distro_source():
    plan = nd.package_plan(os_vars('RedHat_9'), settings(nvidia_driver_source='distro'), H100)
    assert plan['errors'] == ['nvidia_driver_source distro is not offered on EL 9 (choose one of cuda_repo)']


def test_cuda_toolkit_package_from_the_cuda_repo():
    plan = nd.package_plan(os_vars('Ubuntu_24'), settings(nvidia_driver_source='cuda_repo', nvidia_driver_cuda_toolkit=True,
                                                          nvidia_driver_cuda_toolkit_version='12.8'), RTX4070)
    assert plan['toolkit'] == ['cuda-toolkit-12-8']
    debian = nd.package_plan(os_vars('Debian_12'), settings(nvidia_driver_branch='535', nvidia_driver_cuda_toolkit=True,
                                                            nvidia_driver_cuda_toolkit_version='12.2'), RTX4070)
    assert debian['errors'] == ["nvidia_driver_cuda_toolkit_version 12.2 is not offered by Debian's archive "
                                "(non-free, contrib) at {{ nvidia_driver_debian_mirror }} (it has 11.8)"]


@pytest.mark.parametrize('over,message', [
    ({'nvidia_driver_branch': 'latest'}, "nvidia_driver_branch latest is not a driver branch number"),
    ({'nvidia_driver_branch': '58'}, "nvidia_driver_branch 58 is not a driver branch number"),
    ({'nvidia_driver_version': '570.86.15'}, 'nvidia_driver_version 570.86.15 is not in nvidia_driver_branch 580'),
    ({'nvidia_driver_version': 'newest'}, "nvidia_driver_version newest is not a driver version"),
    ({'nvidia_driver_cuda_toolkit': True, 'nvidia_driver_branch': '535', 'nvidia_driver_cuda_toolkit_version': '12.8'},
     'nvidia_driver_cuda_toolkit_version 12.8 needs driver branch 570 or newer; nvidia_driver_branch 535 cannot run it'),
    ({'nvidia_driver_cuda_toolkit': True, 'nvidia_driver_cuda_toolkit_version': '12.7'},
     'nvidia_driver_cuda_toolkit_version 12.7 is not a CUDA release this role knows'),
    ({'nvidia_driver_open': 'maybe'}, "nvidia_driver_open maybe is not auto, true or false"),
    ({'nvidia_driver_source': 'ppa'}, "nvidia_driver_source ppa is not one of distro, cuda_repo"),
])
def test_settings_that_cannot_work_name_the_variable(over, message):
    errors = nd.setting_errors(settings(**over))
    assert len(errors) == 1 and errors[0].startswith(message), errors


def test_good_settings_pass():
    assert nd.setting_errors(settings()) == []
    assert nd.setting_errors(settings(nvidia_driver_branch=535, nvidia_driver_version='535.309.01',
                                      nvidia_driver_cuda_toolkit=True, nvidia_driver_cuda_toolkit_version='12.2')) == []


def test_versions_debian_offers_recorded_from_apt_cache_madison():
    with open(os.path.join(FIXTURES, 'apt-cache-madison-nvidia-driver-debian12.txt')) as f:
        rows = nd.parse_apt_madison(f.read())
    assert [r[1] for r in rows] == ['535.309.01-0+deb12u1', '535.261.03-1']
    offered = nd.upstream_versions([r[1] for r in rows])
    assert offered == ['535.309.01', '535.261.03']
    assert nd.version_offered('535.261.03', offered) and not nd.version_offered('535.999.99', offered)
    assert nd.version_offered('535.309.01', ['535.309.01-0+deb12u1'])
    assert not nd.version_offered('535.309', ['535.309.01-0+deb12u1'])


def test_reboot_reasons():
    assert nd.reboot_reasons({'has_gpu': False, 'installed_version': '535.309.01'}) == []
    assert nd.reboot_reasons({'has_gpu': True, 'loaded_version': '580.95.05', 'installed_version': '580.95.05'}) == []
    assert nd.reboot_reasons({'has_gpu': True, 'nouveau_loaded': True, 'installed_version': '580.95.05'}) == [
        'nouveau is loaded and holds the GPUs (it is blacklisted now)',
        'driver 580.95.05 is installed but its kernel module is not loaded']
    assert nd.reboot_reasons({'has_gpu': True, 'loaded_version': '580.82.07', 'installed_version': '580.95.05'}) == [
        'the running kernel module is 580.82.07 but driver 580.95.05 is installed']


def test_version_mismatch_names_the_nodes():
    assert nd.version_mismatches({'a': '580.95.05', 'b': '580.95.05'}) == []
    assert nd.version_mismatches({'gpu-1': '580.95.05', 'gpu-2': '580.82.07', 'gpu-3': '580.95.05'}) == [
        'driver 580.82.07 on gpu-2', 'driver 580.95.05 on gpu-1, gpu-3']
