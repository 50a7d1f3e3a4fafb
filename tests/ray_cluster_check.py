"""Run by tests/test_ray.py inside a fresh network namespace (loopback only): a local Ray cluster
of four fake 8-GPU nodes labelled as ``gpuplace.integrations.ray.label_nodes`` says, gpuplace placement
groups on it, and where Ray put each bundle. Prints one JSON object on its last line."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np


def main() -> None:
    import gpuplace
    import gpuplace.integrations.ray as gray
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group_table, remove_placement_group

    topology = gpuplace.Topology.preset("h100-superpod", nodes=4)
    labels = gray.label_nodes(topology)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "num_gpus": 0,
            "include_dashboard": False,
            "node_ip_address": "127.0.0.1",
        },
    )
    node_of: dict[str, str] = {}
    for host in topology.hosts:
        # `ray start --labels 'k=v,...'` as label_nodes gives it, parsed the way ray start does.
        arg = labels[host].split(" ", 1)[1].strip("'")
        node_labels = dict(pair.split("=", 1) for pair in arg.split(","))
        node = cluster.add_node(
            num_cpus=16, num_gpus=8, labels=node_labels, node_ip_address="127.0.0.1"
        )
        node_of[node.node_id] = host
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)

    # Half of dgx002 and all of dgx003 are taken: the placement must work around them.
    state = gpuplace.ClusterState(topology)
    state.allocate(name="other-a", gpus=topology.host_gpus("dgx002")[:4])
    state.allocate(name="other-b", gpus=topology.host_gpus("dgx003"))
    job = gpuplace.Job(name="train", tp=4, dp=3)
    placement = gpuplace.place(state, job, "greedy")
    # The same GPUs with the ranks reversed: Ray must follow gpuplace's order, not its own.
    reversed_ = dataclasses.replace(placement, gpus=np.asarray(placement.gpus[::-1]))
    results = {}
    for case, p in (("placed", placement), ("reversed", reversed_)):
        pg = gray.placement_group(state, p, cpus_per_rank=1)
        ray.get(pg.ready(), timeout=120)
        # The placement group is recorded in the state like any other placement.
        recorded = state.job_gpus("train")
        assert recorded is not None and list(recorded) == [int(g) for g in p.gpus]
        table = placement_group_table(pg)
        bundle_nodes = table["bundles_to_node_id"]
        results[case] = {
            "expected": [topology.host_of(int(g)) for g in p.gpus],
            "actual": [node_of[bundle_nodes[i]] for i in range(len(p.gpus))],
            "selectors": [s["gpuplace/host"] for s in table["bundles_label_selector"]]
            if "bundles_label_selector" in table
            else None,
        }
        remove_placement_group(pg)
        state.release("train")
    results["scaling_config"] = gray.scaling_config_kwargs(state, placement)["label_selector"]
    results["scaling_expected"] = [topology.host_of(int(g)) for g in placement.gpus]
    ray.shutdown()
    cluster.shutdown()
    print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
