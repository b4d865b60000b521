"""The collection-wide defaults: one definition, read by the modules and through the lookup by the roles."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleLookupError

from ansible_collections.gpucluster.multinode.plugins.lookup.cluster_default import LookupModule
from ansible_collections.gpucluster.multinode.plugins.module_utils import cluster_defaults, hostfile, smoke


def test_the_lookup_returns_the_defaults_the_modules_use():
    found = LookupModule().run(['env_path', 'nccl_profile', 'master_port', 'max_slots'], {})
    assert found == ['/opt/gpucluster/env', '/etc/profile.d/gpucluster-nccl.sh', 29500, 1024]
    assert hostfile.MAX_SLOTS == smoke.MAX_SLOTS == cluster_defaults.MAX_SLOTS


def test_the_port_ranges_the_firewall_opens_by_default():
    d = cluster_defaults
    assert d.port_range(d.MASTER_PORT, d.RENDEZVOUS_PORT_COUNT) == '29500:29600'
    assert d.port_range(d.RAY_CLIENT_SERVER_PORT, d.RAY_CLIENT_PORT_COUNT) == '10001:10100'


def test_an_unknown_name_fails_naming_it():
    with pytest.raises(AnsibleLookupError, match="no default named 'env'"):
        LookupModule().run(['env'], {})


def test_the_training_image_is_named_after_the_pins_given_or_the_collections():
    assert LookupModule().run(['train_image'], {}) == ['localhost/gpucluster-train:torch2.13.0-ds0.19.8']
    assert (LookupModule().run(['train_image'], {}, torch='2.12.0', deepspeed='')
            == ['localhost/gpucluster-train:torch2.12.0-ds0.19.8'])
    assert LookupModule().run(['torch_version', 'deepspeed_version', 'bandwidth_port'], {}) == ['2.13.0', '0.19.8', 5201]
