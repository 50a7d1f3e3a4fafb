"""slurm-tree against the real thing: Slurm 22.05 with topology/tree on loopback.

For seeded fragmented states, real exclusive jobs occupy some nodes, Slurm is asked where an
exclusive job of k nodes would start (``sbatch --test-only``), and the slurm-tree baseline must
name the same nodes. Skipped, saying why, where Slurm and munge are not installed or the test
does not run as root (slurmd must). Daemons are started and stopped by the test itself.
"""

from __future__ import annotations

import os

import gpuplace
import gpuplace.placement.solvers
import numpy as np
import pytest
from slurm_harness import LoopbackSlurm, missing_daemons

pytestmark = pytest.mark.slurm

STATES_PER_CLUSTER = 8
GPUS_PER_NODE = 8

# (leaves, nodes per leaf, spines): one root over three leaves; two spines under a core.
CLUSTERS = [(3, 4, 1), (4, 3, 2)]


def _requirements() -> str | None:
    missing = missing_daemons()
    if missing:
        return (
            f"Slurm/munge not installed ({', '.join(missing)} missing; apt-get install "
            "slurmctld slurmd munge slurm-client)"
        )
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    return None


def _topology(leaves: int, per_leaf: int, spines: int) -> gpuplace.Topology:
    """The same cluster as gpuplace sees it: hosts n01.. in leaf order, 8 GPUs each."""
    per_spine = -(-leaves // spines)
    nodes = []
    for leaf in range(leaves):
        first = leaf * per_leaf + 1
        domains = {"leaf": f"leaf{leaf + 1}", "spine": f"spine{leaf // per_spine + 1}"}
        if spines > 1:
            domains["core"] = "core"
        nodes.append(
            {
                "name": f"n[{first:02d}-{first + per_leaf - 1:02d}]",
                "type": "hgx",
                "domains": domains,
            }
        )
    levels = [("node", 370.8), ("leaf", 50.0), ("spine", 50.0)]
    if spines > 1:
        levels.append(("core", 50.0))
    return gpuplace.Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "slurm-loopback",
            "levels": [{"name": n, "bandwidth_gbps": b, "latency_us": 1.0} for n, b in levels],
            "node_level": "node",
            "node_types": {"hgx": {"gpus": GPUS_PER_NODE}},
            "nodes": nodes,
        }
    )


def _states(rng: np.random.Generator, nodes: int) -> list[np.ndarray]:
    """Busy-node masks: a few nodes to half of the cluster busy, scattered."""
    out = []
    for _ in range(STATES_PER_CLUSTER):
        busy = np.zeros(nodes, dtype=bool)
        busy[rng.choice(nodes, size=int(rng.integers(1, nodes // 2 + 1)), replace=False)] = True
        out.append(busy)
    return out


@pytest.mark.parametrize(("leaves", "per_leaf", "spines"), CLUSTERS)
def test_slurm_tree_picks_the_nodes_slurm_picks(
    tmp_path_factory: pytest.TempPathFactory, leaves: int, per_leaf: int, spines: int
) -> None:
    reason = _requirements()
    if reason:
        pytest.skip(reason)
    topology = _topology(leaves, per_leaf, spines)
    rng = np.random.default_rng(20240 + leaves)
    disagreements = []
    checked = spanning = not_first_fit = 0
    workdir = tmp_path_factory.mktemp(f"slurm-{leaves}x{per_leaf}")
    with LoopbackSlurm(workdir, leaves, per_leaf, spines) as slurm:
        names = slurm.nodes
        assert list(topology.hosts) == names
        for busy in _states(rng, len(names)):
            job = slurm.occupy([n for n, b in zip(names, busy, strict=True) if b])
            state = gpuplace.ClusterState(topology)
            for host in np.flatnonzero(busy):
                state.allocate(name=f"busy-{host}", gpus=topology.host_gpus(names[host]))
            idle = int((~busy).sum())
            # Small, middle and large requests: within one leaf, across leaves, nearly all.
            for count in sorted({1, max(1, idle // 2), max(1, idle - 1), per_leaf + 1} - {0}):
                if count > idle:
                    continue
                expected, answer = slurm.choose(count)
                placement = gpuplace.place(
                    state, gpuplace.Job(name="probe", dp=count * GPUS_PER_NODE), "slurm-tree"
                )
                chosen = sorted(placement.nodes)
                checked += 1
                spanning += len({topology.domain_of(int(g), "leaf") for g in placement.gpus}) > 1
                lowest_idle = [n for n, b in zip(names, busy, strict=True) if not b][:count]
                not_first_fit += expected != lowest_idle
                if chosen != expected:
                    disagreements.append(
                        f"busy={[n for n, b in zip(names, busy, strict=True) if b]} k={count}: "
                        f"slurm {expected} ({answer}), baseline {chosen}"
                    )
            slurm.release(job)
    # The states must exercise the switch choice: jobs across leaves, and answers that the
    # lowest idle nodes would get wrong.
    assert checked >= STATES_PER_CLUSTER
    assert spanning > 0 and not_first_fit > 0, (checked, spanning, not_first_fit)
    assert not disagreements, "\n".join(disagreements)
