# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Filters of the health playbook: the records of a tier from what the nodes returned."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import health_checks
from ansible_collections.gpucluster.multinode.plugins.module_utils import health_reports
from ansible_collections.gpucluster.multinode.plugins.plugin_utils import inventory_contract as contract


def _plain(value):
    """Registered results come back as Ansible's lazy containers; make them plain."""
    if isinstance(value, dict) or hasattr(value, 'items'):
        return dict((k, _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _unreachable(result):
    """Why a node gave no answer: unreachable over SSH, or its task ran past its timeout."""
    if not result:
        return None
    if result.get('unreachable'):
        return ' '.join(str(result.get('msg') or 'no answer').split())
    timedout = result.get('timedout')
    if timedout:   # the task ran past its `timeout:` (a frozen node, a hung call)
        period = timedout.get('period') if hasattr(timedout, 'get') else None
        return 'timeout: the node did not finish its probe within %s s (health_probe_timeout): frozen or hung' % (
            period if period is not None else 'its timeout')
    msg = ' '.join(str(result.get('msg') or '').split())
    if result.get('failed') and 'timed out after' in msg.lower():
        return 'timeout: %s' % msg
    return None


def health_nodes(groups, hostvars, probes, prepare=None, hosts=None):
    """The nodes as evaluate_quick wants them.

    probes: {host: the health_probe result registered on that host}; prepare: the head's result
    of the probe that holds the rendezvous port; hosts: the hosts of the run (default all)."""
    if not hasattr(probes, 'items'):
        raise AnsibleFilterError('health_nodes: probes must be {host: health_probe result}, got %s'
                                 % type(probes).__name__)
    order = contract.cluster_nodes(groups)  # a spare is checked too: a restart may take it
    if hosts is not None:
        order = [h for h in order if h in hosts]
    head = (groups.get('head') or [None])[0]
    prep_result = _plain(prepare or {})
    nodes = []
    for h in order:
        hv = hostvars[h]
        prep = prep_result if h == head else {}
        probe = _plain(probes.get(h) or {})
        gpu = probe.get('gpu') or {}   # the probe reads the GPUs itself (option gpus)
        why = _unreachable(prep) or _unreachable(probe)
        usable_probe = probe if 'interfaces' in probe and not why else None
        # the probe that failed: this node's, or the head's first one (then its probe was skipped)
        failed = probe if probe and not probe.get('skipped') else (prep if prep.get('failed') else {})
        node = {
            'name': h,
            'address': contract.cluster_address(hostvars, h),
            'unreachable': why,
            'probe': usable_probe,
            # a probe that answered without 'gpu' ran with health_gpu_checks off
            'gpu': gpu if 'gpu_count' in gpu else ({'disabled': True} if usable_probe else None),
            # GPUs this node has (node_slots, the ranks launchers start, is not a GPU count)
            'gpu_slots': hv.get('gpu_slots'),
            'versions': dict(usable_probe.get('versions') or {}) if usable_probe else {},
            'xid': (usable_probe or {}).get('xid') or [],
            'probe_error': (' '.join(str(failed.get('msg') or 'the probe failed').split())
                            if failed and not usable_probe and not why else None),
            'listen': prep.get('listen') if prep and not prep.get('skipped') else None,
        }
        if node['gpu']:
            node['versions']['driver'] = node['gpu'].get('driver_version')
            node['versions']['cuda'] = node['gpu'].get('cuda_version')
        nodes.append(node)
    return nodes


def health_quick_records(groups, hostvars, probes, prepare=None, hosts=None, token='', thresholds=None):
    """Records of the quick tier (see module_utils/health_checks.py); probes and prepare as in health_nodes."""
    nodes = health_nodes(groups, hostvars, probes, prepare, hosts)
    manifest = contract.cluster_manifest(groups, hostvars)
    try:
        return health_checks.evaluate_quick(nodes, manifest['head'], manifest['master_port'], token,
                                            _plain(thresholds or {}))
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError('health_quick_records: %s' % exc)


def health_container_image_records(images, head, image):
    """Records of the container.image check: {node: image id ('' missing, None unread)} against the head's."""
    try:
        return health_checks.check_container_image(dict(_plain(images)), head, str(image))
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError('health_container_image_records: %s' % exc)


def health_deep_records(nodes, bandwidth=None, smoke=None, collective=None, errors=None, tests=None,
                        thresholds=None):
    """Records of the deep tier from the cluster_tests results (see module_utils/health_checks.py)."""
    return health_checks.evaluate_deep(list(nodes), _plain(bandwidth), _plain(smoke), _plain(collective),
                                       _plain(errors or {}), _plain(tests))


def health_summary(records, changes=None):
    """The human summary table (a list of lines)."""
    return health_reports.summary_lines(_plain(records), changes)


def health_failed(records):
    """Records whose status is fail."""
    return [r for r in records if r.get('status') == 'fail']


def health_failing(records, with_warn=False, width=120):
    """{node: 'check, check'} of the nodes with a failed check (warnings too with with_warn), for
    a Slurm drain reason; the list is cut to width characters."""
    bad = ('fail', 'warn') if with_warn else ('fail',)
    out = {}
    for r in _plain(records):
        if r.get('status') in bad and r.get('node'):
            checks = out.setdefault(r['node'], [])
            if r.get('check') not in checks:
                checks.append(r.get('check'))
    cut = {}
    for node, checks in out.items():
        text = ', '.join(str(c) for c in checks)
        cut[node] = text if len(text) <= width else text[:width - 3].rstrip(', ') + '...'
    return cut


def health_slurm_lines(result, check_mode=False):
    """The summary's line about Slurm from a slurm_drain result ([] when it did not run)."""
    result = _plain(result or {})
    if 'drained' not in result:
        return []
    head = 'slurm (check mode, nothing changed)' if check_mode else 'slurm'
    if result.get('held'):
        return ['%s: %s' % (head, result['held'])]
    parts = ['drained %s' % (', '.join(sorted(result.get('drained') or {})) or 'none'),
             'resumed %s' % (', '.join(result.get('resumed') or []) or 'none')]
    if result.get('kept'):
        parts.append('still drained %s' % ', '.join(result['kept']))
    if result.get('foreign'):
        parts.append('drained by someone else, left alone: %s' % ', '.join(result['foreign']))
    if result.get('not_in_slurm'):
        parts.append('not in Slurm: %s' % ', '.join(result['not_in_slurm']))
    return ['%s: %s' % (head, '; '.join(parts))]


def health_setting_errors(settings):
    """Problems with the health settings, one line each naming the variable."""
    return health_checks.setting_errors(_plain(settings or {}))


def health_page_dir_error(path):
    """Why health_report_page_dir cannot take the page on the controller ('' when it can)."""
    return health_checks.page_dir_error(str(path))


class FilterModule:
    def filters(self):
        return {
            'health_nodes': health_nodes,
            'health_quick_records': health_quick_records,
            'health_container_image_records': health_container_image_records,
            'health_deep_records': health_deep_records,
            'health_summary': health_summary,
            'health_failed': health_failed,
            'health_failing': health_failing,
            'health_slurm_lines': health_slurm_lines,
            'health_setting_errors': health_setting_errors,
            'health_page_dir_error': health_page_dir_error,
        }
