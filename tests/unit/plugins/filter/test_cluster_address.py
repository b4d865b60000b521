import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.filter.cluster_address import FilterModule, cluster_address
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import inventory_contract as contract


def test_cluster_address_wins_over_ansible_host():
    assert cluster_address({'cluster_address': '10.0.0.5', 'ansible_host': '192.168.1.5'}, 'n1') == '10.0.0.5'


def test_ansible_host_when_no_cluster_address():
    assert cluster_address({'ansible_host': '192.168.1.5'}, 'n1') == '192.168.1.5'


def test_inventory_name_when_neither_is_set():
    assert cluster_address({}, 'n1') == 'n1'
    assert cluster_address({'inventory_hostname': 'n2'}) == 'n2'


@pytest.mark.parametrize('empty', ['', '   ', None])
def test_an_empty_value_counts_as_not_set(empty):
    # Jinja's default() would keep '' and give an empty address; this filter goes on to the next source
    assert cluster_address({'cluster_address': empty, 'ansible_host': '192.168.1.5'}, 'n1') == '192.168.1.5'
    assert cluster_address({'cluster_address': empty, 'ansible_host': empty}, 'n1') == 'n1'


def test_whitespace_around_a_value_is_dropped():
    assert cluster_address({'cluster_address': ' 10.0.0.5\n'}, 'n1') == '10.0.0.5'


def test_no_source_at_all_is_a_filter_error_not_an_empty_string():
    with pytest.raises(AnsibleFilterError, match='no cluster_address'):
        cluster_address({'cluster_address': ''})


def test_undefined_templated_value_is_skipped():
    class HostVarsLike(dict):
        def get(self, key, default=None):
            if key == 'cluster_address':
                raise KeyError('undefined variable in template')
            return super().get(key, default)

    assert cluster_address(HostVarsLike(ansible_host='10.1.1.1'), 'n1') == '10.1.1.1'


def test_the_contract_and_the_filter_agree():
    hostvars = {'a': {'cluster_address': '', 'ansible_host': '10.0.0.1'}, 'b': {}}
    for host in hostvars:
        assert contract.cluster_address(hostvars, host) == cluster_address(hostvars[host], host)
    assert contract.address_source(hostvars['a']) == 'ansible_host'


def test_registered_under_its_public_name():
    assert FilterModule().filters()['cluster_address'] is cluster_address
