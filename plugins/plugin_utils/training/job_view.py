# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""How a job is shown: one line per rank, a phase, the ranks of older attempts left out, each node's
containers, and the end-of-job summary. The job's state is decided in plugin_utils/training/job_state.py, which
prints its lines with these. Controller only."""

from __future__ import annotations

from ansible_collections.gpucluster.multinode.plugins.module_utils.training.supervision import phase_text


def stale_line(stale, attempt):
    """'left out, of older attempts than attempt 2: rank 3 of attempt 1 (progress file, node-4)'."""
    items = ['rank %s of attempt %s (%s%s)' % (i.get('rank'), i.get('attempt'), i.get('kind'),
                                               ', %s' % i['host'] if i.get('host') else '') for i in stale]
    return 'left out, of older attempts than attempt %s: %s' % (attempt if attempt is not None else '?', ', '.join(items))


def container_lines(results):
    """Each node's containers of the job (podman: name, image id, state, exit code), for a job run in
    containers (the results carry 'containers'); a node that has none says so."""
    lines = []
    for r in results:
        if 'containers' not in r:
            continue
        boxes = r.get('containers') or []
        if not boxes:
            lines.append('  %-20s containers: none' % r.get('node'))
        for box in boxes:
            code = box.get('exit_code')
            lines.append('  %-20s container %s image %s %s exit=%s' % (
                r.get('node'), box.get('name') or box.get('id'), box.get('image_id') or box.get('image') or '?',
                box.get('state') or '?', '-' if code is None else code))
    return lines


def _fmt(value, pattern, missing='-'):
    return missing if value is None else pattern % value


def rank_line(r):
    """One line per rank, the figures a person watching the job looks at first."""
    if r.get('alive'):
        life = 'alive' if not r.get('held') else 'HELD (%s)' % r['held']
    else:
        life = r.get('exit', 'exited')
    parts = ['%s rank %d: %s' % (r['node'], r['rank'], life),
             'step %s' % _fmt(r.get('last_step'), '%d'),
             'loss %s' % _fmt(r.get('last_loss'), '%.4f'),
             '%s steps/s' % _fmt(r.get('steps_per_s'), '%.2f'),
             'last step %s s ago' % _fmt(r.get('seconds_since_step'), '%.0f')]
    if r.get('phase'):
        parts.append(phase_text(r))
    if r.get('tracked') == 'log':
        parts.append('steps from its log')
    elif str(r.get('tracked') or '').startswith('log of '):
        parts.append('steps from the %s' % r['tracked'])
    elif not r.get('tracked'):
        parts.append('no steps tracked')
    if r.get('compute_s') is not None:
        parts.append('compute %.3f s/step, wait %.3f' % (r['compute_s'], r['wait_s']))
    if r.get('alive'):
        parts.append('cpu %s%%' % _fmt(r.get('cpu_pct'), '%.0f'))
        rss = _fmt(r.get('rss_kib'), '%d', '?') if r.get('rss_kib') is None else r['rss_kib'] // 1024
        peak = '?' if r.get('peak_rss_kib') is None else r['peak_rss_kib'] // 1024
        parts.append('rss %s MiB (peak %s)' % (rss, peak))
    gpu = r.get('gpu')
    if gpu:
        parts.append('gpu %s: %s%% util, %s/%s MiB' % (gpu.get('index'), _fmt(gpu.get('utilization_pct'), '%d'),
                                                       _fmt(gpu.get('memory_used_mib'), '%d'),
                                                       _fmt(gpu.get('memory_total_mib'), '%d')))
    elif r.get('gpu_note'):
        parts.append(r['gpu_note'])
    return ', '.join(parts)


def summary(rows, job_id, state, slowest, finished_s):
    """The end-of-job record: steps, mean steps/s, slowest node, peak memory per rank."""
    ranks = []
    for r in sorted(rows, key=lambda r: r['rank']):
        ranks.append({'rank': r['rank'], 'node': r['node'], 'last_step': r.get('last_step'),
                      'mean_steps_per_s': r.get('mean_steps_per_s'), 'last_loss': r.get('last_loss'),
                      'peak_rss_kib': r.get('peak_rss_kib') or r.get('final_peak_rss_kib'),
                      'compute_s': r.get('compute_s')})
    rates = [r['mean_steps_per_s'] for r in ranks if isinstance(r['mean_steps_per_s'], (int, float))]
    steps = [r['last_step'] for r in ranks if isinstance(r['last_step'], int)]
    return {'job_id': job_id, 'state': state, 'written': finished_s, 'steps': max(steps) if steps else None,
            'mean_steps_per_s': round(sum(rates) / len(rates), 3) if rates else None,
            'slowest_node': slowest, 'ranks': ranks}
