"""Parsing what nvidia-smi prints, on outputs recorded from real machines (see the fixtures README)."""

import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.module_utils import nvidia_smi

FIXTURES = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures', 'nvidia_smi')


def fixture(*parts):
    with open(os.path.join(FIXTURES, *parts)) as f:
        return f.read()


def test_h100_query_without_units_every_contract_key():
    gpus = nvidia_smi.gpus_from_rows(nvidia_smi.parse_query_csv(fixture('h100-sxm-x1-driver580', 'query-gpu.csv')))
    assert gpus == [{
        'index': 0, 'name': 'NVIDIA H100 80GB HBM3', 'uuid': 'GPU-5b3c492e-32b8-eaf7-86ce-9ff7970c63b9',
        'pci_bus_id': '00000000:00:06.0', 'memory_total_mib': 81559, 'memory_used_mib': 0,
        'driver_version': '580.159.04', 'compute_cap': '9.0', 'ecc_mode': 'Enabled',
        'ecc_errors_uncorrected_volatile': 0, 'retired_pages_pending': None, 'remapped_rows_pending': False,
        'remapped_rows_failure': False, 'clock_event_reasons': ['gpu_idle'], 'temperature_c': 39,
        'power_draw_w': 72.41, 'power_limit_w': 700.0, 'persistence_mode': 'Enabled', 'mig_mode': 'Disabled'}]


def test_h100_query_with_units_gives_the_same_numbers():
    plain = nvidia_smi.gpus_from_rows(nvidia_smi.parse_query_csv(fixture('h100-sxm-x1-driver580', 'query-gpu.csv')))
    units = nvidia_smi.gpus_from_rows(nvidia_smi.parse_query_csv(fixture('h100-sxm-x1-driver580', 'query-gpu-units.csv')))
    assert units[0]['memory_total_mib'] == plain[0]['memory_total_mib'] == 81559
    assert units[0]['power_draw_w'] == 72.35 and units[0]['power_limit_w'] == 700.0


def test_the_alias_column_repeated_in_the_header_keeps_one_value():
    # Asked clocks_event_reasons.active and clocks_throttle_reasons.active: the header names
    # the new field twice (recorded on the H100).
    header = fixture('h100-sxm-x1-driver580', 'query-gpu.csv').splitlines()[0]
    assert header.count('clocks_event_reasons.active') == 2
    rows = nvidia_smi.parse_query_csv(fixture('h100-sxm-x1-driver580', 'query-gpu.csv'))
    assert rows[0]['clocks_event_reasons.active'] == '0x0000000000000001'


def test_a_consumer_card_answers_na_for_ecc_remapping_and_mig():
    # Every field the 595 driver knows, on a GeForce RTX 4080 SUPER: many [N/A], a bare N/A,
    # "[Requested functionality has been deprecated]" and an empty cell.
    rows = nvidia_smi.parse_query_csv(fixture('rtx4080-super-driver595', 'query-gpu-all-fields.csv'))
    assert len(rows) == 1 and len(rows[0]) > 190
    gpu = nvidia_smi.gpus_from_rows(rows)[0]
    assert gpu['name'] == 'NVIDIA GeForce RTX 4080 SUPER'
    assert (gpu['memory_total_mib'], gpu['memory_used_mib']) == (16376, 596)
    assert gpu['ecc_mode'] is None and gpu['ecc_errors_uncorrected_volatile'] is None
    assert gpu['retired_pages_pending'] is None and gpu['remapped_rows_pending'] is None
    assert gpu['mig_mode'] is None
    assert gpu['persistence_mode'] == 'Disabled'
    assert gpu['compute_cap'] == '8.9'
    assert (gpu['temperature_c'], gpu['power_draw_w'], gpu['power_limit_w']) == (43, 26.2, 320.0)
    assert gpu['clock_event_reasons'] == ['gpu_idle']


def test_eight_h200_rows_with_a_field_subset_leave_the_rest_null():
    gpus = nvidia_smi.gpus_from_rows(nvidia_smi.parse_query_csv(fixture('h200-x8-driver570', 'query-gpu.csv')))
    assert [g['index'] for g in gpus] == list(range(8))
    assert {g['name'] for g in gpus} == {'NVIDIA H200'}
    assert {g['memory_total_mib'] for g in gpus} == {143771}
    assert gpus[3]['uuid'] is None and gpus[3]['temperature_c'] is None and gpus[3]['clock_event_reasons'] == []


@pytest.mark.parametrize('mask,names', [
    ('0x0000000000000001', ['gpu_idle']),
    ('0x0000000000000000', []),
    ('0x0000000000000044', ['sw_power_cap', 'hw_thermal_slowdown']),
    ('0x00000000000001FF', ['gpu_idle', 'applications_clocks_setting', 'sw_power_cap', 'hw_slowdown', 'sync_boost',
                            'sw_thermal_slowdown', 'hw_thermal_slowdown', 'hw_power_brake_slowdown',
                            'display_clock_setting']),
    ('0x0000000000001008', ['hw_slowdown', 'unknown_0x1000']),
])
def test_clock_event_reason_bits(mask, names):
    assert nvidia_smi.clock_event_reasons(mask) == names


def test_the_supported_mask_of_the_4080_covers_every_named_reason():
    rows = nvidia_smi.parse_query_csv(fixture('rtx4080-super-driver595', 'query-gpu-all-fields.csv'))
    assert len(nvidia_smi.clock_event_reasons(rows[0]['clocks_event_reasons.supported'])) == 9


def test_help_query_gpu_lists_current_and_former_names():
    valid = nvidia_smi.parse_help_query_gpu(fixture('h100-sxm-x1-driver580', 'help-query-gpu.txt'))
    recorded = fixture('h100-sxm-x1-driver580', 'valid-fields.txt').strip().split(',')
    assert set(recorded) <= valid
    assert {'clocks_event_reasons.active', 'clocks_throttle_reasons.active', 'gpu_name', 'gpu_bus_id'} <= valid
    assert set(nvidia_smi.QUERY_FIELDS) <= valid


def test_an_unknown_field_is_named_and_an_older_driver_gets_the_former_name():
    assert nvidia_smi.invalid_fields(fixture('h100-sxm-x1-driver580', 'query-bogus.txt')) == ['bogus.field']
    valid = nvidia_smi.parse_help_query_gpu(fixture('h100-sxm-x1-driver580', 'help-query-gpu.txt'))
    assert nvidia_smi.usable_fields(['index', 'bogus.field'], valid) == ['index']
    older = valid - {'clocks_event_reasons.active'}
    assert nvidia_smi.usable_fields(['clocks_event_reasons.active'], older) == ['clocks_throttle_reasons.active']
    assert nvidia_smi.header_name('clocks_throttle_reasons.active') == 'clocks_event_reasons.active'
    assert nvidia_smi.header_name('memory.total [MiB]') == 'memory.total'


@pytest.mark.parametrize('path,versions', [
    (('h100-sxm-x1-driver580', 'nvidia-smi.txt'), ('580.159.04', '13.0')),
    (('h100-sxm-x1-driver580', 'nvidia-smi-version.txt'), ('580.159.04', '13.0')),
    (('h100-sxm-x8-driver580', 'nvidia-smi-head.txt'), ('580.126.20', '13.0')),
    (('h200-x8-driver570', 'nvidia-smi-banner.txt'), ('570.211.01', '12.8')),
    (('a100-pcie-x2-driver535', 'nvidia-smi.txt'), ('535.86.05', '12.2')),
    (('rtx4070-driver550', 'nvidia-smi.txt'), ('550.40.07', '12.4')),
    (('rtx4080-super-driver595', 'nvidia-smi.txt'), ('595.71.05', '13.2')),
    (('driver-mismatch', 'nvidia-smi.txt'), (None, None)),
])
def test_driver_and_cuda_versions_from_the_banner(path, versions):
    assert nvidia_smi.parse_versions(fixture(*path)) == versions


def test_a_driver_library_mismatch_is_a_reason_not_a_crash():
    reason = nvidia_smi.failure_reason(fixture('driver-mismatch', 'nvidia-smi.txt'), 18)
    assert reason == 'nvidia-smi failed (rc 18): Failed to initialize NVML: Driver/library version mismatch'


def test_a_driver_that_is_installed_but_not_loaded():
    # Recorded in a Debian 12 container with Debian's 535 packages and no GPU.
    text = fixture('driver-not-loaded', 'nvidia-smi.txt')
    assert nvidia_smi.parse_versions(text) == (None, None)
    assert "couldn't communicate with the NVIDIA driver" in nvidia_smi.failure_reason(text, 9)


def test_topology_of_an_8x_h100_hgx_board():
    topo = nvidia_smi.parse_topology(fixture('h100-sxm-x8-driver580', 'topo-m.txt'))
    assert topo['gpus'] == ['GPU%d' % i for i in range(8)]
    assert topo['nvlink'] is True
    assert {topo['matrix']['GPU%d' % a]['GPU%d' % b] for a in range(8) for b in range(8) if a != b} == {'NV18'}
    assert topo['matrix']['GPU3']['GPU3'] == 'X'
    assert topo['nic_affinity']['GPU0'] == ['NIC0'] and topo['nic_affinity']['GPU5'] == ['NIC9']
    assert topo['matrix']['NIC1']['NIC2'] == 'PIX'
    assert topo['cpu_affinity']['GPU4'] == '56-111,168-223' and topo['numa_affinity']['GPU4'] == '1'


def test_topology_names_nics_from_the_legend():
    topo = nvidia_smi.parse_topology(fixture('h200-x8-driver570', 'topo-m.txt'))
    assert topo['nics']['NIC4'] == 'mlx5_4'
    assert topo['nic_affinity']['GPU0'] == ['mlx5_4'] and topo['nic_affinity']['GPU7'] == ['mlx5_2']
    assert topo['matrix']['GPU0']['NIC2'] == 'SYS'


def test_topology_of_one_gpu_with_terminal_underline_codes():
    text = fixture('h100-sxm-x1-driver580', 'topo-m.txt')
    assert '\x1b[4m' in text
    topo = nvidia_smi.parse_topology(text)
    assert topo['gpus'] == ['GPU0'] and topo['nvlink'] is False
    assert topo['matrix'] == {'GPU0': {'GPU0': 'X'}}
    assert topo['cpu_affinity'] == {'GPU0': '0-15'} and topo['nic_affinity'] == {}


def test_pci_listing_finds_the_gpu_among_virtio_devices():
    devices = nvidia_smi.parse_pci_listing(fixture('h100-sxm-x1-driver580', 'pci.txt'))
    assert devices == [{'address': '0000:00:06.0', 'device_id': '0x2330', 'class': '0x030200', 'kind': 'gpu'}]
    assert nvidia_smi.open_modules_supported('0x2330') is True
    assert nvidia_smi.open_modules_supported('0x1db1') is False   # V100: before Turing
    assert nvidia_smi.pci_device('0000:05:00.0', '0x22a3', '0x068000')['kind'] == 'nvswitch'
