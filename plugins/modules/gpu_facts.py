#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: gpu_facts
short_description: NVIDIA GPUs of a node as nvidia-smi and the PCI bus report them
description:
  - Counts the NVIDIA devices on the PCI bus (C(/sys/bus/pci/devices/*/vendor) is C(0x10de)),
    GPUs (display class) and NVSwitches (bridge class C(0x0680)), without needing a driver.
  - Reads the driver and CUDA versions from the C(nvidia-smi) banner, then every GPU with
    C(nvidia-smi --query-gpu=FIELDS --format=csv,nounits), parsed by the header nvidia-smi
    prints, so a field the GPU does not report (C([N/A])) is null and a field the driver does
    not know (nvidia-smi exits 2 naming it) is dropped and the query retried with the fields
    C(nvidia-smi --help-query-gpu) lists.
  - Reads the C(nvidia-smi topo -m) matrix (NVLink or PCIe path between GPUs, NIC affinity).
  - No GPU, no driver, or a driver that does not answer (for example a driver/library version
    mismatch) is not a failure; C(gpu_count) is 0 and C(reason) says why.
  - Returns the same keys at the top level and as C(ansible_facts.gpu_facts).
version_added: 0.1.0
author: gpucluster.multinode contributors (!UNKNOWN)
options:
  nvidia_smi:
    description: The nvidia-smi program; a bare name is looked up on C(PATH) and in C(/usr/bin).
    type: str
    default: nvidia-smi
  topology:
    description: Also read C(nvidia-smi topo -m).
    type: bool
    default: true
  timeout:
    description: Seconds each nvidia-smi call may take (a hung driver makes it hang).
    type: int
    default: 60
  sysfs_pci:
    description: Where the PCI devices are listed (for tests against a recorded tree).
    type: path
    default: /sys/bus/pci/devices
extends_documentation_fragment: [gpucluster.multinode.attributes.read_only]
attributes:
  facts:
    support: full
    description: Sets facts (under C(ansible_facts)) that later tasks can read.
notes:
  - C(gpu_count) counts the GPUs nvidia-smi reads; C(pci_gpu_count) the GPUs on the PCI bus.
    They differ when the driver is missing or broken, or a GPU fell off the bus.
'''

EXAMPLES = r'''
- name: Read the GPUs of every node
  gpucluster.multinode.gpu_facts:

- name: Name the nodes whose GPUs are not all readable
  ansible.builtin.debug:
    msg: >-
      {{ inventory_hostname }}: {{ ansible_facts.gpu_facts.gpu_count }} of
      {{ ansible_facts.gpu_facts.pci_gpu_count }} GPU(s) {{ ansible_facts.gpu_facts.reason }}
  when: ansible_facts.gpu_facts.gpu_count != ansible_facts.gpu_facts.pci_gpu_count
'''

RETURN = r'''
gpu_count:
  description: Number of GPUs nvidia-smi read; 0 when there is no GPU or no working driver.
  returned: always
  type: int
  sample: 8
reason:
  description: Why no GPU was read (empty when GPUs were read).
  returned: always
  type: str
  sample: "nvidia-smi failed (rc 18): Failed to initialize NVML: Driver/library version mismatch"
driver_version:
  description: Driver version from the nvidia-smi banner (null without a working driver).
  returned: always
  type: str
  sample: 580.159.04
cuda_version:
  description: Highest CUDA version the driver supports, from the nvidia-smi banner.
  returned: always
  type: str
  sample: "13.0"
gpus:
  description:
    - One entry per GPU, sorted by index. A field the GPU does not report is null.
    - C(ecc_mode), C(persistence_mode) and C(mig_mode) are nvidia-smi's words
      (C(Enabled), C(Disabled)); C(clock_event_reasons) lists the active reasons by their
      nvml names (C(gpu_idle), C(sw_power_cap), C(hw_slowdown), C(sync_boost),
      C(sw_thermal_slowdown), C(hw_thermal_slowdown), C(hw_power_brake_slowdown), ...).
  returned: always
  type: list
  elements: dict
  sample:
    - index: 0
      name: NVIDIA H100 80GB HBM3
      uuid: GPU-5b3c492e-32b8-eaf7-86ce-9ff7970c63b9
      pci_bus_id: "00000000:00:06.0"
      memory_total_mib: 81559
      memory_used_mib: 0
      driver_version: 580.159.04
      compute_cap: "9.0"
      ecc_mode: Enabled
      ecc_errors_uncorrected_volatile: 0
      retired_pages_pending: null
      remapped_rows_pending: false
      remapped_rows_failure: false
      clock_event_reasons: [gpu_idle]
      temperature_c: 39
      power_draw_w: 72.41
      power_limit_w: 700.0
      persistence_mode: Enabled
      mig_mode: Disabled
topology:
  description:
    - The C(nvidia-smi topo -m) matrix; empty when it was not read.
    - C(matrix) maps each device to its link with every other (C(X), C(NV18), C(PIX),
      C(PXB), C(PHB), C(NODE), C(SYS)); C(nvlink) is true when two GPUs are joined by
      NVLink; C(nic_affinity) lists per GPU the NICs on its nearest path; C(nics) maps
      the column names to the device names of the NIC legend.
  returned: always
  type: dict
  sample: {gpus: [GPU0, GPU1], nvlink: true, matrix: {GPU0: {GPU0: X, GPU1: NV18}}, nic_affinity: {GPU0: [mlx5_0]}}
pci_gpu_count:
  description: NVIDIA GPUs on the PCI bus, driver or not.
  returned: always
  type: int
  sample: 8
pci_nvswitch_count:
  description: NVIDIA NVSwitches on the PCI bus (HGX boards; fabric manager needed).
  returned: always
  type: int
  sample: 4
pci_devices:
  description: The NVIDIA PCI devices (address, device_id, class, kind gpu/nvswitch/other).
  returned: always
  type: list
  elements: dict
  sample: [{address: "0000:00:06.0", device_id: "0x2330", class: "0x030200", kind: gpu}]
query_fields_dropped:
  description: Query fields this driver does not know, left out (their values are null).
  returned: always
  type: list
  elements: str
  sample: []
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import nvidia_smi


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type='str', default='nvidia-smi'),
            topology=dict(type='bool', default=True),
            timeout=dict(type='int', default=60),
            sysfs_pci=dict(type='path', default='/sys/bus/pci/devices'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    facts = nvidia_smi.read_gpu_facts(module, p['nvidia_smi'], p['timeout'], p['topology'], p['sysfs_pci'])
    module.exit_json(changed=False, ansible_facts={'gpu_facts': facts}, **facts)


if __name__ == '__main__':
    main()
