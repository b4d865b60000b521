"""Example Ray job: one task on every alive node of the cluster, each returns its host name.

    ray job submit --address http://<head>:8265 -- python ray_hostnames.py
"""

import socket

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
def where():
    return socket.gethostname(), ray.get_runtime_context().get_node_id()


def main():
    ray.init()
    nodes = [n for n in ray.nodes() if n['Alive']]
    tasks = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n['NodeID'], soft=False)).remote()
             for n in sorted(nodes, key=lambda n: n['NodeManagerAddress'])]
    for (host, node_id), node in zip(ray.get(tasks, timeout=120), sorted(nodes, key=lambda n: n['NodeManagerAddress'])):
        print('task on %s (%s): host %s' % (node['NodeManagerAddress'], node_id[:12], host), flush=True)
    print('ray_hostnames: %d task(s) on %d node(s)' % (len(tasks), len(nodes)), flush=True)


if __name__ == '__main__':
    main()
