"""The digest comparison site.yml and train.yml use to refuse a node with another image."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.filter.containers import container_digest_mismatches


def test_lines_name_the_odd_node_both_digests_and_a_missing_image():
    lines = container_digest_mismatches({'head': 'sha256:aa', 'w1': 'sha256:aa', 'w2': 'sha256:bb', 'w3': ''}, 'img:1')
    assert lines == ['node w2: image img:1 is sha256:bb but head has sha256:aa; load the same image on every node '
                     '(site.yml --tags container)',
                     'node w3: image img:1 is missing (head has sha256:aa); load it there (site.yml --tags container)']
    assert container_digest_mismatches({'head': 'sha256:aa', 'w1': 'sha256:aa'}, 'img:1') == []


def test_reference_node_must_be_known_and_input_a_dict():
    with pytest.raises(AnsibleFilterError, match='reference node x is not among head'):
        container_digest_mismatches({'head': 'a'}, 'img', reference='x')
    with pytest.raises(AnsibleFilterError, match='takes a dict'):
        container_digest_mismatches(['a'], 'img')
