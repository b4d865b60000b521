"""Running a test program on a node: the environment it gets and the lines read back."""

from ansible_collections.gpucluster.multinode.plugins.module_utils import node_commands as nc


class ShellModule:
    """run_command runs the real /bin/sh, as AnsibleModule would."""

    def run_command(self, argv):
        import subprocess
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr


def test_the_profile_is_sourced_and_extra_values_win(tmp_path, monkeypatch):
    monkeypatch.setenv('GPUCLUSTER_TEST_KEEP', 'kept')
    profile = tmp_path / 'gpucluster-nccl.sh'
    profile.write_text("export NCCL_SOCKET_IFNAME=enp26s0np0\nexport NCCL_DEBUG='WARN'\necho noise\n")
    env = nc.node_environment(ShellModule(), [str(profile), str(tmp_path / 'missing.sh')], {'NCCL_DEBUG': 'INFO'})
    assert env['NCCL_SOCKET_IFNAME'] == 'enp26s0np0'
    assert env['NCCL_DEBUG'] == 'INFO'
    assert env['GPUCLUSTER_TEST_KEEP'] == 'kept'


def test_json_lines_take_only_the_prefixed_lines():
    text = 'W1123 warning\nPFX {"kind": "start", "world_size": 5}\nrank1: PFX {"kind": "row"}\nPFX {broken\n'
    assert nc.json_lines(text, 'PFX ') == [{'kind': 'start', 'world_size': 5}, {'kind': 'row'}]


def test_tail_keeps_the_last_lines():
    assert nc.tail('a\nb\nc\n\n', 2) == 'b\nc'
    assert nc.tail(None) == ''
