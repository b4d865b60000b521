#!/usr/bin/env python3
# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""The pod entrypoint of a gpucluster.multinode training StatefulSet (mounted from its ConfigMap).

Every pod runs ``k8s_pod.py agent``: a small agent on the agent port (the readiness probe's port)
that answers its peers and starts, reports and stops this pod's part of a job. A job is
``deepspeed --no_ssh --node_rank <ordinal>`` with the hostfile of the ConfigMap: each pod starts its
own ranks, no SSH, no root, any uid (OpenShift's restricted-v2 runs it as a random one).

In pod 0, ``k8s_pod.py launch --job-id ID`` waits (bounded by --peer-wait) until every pod of the job
answers as itself: at the name the headless Service publishes, or, before that name exists (a Service
publishes a pod seconds after it starts, and a resolver caches the answer that it did not exist), at
the address the pod registered on the shared volume; a pod that never does is named in one line and
nothing is started anywhere. A pod takes a start or a stop only from pod 0, which it knows by its
published address or, before that, by asking the caller's own agent who it is. Then it starts every
pod's part (pod 0's own last is not special: all are started through the agents) and, unless
--detach, follows the job: the first pod whose launcher exits non-zero is named and the job is
stopped on the others. ``status`` and ``stop`` do the same through the agents.

Its parts, mounted beside it from the same ConfigMap (Python puts a program's own directory first on its path):
    pod_agent.py     the agent (start, status, stop of this pod's part; pod 0's supervision and fences)
    pod_driver.py    pod 0's driver of the supervision loop (supervision.Loop; supervision.py is mounted too)
    pod_cluster.py   pod 0's acts on every pod: wait for them, read, start, stop, launch
    pod_job.py       the job as a pod sees it: job.json, its layout, the state directory's records and events
    pod_checks.py    what a pod can do (RDMA, the volume), how a part ended, the culprit
    pod_net.py       the requests between agents, names resolved once, the registry of addresses

Only the standard library; Python 3.8 or later.
"""

import argparse
import json
import sys

# the agent's parts and the supervision core, mounted beside this program from the ConfigMap
import pod_net as net
from pod_agent import Agent
from pod_cluster import all_status, launch, stop_job, summary
from pod_job import JOB_ID_RE, layout_of, load_job, ordinal_of, pod_name, read_job_record, run_part, state_root


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='mode', required=True)
    sub.add_parser('agent', help="the pod's main process")
    sub.add_parser('run', help="a JobSet pod's main process: its own part, then its exit code")
    for mode in ('launch', 'status', 'stop'):
        p = sub.add_parser(mode)
        p.add_argument('--job-id', required=True)
        if mode == 'launch':
            p.add_argument('--peer-wait', type=int, default=None, help='seconds to wait for the pods (job.json)')
            p.add_argument('--detach', action='store_true', help='return once every pod started its part')
            p.add_argument('--timeout', type=int, default=0, help='stop the job after this many seconds (0: none)')
        if mode == 'status':
            p.add_argument('--lines', type=int, default=20)
    args = parser.parse_args(argv)
    job = load_job()
    net.REGISTRY_ROOT = state_root(job)
    if args.mode == 'agent':
        Agent(job, pod_name()).serve()
        return 0
    if args.mode == 'run':
        return run_part(job)
    if not JOB_ID_RE.match(args.job_id):
        print('k8s_pod: job id %r must be 1-64 letters, digits, ".", "_" or "-"' % args.job_id, file=sys.stderr)
        return 2
    if args.mode == 'launch':
        if ordinal_of(job, pod_name()) != 0:
            print('k8s_pod: launch runs in pod %s (pod 0), not in %s' % (job['pods'][0]['name'], pod_name()),
                  file=sys.stderr)
            return 2
        peer_wait = job['peer_wait'] if args.peer_wait is None else args.peer_wait
        return launch(job, args.job_id, peer_wait, args.detach, args.timeout)
    if args.mode == 'status':
        record = read_job_record(state_root(job), args.job_id)
        states = all_status(job, args.job_id, args.lines, pods=layout_of(job, record))
        print(json.dumps(summary(job, args.job_id, states, record), sort_keys=True))
        return 0
    print(json.dumps({'job_id': args.job_id, 'pods': stop_job(job, args.job_id)}, sort_keys=True))
    return 0


if __name__ == '__main__':
    sys.exit(main())
