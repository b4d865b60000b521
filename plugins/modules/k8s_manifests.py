#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: k8s_manifests
short_description: Check a Kubernetes/OpenShift cluster file, render its training StatefulSet and validate the objects
version_added: 0.1.0
description:
  - Reads one cluster file (see the k8s role's README), checks every field (type, range, consistency) and
    refuses a bad one with one line naming the file and the field.
  - Renders the objects of the training cluster in apply order. ServiceAccount. For OpenShift a Role and
    RoleBinding granting the SCC, and in rdma mode a SecurityContextConstraints object. In rdma mode with
    the cluster file's C(network.attachment_config) a NetworkAttachmentDefinition. A NetworkPolicy (peers only). A ConfigMap
    (hostfile of the pod DNS names and slots, job.json, the pod entrypoint, the DeepSpeed config, extra
    files). A ReadWriteMany PersistentVolumeClaim. The headless Service. The StatefulSet. The NCCL/gloo
    variables come from the same function as the nccl_env role's.
  - Every object is validated against the strict OpenAPI schemas of two Kubernetes versions
    (kubernetes-validate) or, for NetworkAttachmentDefinition and SecurityContextConstraints, against
    the JSON schemas shipped in the collection; then the semantic checks run (selector against template
    labels, serviceName, hostfile against replicas and slots, /dev/shm, RDMA and TCP settings, OpenShift
    restricted-v2 rules). Any problem fails the task and nothing is written.
  - Runs on the controller (action plugin); nothing is sent to a node or to an API server.
author: gpucluster.multinode contributors (!UNKNOWN)
options:
  cluster_file:
    description: The cluster file (YAML). Relative paths in its C(files) are read next to it.
    type: path
    required: true
  state:
    description:
      - C(checked) checks and renders in memory and returns the objects; writes nothing.
      - C(rendered) also writes one file per object to O(dest) (C(NN-kind-name.yaml), apply order) and
        removes the files of objects it no longer renders (only files of that name pattern).
      - C(validated) reads the manifests in O(dest) as they are (edited by hand, for instance) and runs the
        same schema and semantic checks against the cluster file.
    type: str
    choices: [checked, rendered, validated]
    default: rendered
  dest:
    description: The manifest directory (required with C(rendered) and C(validated)). Files are mode 0640.
    type: path
  kubernetes_versions:
    description: Kubernetes versions whose strict schemas every object must pass (1.25 to 1.37).
    type: list
    elements: str
    default: ['1.30.0', '1.34.0']
  entrypoint:
    description: The pod entrypoint put in the ConfigMap; default the k8s role's C(files/k8s_pod.py).
    type: path
  schema_dir:
    description: Directory of the JSON schemas of the kinds Kubernetes does not define; default the k8s role's C(files/schemas).
    type: path
attributes:
  check_mode:
    support: full
    details: In check mode nothing is written; the result says what would change.
    description: Can run in check mode and return changed status prediction without writing.
  diff_mode:
    support: full
    description: Returns the manifest files that would change as a diff.
  action:
    support: full
    description: Runs on the controller as an action plugin.
  platform:
    platforms: posix
    support: full
    description: The controller it runs on.
requirements:
  - kubernetes-validate (pinned in requirements/controller.txt) on the controller
'''

EXAMPLES = r'''
- name: Render the manifests of a cluster file
  gpucluster.multinode.k8s_manifests:
    cluster_file: inventories/example-k8s/k8s-cluster.yml
    dest: inventories/example-k8s/manifests

- name: Check manifests edited by hand against the cluster file
  gpucluster.multinode.k8s_manifests:
    cluster_file: inventories/example-k8s/k8s-cluster.yml
    dest: inventories/example-k8s/manifests
    state: validated
'''

RETURN = r'''
cluster:
  description: The cluster settings with every default filled in.
  returned: success
  type: dict
pods:
  description: The pods of the StatefulSet in ordinal order.
  returned: success
  type: list
  elements: dict
  sample: [{name: trainer-0, ordinal: 0, address: trainer-0.trainer.ml-team.svc.cluster.local, slots: 2}]
world_size:
  description: Ranks of a job (the sum of the slots of the pods it starts on, the spares left out).
  returned: success
  type: int
  sample: 4
objects:
  description: Kind, name and namespace of every object, in apply order.
  returned: success
  type: list
  elements: dict
manifests:
  description: The objects themselves, in apply order (what C(present) applies).
  returned: success
  type: list
  elements: dict
admin_manifests:
  description:
    - What a cluster administrator applies once and C(present) never does (OpenShift with RDMA the SCC
      C(<namespace>-<name>-rdma) and the Role and RoleBinding granting its use); empty otherwise.
    - C(rendered) writes them to O(dest)/admin/.
  returned: success
  type: list
  elements: dict
scc:
  description: The SCC the pods use on OpenShift (C(restricted-v2) or the RDMA one); empty on Kubernetes.
  returned: success
  type: str
hostfile:
  description: The DeepSpeed hostfile of the ConfigMap.
  returned: success
  type: str
  sample: "trainer-0.trainer.ml-team.svc.cluster.local slots=2\n"
per_pod_claims:
  description: The claims the StatefulSet makes from its volumeClaimTemplates (per-pod storage).
  returned: success
  type: list
  elements: str
validated:
  description: The Kubernetes versions checked, the number of objects and the shipped schemas used.
  returned: success
  type: dict
files:
  description: The manifest files (written or already up to date).
  returned: state is rendered
  type: list
  elements: str
admin_files:
  description: The files of O(dest)/admin/ (see RV(admin_manifests)).
  returned: state is rendered
  type: list
  elements: str
removed:
  description: Manifest files of objects no longer rendered, removed.
  returned: state is rendered
  type: list
  elements: str
'''
