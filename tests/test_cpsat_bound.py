"""cpsat's proof without a model: greedy's placement is returned as optimal when its cost meets
the core's lower bound (``cost::lower_bound``). The bound never exceeds the exhaustive optimum,
the shortcut's cost equals the optimum of the full CP-SAT path and of enumeration on random
small instances (heterogeneous host types, degraded GPUs, running neighbours), and the
shortcut is not taken where the placement is dearer than the bound for each of those reasons."""

from __future__ import annotations

import itertools

import gpuplace
import numpy as np
import pytest
from gpuplace import Communication, Job, Topology
from gpuplace import _core as core
from gpuplace.placement.solvers import cpsat
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

#: Relative slack between two costs: CP-SAT's rounding plus floating-point noise.
REL_TOL = 1e-6
KINDS = {"tp": "all-reduce", "cp": "all-gather", "ep": "all-to-all", "dp": "all-reduce"}


@pytest.fixture(autouse=True)
def _one_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # The machine is shared: never let a test take every core.
    monkeypatch.setenv(cpsat.WORKERS_ENV, "1")


def mixed_cluster(types: str = "fsfs") -> Topology:
    """16 GPUs in 4 hosts of 4 of two types: ``fast`` (NVLink SHARP, one NIC per GPU) and
    ``slow`` (no NVLS, two NICs for four GPUs, so one GPU alone drives a NIC of twice the
    per-GPU bandwidth, and a third of the peak); hosts a and b under leaf l1, c and d under l2
    (``types``: f or s per host); leaf uplinks oversubscribed 4:1, so running jobs slow the
    fabric down."""
    kind = {"f": "fast", "s": "slow"}
    return Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "mixed",
            "levels": [
                {"name": "node", "bandwidth_gbps": 300.0, "latency_us": 1.0},
                {
                    "name": "leaf",
                    "bandwidth_gbps": 50.0,
                    "latency_us": 3.0,
                    "oversubscription": 4,
                },
                {"name": "spine", "bandwidth_gbps": 50.0, "latency_us": 5.0},
            ],
            "node_level": "node",
            "nvlink_domain": "node",
            "node_types": {
                name: spec
                for name, spec in {
                    "fast": {"gpus": 4, "nvls_gbps": 400.0, "peak_tflops": 989.0},
                    "slow": {
                        "gpus": 4,
                        "nics": ["mlx5_0", "mlx5_1"],
                        "gpu_nic": [0, 0, 1, 1],
                        "peak_tflops": 312.0,
                    },
                }.items()
                if name in {kind[t] for t in types}
            },
            "nodes": [
                {"name": h, "type": kind[t], "domains": {"leaf": leaf, "spine": "s"}}
                for h, t, leaf in zip("abcd", types, ("l1", "l1", "l2", "l2"), strict=True)
            ],
        }
    )


TOPOLOGY = mixed_cluster()
SHAPES = [
    {"dp": 1},
    {"tp": 2},
    {"tp": 4},
    {"dp": 3},
    {"tp": 2, "dp": 2},
    {"tp": 4, "dp": 2},
    {"dp": 2, "pp": 2},
    {"ep": 2, "dp": 2},
]


def exhaustive(state: gpuplace.ClusterState, job: Job) -> float:
    """Least real cost (degraded hardware and running jobs included) over every injective
    rank -> free GPU map that meets the job's rules; GPUs of one host are tried in every order
    only for the ranks, so the maps number at most 16 * 15 * ... (job.gpus factors)."""
    free = np.flatnonzero(state.free_mask()).tolist()
    best = np.inf
    for perm in itertools.permutations(free, job.gpus):
        report = gpuplace.evaluate(state.topology, job, perm, state=state)
        if report.confinement_ok and report.comm_seconds < best:
            best = report.comm_seconds
    return float(best)


@st.composite
def instances(draw: st.DrawFn) -> tuple[gpuplace.ClusterState, Job]:
    """A fragmented state of :func:`mixed_cluster` with a communicating neighbour on some busy
    GPUs, maybe degraded GPUs / hosts / leaves, and a small job."""
    state = gpuplace.ClusterState(TOPOLOGY)
    free = draw(st.sets(st.integers(0, 15), min_size=5, max_size=9), label="free")
    busy = sorted(set(range(16)) - free)
    # A running data-parallel neighbour across the leaves loads the oversubscribed uplinks.
    if len(busy) >= 2 and draw(st.booleans(), label="neighbour"):
        neighbour = Job(
            "other",
            dp=len(busy),
            confine={},
            communication={"dp": Communication("all-reduce", 4e9)},
        )
        state.allocate(name="other", gpus=busy, job=neighbour)
    elif busy:
        state.allocate(name="other", gpus=busy)
    for kind, index, factor in draw(
        st.lists(
            st.tuples(
                st.sampled_from(["gpu", "host", "switch"]),
                st.integers(0, 15),
                st.sampled_from([0.3, 0.8]),
            ),
            max_size=2,
        ),
        label="degraded",
    ):
        target = {"gpu": index, "host": "abcd"[index % 4], "switch": f"l{1 + index % 2}"}[kind]
        state.degrade(factor=factor, **{kind: target})
    shape = draw(st.sampled_from(SHAPES), label="shape")
    job = Job(
        "j",
        **shape,
        confine=draw(st.sampled_from([{}, {"tp": "node"}]), label="confine")
        if "tp" in shape
        else {},
        communication={
            d: Communication(
                "p2p" if d == "pp" else KINDS[d], draw(st.sampled_from([1e4, 1e8, 2e9]))
            )
            for d in shape
            if shape[d] > 1
        },
    )
    return state, job


@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(instances())
def test_shortcut_equals_the_optimum_and_the_bound_never_exceeds_it(
    instance: tuple[gpuplace.ClusterState, Job],
) -> None:
    state, job = instance
    spec = job.compile(state.topology)
    expected = exhaustive(state, job)
    bound = core.lower_bound(state._core, spec)
    assert bound is not None
    if np.isfinite(expected):
        # The bound holds for every placement, on the state's real prices.
        assert bound <= expected * (1 + 1e-9) + 1e-15
    shortcut = cpsat.proven_by_bound(state, job)
    if shortcut is None:
        event("no shortcut")
        return
    event("shortcut taken")
    cost = gpuplace.evaluate(state.topology, job, shortcut.gpus, state=state)
    assert cost.confinement_ok
    assert shortcut.optimal is True
    assert shortcut.details["status"] == "OPTIMAL"
    assert cost.comm_seconds == pytest.approx(expected, rel=REL_TOL, abs=1e-15)
    # The full CP-SAT path (model, enumeration or GPU-level model) finds nothing cheaper,
    # and where it proves its optimum, it is the shortcut's cost.
    full = cpsat.solve(state, job, time_limit=20, num_workers=1, shortcut=False)
    full_cost = gpuplace.evaluate(state.topology, job, full.gpus, state=state).comm_seconds
    assert cost.comm_seconds <= full_cost * (1 + REL_TOL) + 1e-15
    if full.optimal:
        event("full CP-SAT path proven")
        assert cost.comm_seconds == pytest.approx(full_cost, rel=REL_TOL, abs=1e-15)


def _free_only(gpus: list[int], topology: Topology = TOPOLOGY) -> gpuplace.ClusterState:
    state = gpuplace.ClusterState(topology)
    state.allocate(name="other", gpus=sorted(set(range(16)) - set(gpus)))
    return state


def _meets(state: gpuplace.ClusterState, job: Job, gpus: list[int]) -> bool:
    return cpsat._meets_bound(state, job, np.asarray(gpus, dtype=np.int64), 0.0) is not None


TP4 = Job("tp4", tp=4, communication={"tp": Communication("all-reduce", 1e9)})
TP2 = Job("tp2", tp=2, communication={"tp": Communication("all-reduce", 1e9)})
TP4DP2 = Job(
    "tp4dp2",
    tp=4,
    dp=2,
    communication={
        "tp": Communication("all-reduce", 1e8),
        "dp": Communication("all-reduce", 2e9),
    },
)


def test_one_gpu_and_one_nvlink_domain_are_proven_without_a_model() -> None:
    state = gpuplace.ClusterState(TOPOLOGY)
    one = gpuplace.place(state, Job("one", dp=1), "cpsat")
    assert one.optimal is True and one.bound == 0.0 and one.cost.comm_seconds == 0.0
    assert one.details["formulation"] == "lower bound"
    tp4 = gpuplace.place(state, TP4, "cpsat")
    assert tp4.optimal is True and tp4.details["formulation"] == "lower bound"
    assert tp4.bound == pytest.approx(tp4.cost.comm_seconds, rel=1e-9)
    # On a fast host (NVLS): the cheapest domain of the cluster.
    assert {TOPOLOGY.host_types[TOPOLOGY.host_of_gpu[g]] for g in tp4.gpus} == {"fast"}


def test_not_taken_on_a_dearer_host_type() -> None:
    """Heterogeneous types: a slow host (no NVLS) prices tp4 above the fast hosts' bound."""
    state = gpuplace.ClusterState(TOPOLOGY)
    assert _meets(state, TP4, [0, 1, 2, 3])  # host a, fast
    assert not _meets(state, TP4, [4, 5, 6, 7])  # host b, slow
    # With only slow hosts free, the bound is still the fast hosts' price (the bound does not
    # look at types): greedy's answer is not proven, the model decides, and its answer is the
    # enumeration's.
    only_slow = _free_only([4, 5, 6, 7, 12, 13, 14, 15])
    assert cpsat.proven_by_bound(only_slow, TP4) is None
    placed = gpuplace.place(only_slow, TP4, "cpsat")
    assert placed.details["formulation"] != "lower bound"
    assert placed.cost.comm_seconds == pytest.approx(exhaustive(only_slow, TP4), rel=REL_TOL)


def test_not_taken_on_degraded_gpus() -> None:
    state = gpuplace.ClusterState(TOPOLOGY)
    state.degrade(factor=0.5, gpu=1)
    assert _meets(state, TP2, [2, 3])
    assert not _meets(state, TP2, [0, 1])
    # Every fast GPU degraded: greedy's placement is dearer than the healthy bound, no shortcut.
    everywhere = _free_only([0, 1, 2, 3])
    everywhere.degrade(factor=0.5, host="a")
    assert cpsat.proven_by_bound(everywhere, TP2) is None
    placed = gpuplace.place(everywhere, TP2, "cpsat")
    assert placed.details["formulation"] != "lower bound"
    assert placed.optimal is True


def test_not_taken_against_running_neighbours() -> None:
    """One GPU free on each of two hosts in different leaves (one host type): the dp ring
    crosses the oversubscribed uplinks. Alone it meets the bound; with a running job loading
    those uplinks it does not, and the model decides."""
    topo = mixed_cluster("ffff")
    job = Job("dp2", dp=2, confine={}, communication={"dp": Communication("all-reduce", 2e9)})
    gpus = [0, 8]
    alone = _free_only(gpus, topo)
    assert _meets(alone, job, gpus)
    loaded = gpuplace.ClusterState(topo)
    neighbour = Job(
        "other", dp=8, confine={}, communication={"dp": Communication("all-reduce", 8e9)}
    )
    loaded.allocate(name="other", gpus=[4, 5, 6, 7, 12, 13, 14, 15], job=neighbour)
    loaded.allocate(name="rest", gpus=[1, 2, 3, 9, 10, 11])
    report = gpuplace.evaluate(topo, job, gpus, state=loaded)
    assert report.alone_seconds is not None and report.comm_seconds > report.alone_seconds
    assert not _meets(loaded, job, gpus)
    assert cpsat.proven_by_bound(loaded, job) is None
    placed = gpuplace.place(loaded, job, "cpsat")
    assert placed.details["formulation"] != "lower bound"
    assert placed.cost.comm_seconds == pytest.approx(exhaustive(loaded, job), rel=REL_TOL)


def test_bound_follows_the_free_gpus_and_confinement() -> None:
    """With no host of 4 free GPUs left, tp4 confined to the host cannot be placed and tp4
    unconfined must cross hosts: the bound rises to the leaf's price, and greedy's placement
    across one leaf is then proven."""
    state = _free_only([0, 1, 4, 5, 8, 9])
    confined = core.lower_bound(state._core, TP4.compile(TOPOLOGY))
    free = Job("tp4", tp=4, confine={}, communication={"tp": Communication("all-reduce", 1e9)})
    spread = core.lower_bound(state._core, free.compile(TOPOLOGY))
    assert confined is not None and spread is not None
    empty = core.lower_bound(gpuplace.ClusterState(TOPOLOGY)._core, free.compile(TOPOLOGY))
    assert empty is not None and spread > empty
    with pytest.raises(gpuplace.Infeasible):
        gpuplace.place(state, TP4, "cpsat")
    placed = gpuplace.place(state, free, "cpsat")
    assert placed.cost.comm_seconds == pytest.approx(exhaustive(state, free), rel=REL_TOL)
    assert placed.bound is not None and placed.bound <= placed.cost.comm_seconds * (1 + 1e-9)


def test_no_bound_on_hosts_with_a_bandwidth_matrix() -> None:
    topo = Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "matrix",
            "levels": [
                {"name": "node", "bandwidth_gbps": 100.0, "latency_us": 1.0},
                {"name": "leaf", "bandwidth_gbps": 25.0, "latency_us": 3.0},
            ],
            "node_level": "node",
            "nvlink_domain": "node",
            "node_types": {
                "m": {
                    "gpus": 2,
                    "bandwidth_gbps": [[0.0, 50.0], [50.0, 0.0]],
                }
            },
            "nodes": [{"name": "h[1-2]", "type": "m", "domains": {"leaf": "l"}}],
        }
    )
    state = gpuplace.ClusterState(topo)
    assert core.lower_bound(state._core, TP2.compile(topo)) is None
    assert cpsat.proven_by_bound(state, TP2) is None


def test_auto_takes_the_shortcut_and_says_so() -> None:
    state = gpuplace.ClusterState(Topology.preset("h100-superpod", nodes=8))
    job = Job(
        "tp8dp4",
        tp=8,
        dp=4,
        communication={
            "tp": Communication("all-reduce", 1e9),
            "dp": Communication("all-reduce", 4e9),
        },
    )
    placed = gpuplace.place(state, job, "auto")
    assert placed.optimal is True
    assert placed.details["formulation"] == "lower bound"
    assert "lower bound" in placed.details["auto"]
    assert placed.bound == pytest.approx(placed.cost.comm_seconds, rel=1e-9)


PRESETS = {
    "h100-superpod": Topology.preset("h100-superpod", nodes=8, oversubscription=4),
    "a100-pod": Topology.preset("a100-pod", nodes=6),
    "pcie-cluster": Topology.preset("pcie-cluster", nodes=4),
    "gb200-nvl72": Topology.preset("gb200-nvl72", racks=2),
}


@settings(
    max_examples=16, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    cluster=st.sampled_from(sorted(PRESETS)),
    shape=st.sampled_from([{"tp": 4}, {"tp": 8, "dp": 2}, {"tp": 4, "dp": 4}, {"dp": 2, "pp": 2}]),
    data=st.data(),
)
def test_shortcut_is_never_above_the_full_cpsat_on_presets(
    cluster: str, shape: dict[str, int], data: st.DataObject
) -> None:
    """On the presets (NVL72's rack-wide NVLink domain, PCIe hosts whose switches lie below the
    NVLink domain, an oversubscribed fabric) a fragmented state with a running neighbour: where
    the shortcut proves a placement, the full CP-SAT path finds nothing cheaper."""
    topo = PRESETS[cluster]
    state = gpuplace.ClusterState(topo)
    busy = data.draw(st.sets(st.integers(0, topo.num_gpus - 1), max_size=topo.num_gpus // 2))
    if len(busy) >= 2:
        neighbour = Job(
            "other",
            dp=len(busy),
            confine={},
            communication={"dp": Communication("all-reduce", 4e9)},
        )
        state.allocate(name="other", gpus=sorted(busy), job=neighbour)
    job = Job(
        "j",
        **shape,
        communication={
            d: Communication(
                "p2p" if d == "pp" else "all-reduce", data.draw(st.sampled_from([1e5, 2e9]))
            )
            for d in shape
        },
    )
    shortcut = cpsat.proven_by_bound(state, job)
    if shortcut is None:
        event("no shortcut")
        return
    event("shortcut taken")
    cost = gpuplace.evaluate(topo, job, shortcut.gpus, state=state).comm_seconds
    full = cpsat.solve(state, job, time_limit=10, num_workers=1, shortcut=False)
    full_cost = gpuplace.evaluate(topo, job, full.gpus, state=state).comm_seconds
    assert cost <= full_cost * (1 + REL_TOL) + 1e-15
    if full.optimal:
        assert cost == pytest.approx(full_cost, rel=REL_TOL, abs=1e-15)
