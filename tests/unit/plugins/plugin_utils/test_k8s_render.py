import copy
import os

import pytest

from ansible_collections.gpucluster.multinode.plugins.filter.nccl_env import nccl_environment
from ansible_collections.gpucluster.multinode.plugins.module_utils import k8s_cluster as kc
from ansible_collections.gpucluster.multinode.plugins.module_utils import k8s_manifests as km
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import k8s_render as kr

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
EXAMPLE = os.path.join(ROOT, 'inventories', 'example-k8s', 'k8s-cluster.yml')
SCHEMAS = os.path.join(ROOT, 'roles', 'k8s', 'files', 'schemas')
pytest.importorskip('kubernetes_validate')


def example():
    c = kr.load_cluster_file(EXAMPLE)
    env = nccl_environment(c['network']['mode'], c['network']['socket_ifname'], ib_hca=c['network']['ib_hca'],
                           master_addr=kc.pod_dns(c, 0), master_port=c['train']['master_port'])
    objs = km.render(c, env, kr.read_text(os.path.join(kr.role_files(), kc.ENTRYPOINT), 'entrypoint'),
                     kr.config_files(c, EXAMPLE))
    return c, objs


def test_the_example_passes_both_versions_and_the_shipped_schemas():
    c, objs = example()
    report = kr.check_objects(objs, c, kr.DEFAULT_VERSIONS, SCHEMAS)
    assert report == {'kubernetes_versions': ['1.30.0', '1.34.0'], 'objects': 9,
                      'crd_schemas': ['securitycontextconstraints-security.openshift.io-v1.json']}


@pytest.mark.parametrize('mutate,expected', [
    (lambda o: o[-1]['spec'].update(podManagmentPolicy=o[-1]['spec'].pop('podManagementPolicy')),
     "StatefulSet trainer: Kubernetes 1.30.0: spec: Additional properties are not allowed ('podManagmentPolicy'"),
    (lambda o: o[-1]['spec'].update(replicas='three'),
     "StatefulSet trainer: Kubernetes 1.30.0: spec.replicas: 'three' is not of type 'integer'"),
    (lambda o: next(x for x in o if x['kind'] == 'SecurityContextConstraints').update(allowHostIPC='no'),
     "SecurityContextConstraints trainer-rdma: allowHostIPC: 'no' is not of type 'boolean'"),
    (lambda o: next(x for x in o if x['kind'] == 'SecurityContextConstraints').update(allowedCapabilitys=['IPC_LOCK']),
     "SecurityContextConstraints trainer-rdma: (top): Additional properties are not allowed ('allowedCapabilitys'"),
])
def test_a_broken_manifest_is_refused_with_the_object_and_field(mutate, expected):
    c, objs = example()
    objs = copy.deepcopy(objs)
    mutate(objs)
    with pytest.raises(kr.RenderError) as err:
        kr.check_objects(objs, c, kr.DEFAULT_VERSIONS, SCHEMAS, where='k.yml')
    assert expected in str(err.value)


def test_nad_schema_refuses_a_config_that_is_not_json_text():
    nad = {'apiVersion': 'k8s.cni.cncf.io/v1', 'kind': 'NetworkAttachmentDefinition',
           'metadata': {'name': 'rdma-net', 'namespace': 'ml-team'}, 'spec': {'config': {'type': 'host-device'}}}
    assert "spec.config: {'type': 'host-device'} is not of type 'string'" in kr.schema_check(nad, ['1.30.0'], SCHEMAS)


def test_manifests_are_written_idempotently_and_stale_files_removed(tmp_path):
    c, objs = example()
    files, removed, diffs = kr.write_manifests(objs, str(tmp_path))
    assert [os.path.basename(f) for f in files][:2] == ['01-serviceaccount-trainer.yaml',
                                                        '02-securitycontextconstraints-trainer-rdma.yaml']
    assert len(diffs) == 9 and removed == []
    assert kr.write_manifests(objs, str(tmp_path))[2] == []
    (tmp_path / '99-configmap-old.yaml').write_text('kind: ConfigMap\n')
    (tmp_path / 'notes.yaml').write_text('mine\n')
    _, removed, _ = kr.write_manifests(objs, str(tmp_path))
    assert removed == [str(tmp_path / '99-configmap-old.yaml')]
    assert (tmp_path / 'notes.yaml').exists()
    back, sources = kr.read_manifests(str(tmp_path))
    assert back == objs and os.path.basename(sources[-1]) == '09-statefulset-trainer.yaml'


def test_check_mode_writes_nothing(tmp_path):
    _, objs = example()
    _, _, diffs = kr.write_manifests(objs, str(tmp_path / 'm'), check=True)
    assert len(diffs) == 9 and not (tmp_path / 'm').exists()


def test_a_missing_cluster_file_and_bad_yaml_name_the_file(tmp_path):
    with pytest.raises(kr.RenderError, match='cluster file: cannot read /nonexistent.yml'):
        kr.load_cluster_file('/nonexistent.yml')
    bad = tmp_path / 'k.yml'
    bad.write_text('name: [a\n')
    with pytest.raises(kr.RenderError, match=r'k.yml: line \d+ is not valid YAML'):
        kr.load_cluster_file(str(bad))
