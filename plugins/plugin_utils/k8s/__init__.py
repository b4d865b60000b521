# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Kubernetes/OpenShift on the controller: the cluster file (cluster), the objects rendered from it and
their checks (manifests), the schema checks and the manifest directory (render), and what the API
server says about the pods (pods). The k8s_manifests action and the k8s filters use them; nothing here
is shipped to a node."""
