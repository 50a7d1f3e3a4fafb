"""Placing jobs: greedy on real presets, exports, solver registry and Infeasible messages."""

from __future__ import annotations

import dataclasses
import json

import gpuplace
import numpy as np
import pytest
from gpuplace import ClusterState, Job, Topology, TransformerModel
from gpuplace._util.hostlist import expand
from gpuplace.sim.workload import MOE_MODEL, fragment
from reference import reference_evaluate

LLAMA7B = TransformerModel(parameters=7e9, layers=32, hidden_size=4096, sequence_length=4096)


@pytest.fixture
def pod() -> Topology:
    """4 leaves of 32 DGX H100 (1024 GPUs)."""
    return Topology.preset("h100-superpod", nodes=128)


def take_nodes(state: ClusterState, nodes, per_node: int = 8, prefix: str = "bg") -> None:
    for n in nodes:
        state.allocate(name=f"{prefix}{n}", gpus=list(range(n * 8, n * 8 + per_node)))


def hosts_of(topology: Topology, gpus) -> list[str]:
    return [topology.host_of(int(g)) for g in gpus]


def test_greedy_keeps_tp_groups_in_nodes_on_a_fragmented_cluster(pod):
    state = ClusterState(pod)
    # Half of every node is taken, except four whole nodes spread over two leaves.
    whole = {5, 17, 40, 90}
    for n in range(128):
        if n not in whole:
            state.allocate(name=f"half{n}", gpus=list(range(n * 8, n * 8 + 4)))
    job = Job(name="j", tp=8, dp=3, model=LLAMA7B)
    placement = gpuplace.place(state, job)
    assert placement.cost.confinement_ok
    for group in job.rank_groups("tp"):
        assert len(set(hosts_of(pod, placement.gpus[group]))) == 1
    assert set(placement.nodes) <= {pod.hosts[n] for n in whole}
    # Groups of 4 fit in the half-free nodes; each still stays in one node.
    job4 = Job(name="k", tp=4, dp=16, model=LLAMA7B)
    placement = gpuplace.place(state, job4)
    assert placement.cost.confinement_ok
    for group in job4.rank_groups("tp"):
        assert len(set(hosts_of(pod, placement.gpus[group]))) == 1
    # The topology-blind baseline splits tp groups over the first nodes' free halves.
    blind = gpuplace.place(state, job, "first-fit")
    assert not blind.cost.confinement_ok
    assert placement.cost.comm_seconds > 0


def test_greedy_places_a_four_stage_pipeline_inside_one_leaf(pod):
    state = ClusterState(pod)
    # Leaf su001 keeps 2 free nodes, su002 keeps 6, su003 and su004 are empty.
    take_nodes(state, range(0, 30))
    take_nodes(state, range(32, 58))
    job = Job(name="pipe", tp=8, pp=4, model=LLAMA7B)
    placement = gpuplace.place(state, job)
    assert placement.cost.confinement_ok
    assert placement.cost.span_level == "leaf"
    leaves = {pod.domain_of(int(g), "leaf") for g in placement.gpus}
    assert leaves == {"su002"}, "the tightest leaf that holds the whole pipeline"
    # Each stage is one whole node; neighbouring stages talk over the leaf only.
    for stage in range(4):
        stage_gpus = placement.gpus[stage * 8 : (stage + 1) * 8]
        assert len(set(hosts_of(pod, stage_gpus))) == 1
    assert placement.cost.bytes_above("spine") == 0
    # The cost is the reference's.
    reference = reference_evaluate(pod, job, placement.gpus)
    assert placement.cost.comm_seconds == pytest.approx(reference.comm_seconds, rel=1e-9)


def test_greedy_beats_random_on_a_big_job(pod):
    job = Job(name="big", tp=8, pp=4, dp=4, model=LLAMA7B)
    state = ClusterState(pod)
    greedy = gpuplace.place(state, job)
    random = gpuplace.place(state, job, "random", seed=3)
    assert greedy.cost.confinement_ok
    assert greedy.cost.span_level == "leaf"
    assert greedy.cost.comm_seconds < random.cost.comm_seconds
    assert greedy.solver == "greedy" and random.solver == "random"
    assert greedy.elapsed_s >= 0


def test_greedy_prefers_the_tightest_node_for_a_small_job(pod):
    state = ClusterState(pod)
    state.allocate(name="x", gpus=[16, 17, 18, 19, 20, 21])  # dgx003 keeps GPUs 22, 23
    placement = gpuplace.place(state, Job(name="j", tp=2))
    assert placement.gpus.tolist() == [22, 23]


def test_greedy_spreads_a_ring_over_hosts_when_their_nics_beat_the_cpu_link():
    """pcie-cluster: the CPU sockets of a host join at 16 GB/s, while the two GPUs of one PCIe
    switch drive 4 NIC shares of 25 GB/s. A dp ring over one PCIe switch of each of 4 hosts is
    then 4x cheaper than one inside a host, and CP-SAT proves it optimal; greedy's spread view
    (one PCIe switch per host) finds it, plain packing would take a whole host."""
    topo = Topology.preset("pcie-cluster", nodes=4)
    state = ClusterState(topo)
    job = Job(
        "d", dp=8, confine={}, communication={"dp": gpuplace.Communication("all-reduce", 1e9)}
    )
    whole_host = gpuplace.evaluate(topo, job, list(range(8))).comm_seconds
    placement = gpuplace.place(state, job, "greedy")
    assert placement.cost.comm_seconds < whole_host / 3
    switches = {topo.host_of(int(g)): set() for g in placement.gpus}
    for g in placement.gpus:
        switches[topo.host_of(int(g))].add(int(topo.path[int(g), 0]))
    assert len(switches) == 4 and all(len(s) == 1 for s in switches.values())
    proven = gpuplace.place(state, job, "cpsat", time_limit=20)
    assert proven.optimal
    assert placement.cost.comm_seconds == pytest.approx(proven.cost.comm_seconds, rel=1e-9)
    # A tp 8 job must stay inside one host: the spread view cannot hold it, the packing can.
    tp = Job("t", tp=8, communication={"tp": gpuplace.Communication("all-reduce", 1e9)})
    assert {topo.host_of(int(g)) for g in gpuplace.place(state, tp, "greedy").gpus} == {"gpu001"}


@pytest.mark.parametrize("tp, ep, dp", [(2, 8, 4), (1, 16, 2)])
def test_greedy_is_never_dearer_than_whole_node_peers_for_an_all_to_all_job(tp, ep, dp):
    """A mixture-of-experts job on a fragmented cluster: best fit alone packs it onto partly
    used hosts with its data-parallel pairs innermost, splitting each 16-rank all-to-all group
    over three or four hosts, where Slurm and Kueue take whole hosts (two per group). Greedy
    prices whole free hosts and the other rank orders too, so it is never the dearer."""
    topology = Topology.preset("h100-superpod", nodes=64)
    job = Job(name="moe", tp=tp, ep=ep, dp=dp, model=MOE_MODEL)
    for seed in range(4):
        for occupancy in (0.3, 0.5, 0.7):
            state = ClusterState(topology)
            fragment(state, occupancy, seed=seed)
            ours = gpuplace.place(state, job, "greedy").cost
            for peer in ("slurm-tree", "kueue-bestfit"):
                theirs = gpuplace.place(state, job, peer).cost
                assert ours.comm_seconds <= theirs.comm_seconds * (1 + 1e-9), (
                    seed,
                    occupancy,
                    peer,
                    ours.comm_seconds,
                    theirs.comm_seconds,
                )


def test_greedy_never_uses_failed_or_drained_gpus():
    topo = Topology.preset("dgx-h100")
    state = ClusterState(topo)
    state.fail_gpus([0, 3])
    state.drain_gpus([5])
    placement = gpuplace.place(state, Job(name="j", tp=4))
    assert set(placement.gpus.tolist()).isdisjoint({0, 3, 5})
    with pytest.raises(gpuplace.Infeasible):
        gpuplace.place(state, Job(name="j", tp=6))


def test_gb200_keeps_tp72_in_one_nvlink_domain():
    topo = Topology.preset("gb200-nvl72", racks=2)
    state = ClusterState(topo)
    state.allocate(name="x", gpus=[0])
    placement = gpuplace.place(state, Job(name="j", tp=72))
    assert {topo.domain_of(int(g), "nvlink-domain") for g in placement.gpus} == {"rack002"}
    assert placement.cost.span_level == "nvlink-domain"


# --------------------------------------------------------------------------- exports
def placement_on(topology: Topology, gpus: list[int]) -> gpuplace.Placement:
    job = Job(name="export", dp=len(gpus), confine={})
    return dataclasses.replace(
        gpuplace.place(ClusterState(topology), job, "first-fit"),
        gpus=np.array(gpus),
        cost=gpuplace.evaluate(topology, job, gpus),
    )


def test_hostlist_cuda_visible_devices_and_rank_table(pod):
    p = placement_on(pod, [9, 8, 0, 1, 24, 17])
    assert p.nodes == ["dgx002", "dgx001", "dgx004", "dgx003"]
    assert p.hostlist() == "dgx[001-004]"
    assert p.cuda_visible_devices() == {
        "dgx002": "1,0",
        "dgx001": "0,1",
        "dgx004": "0",
        "dgx003": "1",
    }
    assert p.rank_table() == [
        {"rank": 0, "host": "dgx002", "local_rank": 0, "device": 1},
        {"rank": 1, "host": "dgx002", "local_rank": 1, "device": 0},
        {"rank": 2, "host": "dgx001", "local_rank": 0, "device": 0},
        {"rank": 3, "host": "dgx001", "local_rank": 1, "device": 1},
        {"rank": 4, "host": "dgx004", "local_rank": 0, "device": 0},
        {"rank": 5, "host": "dgx003", "local_rank": 0, "device": 1},
    ]
    gap = placement_on(pod, [0, 80, 81, 1000])
    assert gap.hostlist() == "dgx[001,011,126]"


def test_gb200_hostlist_keeps_tray_names():
    topo = Topology.preset("gb200-nvl72", racks=2)
    p = placement_on(topo, [0, 4, 8, 72])
    assert p.nodes == ["rack001-tray01", "rack001-tray02", "rack001-tray03", "rack002-tray01"]
    assert expand(p.hostlist()) == sorted(p.nodes)


def test_placement_json(pod):
    state = ClusterState(pod)
    placement = gpuplace.place(state, Job(name="j", tp=8, dp=2, model=LLAMA7B))
    document = json.loads(placement.to_json())
    assert document["job"] == "j"
    assert document["gpus"] == placement.gpus.tolist()
    assert document["nodes"] == placement.nodes
    assert document["hostlist"] == placement.hostlist()
    assert document["solver"] == "greedy"
    assert document["cost"]["comm_seconds"] == pytest.approx(placement.cost.comm_seconds)
    assert document["cost"]["confinement_ok"] is True
    assert set(document["cost"]["class_seconds"]) == {"tp all-reduce", "dp all-reduce"}


# --------------------------------------------------------------------------- registry
def test_solver_registry():
    names = gpuplace.solvers()
    assert {"greedy", "first-fit", "random"} <= set(names)
    assert all(names.values())
    state = ClusterState(Topology.preset("dgx-h100"))
    with pytest.raises(gpuplace.InvalidJob, match="unknown solver"):
        gpuplace.place(state, Job(name="j"), "simulated-annealing-9000")
    with pytest.raises(gpuplace.InvalidJob, match="time_limit"):
        gpuplace.place(state, Job(name="j"), time_limit=0)


def test_a_registered_python_solver_is_priced_by_the_one_cost_model():
    @gpuplace.register_solver("test-reverse", "test only: the highest free GPU ids")
    def reverse(state, job, seed, time_limit):
        free = np.flatnonzero(state.free_mask())[::-1][: job.gpus]
        if len(free) < job.gpus:
            raise gpuplace.Infeasible(f"needs {job.gpus} GPUs, {len(free)} are free")
        return gpuplace.SolveResult(gpus=free, optimal=False, bound=0.0)

    topo = Topology.preset("dgx-h100")
    job = Job(name="j", tp=2, communication={"tp": gpuplace.Communication("all-reduce", 1e9)})
    placement = gpuplace.place(ClusterState(topo), job, "test-reverse")
    assert placement.gpus.tolist() == [7, 6]
    assert placement.cost == gpuplace.evaluate(topo, job, [7, 6])
    assert placement.gap == pytest.approx(1.0)


def test_the_gate_refuses_every_kind_of_broken_placement_from_a_python_solver():
    """Whatever a registered solver returns, place() hands back only a valid placement: the
    gate in the core refuses a short list, a GPU twice, a GPU that is taken, failed or a spare,
    and a broken confinement from a solver that promises it, and changes nothing."""
    topo = Topology.preset("dgx-h100")
    state = ClusterState(topo)
    state.allocate(name="bg", gpus=[0])
    state.fail_gpus([1])
    state.reserve_spares(gpus=[2])
    job = Job(name="j", tp=2, communication={"tp": gpuplace.Communication("all-reduce", 1e9)})
    answers = {
        "short": ([3], "gives 1 GPUs for a job of 2 ranks"),
        "twice": ([3, 3], "GPU 3 is given to two ranks"),
        "taken": ([0, 3], "rank 0 is on GPU 0, which is allocated to job 'bg'"),
        "failed": ([3, 1], "rank 1 is on GPU 1, which is failed"),
        "spare": ([2, 3], "GPU 2, which is a reserved spare"),
        "missing": ([3, 99], "GPU 99 does not exist"),
        "negative": ([3, -1], "-1 is not a valid id"),
        "floats": (np.array([3.0, 4.0]), "expected a 1-d array of GPU ids"),
    }
    for name, (gpus, _) in answers.items():
        gpuplace.register_solver(f"broken-{name}", "test only")(
            lambda state, job, seed, limit, gpus=gpus: gpuplace.SolveResult(gpus=np.asarray(gpus))
        )
    free_before = state.free_mask().copy()
    for name, (_, message) in answers.items():
        with pytest.raises(gpuplace.InvalidState) as info:
            gpuplace.place(state, job, f"broken-{name}")
        assert f"solver 'broken-{name}' returned an invalid placement" in str(info.value)
        assert message in str(info.value), str(info.value)
    assert (state.free_mask() == free_before).all() and list(state.jobs) == ["bg"]

    # Confinement: refused from a solver that promises it, reported from one that does not.
    def split(state, job, seed, limit):
        return gpuplace.SolveResult(gpus=np.array([3, 8]))

    big = ClusterState(Topology.preset("h100-superpod", nodes=2))
    gpuplace.register_solver("test-split-confining", "test only", confining=True)(split)
    gpuplace.register_solver("test-split", "test only")(split)
    with pytest.raises(gpuplace.InvalidState, match="promises confinement but breaks it"):
        gpuplace.place(big, job, "test-split-confining")
    placement = gpuplace.place(big, job, "test-split")
    assert not placement.cost.confinement_ok and placement.cost.violations


# --------------------------------------------------------------------------- Infeasible says why
def test_infeasible_tp_larger_than_any_nvlink_domain(pod):
    with pytest.raises(gpuplace.Infeasible) as info:
        gpuplace.place(ClusterState(pod), Job(name="j", tp=16))
    message = str(info.value)
    assert (
        "needs 16 GPUs" in message
        and "each tp group (16 GPUs) must stay inside one node" in message
    )
    assert "largest node has 8" in message


def test_infeasible_on_a_fragmented_cluster_names_the_group(pod):
    state = ClusterState(pod)
    for n in range(128):
        state.allocate(name=f"half{n}", gpus=list(range(n * 8, n * 8 + 4)))
    with pytest.raises(gpuplace.Infeasible) as info:
        gpuplace.place(state, Job(name="j", tp=8))
    message = str(info.value)
    assert "needs 8 GPUs" in message
    assert "tp group (8 GPUs) inside one node" in message
    assert "512 GPUs are free" in message


def test_infeasible_max_span(pod):
    with pytest.raises(gpuplace.Infeasible) as info:
        gpuplace.place(ClusterState(pod), Job(name="j", dp=300, confine={}, max_span="leaf"))
    assert "needs 300 GPUs" in str(info.value)
    assert "at most one leaf" in str(info.value)
    assert "256" in str(info.value)


def test_infeasible_too_few_free_gpus(pod):
    state = ClusterState(pod)
    state.fail_gpus(range(1000))
    for solver in ("greedy", "first-fit", "random"):
        with pytest.raises(gpuplace.Infeasible, match="needs 32 GPUs but only 24"):
            gpuplace.place(state, Job(name="j", dp=32, confine={}), solver)


def test_infeasible_nvl72_domain():
    topo = Topology.preset("gb200-nvl72", racks=2)
    with pytest.raises(
        gpuplace.Infeasible, match=r"tp group \(144 GPUs\) must stay inside one nvlink-domain"
    ):
        gpuplace.place(ClusterState(topo), Job(name="j", tp=144))


# --------------------------------------------------------------------------- Ctrl-C
def test_ctrl_c_stops_a_long_refine_promptly(superpod):
    """A refine given a minute stops within a second of Ctrl-C (the core polls an interrupt
    flag the bindings set when Python sees the signal) and raises KeyboardInterrupt; the
    next call runs normally."""
    import os
    import signal
    import threading
    import time

    state = ClusterState(superpod)
    job = Job(name="j", tp=8, pp=4, dp=4)
    start = gpuplace.place(state, job, "first-fit")
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))  # a real Ctrl-C
    began = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            gpuplace.refine(state, start, time_limit=60.0, max_iterations=10**15)
    finally:
        timer.cancel()
    assert time.perf_counter() - began < 1.5
    again = gpuplace.refine(state, start, time_limit=0.05, max_iterations=10**15)
    assert again.cost.comm_seconds <= start.cost.comm_seconds
