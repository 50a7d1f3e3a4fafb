"""The CP-SAT solver: exact against exhaustive enumeration, never worse than the heuristics,
time-limited, and honest about infeasibility."""

from __future__ import annotations

import itertools
import time

import gpuplace
import numpy as np
import pytest
from gpuplace import Communication, Job, Topology
from gpuplace.placement.solvers import auto, cpsat
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: Relative slack on costs: CP-SAT's rounding (<= K * 1e-8 relative, K priced terms) plus
#: floating-point noise between the model's prices and the Rust evaluator's.
REL_TOL = 1e-6


@pytest.fixture(autouse=True)
def _two_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # The machine is shared: never let a test take every core.
    monkeypatch.setenv(cpsat.WORKERS_ENV, "1")


LOWER_BOUND_CLUSTERS = {
    "h100-superpod": Topology.preset("h100-superpod", nodes=6),
    "a100-pod": Topology.preset("a100-pod", nodes=6),
    "pcie-cluster": Topology.preset("pcie-cluster", nodes=4),
    "gb200-nvl72": Topology.preset("gb200-nvl72", racks=2),
    "oversubscribed": Topology.preset("h100-superpod", nodes=6, oversubscription=4),
}


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=st.sampled_from(sorted(LOWER_BOUND_CLUSTERS)),
    kind=st.sampled_from(["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p"]),
    size=st.sampled_from([1e3, 1e6, 1e8, 4e9]),
    data=st.data(),
)
def test_level_prices_never_exceed_the_evaluators_price(
    cluster: str, kind: str, size: float, data: st.DataObject
) -> None:
    """CP-SAT's bound rests on this: the price of a collective at its span level
    (``collective_seconds_by_level``) is at most what the evaluator charges for the same group,
    whatever GPUs it takes (NIC shares, ring order and NCCL's algorithm choice included)."""
    topo = LOWER_BOUND_CLUSTERS[cluster]
    n = 2 if kind == "p2p" else data.draw(st.integers(2, 16), label="n")
    gpus = data.draw(st.permutations(range(topo.num_gpus)), label="gpus")[:n]
    dim = "pp" if kind == "p2p" else "dp"
    job = Job("g", **{dim: n}, confine={}, communication={dim: Communication(kind, size)})
    report = gpuplace.evaluate(topo, job, gpus)
    assert report.span_level is not None
    span = topo.level_index(report.span_level)
    bound = topo._core.collective_seconds_by_level(kind, n, size)[span]
    assert bound <= report.comm_seconds * (1 + 1e-9), (report.class_algorithms, bound)


def small_cluster(*, latencies: tuple[float, ...] = (1.0, 1.5, 3.0, 5.0)) -> Topology:
    """16 GPUs: hosts of 4 GPUs in two PCIe pairs, 2 hosts per leaf, 2 leaves under a spine."""
    names = ("pair", "node", "leaf", "spine")
    bws = (100.0, 60.0, 25.0, 12.5)
    return Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "tiny",
            "levels": [
                {"name": n, "bandwidth_gbps": b, "latency_us": lat}
                for n, b, lat in zip(names, bws, latencies, strict=True)
            ],
            "node_level": "node",
            "nvlink_domain": "node",
            "node_types": {"box": {"gpus": 4, "sublevels": {"pair": [0, 0, 1, 1]}}},
            "nodes": [
                {"name": "n[1-2]", "type": "box", "domains": {"leaf": "l1", "spine": "s"}},
                {"name": "n[3-4]", "type": "box", "domains": {"leaf": "l2", "spine": "s"}},
            ],
        }
    )


def comm(**dims: tuple[str, float]) -> dict[str, Communication]:
    return {d: Communication(kind, size) for d, (kind, size) in dims.items()}


def occupy(state: gpuplace.ClusterState, gpus: list[int]) -> None:
    if gpus:
        state.allocate(name="other", gpus=gpus)


def brute_force(state: gpuplace.ClusterState, job: Job) -> float:
    """Least cost over every injective rank -> free GPU map that meets the job's rules."""
    free = np.flatnonzero(state.free_mask())
    best = np.inf
    for perm in itertools.permutations(free.tolist(), job.gpus):
        report = gpuplace.evaluate(state.topology, job, perm)
        if report.confinement_ok and report.comm_seconds < best:
            best = report.comm_seconds
    return float(best)


# Each case: job, busy GPUs, topology latencies. Enumeration sizes stay below ~100k maps.
EXACT_CASES = [
    # tp confined to the node, dp across: the count model
    (
        Job(
            "tp2dp2", tp=2, dp=2, communication=comm(tp=("all-reduce", 4e8), dp=("all-reduce", 1e9))
        ),
        [0, 5, 10, 15],
        None,
    ),
    # pipeline pairs between stages, dp rings inside each stage
    (
        Job(
            "dp2pp3",
            dp=2,
            pp=3,
            confine={},
            communication=comm(dp=("all-reduce", 5e8), pp=("p2p", 2e8)),
        ),
        [1, 2, 6, 9, 13, 14],
        None,
    ),
    (
        Job("tp2pp2", tp=2, pp=2, communication=comm(tp=("all-reduce", 1e8), pp=("p2p", 3e8))),
        [0, 3, 4, 8, 12],
        None,
    ),
    # two collective dims outside the blocks: the assignment model
    (
        Job(
            "ep2dp2",
            ep=2,
            dp=2,
            confine={},
            communication=comm(ep=("all-to-all", 6e8), dp=("all-reduce", 2e8)),
        ),
        [2, 7, 11],
        None,
    ),
    # dp confined to a leaf, max_span, and 7 ranks
    (
        Job("dp7", dp=7, confine={}, max_span="spine", communication=comm(dp=("all-reduce", 1e8))),
        [0, 1, 4, 6, 9, 10, 13, 14],
        None,
    ),
    (
        Job(
            "cp2dp2leaf",
            cp=2,
            dp=2,
            confine={"dp": "leaf"},
            communication=comm(cp=("all-gather", 3e8), dp=("all-reduce", 9e8)),
        ),
        [0, 4, 5, 9],
        None,
    ),
    # latencies that fall with the level (prices not monotone): the exact-indicator path
    (
        Job(
            "latency",
            dp=2,
            pp=2,
            confine={},
            communication=comm(dp=("all-reduce", 10.0), pp=("p2p", 10.0)),
        ),
        [1, 2, 7, 8, 13, 14],
        (20.0, 9.0, 30.0, 2.0),
    ),
]


#: Cases whose optimum spreads a ring over hosts with different GPU counts, where the model's
#: level prices are only a lower bound of the evaluator's (``_collective_price``).
RELAXED = {"dp7"}


def assert_optimal_or_relaxed(placement: gpuplace.Placement) -> None:
    """CP-SAT proves optimality unless a collective may leave the NVLink domain, where its level
    prices are lower bounds of the evaluator's (NIC shares depend on GPUs per host): then it
    claims no proof it lacks, and its bound stays below the cost."""
    topo = placement.topology
    if placement.optimal is True:
        return
    assert placement.optimal is False
    # The relaxation can only bite where the cluster has several NVLink domains.
    assert topo._core.domain_count(topo.nvlink_level) > 1
    assert placement.bound is not None and placement.bound <= placement.cost.comm_seconds


def assert_matches_brute_force(placement: gpuplace.Placement, expected: float) -> None:
    """Proven: the brute-force optimum. Relaxed (see above): the bound below the optimum, the
    cost at least it; the optimum itself is then found in most cases but not guaranteed."""
    assert_optimal_or_relaxed(placement)
    assert placement.bound is not None and placement.bound <= expected * (1 + REL_TOL)
    assert placement.cost.comm_seconds >= expected * (1 - REL_TOL)
    if placement.optimal:
        assert placement.cost.comm_seconds == pytest.approx(expected, rel=REL_TOL)


@pytest.mark.parametrize(
    ("job", "busy", "latencies"), EXACT_CASES, ids=lambda c: getattr(c, "name", "")
)
def test_cpsat_matches_exhaustive_enumeration(job: Job, busy: list[int], latencies) -> None:
    topo = small_cluster() if latencies is None else small_cluster(latencies=latencies)
    state = gpuplace.ClusterState(topo)
    occupy(state, busy)
    expected = brute_force(state, job)
    placement = gpuplace.place(state, job, "cpsat", time_limit=20)
    assert placement.cost.confinement_ok
    assert placement.cost.comm_seconds == pytest.approx(expected, rel=REL_TOL)
    assert placement.bound is not None and placement.bound <= expected * (1 + REL_TOL)
    d = placement.details
    if job.name in RELAXED:
        # Above the NVLink domain the model prices a lower bound of the evaluator's cost (NIC
        # shares depend on GPUs per host): its bound does not meet the cost, so this tiny
        # instance is settled by enumerating every placement on the evaluator.
        assert d["formulation"] == "enumeration"
        assert placement.optimal is True
        assert placement.bound == placement.cost.comm_seconds
        block = d["block_model"]
        assert block["objective_s"] <= placement.cost.comm_seconds + block["rounding_bound_s"]
        return
    assert placement.optimal is True
    # The model's objective is the evaluator's cost up to the stated rounding.
    assert abs(d["objective_s"] - placement.cost.comm_seconds) <= d["rounding_bound_s"] + 1e-12


def test_traffic_job_matches_exhaustive_enumeration() -> None:
    rng = np.random.default_rng(7)
    traffic = rng.integers(0, 4, size=(5, 5)) * 1e8
    np.fill_diagonal(traffic, 0)
    job = Job.from_traffic("qap", traffic)
    state = gpuplace.ClusterState(small_cluster())
    occupy(state, [0, 3, 5, 6, 9, 12, 15])
    expected = brute_force(state, job)
    placement = gpuplace.place(state, job, "cpsat", time_limit=20)
    assert placement.optimal is True
    assert placement.cost.comm_seconds == pytest.approx(expected, rel=REL_TOL)


# --------------------------------------------------------------------------- random instances
SHAPES = [
    {"tp": 2, "dp": 2},
    {"tp": 2, "pp": 2},
    {"dp": 4},
    {"dp": 2, "pp": 2},
    {"tp": 2, "dp": 2, "pp": 2},
    {"ep": 2, "dp": 3},
    {"cp": 2, "dp": 2, "pp": 2},
]


@st.composite
def instances(draw: st.DrawFn) -> tuple[gpuplace.ClusterState, Job]:
    topo = Topology.preset("h100-superpod", nodes=draw(st.sampled_from([4, 8])))
    state = gpuplace.ClusterState(topo)
    busy = draw(st.sets(st.integers(0, topo.num_gpus - 1), max_size=topo.num_gpus // 2))
    occupy(state, sorted(busy))
    shape = draw(st.sampled_from(SHAPES))
    kinds = {
        "tp": "all-reduce",
        "cp": "all-gather",
        "ep": "all-to-all",
        "dp": "all-reduce",
        "pp": "p2p",
    }
    sizes = {d: draw(st.sampled_from([1e6, 1e8, 3e9])) for d in shape}
    confine = {"tp": "node"} if draw(st.booleans()) else {}
    job = Job(
        "r",
        **shape,
        confine=confine,
        communication={d: Communication(kinds[d], sizes[d]) for d in shape},
    )
    return state, job


@settings(
    max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(instances())
def test_cpsat_never_worse_than_heuristics(instance: tuple[gpuplace.ClusterState, Job]) -> None:
    state, job = instance
    try:
        best = gpuplace.place(state, job, "cpsat", time_limit=10)
    except gpuplace.Infeasible:
        for name in ("greedy", "first-fit"):
            try:
                other = gpuplace.place(state, job, name)
            except gpuplace.Infeasible:
                continue
            assert not other.cost.confinement_ok, f"{name} placed a job cpsat called infeasible"
        return
    assert best.cost.confinement_ok
    tol = best.details["rounding_bound_s"] * 2 + REL_TOL * best.cost.comm_seconds
    for name in ("greedy", "first-fit", "random"):
        try:
            other = gpuplace.place(state, job, name)
        except gpuplace.Infeasible:
            continue
        if other.cost.confinement_ok:
            assert best.cost.comm_seconds <= other.cost.comm_seconds + tol, name
    if best.optimal:
        assert best.bound is not None and best.bound <= best.cost.comm_seconds + tol


TINY_SHAPES = [
    {"dp": 4},
    {"tp": 2, "dp": 2},
    {"dp": 2, "pp": 2},
    {"pp": 4},
    {"tp": 2, "pp": 2},
    {"dp": 2, "pp": 3},
    {"ep": 2, "dp": 2},
    {"cp": 2, "pp": 2},
]


@st.composite
def tiny_instances(draw: st.DrawFn, shape: dict[str, int]) -> tuple[gpuplace.ClusterState, Job]:
    latencies = draw(st.sampled_from([(1.0, 1.5, 3.0, 5.0), (20.0, 9.0, 30.0, 2.0)]))
    state = gpuplace.ClusterState(small_cluster(latencies=latencies))
    free = draw(st.sets(st.integers(0, 15), min_size=6, max_size=9))
    occupy(state, sorted(set(range(16)) - free))
    kinds = {
        "tp": "all-reduce",
        "cp": "all-gather",
        "ep": "all-to-all",
        "dp": "all-reduce",
        "pp": "p2p",
    }
    sizes = {d: draw(st.sampled_from([10.0, 1e7, 1e9])) for d in shape}
    confine = draw(st.sampled_from([{}, {"tp": "node"}, {"tp": "pair"}, {"dp": "leaf"}]))
    max_span = draw(st.sampled_from([None, None, "leaf"]))
    job = Job(
        "t",
        **shape,
        confine={d: lv for d, lv in confine.items() if d in shape},
        max_span=max_span,
        communication={d: Communication(kinds[d], sizes[d]) for d in shape},
    )
    return state, job


@pytest.mark.parametrize(
    "shape", TINY_SHAPES, ids=lambda s: "x".join(f"{d}{n}" for d, n in s.items())
)
@settings(
    max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_cpsat_is_optimal_on_random_tiny_instances(
    shape: dict[str, int], data: st.DataObject
) -> None:
    state, job = data.draw(tiny_instances(shape))
    expected = brute_force(state, job)
    if not np.isfinite(expected):
        with pytest.raises(gpuplace.Infeasible):
            gpuplace.place(state, job, "cpsat", time_limit=20)
        return
    placement = gpuplace.place(state, job, "cpsat", time_limit=20)
    assert placement.cost.confinement_ok
    assert_matches_brute_force(placement, expected)


# --------------------------------------------------------------------------- PCIe hosts
def pcie_tree() -> Topology:
    """12 GPUs shaped like the ``pcie-cluster`` preset: hosts of 6 GPUs in three PCIe-switch
    pairs, two switches on NUMA domain 0 and one on NUMA domain 1; the host is the NVLink
    domain (tp's confinement level), so the sites (PCIe switches) lie below it. As in the
    preset, a cross-host hop has a lower latency than a cross-socket one (prices are not
    monotone in the level)."""
    names = ("pcie-switch", "numa", "node", "leaf")
    bws = (64.0, 32.0, 16.0, 25.0)
    lats = (1.5, 2.0, 3.0, 2.5)
    return Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "pcie-tiny",
            "levels": [
                {"name": n, "bandwidth_gbps": b, "latency_us": lat}
                for n, b, lat in zip(names, bws, lats, strict=True)
            ],
            "node_level": "node",
            "nvlink_domain": "node",
            "node_types": {
                "pcie6": {
                    "gpus": 6,
                    "sublevels": {
                        "pcie-switch": [0, 0, 1, 1, 2, 2],
                        "numa": [0, 0, 0, 0, 1, 1],
                    },
                }
            },
            "nodes": [{"name": "p[1-2]", "type": "pcie6", "domains": {"leaf": "l"}}],
        }
    )


# Each case: job, busy GPUs. tp stays confined to the host (above the sites), so these run the
# assignment model with its capacity cuts and symmetry breaking. Small sizes (10, 1e7 bytes)
# make latency decide, where the cross-host hop is cheaper than the cross-socket one.
PCIE_CASES = [
    (
        Job(
            "tp2dp2", tp=2, dp=2, communication=comm(tp=("all-reduce", 1e9), dp=("all-reduce", 4e8))
        ),
        [3, 10],
    ),
    (
        Job(
            "tp2dp3", tp=2, dp=3, communication=comm(tp=("all-reduce", 1e8), dp=("all-reduce", 1e9))
        ),
        [0, 7, 11],
    ),
    (
        Job("tp2pp3", tp=2, pp=3, communication=comm(tp=("all-reduce", 1e9), pp=("p2p", 3e8))),
        [2, 5, 9],
    ),
    (
        Job(
            "dp3pp2-latency",
            dp=3,
            pp=2,
            confine={},
            communication=comm(dp=("all-reduce", 10.0), pp=("p2p", 10.0)),
        ),
        [0, 5, 8],
    ),
    (
        Job(
            "tp3ep2", tp=3, ep=2, communication=comm(tp=("all-reduce", 1e7), ep=("all-to-all", 1e9))
        ),
        [1, 4, 11],
    ),
    (
        Job(
            "cp2pp3-numa",
            cp=2,
            pp=3,
            confine={"cp": "numa"},
            communication=comm(cp=("all-gather", 1e9), pp=("p2p", 1e8)),
        ),
        [3, 8, 9],
    ),
    (Job("dp7", dp=7, confine={}, communication=comm(dp=("all-reduce", 1e8))), [2, 4, 6, 9]),
    # dp carries no traffic: its index is free, only tp is priced
    (Job("tp2dp2-free-dp", tp=2, dp=2, communication=comm(tp=("all-gather", 10.0))), [0, 1, 6]),
]


@pytest.mark.parametrize(("job", "busy"), PCIE_CASES, ids=lambda c: getattr(c, "name", ""))
def test_cpsat_matches_exhaustive_enumeration_on_pcie_hosts(job: Job, busy: list[int]) -> None:
    state = gpuplace.ClusterState(pcie_tree())
    occupy(state, busy)
    expected = brute_force(state, job)
    placement = gpuplace.place(state, job, "cpsat", time_limit=20)
    assert placement.cost.confinement_ok
    assert_matches_brute_force(placement, expected)
    # The block model's objective is the evaluator's cost up to the stated rounding when
    # proven, a lower bound of it otherwise (tiny instances are then settled by enumeration).
    d = placement.details.get("block_model", placement.details)
    assert d["objective_s"] <= placement.cost.comm_seconds + d["rounding_bound_s"] + 1e-12
    if placement.optimal and "block_model" not in placement.details:
        assert abs(d["objective_s"] - placement.cost.comm_seconds) <= d["rounding_bound_s"] + 1e-12


def test_capacity_cut_helpers() -> None:
    # Overlapping groups join into one component; blocks in no group are left out.
    assert cpsat._component_sizes(7, [(0, 1), (2, 3), (1, 2, 4)]) == [5]
    assert cpsat._component_sizes(6, [(0, 1), (2, 3)]) == [2, 2]
    # A stage of 8 ranks (tp2 x dp4) cannot stay on one NUMA domain of 4 GPUs.
    assert not cpsat._fits_side_by_side([8], [4, 4, 4])
    assert cpsat._fits_side_by_side([8], [8, 4])
    # Two components of 5 need two domains of at least 5.
    assert not cpsat._fits_side_by_side([5, 5], [6, 4, 4])
    assert cpsat._fits_side_by_side([5, 3], [6, 4])
    assert cpsat._fits_side_by_side([3, 3], [6])


def test_sixteen_ranks_proven_optimal_on_fragmented_pcie_cluster() -> None:
    """The issue's target on the PCIe preset: 16 ranks, tp confined above the sites."""
    from gpuplace.sim import workload

    topo = Topology.preset("pcie-cluster", nodes=16)
    state = gpuplace.ClusterState(topo)
    mix = workload.philly_running_mix().capped(topo.num_gpus // 8)
    workload.fragment(state, 0.3, seed=0, mix=mix, rounds=3, high_water=0.6)
    job = Job("t16", model=workload.DEFAULT_MODEL, tp=2, pp=2, dp=4)
    placement = gpuplace.place(state, job, "cpsat", time_limit=120)
    assert placement.details["formulation"] == "assignment"
    assert_optimal_or_relaxed(placement)
    assert placement.cost.confinement_ok
    greedy = gpuplace.place(state, job, "greedy")
    assert placement.cost.comm_seconds <= greedy.cost.comm_seconds * (1 + REL_TOL)


# --------------------------------------------------------------------------- limits and errors
def fragmented_superpod(nodes: int, seed: int) -> gpuplace.ClusterState:
    topo = Topology.preset("h100-superpod", nodes=nodes)
    state = gpuplace.ClusterState(topo)
    rng = np.random.default_rng(seed)
    busy = rng.choice(topo.num_gpus, size=topo.num_gpus // 2, replace=False)
    occupy(state, sorted(busy.tolist()))
    return state


def test_time_limit_is_respected() -> None:
    state = fragmented_superpod(32, seed=3)
    # Three collective dims outside the blocks: the large assignment model.
    job = Job(
        "big",
        ep=4,
        dp=4,
        pp=2,
        confine={},
        communication=comm(ep=("all-to-all", 1e9), dp=("all-reduce", 2e9), pp=("p2p", 1e8)),
    )
    start = time.perf_counter()
    placement = gpuplace.place(state, job, "cpsat", time_limit=1.0)
    elapsed = time.perf_counter() - start
    assert elapsed < 15.0  # model building and greedy come on top of the search limit
    assert placement.details["time_limit_s"] == 1.0
    assert placement.cost.confinement_ok
    if not placement.optimal:
        status = placement.details["status"]
        assert status in ("FEASIBLE", "UNKNOWN", "OPTIMAL")
        if status == "OPTIMAL":
            # Proven on the model's prices, lower bounds above the NVLink domain: not claimed
            # because the evaluated cost is above the bound.
            assert placement.bound is not None
            assert placement.cost.comm_seconds > placement.bound


def test_infeasible_raises_and_leaves_state_untouched() -> None:
    state = gpuplace.ClusterState(small_cluster())
    occupy(state, [0, 5, 10, 15])  # every host keeps 3 free GPUs
    before = state.snapshot()
    job = Job("tp4", tp=4, communication=comm(tp=("all-reduce", 1e8)))
    with pytest.raises(gpuplace.Infeasible, match="node"):
        gpuplace.place(state, job, "cpsat")
    assert state.snapshot() == before
    too_big = Job("huge", dp=13, confine={}, communication=comm(dp=("all-reduce", 1e8)))
    with pytest.raises(gpuplace.Infeasible, match="13 GPUs"):
        gpuplace.place(state, too_big, "cpsat")
    assert state.snapshot() == before


def test_infeasible_confinement_that_greedy_cannot_explain() -> None:
    # dp groups confined to a leaf, but no leaf has room for a dp group of 6.
    state = gpuplace.ClusterState(small_cluster())
    occupy(state, [0, 1, 2, 8, 9, 10])
    before = state.snapshot()
    job = Job("dp6", dp=6, confine={"dp": "leaf"}, communication=comm(dp=("all-reduce", 1e8)))
    with pytest.raises(gpuplace.Infeasible):
        gpuplace.place(state, job, "cpsat")
    assert state.snapshot() == before


def test_result_reports_proof_and_solver() -> None:
    state = fragmented_superpod(8, seed=1)
    job = Job("j", tp=2, dp=4, communication=comm(tp=("all-reduce", 1e8), dp=("all-reduce", 1e9)))
    p = gpuplace.place(state, job, "cpsat", time_limit=10)
    assert p.solver == "cpsat"
    for key in ("status", "objective_s", "gap", "wall_s", "num_workers", "rounding_bound_s"):
        assert key in p.details
    assert p.details["num_workers"] == 1
    # A proof needs CP-SAT's OPTIMAL and, for collectives leaving the NVLink domain (whose
    # level prices are lower bounds), the evaluated cost meeting the bound.
    assert not p.optimal or p.details["status"] == "OPTIMAL"
    assert_optimal_or_relaxed(p)
    if p.optimal:
        assert p.gap is not None and p.gap <= 1e-6


def test_auto_names_the_solver_that_ran() -> None:
    state = fragmented_superpod(8, seed=2)
    small = Job("s", tp=2, dp=2, communication=comm(tp=("all-reduce", 1e8), dp=("all-reduce", 1e9)))
    p = gpuplace.place(state, small, "auto", time_limit=5)
    assert p.solver == "cpsat"
    assert "auto" in p.details
    big_state = fragmented_superpod(64, seed=2)
    big = Job(
        "b",
        ep=8,
        dp=8,
        confine={},
        communication=comm(ep=("all-to-all", 1e9), dp=("all-reduce", 1e9)),
    )
    fits, _ = auto.cpsat_fits(big_state, big)
    assert not fits
    p = gpuplace.place(big_state, big, "auto")
    assert p.solver == auto.FALLBACK


def test_bandwidth_matrix_hosts_are_refused_not_mispriced() -> None:
    m = [[0, 50, 20, 20], [50, 0, 20, 20], [20, 20, 0, 50], [20, 20, 50, 0]]
    topo = Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "matrix",
            "levels": [
                {"name": "node", "bandwidth_gbps": 50, "latency_us": 1},
                {"name": "leaf", "bandwidth_gbps": 10, "latency_us": 3},
            ],
            "node_types": {"pcie": {"gpus": 4, "bandwidth_gbps": m}},
            "nodes": [{"name": "h[1-2]", "type": "pcie", "domains": {"leaf": "l"}}],
        }
    )
    state = gpuplace.ClusterState(topo)
    job = Job("j", dp=2, confine={}, communication=comm(dp=("all-reduce", 1e8)))
    with pytest.raises(gpuplace.GpuplaceError, match="bandwidth matrix"):
        gpuplace.place(state, job, "cpsat")
    assert gpuplace.place(state, job, "auto").solver == auto.FALLBACK


def test_ctrl_c_stops_cpsat_and_raises():
    """Ctrl-C during a CP-SAT search that would run a minute stops it promptly and raises
    KeyboardInterrupt, instead of CP-SAT ending quietly with its incumbent."""
    import os
    import signal
    import threading
    import time

    from gpuplace.sim.workload import DEFAULT_MODEL, fragment

    state = gpuplace.ClusterState(gpuplace.Topology.preset("pcie-cluster", nodes=32))
    fragment(state, 0.5, seed=1)
    job = gpuplace.Job(name="k", pp=4, dp=8, model=DEFAULT_MODEL)  # not proven within 8 s
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))  # into the search
    began = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            gpuplace.place(state, job, "cpsat", time_limit=60.0)
    finally:
        timer.cancel()
    assert time.perf_counter() - began < 10.0
