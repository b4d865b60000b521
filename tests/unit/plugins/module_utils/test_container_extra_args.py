"""Extra arguments of a job's container that undo what the collection's command line sets are
refused naming the variable, the argument and why; the others pass through untouched."""

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import containers as cn
from ansible_collections.gpucluster.multinode.plugins.filter.containers import container_extra_args_conflicts

PODMAN = {'runtime': 'podman', 'image': 'localhost/gpucluster-train:1', 'mounts': ['/shared']}
WHY_NETWORK = 'every launcher needs (ranks reach each other on the cluster addresses'


@pytest.mark.parametrize('args, shown', [
    (['--network', 'bridge'], '--network bridge'),
    (['--network=bridge'], '--network=bridge'),
    (['--net', 'bridge'], '--net bridge'),
    (['--net=bridge'], '--net=bridge'),
    (['--net bridge'], '--net bridge'),             # one item with a space, as YAML gives "--net bridge"
    (['--network', 'host'], '--network host'),      # podman refuses a second --network even with host
])
def test_every_form_of_another_network_is_refused_naming_the_variable_and_why(args, shown):
    assert cn.extra_args_conflicts('podman', args) == [
        'training_container_extra_args: %s conflicts with --network host that %s; podman takes no second --network)'
        % (shown, WHY_NETWORK)]


def test_podman_options_the_line_sets_are_refused_and_the_same_values_accepted():
    args = ['--ipc=host', '--ipc', 'private', '--userns', 'keep-id', '--userns=auto', '--name', 'mine',
            '--label', 'team=vision', '--label', 'gpucluster.job=other', '-w', '/tmp', '-d', '--detach=false',
            '--ulimit', 'nofile=65536:65536', '--ulimit=memlock=8192', '--device', '/dev/fuse', '--shm-size', '8g']
    refused = [line.split(' conflicts with ')[0].split(': ', 1)[1] for line in cn.extra_args_conflicts('podman', args)]
    assert refused == ['--ipc private', '--userns=auto', '--name mine', '--label gpucluster.job=other', '-w /tmp', '-d',
                       '--ulimit=memlock=8192']
    # without training_container_memlock the line sets no memlock limit: one of the user's is no conflict
    assert cn.extra_args_conflicts('podman', ['--ulimit', 'memlock=8192'], memlock=False) == []


def test_apptainer_and_pyxis_options_that_undo_the_line_are_refused():
    assert [line.split(': ', 1)[1].split(' conflicts')[0] for line in cn.extra_args_conflicts(
        'apptainer', ['--writable-tmpfs', '--net', '--network', 'bridge', '-C', '--cleanenv', '--ipc'])] == [
        '--net', '--network bridge', '-C', '--cleanenv', '--ipc']
    assert cn.extra_args_conflicts('singularity', ['-e'])[0].startswith(
        'training_container_extra_args: -e conflicts with the host environment passed through')
    assert [line.split(': ', 1)[1].split(' conflicts')[0] for line in cn.extra_args_conflicts(
        'enroot', ['--container-workdir=/x', '--container-mounts=/data:/data', '--container-remap-root'])] == [
        '--container-mounts=/data:/data', '--container-remap-root']
    # podman's options mean nothing to the other runtimes' lines, and the reverse
    assert cn.extra_args_conflicts('enroot', ['--network', 'bridge']) == []
    assert cn.extra_args_conflicts('podman', ['--container-mounts=/x:/x', '-e', 'A=1']) == []
    assert cn.extra_args_conflicts('none', ['--network', 'bridge']) == []


def test_the_job_module_refuses_them_too_before_building_a_line():
    with pytest.raises(cn.ContainerError, match='container extra_args: --network=bridge conflicts with --network host'):
        cn.check_spec(dict(PODMAN, extra_args=['--network=bridge']))
    spec = cn.check_spec(dict(PODMAN, extra_args=['--shm-size', '8g', '--device', '/dev/fuse']))
    argv = cn.wrap(spec, 'j', 'n', ['python'], '')
    assert argv[argv.index(PODMAN['image']) - 4:argv.index(PODMAN['image'])] == ['--shm-size', '8g', '--device', '/dev/fuse']


def test_the_filter_names_the_variable_it_is_given_and_refuses_a_string():
    assert container_extra_args_conflicts(['--net=bridge'], 'podman', 'container_extra_args')[0].startswith(
        'container_extra_args: --net=bridge conflicts')
    assert container_extra_args_conflicts(None, 'podman') == []
    with pytest.raises(Exception, match='must be a list of arguments, got str'):
        container_extra_args_conflicts('--network bridge', 'podman')


def test_a_runtime_image_or_pin_set_on_one_node_only_is_named_against_the_head():
    from ansible_collections.gpucluster.multinode.plugins.filter.containers import container_settings_mismatches
    same = {'container_runtime': 'podman', 'container_image': None, 'container_image_digest': ''}
    settings = {'gpu-master': same, 'gpu-worker-1': dict(same, container_image_digest=None),
                'gpu-worker-2': dict(same, container_runtime='none', container_image='train:2')}
    assert container_settings_mismatches(settings, 'gpu-master') == [
        'host gpu-worker-2: container_image is train:2, on gpu-master not set; '
        'container_image must be the same on every node of the cluster',
        'host gpu-worker-2: container_runtime is none, on gpu-master podman; '
        'container_runtime must be the same on every node of the cluster']
    assert container_settings_mismatches({'h': same, 'w': dict(same)}, 'h') == []
    with pytest.raises(Exception, match='reference node x'):
        container_settings_mismatches(settings, 'x')
