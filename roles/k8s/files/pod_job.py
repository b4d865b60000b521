# Copyright: gpucluster.multinode contributors
# Apache License 2.0
"""A job as every pod sees it: the ConfigMap's job.json (load_job), this pod's name, address and node (the
downward API), the job's layout and launcher line, its state directory on the volume with pod 0's record of the
job (job.json there) and its events (events.jsonl, in the supervision core's vocabulary), and a JobSet pod's
whole life (run_part). Standard library only; mounted beside the pod entrypoint (k8s_pod.py)."""

import json
import os
import re
import socket
import sys
import time

import pod_net as net
import supervision


CONFIG_DIR = os.environ.get('GPUCLUSTER_CONFIG_DIR', '/etc/gpucluster')


JOB_ID_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$')


STATE_ROOT = os.environ.get('GPUCLUSTER_JOB_DIR', '/tmp/gpucluster-jobs')


JOB_ENV = 'GPUCLUSTER_JOB_ID'


def load_job(config_dir=CONFIG_DIR):
    with open(os.path.join(config_dir, 'job.json')) as handle:
        return json.load(handle)


def pod_name():
    return os.environ.get('GPUCLUSTER_POD_NAME') or socket.gethostname().split('.')[0]


def pod_ip():
    """This pod's address (the downward API's status.podIP), '' where it is not set."""
    return os.environ.get('GPUCLUSTER_POD_IP', '')


def node_name():
    """The node this pod runs on (the downward API's spec.nodeName), '' where it is not set."""
    return os.environ.get('GPUCLUSTER_NODE_NAME', '')


def working_pods(job):
    """The pods a job starts on: all but the last train.spares (they wait to take a lost pod's place)."""
    pods = list(job['pods'])
    return pods[:len(pods) - int(job.get('spares') or 0)]


def layout_of(job, record):
    """The pods of the job's current attempt ({name, address, slots}, rank order): the record's, else the
    working pods."""
    by_name = {p['name']: p for p in job['pods']}
    out = []
    for entry in (record or {}).get('layout') or []:
        pod = by_name.get(entry.get('name'))
        if pod:
            out.append(dict(pod, slots=int(entry.get('slots', pod['slots']))))
    return out or working_pods(job)


def launcher_line(job, node_rank, attempt=0, hostfile=None, master=None):
    """deepspeed --no_ssh for one pod's part: its node rank in the hostfile (default: the ConfigMap's), the
    ranks' master (default: pod 0's name), train.resume_args added from the second attempt on."""
    extra = list(job.get('resume_args') or []) if attempt else []
    return [job['deepspeed'], '--no_ssh', '--hostfile', hostfile or os.path.join(job['config_dir'], 'hostfile'),
            '--node_rank', str(node_rank), '--master_addr', master or job['pods'][0]['address'],
            '--master_port', str(job['master_port'])] + list(job['command']) + extra


def hostfile_lines(layout):
    return ''.join('%s slots=%d\n' % (p['address'], p['slots']) for p in layout)


def ordinal_of(job, name):
    for index, pod in enumerate(job['pods']):
        if pod['name'] == name:
            return index
    raise SystemExit('k8s_pod: this pod %r is not in the hostfile of %s (pods: %s)'
                     % (name, job['name'], ', '.join(p['name'] for p in job['pods'])))


def state_root(job):
    return os.environ.get('GPUCLUSTER_JOB_DIR') or job.get('state_dir') or STATE_ROOT


def read_job_record(root, job_id):
    try:
        with open(os.path.join(root, job_id, 'job.json')) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_job_record(root, job_id, record):
    path = os.path.join(root, job_id)
    os.makedirs(path, mode=0o2770, exist_ok=True)
    net.replace_file(os.path.join(path, 'job.json'), json.dumps(record, sort_keys=True))


def job_event(root, job_id, kind, **fields):
    """One event in <state dir>/<job id>/events.jsonl, in the supervision core's vocabulary (nodes are
    the pods)."""
    path = os.path.join(root, job_id)
    os.makedirs(path, mode=0o2770, exist_ok=True)
    return supervision.append_event(path, kind, **fields)


def read_job_events(root, job_id):
    return supervision.read_events(os.path.join(root, job_id, supervision.EVENTS)) or []


def tail(path, lines):
    try:
        with open(path, 'rb') as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            text = handle.read().decode('utf-8', 'replace')
    except OSError:
        return []
    return text.splitlines()[-lines:]


def run_part(job, environ=None, clock=time.time, sleep=time.sleep, execute=os.execvpe):
    """A JobSet pod's whole life (k8s_pod.py run): its rank is its completion index; rank 0 is the master at its
    own address, the others wait (bounded by train.peer_wait) for pod 0's name to resolve, then the launcher
    replaces this process: its exit code is the pod's, which the Job's podFailurePolicy and the JobSet's
    failurePolicy read. Returns an exit code only when it cannot start (3: pod 0 never resolved, 2: no rank)."""
    environ = os.environ if environ is None else environ
    try:
        rank = int(environ.get('GPUCLUSTER_NODE_RANK', ''))
        attempt = int(environ.get('GPUCLUSTER_JOB_ATTEMPT') or 0)
    except ValueError:
        print('k8s_pod: run needs GPUCLUSTER_NODE_RANK (the Job completion index) and GPUCLUSTER_JOB_ATTEMPT, '
              'got %r and %r' % (environ.get('GPUCLUSTER_NODE_RANK'), environ.get('GPUCLUSTER_JOB_ATTEMPT')),
              file=sys.stderr, flush=True)
        return 2
    master = environ.get('GPUCLUSTER_POD_IP', '') if rank == 0 else ''
    name, bound = job['pods'][0]['address'], int(job.get('peer_wait', 300))
    deadline = clock() + bound
    while not master:
        found = net.resolve(name)
        if found:
            master = found[0]
        elif clock() >= deadline:
            print('k8s_pod: rank %d not started: %s (pod 0) does not resolve after %d s (train.peer_wait)'
                  % (rank, name, bound), file=sys.stderr, flush=True)
            return 3
        else:
            sleep(1.0)
    env = dict(environ, **{JOB_ENV: job['name'], 'GPUCLUSTER_JOB_ATTEMPT': str(attempt),
                           'GPUCLUSTER_ATTEMPT': str(attempt + 1)})
    line = launcher_line(job, rank, attempt, master=master)
    print('k8s_pod: rank %d of %s, attempt %d: %s' % (rank, job['name'], attempt + 1, ' '.join(line)), flush=True)
    if os.path.isdir(job['workdir']):
        os.chdir(job['workdir'])
    return execute(line[0], line, env)
