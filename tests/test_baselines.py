"""The peer baselines: worked examples from their originals' rules, and the invariants every
solver keeps (no GPU twice, never a failed or drained GPU, Infeasible when it cannot fit)."""

from __future__ import annotations

import dataclasses

import gpuplace
import numpy as np
import pytest
from gpuplace.placement.solvers.baselines import gpuallocator_best_effort
from hypothesis import given
from hypothesis import strategies as st

BASELINES = ("slurm-tree", "kueue-bestfit", "gpuallocator")


def _tree(leaves: int, per_leaf: int, spines: int = 1) -> gpuplace.Topology:
    per_spine = -(-leaves // spines)
    nodes = [
        {
            "name": f"n[{leaf * per_leaf + 1:02d}-{leaf * per_leaf + per_leaf:02d}]",
            "type": "hgx",
            "domains": {"leaf": f"leaf{leaf + 1}", "spine": f"spine{leaf // per_spine + 1}"},
        }
        for leaf in range(leaves)
    ]
    return gpuplace.Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "tree",
            "levels": [
                {"name": "node", "bandwidth_gbps": 370.8},
                {"name": "leaf", "bandwidth_gbps": 50.0},
                {"name": "spine", "bandwidth_gbps": 50.0},
            ],
            "node_level": "node",
            "node_types": {"hgx": {"gpus": 8}},
            "nodes": nodes,
        }
    )


def _busy(topology: gpuplace.Topology, hosts: list[str]) -> gpuplace.ClusterState:
    state = gpuplace.ClusterState(topology)
    for host in hosts:
        state.allocate(name=f"busy-{host}", gpus=topology.host_gpus(host))
    return state


def test_the_registry_lists_the_baselines_and_stays_callable():
    registered = gpuplace.solvers()
    assert set(BASELINES) <= set(registered)
    assert all(registered[name] for name in BASELINES)


def test_slurm_tree_takes_the_best_fit_leaf_then_the_largest_and_the_closest():
    # Answers of Slurm 22.05 itself for this state (busy n01, n02, n06; leaves of 4 nodes).
    topology = _tree(3, 4)
    state = _busy(topology, ["n01", "n02", "n06"])
    three = gpuplace.place(state, gpuplace.Job(name="j", dp=24), "slurm-tree")
    assert sorted(three.nodes) == ["n05", "n07", "n08"]
    five = gpuplace.place(state, gpuplace.Job(name="j", dp=40), "slurm-tree")
    assert sorted(five.nodes) == ["n03", "n09", "n10", "n11", "n12"]
    # Ranks fill the nodes in node order, local GPU fastest.
    assert list(five.gpus[:9]) == [*topology.host_gpus("n03"), topology.host_gpus("n09")[0]]


def test_slurm_tree_exclusive_needs_whole_idle_nodes_and_slurm_tree_shares_them():
    topology = _tree(2, 2)
    state = gpuplace.ClusterState(topology)
    for host in topology.hosts:
        state.allocate(name=f"one-{host}", gpus=topology.host_gpus(host)[:1])
    with pytest.raises(gpuplace.Infeasible, match="idle nodes"):
        gpuplace.place(state, gpuplace.Job(name="j", tp=2), "slurm-tree-exclusive")
    # cons_tres without --exclusive: the job shares a node, on its lowest free GPUs.
    shared = gpuplace.place(state, gpuplace.Job(name="j", tp=2), "slurm-tree")
    assert len(shared.nodes) == 1
    host = shared.nodes[0]
    assert list(shared.gpus) == list(topology.host_gpus(host)[1:3])
    # A job of a node and a half takes two nodes with 6 free GPUs each (--gpus-per-node=6).
    big = gpuplace.Job(name="k", dp=12)
    with pytest.raises(gpuplace.Infeasible):
        gpuplace.place(state, dataclasses.replace(big, dp=16), "slurm-tree")
    two = gpuplace.place(state, big, "slurm-tree")
    assert len(two.nodes) == 2 and len(set(two.gpus.tolist())) == 12


def test_pods_never_span_hosts():
    topology = _tree(2, 2)
    state = gpuplace.ClusterState(topology)
    # Every host has 5 free GPUs: first-fit would split a 6-GPU pod over two hosts.
    for host in topology.hosts:
        state.allocate(name=f"three-{host}", gpus=topology.host_gpus(host)[:3])
    split = gpuplace.place(state, gpuplace.Job(name="p", dp=4), "first-fit")
    assert len(split.nodes) == 1  # fits the first host
    for solver in ("first-fit-pod", "random-pod"):
        for seed in range(5):
            pod = gpuplace.place(state, gpuplace.Job(name="p", dp=5), solver, seed=seed)
            assert len(pod.nodes) == 1
        with pytest.raises(gpuplace.Infeasible, match="one node"):
            gpuplace.place(state, gpuplace.Job(name="p", dp=6), solver)
    assert len(gpuplace.place(state, gpuplace.Job(name="p", dp=6), "first-fit").nodes) == 2


def test_kueue_bestfit_takes_the_tightest_domain_at_the_lowest_level_that_fits():
    topology = _tree(3, 4)
    # leaf1: 2 idle nodes, leaf2: 3, leaf3: 4. Two pods fit one leaf: the tightest (leaf1).
    state = _busy(topology, ["n01", "n02", "n06"])
    two = gpuplace.place(state, gpuplace.Job(name="j", tp=8, dp=2), "kueue-bestfit")
    assert sorted(two.nodes) == ["n03", "n04"]
    # Five pods fit no leaf: the spine. Its leaves by most free first: leaf3 (4 pods), then
    # the tightest leaf for the fifth pod, leaf1. One level down Kueue sorts the hosts of both
    # leaves together and takes the first five by name: both of leaf1's (the per-leaf counts
    # are not carried down in this Kueue version).
    five = gpuplace.place(state, gpuplace.Job(name="j", tp=8, dp=5), "kueue-bestfit")
    assert sorted(five.nodes) == ["n03", "n04", "n09", "n10", "n11"]
    # One pod: the tightest host. Host n05 has 3 free GPUs after a 5-GPU job, the rest 8 or 0.
    state.allocate(name="five", gpus=topology.host_gpus("n05")[:5])
    small = gpuplace.place(state, gpuplace.Job(name="j", tp=2), "kueue-bestfit")
    assert small.nodes == ["n05"]


def test_gpuallocator_prefers_gpus_behind_one_pcie_switch():
    topology = gpuplace.Topology.preset("pcie-cluster", nodes=1)
    host = topology.hosts[0]
    gpus = topology.host_gpus(host)
    # Free: GPU 1 (switch 0), 2 and 3 (switch 1), 4 (switch 2). The pair 2-3 shares a switch.
    picked = gpuallocator_best_effort(topology, 0, gpus[[1, 2, 3, 4]], 2)
    assert list(picked) == [gpus[2], gpus[3]]
    # Four of eight: the partition into switch-aligned halves, its best set.
    assert list(gpuallocator_best_effort(topology, 0, gpus, 4)) == list(gpus[:4])


def _clusters() -> list[gpuplace.Topology]:
    return [
        _tree(3, 4),
        gpuplace.Topology.preset("pcie-cluster", nodes=4),
        gpuplace.Topology.preset("gb200-nvl72", racks=2),
    ]


CLUSTERS = _clusters()


@st.composite
def damaged_states(draw, topology: gpuplace.Topology) -> gpuplace.ClusterState:
    """Random jobs on random GPUs, then random GPUs failed and drained (some under jobs)."""
    state = gpuplace.ClusterState(topology)
    n = topology.num_gpus
    for k in range(draw(st.integers(0, 6))):
        free = np.flatnonzero(state.free_mask())
        if free.size == 0:
            break
        size = draw(st.integers(1, min(16, free.size)))
        start = draw(st.integers(0, free.size - size))
        state.allocate(name=f"bg{k}", gpus=free[start : start + size])
    state.fail_gpus(draw(st.lists(st.integers(0, n - 1), max_size=6, unique=True)))
    state.drain_gpus(draw(st.lists(st.integers(0, n - 1), max_size=6, unique=True)))
    return state


@pytest.mark.parametrize("solver", BASELINES)
@given(data=st.data())
def test_baselines_never_reuse_or_touch_unhealthy_gpus(solver, data):
    topology = data.draw(st.sampled_from(CLUSTERS))
    state = data.draw(damaged_states(topology))
    tp = data.draw(st.sampled_from([1, 2, 4, 8]))
    dp = data.draw(st.integers(1, max(1, topology.num_gpus // tp)))
    job = gpuplace.Job(name="probe", tp=tp, dp=dp)
    free = state.free_mask()
    try:
        placement = gpuplace.place(state, job, solver)
    except gpuplace.Infeasible:  # allowed: the policy cannot fit this job here
        return
    gpus = placement.gpus
    assert len(gpus) == job.gpus
    assert len(np.unique(gpus)) == len(gpus)
    assert free[gpus].all(), "a baseline used an allocated, failed or drained GPU"
    assert np.isfinite(placement.cost.comm_seconds)


@pytest.mark.parametrize("solver", BASELINES)
def test_baselines_raise_infeasible_when_the_cluster_is_too_small(solver):
    topology = _tree(2, 2)
    with pytest.raises(gpuplace.Infeasible):
        gpuplace.place(gpuplace.ClusterState(topology), gpuplace.Job(name="j", dp=40), solver)
