"""gpu_facts run as Ansible runs it, against an nvidia-smi that replays recorded outputs.

The stand-in answers from the fixtures recorded on a real H100 (fields.txt holds each field's
value there, help-query-gpu.txt the fields the 580 driver knows); a query naming a field it does
not know exits 2 with nvidia-smi's recorded message (query-bogus.txt) for that field. The PCI
tree is built from the recorded pci.txt.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
MODULE = os.path.join(ROOT, 'plugins', 'modules', 'gpu_facts.py')
COLLECTIONS = os.path.join(ROOT, '.build', 'collections')
H100 = os.path.join(ROOT, 'tests', 'unit', 'fixtures', 'nvidia_smi', 'h100-sxm-x1-driver580')
FIXTURES = os.path.dirname(H100)

FAKE = textwrap.dedent('''\
    #!%(python)s
    import json, os, sys
    cfg = json.load(open(%(cfg)r))
    args = sys.argv[1:]
    log = open(cfg['log'], 'a'); log.write(' '.join(args) + '\\n'); log.close()
    def show(path, rc=0):
        sys.stdout.write(open(path).read()); sys.exit(rc)
    if cfg.get('stderr'):
        sys.stderr.write(cfg['stderr'])
    if cfg.get('fail'):
        show(cfg['fail'], cfg.get('rc', 9))
    if not args:
        show(os.path.join(cfg['dir'], 'nvidia-smi.txt'))
    if args == ['--help-query-gpu']:
        text = open(os.path.join(cfg['dir'], 'help-query-gpu.txt')).read()
        for name in cfg.get('unknown', []):
            text = text.replace('"%%s" or ' %% name, '').replace(' or "%%s"' %% name, '')
            text = text.replace('\\n"%%s"\\n' %% name, '\\n')
        sys.stdout.write(text); sys.exit(0)
    if args == ['topo', '-m']:
        show(os.path.join(cfg['dir'], 'topo-m.txt'))
    if args[0].startswith('--query-gpu='):
        fields = args[0].split('=', 1)[1].split(',')
        values = {}
        for line in open(os.path.join(cfg['dir'], 'fields.txt')):
            name, _, value = line.rstrip('\\n').rstrip('|').partition(': ')
            values[name] = value
        for name in fields:
            if name not in values or name in cfg.get('unknown', []):
                sys.stdout.write('Field "%%s" is not a valid field to query.\\n\\n' %% name); sys.exit(2)
        units = {'memory.total': ' [MiB]', 'memory.used': ' [MiB]', 'power.draw': ' [W]', 'power.limit': ' [W]'}
        renamed = {'clocks_throttle_reasons.active': 'clocks_event_reasons.active'}
        print(', '.join(renamed.get(n, n) + units.get(n, '') for n in fields))
        print(', '.join(values[n] for n in fields))
        sys.exit(0)
    sys.exit(2)
''')


def make_fake(tmp_path, **cfg):
    cfg.setdefault('dir', H100)
    cfg['log'] = str(tmp_path / 'calls.log')
    (tmp_path / 'cfg.json').write_text(json.dumps(cfg))
    fake = tmp_path / 'nvidia-smi'
    fake.write_text(FAKE % {'python': sys.executable, 'cfg': str(tmp_path / 'cfg.json')})
    fake.chmod(0o755)
    return str(fake)


def make_pci(tmp_path, listing):
    root = tmp_path / 'pci'
    root.mkdir()
    for line in listing.splitlines():
        path, vendor, device, pci_class = line.split()
        d = root / os.path.basename(path)
        d.mkdir()
        (d / 'vendor').write_text(vendor + '\n')
        (d / 'device').write_text(device + '\n')
        (d / 'class').write_text(pci_class + '\n')
    return str(root)


def run(tmp_path, check=False, **args):
    payload = {'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=check, _ansible_tmpdir=str(tmp_path))}
    (tmp_path / 'args.json').write_text(json.dumps(payload))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, MODULE, str(tmp_path / 'args.json')], capture_output=True, text=True,
                          env=env, check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        pytest.fail('module printed no JSON (rc %d): %s %s' % (proc.returncode, proc.stdout, proc.stderr))


@pytest.fixture
def h100_pci(tmp_path):
    with open(os.path.join(H100, 'pci.txt')) as f:
        return make_pci(tmp_path, f.read())


def test_h100_node_in_check_mode(tmp_path, h100_pci):
    out = run(tmp_path, check=True, nvidia_smi=make_fake(tmp_path), sysfs_pci=h100_pci)
    assert out.get('failed') is not True, out
    assert out['changed'] is False
    assert (out['gpu_count'], out['reason'], out['pci_gpu_count'], out['pci_nvswitch_count']) == (1, '', 1, 0)
    assert (out['driver_version'], out['cuda_version']) == ('580.159.04', '13.0')
    gpu = out['gpus'][0]
    assert gpu['name'] == 'NVIDIA H100 80GB HBM3' and gpu['memory_total_mib'] == 81559
    assert gpu['clock_event_reasons'] == ['gpu_idle'] and gpu['retired_pages_pending'] is None
    assert out['topology']['gpus'] == ['GPU0']
    facts = out['ansible_facts']['gpu_facts']
    assert facts['gpus'] == out['gpus'] and facts['gpu_count'] == 1 and facts['reason'] == ''
    assert out['query_fields_dropped'] == []


def test_a_driver_without_a_field_drops_it_and_retries(tmp_path, h100_pci):
    fake = make_fake(tmp_path, unknown=['remapped_rows.failure', 'clocks_event_reasons.active'])
    out = run(tmp_path, nvidia_smi=fake, sysfs_pci=h100_pci)
    assert out['gpu_count'] == 1, out
    assert out['query_fields_dropped'] == ['remapped_rows.failure']
    assert out['gpus'][0]['remapped_rows_failure'] is None
    assert out['gpus'][0]['clock_event_reasons'] == ['gpu_idle']   # asked by its former name
    calls = (tmp_path / 'calls.log').read_text().splitlines()
    assert '--help-query-gpu' in calls
    assert [c for c in calls if c.startswith('--query-gpu=')][-1].count('clocks_throttle_reasons.active') == 1


# nvidia-smi's message for a GPU whose infoROM checksum is bad; it prints it on stderr before
# its normal output on every call, and the GPU works.
INFOROM = 'WARNING: infoROM is corrupted at gpu 0000:00:06.0\n'


def test_a_warning_on_stderr_leaves_the_gpus_counted(tmp_path, h100_pci):
    out = run(tmp_path, nvidia_smi=make_fake(tmp_path, stderr=INFOROM), sysfs_pci=h100_pci)
    assert out.get('failed') is not True, out
    assert (out['gpu_count'], out['reason']) == (1, ''), out
    assert out['gpus'][0]['name'] == 'NVIDIA H100 80GB HBM3'
    assert (out['driver_version'], out['cuda_version']) == ('580.159.04', '13.0')
    assert out['topology']['gpus'] == ['GPU0']


def test_a_failure_reason_comes_from_stderr_when_stdout_is_empty(tmp_path, h100_pci):
    empty = tmp_path / 'empty.txt'
    empty.write_text('')
    fake = make_fake(tmp_path, fail=str(empty), rc=15,
                     stderr='Unable to determine the device handle for GPU0000:00:06.0: Unknown Error\n')
    out = run(tmp_path, nvidia_smi=fake, sysfs_pci=h100_pci)
    assert out['gpu_count'] == 0
    assert out['reason'] == ('nvidia-smi failed (rc 15): Unable to determine the device handle for '
                             'GPU0000:00:06.0: Unknown Error')


def test_driver_library_mismatch_is_gpu_count_0_with_the_reason(tmp_path, h100_pci):
    fake = make_fake(tmp_path, fail=os.path.join(FIXTURES, 'driver-mismatch', 'nvidia-smi.txt'), rc=18)
    out = run(tmp_path, nvidia_smi=fake, sysfs_pci=h100_pci)
    assert out.get('failed') is not True, out
    assert out['gpu_count'] == 0 and out['gpus'] == []
    assert out['reason'] == 'nvidia-smi failed (rc 18): Failed to initialize NVML: Driver/library version mismatch'
    assert out['pci_gpu_count'] == 1


def test_no_driver_installed_but_a_gpu_on_the_bus(tmp_path, h100_pci):
    out = run(tmp_path, nvidia_smi=str(tmp_path / 'absent' / 'nvidia-smi'), sysfs_pci=h100_pci)
    assert out['gpu_count'] == 0
    assert out['reason'] == 'nvidia-smi not found: no NVIDIA driver is installed (1 NVIDIA GPU(s) on the PCI bus)'


def test_no_gpu_and_no_driver(tmp_path):
    out = run(tmp_path, nvidia_smi=str(tmp_path / 'absent' / 'nvidia-smi'), sysfs_pci=str(tmp_path))
    assert (out['gpu_count'], out['pci_gpu_count'], out['reason']) == (0, 0, 'no NVIDIA GPU on the PCI bus and no nvidia-smi')


def test_the_health_probe_reads_the_gpus_in_its_own_pass(tmp_path):
    """health_probe with gpus: true returns what gpu_facts returns, without the topology call."""
    fake = make_fake(tmp_path)
    args = {'ANSIBLE_MODULE_ARGS': {'gpus': True, 'nvidia_smi': fake, 'disk_paths': [], 'kernel_log': False,
                                    'nccl_env_file': str(tmp_path / 'none.sh'), '_ansible_tmpdir': str(tmp_path)}}
    (tmp_path / 'probe.json').write_text(json.dumps(args))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'plugins', 'modules', 'health_probe.py'),
                           str(tmp_path / 'probe.json')], capture_output=True, text=True, env=env, check=False)
    out = json.loads(proc.stdout)
    gpu = out['gpu']
    assert (gpu['gpu_count'], gpu['reason'], gpu['driver_version']) == (1, '', '580.159.04')
    assert gpu['gpus'][0]['name'] == 'NVIDIA H100 80GB HBM3' and gpu['topology'] == {}
    calls = (tmp_path / 'calls.log').read_text()
    assert 'topo' not in calls and '--query-gpu=' in calls
