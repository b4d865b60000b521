import copy
import glob
import os
import sys

import pytest

from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import cluster as kc
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import manifests as km
from ansible_collections.gpucluster.multinode.plugins.plugin_utils.k8s import render as kr

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..'))
EXAMPLE = os.path.join(ROOT, 'inventories', 'example-k8s', 'k8s-cluster.yml')
EXAMPLE_TCP = os.path.join(ROOT, 'inventories', 'example-k8s', 'k8s-cluster-tcp.yml')
SCHEMAS = os.path.join(ROOT, 'roles', 'k8s', 'files', 'schemas')
pytest.importorskip('kubernetes_validate')


def example(path=EXAMPLE):
    c = kr.load_cluster_file(path)
    objs = km.render(c, kr.environment(c), kr.read_text(os.path.join(kr.role_files(), kc.ENTRYPOINT), 'entrypoint'),
                     kr.config_files(c, path))
    # the objects present applies, then what the administrator applies (the RDMA SCC and its grant)
    return c, objs + km.admin_objects(c)


def test_the_example_passes_both_versions_and_the_shipped_schemas():
    c, objs = example()
    report = kr.check_objects(objs, c, kr.DEFAULT_VERSIONS, SCHEMAS)
    assert report == {'kubernetes_versions': ['1.30.0', '1.34.0'], 'objects': 9,
                      'crd_schemas': ['securitycontextconstraints-security.openshift.io-v1.json']}


def test_the_plain_kubernetes_example_is_tcp_with_no_admin_step():
    c, objs = example(EXAMPLE_TCP)
    report = kr.check_objects(objs, c, kr.DEFAULT_VERSIONS, SCHEMAS)
    assert report['kubernetes_versions'] == ['1.30.0', '1.34.0'] and report['crd_schemas'] == []
    assert km.admin_objects(c) == []
    kinds = sorted(o['kind'] for o in objs)
    assert 'SecurityContextConstraints' not in kinds and 'NetworkAttachmentDefinition' not in kinds
    pod = next(o for o in objs if o['kind'] == 'StatefulSet')['spec']['template']['spec']
    container = pod['containers'][0]
    env = {e['name']: e.get('value') for e in container.get('env', [])}
    assert env['NCCL_IB_DISABLE'] == '1' and env['NCCL_SOCKET_IFNAME'] == env['GLOO_SOCKET_IFNAME'] == 'eth0'
    assert pod['securityContext']['runAsUser'] == 1000 and pod['securityContext']['runAsNonRoot'] is True
    assert container['resources']['limits']['nvidia.com/gpu'] == '4'
    assert 'annotations' not in pod and 'k8s.v1.cni.cncf.io/networks' not in str(objs)


CLUSTER_FILES = sorted(glob.glob(os.path.join(ROOT, 'inventories', '*', 'k8s-cluster*.yml'))
                       + glob.glob(os.path.join(ROOT, 'molecule', '*', 'k8s-cluster*.yml')))
IMAGE_MODULES = {'torch', 'deepspeed'}  # what a training image brings besides the standard library


@pytest.mark.parametrize('path', CLUSTER_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_shipped_cluster_file_ships_every_module_its_script_imports(path):
    # the ConfigMap's scripts run from /etc/gpucluster: what they import is the standard library, the
    # image's torch and deepspeed, or another key of the ConfigMap (gpucluster_progress.py)
    c = kr.load_cluster_file(path)
    files = kr.config_files(c, path)
    script = os.path.basename(c['train']['command'][0])
    assert c['train']['command'][0] == kc.CONFIG_DIR + '/' + script and script in files
    seen, todo = set(), [script]
    while todo:
        key = todo.pop()
        seen.add(key)
        for name in kr.module_imports(files[key]):
            if name in sys.stdlib_module_names or name in IMAGE_MODULES:
                continue
            assert name + '.py' in files, '%s: %s imports %s, not in the ConfigMap' % (path, key, name)
            if name + '.py' not in seen:
                todo.append(name + '.py')
    assert 'gpucluster_progress.py' in seen
    kr.check_imports(c, files, path)  # and the render-time check agrees


def test_a_script_whose_sibling_module_is_not_shipped_is_refused(tmp_path):
    (tmp_path / 'train.py').write_text('import os\nimport torch\nfrom helpers import thing\n'
                                       'try:\n    import optional_mod\nexcept ImportError:\n    pass\n')
    (tmp_path / 'helpers.py').write_text('X = 1\n')
    (tmp_path / 'optional_mod.py').write_text('Y = 1\n')
    cf = tmp_path / 'k.yml'
    cf.write_text('name: t\nnamespace: ns\nimage: i\nresources: {qos: BestEffort}\nfiles: {train.py: train.py}\n'
                  'train: {command: [/etc/gpucluster/train.py]}\n')
    c = kr.load_cluster_file(str(cf))
    with pytest.raises(kr.RenderError) as err:
        kr.check_imports(c, kr.config_files(c, str(cf)), str(cf))
    assert str(err.value) == ('%s: files.train.py imports helpers, which is not in the ConfigMap (the pods would '
                              'fail with ModuleNotFoundError): add files.helpers.py: helpers.py' % cf)


@pytest.mark.parametrize('mutate,expected', [
    (lambda o: o[5]['spec'].update(podManagmentPolicy=o[5]['spec'].pop('podManagementPolicy')),
     "StatefulSet trainer: Kubernetes 1.30.0: spec: Additional properties are not allowed ('podManagmentPolicy'"),
    (lambda o: o[5]['spec'].update(replicas='three'),
     "StatefulSet trainer: Kubernetes 1.30.0: spec.replicas: 'three' is not of type 'integer'"),
    (lambda o: next(x for x in o if x['kind'] == 'SecurityContextConstraints').update(allowHostIPC='no'),
     "SecurityContextConstraints ml-team-trainer-rdma: allowHostIPC: 'no' is not of type 'boolean'"),
    (lambda o: next(x for x in o if x['kind'] == 'SecurityContextConstraints').update(allowedCapabilitys=['IPC_LOCK']),
     "SecurityContextConstraints ml-team-trainer-rdma: (top): Additional properties are not allowed ('allowedCapabilitys'"),
])
def test_a_broken_manifest_is_refused_with_the_object_and_field(mutate, expected):
    c, objs = example()
    objs = copy.deepcopy(objs)
    mutate(objs)
    with pytest.raises(kr.RenderError) as err:
        kr.check_objects(objs, c, kr.DEFAULT_VERSIONS, SCHEMAS, where='k.yml')
    assert expected in str(err.value)


def test_a_config_map_without_a_part_of_the_pod_entrypoint_is_refused_naming_it():
    """The entrypoint imports its parts by their names: a ConfigMap rendered without one (an earlier version's,
    or edited by hand) would fail every pod with ModuleNotFoundError, so it is refused before it is applied."""
    c, objs = example()
    objs = copy.deepcopy(objs)
    config_map = next(o for o in objs if o['kind'] == 'ConfigMap')
    assert set(kc.AGENT_MODULES) <= set(config_map['data'])
    del config_map['data']['pod_driver.py']
    with pytest.raises(kr.RenderError) as err:
        kr.check_objects(objs, c, kr.DEFAULT_VERSIONS, SCHEMAS, where='k.yml')
    assert "ConfigMap trainer-config: the entrypoint's part pod_driver.py is missing" in str(err.value)


def test_nad_schema_refuses_a_config_that_is_not_json_text():
    nad = {'apiVersion': 'k8s.cni.cncf.io/v1', 'kind': 'NetworkAttachmentDefinition',
           'metadata': {'name': 'rdma-net', 'namespace': 'ml-team'}, 'spec': {'config': {'type': 'host-device'}}}
    assert "spec.config: {'type': 'host-device'} is not of type 'string'" in kr.schema_check(nad, ['1.30.0'], SCHEMAS)


def test_manifests_are_written_idempotently_and_stale_files_removed(tmp_path):
    c, objs = example()
    objs = objs[:6]  # the applied ones (the admin's three go to admin/)
    files, removed, diffs = kr.write_manifests(objs, str(tmp_path))
    assert [os.path.basename(f) for f in files][:2] == ['01-serviceaccount-trainer.yaml',
                                                        '02-networkpolicy-trainer-peers.yaml']
    assert len(diffs) == 6 and removed == []
    assert kr.write_manifests(objs, str(tmp_path))[2] == []
    (tmp_path / '99-configmap-old.yaml').write_text('kind: ConfigMap\n')
    (tmp_path / 'notes.yaml').write_text('mine\n')
    _, removed, _ = kr.write_manifests(objs, str(tmp_path))
    assert removed == [str(tmp_path / '99-configmap-old.yaml')]
    assert (tmp_path / 'notes.yaml').exists()
    back, sources = kr.read_manifests(str(tmp_path))
    assert back == objs and os.path.basename(sources[-1]) == '06-statefulset-trainer.yaml'


def test_check_mode_writes_nothing(tmp_path):
    _, objs = example()
    _, _, diffs = kr.write_manifests(objs[:6], str(tmp_path / 'm'), check=True)
    assert len(diffs) == 6 and not (tmp_path / 'm').exists()


def test_a_missing_cluster_file_and_bad_yaml_name_the_file(tmp_path):
    with pytest.raises(kr.RenderError, match='cluster file: cannot read /nonexistent.yml'):
        kr.load_cluster_file('/nonexistent.yml')
    bad = tmp_path / 'k.yml'
    bad.write_text('name: [a\n')
    with pytest.raises(kr.RenderError, match=r'k.yml: line \d+ is not valid YAML'):
        kr.load_cluster_file(str(bad))


def _checked(path):
    c, objs = example(path)
    admin = km.admin_objects(c)
    pods = kc.pods(c)
    return {'cluster': c, 'manifests': [o for o in objs if o not in admin], 'admin_manifests': admin, 'pods': pods,
            'world_size': sum(p['slots'] for p in pods),
            'validated': kr.check_objects(objs, c, kr.DEFAULT_VERSIONS, SCHEMAS)}


def test_a_dry_run_without_an_api_server_names_what_it_would_apply_and_the_administrators_step():
    lines = kr.dry_run_lines(_checked(EXAMPLE), 'Task failed: Module failed: Could not create API client: '
                             'Invalid kube-config file. No configuration found.', 'm/admin/')
    assert lines[0] == ('dry run of trainer: no API server answered (Could not create API client: Invalid '
                        'kube-config file. No configuration found.); nothing was applied')
    assert lines[1].startswith('rendered and validated 9 object(s) against Kubernetes 1.30.0, 1.34.0 and '
                               'securitycontextconstraints')
    assert lines[3:9] == ['  ServiceAccount/trainer', '  NetworkPolicy/trainer-peers', '  ConfigMap/trainer-config',
                          '  PersistentVolumeClaim/trainer-data', '  Service/trainer', '  StatefulSet/trainer']
    assert lines[9] == 'pods: trainer-0 (8), trainer-1 (8), trainer-2 (4) (world size 20)'
    assert lines[10] == ('a cluster administrator applies m/admin/ first (once): SecurityContextConstraints/'
                         'ml-team-trainer-rdma, Role/trainer-scc, RoleBinding/trainer-scc')
    tcp = kr.dry_run_lines(_checked(EXAMPLE_TCP), '', 'm/admin/')
    assert tcp[0] == 'dry run of tiny: no API server answered (no answer); nothing was applied'
    assert tcp[-1] == 'no administrator step: nothing outside the namespace is needed'
