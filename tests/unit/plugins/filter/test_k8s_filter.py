import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpucluster.multinode.plugins.filter import k8s


def test_job_id_is_made_from_the_cluster_name_and_checked():
    assert k8s.k8s_job_id('', 'trainer', now=0) == 'trainer-19700101-000000'
    assert k8s.k8s_job_id('run.7', 'trainer') == 'run.7'
    with pytest.raises(AnsibleFilterError, match='k8s_train_job_id: job_id'):
        k8s.k8s_job_id('bad id', 'trainer')


def test_pod_report_takes_the_k8s_info_list_of_the_statefulset():
    rep = k8s.k8s_pod_report([], [{'status': {'replicas': 2, 'readyReplicas': 0}}], ['a-0', 'a-1'])
    assert rep['replicas'] == 2 and rep['state'] == 'progressing' and rep['not_ready'] == ['a-0', 'a-1']
