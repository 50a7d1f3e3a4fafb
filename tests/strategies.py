"""Hypothesis strategies shared by the test modules: random small topologies, jobs and
fragmented cluster states. (A module of its own, not conftest, so that ``from strategies
import ...`` cannot pick up another directory's conftest.)"""

from __future__ import annotations

from typing import Any

import gpuplace
import numpy as np
from hypothesis import strategies as st

DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
BANDWIDTHS = (4.0, 16.0, 25.0, 50.0, 64.0, 100.0, 370.8, 450.0, 721.8)


# --------------------------------------------------------------------------- topologies
@st.composite
def topology_dicts(draw: Any, max_hosts: int = 6, max_gpus_per_host: int = 4) -> dict[str, Any]:
    """A random small, valid topology in the native dictionary form: 1-4 levels, optional
    sublevels below the node level, optional host bandwidth matrices, 1-2 node types."""
    num_levels = draw(st.integers(1, 4))
    node_level = draw(st.integers(0, num_levels - 1))
    nvlink_level = draw(st.integers(node_level, num_levels - 1))
    names = draw(
        st.lists(
            st.sampled_from(["numa", "pcie", "board", "node", "rack", "leaf", "spine", "core"]),
            min_size=num_levels,
            max_size=num_levels,
            unique=True,
        )
    )
    levels = [
        {
            "name": name,
            "bandwidth_gbps": draw(st.sampled_from(BANDWIDTHS)),
            "latency_us": draw(st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0])),
            "sharp": draw(st.booleans()),
        }
        for name in names
    ]
    below = names[:node_level]
    above = names[node_level + 1 :]

    node_types: dict[str, Any] = {}
    for t in range(draw(st.integers(1, 2))):
        gpus = draw(st.integers(1, max_gpus_per_host))
        entry: dict[str, Any] = {"gpus": gpus}
        # Sublevels from the node downwards, each refining the one above it, so they nest.
        sublevels: dict[str, list[int]] = {}
        upper = [0] * gpus
        for lname in reversed(below):
            split = [draw(st.integers(0, 1)) for _ in range(gpus)]
            upper = [2 * u + s for u, s in zip(upper, split, strict=True)]
            sublevels[lname] = list(upper)
        if below:
            entry["sublevels"] = sublevels
        if gpus > 1 and draw(st.booleans()):
            matrix = [[0.0] * gpus for _ in range(gpus)]
            for i in range(gpus):
                for j in range(i + 1, gpus):
                    matrix[i][j] = matrix[j][i] = draw(st.sampled_from(BANDWIDTHS))
            entry["bandwidth_gbps"] = matrix
        if draw(st.booleans()):
            # NVLink SHARP (NVLS inside the domain, NVLS-tree across domains).
            entry["nvls_gbps"] = draw(st.sampled_from([100.0, 470.0]))
        if draw(st.booleans()):
            # Fewer NICs than GPUs (shares, rails for PXN), or one per GPU.
            entry["nics"] = [f"nic{i}" for i in range(draw(st.integers(1, gpus)))]
        node_types[f"type{t}"] = entry

    # The tree above the node level: the top level has one domain; every other domain has
    # 1-3 children; hosts hang below the lowest level above the node.
    hosts: list[dict[str, Any]] = []
    if not above:
        host_paths: list[dict[str, str]] = [{}]
    else:
        paths: list[dict[str, str]] = [{above[-1]: "top"}]
        for lname in reversed(above[:-1]):
            grown = []
            for p in paths:
                for _ in range(draw(st.integers(1, 3))):
                    grown.append({**p, lname: f"{lname}{len(grown)}"})
            paths = grown
        host_paths = []
        for p in paths:
            host_paths.extend(dict(p) for _ in range(draw(st.integers(1, 2))))
        host_paths = host_paths[:max_hosts]
    type_names = list(node_types)
    for i, domains in enumerate(host_paths):
        hosts.append(
            {"name": f"h{i:02d}", "type": draw(st.sampled_from(type_names)), "domains": domains}
        )
    return {
        "format": "gpuplace.topology/1",
        "name": "random",
        "levels": levels,
        "node_level": names[node_level],
        "nvlink_domain": names[nvlink_level],
        "node_types": node_types,
        "nodes": hosts,
        "algorithm_efficiency": draw(
            st.dictionaries(
                st.sampled_from(["ring", "tree", "nvls", "collnet"]),
                st.sampled_from([0.5, 0.9, 1.0, 1.2]),
            )
        ),
    }


topologies = topology_dicts().map(gpuplace.Topology.from_dict)


# --------------------------------------------------------------------------- jobs
@st.composite
def jobs(draw: Any, topology: gpuplace.Topology, max_gpus: int | None = None) -> gpuplace.Job:
    """A random job that has at most ``max_gpus`` ranks (default: the cluster's GPUs): parallel
    degrees with a transformer model and/or explicit communication, or an explicit traffic
    matrix; random confinement, max_span and rank order."""
    limit = min(topology.num_gpus, max_gpus or topology.num_gpus)
    level_choices = [*topology.level_names, "nvlink_domain", "node"]
    max_span = draw(st.none() | st.sampled_from(topology.level_names))
    if draw(st.integers(0, 4)) == 0:
        n = draw(st.integers(1, limit))
        rows = draw(
            st.lists(
                st.tuples(
                    st.integers(0, n - 1),
                    st.integers(0, n - 1),
                    st.sampled_from([1.0, 1e3, 2.5e6, 1e9]),
                ),
                max_size=12,
            )
        )
        return gpuplace.Job.from_traffic(
            "traffic", np.array(rows, dtype=np.float64).reshape(-1, 3), ranks=n, max_span=max_span
        )
    degrees = dict.fromkeys(DIMENSIONS, 1)
    for dim in draw(st.permutations(DIMENSIONS)):
        room = limit // int(np.prod(list(degrees.values())))
        if room >= 2:
            degrees[dim] = draw(st.integers(1, min(room, 4)))
    model = None
    if draw(st.booleans()):
        model = gpuplace.TransformerModel(
            parameters=draw(st.sampled_from([1e8, 7e9, 7e10])),
            layers=draw(st.sampled_from([2, 8, 32])),
            hidden_size=draw(st.sampled_from([256, 4096])),
            sequence_length=draw(st.sampled_from([128, 4096])),
            micro_batch_size=draw(st.integers(1, 2)),
            micro_batches=draw(st.integers(1, 4)),
            moe_top_k=draw(st.integers(1, 2)),
        )
    communication = {}
    for dim in draw(st.lists(st.sampled_from(DIMENSIONS), unique=True, max_size=3)):
        kind = "p2p" if dim == "pp" and draw(st.booleans()) else draw(st.sampled_from(KINDS))
        communication[dim] = gpuplace.Communication(
            kind,
            draw(st.sampled_from([0.0, 1.0, 4096.0, 3e7, 1e9])),
            draw(st.sampled_from([0.0, 1.0, 2.0, 16.0])),
        )
    confine = {
        dim: draw(st.sampled_from(level_choices))
        for dim in draw(st.lists(st.sampled_from(DIMENSIONS), unique=True, max_size=2))
    }
    rank_order = draw(st.sampled_from([DIMENSIONS, tuple(draw(st.permutations(DIMENSIONS)))]))
    return gpuplace.Job(
        name="job",
        rank_order=rank_order,
        model=model,
        communication=communication,
        confine=confine,
        max_span=max_span,
        **degrees,
    )


@st.composite
def fragmented_states(draw: Any, topology: gpuplace.Topology) -> gpuplace.ClusterState:
    """A state after a random history: jobs allocated on random free GPUs, some released, some
    GPUs failed or drained (possibly under running jobs), some recovered."""
    state = gpuplace.ClusterState(topology)
    n = topology.num_gpus
    for step in range(draw(st.integers(0, 6))):
        action = draw(st.sampled_from(["allocate", "allocate", "release", "fail", "drain"]))
        free = [int(g) for g in np.flatnonzero(state.free_mask())]
        if action == "allocate" and free:
            gpus = draw(st.lists(st.sampled_from(free), min_size=1, max_size=4, unique=True))
            state.allocate(name=f"bg{step}", gpus=gpus)
        elif action == "release" and state.jobs:
            state.release(draw(st.sampled_from(sorted(state.jobs))))
        elif action in ("fail", "drain"):
            gpus = draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True))
            if action == "fail":
                state.fail_gpus(gpus)
            else:
                state.drain_gpus(gpus)
    return state
