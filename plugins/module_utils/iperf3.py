# -*- coding: utf-8 -*-
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""Parse the JSON that ``iperf3 -c HOST -J`` prints on the client (TCP, one or -P N streams).

iperf3 exits 0 with ``-J`` even when the test failed (refused connection, busy server):
the ``error`` key is the only sign, and a result with it has ``ok: False``. Output that
is not iperf3 JSON at all raises ValueError naming what was missing.
"""

from __future__ import annotations

import json


def _gbps(bits_per_second):
    return None if bits_per_second is None else float(bits_per_second) / 1e9


def parse_iperf3(output):
    """A plain dict from iperf3 -J client output (a JSON string or an already decoded dict).

    Keys: ok, error, version, protocol, streams, reverse, duration_s, local_host,
    remote_host, remote_port, sent_bps, received_bps, sent_gbps, received_gbps, gbps
    (the rate that arrived: received_gbps), bytes_sent, bytes_received, retransmits.
    """
    if isinstance(output, (bytes, bytearray)):
        output = output.decode('utf-8', errors='replace')
    if isinstance(output, str):
        text = output.strip()
        if not text:
            raise ValueError('iperf3 output is empty; was iperf3 run with -J?')
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError('iperf3 output is not JSON (%s); run iperf3 with -J. It starts with: %r'
                             % (exc, text[:80])) from exc
    elif isinstance(output, dict):
        data = output
    else:
        raise ValueError('iperf3 output must be the JSON text or a dict, got %s' % type(output).__name__)
    if not isinstance(data, dict) or 'start' not in data or 'end' not in data:
        raise ValueError("iperf3 JSON has no 'start' or 'end' section; is it the output of iperf3 -J?")

    start = data.get('start') or {}
    connected = start.get('connected') or []
    test = start.get('test_start') or {}
    result = {
        'ok': True,
        'error': None,
        'version': start.get('version'),
        'protocol': test.get('protocol'),
        'streams': test.get('num_streams', len(connected) or None),
        'reverse': bool(test.get('reverse', 0)),
        'duration_s': test.get('duration'),
        'local_host': connected[0].get('local_host') if connected else None,
        'remote_host': connected[0].get('remote_host') if connected else (start.get('connecting_to') or {}).get('host'),
        'remote_port': connected[0].get('remote_port') if connected else (start.get('connecting_to') or {}).get('port'),
        'sent_bps': None,
        'received_bps': None,
        'sent_gbps': None,
        'received_gbps': None,
        'gbps': None,
        'bytes_sent': None,
        'bytes_received': None,
        'retransmits': None,
    }
    if data.get('error'):
        result['ok'] = False
        result['error'] = str(data['error'])
        return result

    end = data.get('end') or {}
    if 'sum' in end and 'sum_sent' not in end:
        raise ValueError("iperf3 JSON has end.sum but no end.sum_sent: a UDP test; only TCP results are read")
    missing = [k for k in ('sum_sent', 'sum_received') if not isinstance(end.get(k), dict)]
    if missing:
        raise ValueError('iperf3 JSON has no end.%s; the test did not finish' % ' or end.'.join(missing))
    sent, received = end['sum_sent'], end['sum_received']
    for key, section in (('sum_sent', sent), ('sum_received', received)):
        if 'bits_per_second' not in section:
            raise ValueError('iperf3 JSON end.%s has no bits_per_second' % key)
    result.update(
        sent_bps=float(sent['bits_per_second']),
        received_bps=float(received['bits_per_second']),
        sent_gbps=_gbps(sent['bits_per_second']),
        received_gbps=_gbps(received['bits_per_second']),
        gbps=_gbps(received['bits_per_second']),
        bytes_sent=sent.get('bytes'),
        bytes_received=received.get('bytes'),
        retransmits=sent.get('retransmits'),
    )
    if result['streams'] is None:
        result['streams'] = len(end.get('streams') or []) or None
    return result
