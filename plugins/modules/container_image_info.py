#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r'''
---
module: container_image_info
short_description: The id and digest of a training image on this node, and of the OCI archive it is loaded from
version_added: 0.1.0
description:
  - Reads C(podman image inspect) of O(image) in the storage of the account the module runs as
    (for rootless podman, run it with C(become_user) of the training account) and, when O(archive) is
    given, the image id that OCI archive holds (read from its index and manifest, without loading it).
  - Changes nothing. An image that is not there is reported as C(present=false), not as a failure.
author: gpucluster.multinode contributors (!UNKNOWN)
options:
  image:
    description: Image reference.
    type: str
    required: true
  archive:
    description: OCI archive (C(podman save --format oci-archive)) whose image id is read.
    type: path
extends_documentation_fragment: [gpucluster.multinode.attributes.read_only]
'''

EXAMPLES = r'''
- name: Read the image on every node
  gpucluster.multinode.container_image_info:
    image: localhost/gpucluster-train:torch2.13.0-ds0.19.8
    archive: /shared/images/gpucluster-train.oci.tar
  become: true
  become_user: train
  register: image
'''

RETURN = r'''
present:
  description: Whether the image is in this account's storage.
  returned: always
  type: bool
id:
  description: Image id (config digest), the same on every node that loaded the same image.
  returned: always
  type: str
  sample: sha256:9dfd6d3a179af5b2df2578547dc36bede86f77b848d7d56450d80a94db1868f3
digest:
  description: Manifest digest podman records for the image.
  returned: always
  type: str
repo_digests:
  description: name@digest references of the image.
  returned: always
  type: list
  elements: str
labels:
  description: The image's labels.
  returned: always
  type: dict
archive_id:
  description: Image id the archive holds (null without O(archive) or when the file does not exist).
  returned: always
  type: str
archive_name:
  description: Reference name recorded in the archive.
  returned: always
  type: str
'''

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpucluster.multinode.plugins.module_utils import containers as cn


def main():
    module = AnsibleModule(argument_spec=dict(image=dict(type='str', required=True), archive=dict(type='path')),
                           supports_check_mode=True)
    image, archive = module.params['image'], module.params['archive']
    podman = module.get_bin_path('podman')
    result = dict(changed=False, present=False, id='', digest='', repo_digests=[], labels={}, archive_id=None,
                  archive_name=None)
    if podman:
        rc, out, err = module.run_command([podman] + cn.inspect_argv(image)[1:])
        if rc == 0:
            try:
                info = cn.parse_inspect(out)
                labels = (json.loads(out)[0].get('Labels') or {}) if info else {}
            except (cn.ContainerError, ValueError) as exc:
                module.fail_json(msg='image %s: %s' % (image, exc))
            if info:
                result.update(present=True, id=info['id'], digest=info['digest'], repo_digests=info['repo_digests'],
                              labels=labels)
        elif 'image not known' not in err and 'no such' not in err.lower():
            module.fail_json(msg='podman cannot inspect image %s: %s' % (image, err.strip()[-300:]))
    if archive and os.path.exists(archive):
        try:
            found = cn.archive_image_id(archive)
        except cn.ContainerError as exc:
            module.fail_json(msg=str(exc))
        result.update(archive_id=found['id'], archive_name=found['name'])
    module.exit_json(**result)


if __name__ == '__main__':
    main()
