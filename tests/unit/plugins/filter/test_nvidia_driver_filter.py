from ansible_collections.gpucluster.multinode.plugins.filter.nvidia_driver import nvidia_driver_mismatches


def test_nodes_on_different_driver_versions_are_named_from_the_results_given():
    results = {'n1': {'gpu_count': 8, 'driver_version': '580.82.07'},
               'n2': {'gpu_count': 8, 'driver_version': '575.57.08'},
               'cpu': {'gpu_count': 0, 'driver_version': ''},
               'skipped': {}}
    assert nvidia_driver_mismatches(results) == ['driver 575.57.08 on n2', 'driver 580.82.07 on n1']


def test_one_version_everywhere_is_no_mismatch():
    assert nvidia_driver_mismatches({'n1': {'gpu_count': 1, 'driver_version': '580.82.07'},
                                     'n2': {'gpu_count': 2, 'driver_version': '580.82.07'}}) == []
    assert nvidia_driver_mismatches({}) == []
