"""Every solver prices on the state's real hardware: on random degraded states each solver's
reported cost is the evaluator's, ``cpsat`` equals exhaustive enumeration and is never above
another solver, and ``optimal=True`` is a proof on the degraded prices."""

from __future__ import annotations

import itertools
import math

import gpuplace
import numpy as np
import pytest
from gpuplace import Communication, Job, Topology
from gpuplace.placement.solvers import auto, cpsat, cpsat_gpus
from hypothesis import given
from hypothesis import strategies as st

#: Relative slack on costs: CP-SAT's rounding plus floating-point noise (as in test_cpsat).
REL_TOL = 1e-6
KINDS = {"tp": "all-reduce", "cp": "all-gather", "ep": "all-to-all", "dp": "all-reduce"}


@pytest.fixture(autouse=True)
def _one_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # The machine is shared: never let a test take every core.
    monkeypatch.setenv(cpsat.WORKERS_ENV, "1")


def railed_cluster() -> Topology:
    """12 GPUs: 3 hosts of 4 GPUs with two NICs each (GPUs 0-1 on mlx5_0, 2-3 on mlx5_1);
    hosts a, b under leaf l1, host c under leaf l2."""
    return Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "railed",
            "levels": [
                {"name": "node", "bandwidth_gbps": 300.0, "latency_us": 1.0},
                {"name": "leaf", "bandwidth_gbps": 50.0, "latency_us": 3.0},
                {"name": "spine", "bandwidth_gbps": 25.0, "latency_us": 5.0},
            ],
            "node_level": "node",
            "nvlink_domain": "node",
            "node_types": {
                "box": {"gpus": 4, "nics": ["mlx5_0", "mlx5_1"], "gpu_nic": [0, 0, 1, 1]}
            },
            "nodes": [
                {"name": "a", "type": "box", "domains": {"leaf": "l1", "spine": "s"}},
                {"name": "b", "type": "box", "domains": {"leaf": "l1", "spine": "s"}},
                {"name": "c", "type": "box", "domains": {"leaf": "l2", "spine": "s"}},
            ],
        }
    )


TOPOLOGY = railed_cluster()
FACTORS = (0.05, 0.3, 0.5, 0.8)


@st.composite
def degraded_instances(draw: st.DrawFn) -> tuple[gpuplace.ClusterState, Job]:
    """A tiny fragmented state with random degraded GPUs, hosts, NICs and leaves, and a small
    job (tp / cp / ep / dp / pp up to 4 ranks, some confinement)."""
    state = gpuplace.ClusterState(TOPOLOGY)
    free = draw(st.sets(st.integers(0, 11), min_size=5, max_size=8))
    busy = sorted(set(range(12)) - free)
    if busy:
        state.allocate(name="other", gpus=busy)
    events = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["gpu", "host", "nic", "switch"]),
                st.integers(0, 11),
                st.sampled_from(FACTORS),
            ),
            min_size=1,
            max_size=3,
        )
    )
    for kind, index, factor in events:
        target = {
            "gpu": index,
            "host": "abc"[index % 3],
            "nic": f"{'abc'[index % 3]}:mlx5_{index % 2}",
            "switch": f"l{1 + index % 2}",
        }[kind]
        state.degrade(factor=factor, **{kind: target})
    if draw(st.integers(0, 5)) == 0:
        # An explicit traffic matrix (quadratic-assignment form) over 3 or 4 ranks.
        n = draw(st.integers(3, 4))
        rows = draw(
            st.lists(
                st.tuples(
                    st.integers(0, n - 1), st.integers(0, n - 1), st.sampled_from([1e6, 1e9])
                ),
                min_size=1,
                max_size=6,
            )
        )
        max_span = draw(st.sampled_from([None, "leaf"]))
        return state, Job.from_traffic("t", np.array(rows, dtype=float), ranks=n, max_span=max_span)
    shape = draw(
        st.sampled_from(
            [{"dp": 3}, {"dp": 4}, {"tp": 2, "dp": 2}, {"dp": 2, "pp": 2}, {"ep": 2, "dp": 2}]
        )
    )
    sizes = {d: draw(st.sampled_from([1e3, 1e8, 1e9])) for d in shape}
    confine = draw(st.sampled_from([{}, {"tp": "node"}, {"dp": "leaf"}]))
    job = Job(
        "j",
        **shape,
        confine={d: lv for d, lv in confine.items() if d in shape},
        max_span=draw(st.sampled_from([None, None, "leaf"])),
        communication={d: Communication("p2p" if d == "pp" else KINDS[d], sizes[d]) for d in shape},
    )
    return state, job


def exhaustive(state: gpuplace.ClusterState, job: Job) -> float:
    """Least real cost over every injective rank -> free GPU map that meets the job's rules."""
    free = np.flatnonzero(state.pricing_view().usable).tolist()
    best = np.inf
    for perm in itertools.permutations(free, job.gpus):
        report = gpuplace.evaluate(state.topology, job, perm, state=state)
        if report.confinement_ok and report.comm_seconds < best:
            best = report.comm_seconds
    return float(best)


def placements(state: gpuplace.ClusterState, job: Job) -> dict[str, gpuplace.Placement]:
    """Every registered solver's placement (those that find one)."""
    out = {}
    for name in gpuplace.solvers():
        try:
            out[name] = gpuplace.place(state, job, name, time_limit=20)
        except gpuplace.Infeasible:
            continue
    return out


@given(instance=degraded_instances())
def test_every_solver_reports_the_cost_the_evaluator_gives(
    instance: tuple[gpuplace.ClusterState, Job],
) -> None:
    state, job = instance
    for name, placement in placements(state, job).items():
        real = gpuplace.evaluate(state.topology, job, placement.gpus, state=state)
        assert placement.cost == real, name
        refined = gpuplace.refine(state, placement, time_limit=0.05, max_iterations=200)
        again = gpuplace.evaluate(state.topology, job, refined.gpus, state=state)
        assert refined.cost == again, f"{name}+refine"
        assert refined.cost.comm_seconds <= placement.cost.comm_seconds * (1 + REL_TOL), name
        if placement.bound is not None:
            assert placement.bound <= real.comm_seconds * (1 + REL_TOL), name


@given(instance=degraded_instances())
def test_cpsat_equals_exhaustive_enumeration_and_beats_every_solver(
    instance: tuple[gpuplace.ClusterState, Job],
) -> None:
    state, job = instance
    expected = exhaustive(state, job)
    if not np.isfinite(expected):
        with pytest.raises(gpuplace.Infeasible):
            gpuplace.place(state, job, "cpsat", time_limit=20)
        return
    found = placements(state, job)
    best = found["cpsat"]
    # A proof on the real prices: the block model meeting its bound, the GPU-level model on
    # exact prices, or enumeration (these instances have at most 8P4 = 1,680 placements).
    assert best.optimal is True
    assert best.cost.confinement_ok
    assert best.cost.comm_seconds == pytest.approx(expected, rel=REL_TOL)
    for name, other in found.items():
        if other.cost.confinement_ok:
            assert best.cost.comm_seconds <= other.cost.comm_seconds * (1 + REL_TOL), name


def tp_dp_job(tp: int, dp: int, tp_bytes: float, dp_bytes: float) -> Job:
    """tp all-reduces of ``tp_bytes`` and dp all-reduces of ``dp_bytes`` per step."""
    return Job(
        "j",
        tp=tp,
        dp=dp,
        communication={
            "tp": Communication("all-reduce", tp_bytes),
            "dp": Communication("all-reduce", dp_bytes),
        },
    )


def issue_scenario() -> tuple[gpuplace.ClusterState, Job]:
    """h100-superpod with 2 nodes; GPUs 0, 1 and 8-13 busy; GPUs 2-5 degraded to 5 %."""
    topology = Topology.preset("h100-superpod", nodes=2)
    state = gpuplace.ClusterState(topology)
    state.allocate(name="bg", gpus=[0, 1, 8, 9, 10, 11, 12, 13])
    state.degrade(gpu=[2, 3, 4, 5], factor=0.05)
    return state, tp_dp_job(2, 2, 4e9, 1e9)


@pytest.mark.parametrize("solver", ["cpsat", "auto", "greedy", "refine"])
def test_issue_scenario_avoids_the_degraded_gpus(solver: str) -> None:
    state, job = issue_scenario()
    placement = gpuplace.place(state, job, solver)
    assert sorted(placement.gpus.tolist()) == [6, 7, 14, 15]
    # tp on NVLS inside each host, dp rings over the fabric (NCCL's algorithm choice).
    assert placement.cost.class_algorithms == {"tp all-reduce": "nvls", "dp all-reduce": "ring"}
    assert placement.cost.comm_seconds == pytest.approx(0.0285406, rel=1e-5)
    assert exhaustive(state, job) == pytest.approx(placement.cost.comm_seconds, rel=REL_TOL)
    if solver in ("cpsat", "auto"):
        assert placement.optimal is True
        assert placement.bound is not None
        assert placement.bound <= placement.cost.comm_seconds


def test_auto_routes_tiny_degraded_instances_to_enumeration() -> None:
    """8 free GPUs, 4 ranks: 1,680 placements, each priced by the core's evaluator."""
    state, job = issue_scenario()
    fits, why = auto.cpsat_fits(state, job)
    assert fits and "enumeration of 1680 placements" in why
    assert gpuplace.place(state, job, "cpsat").details["formulation"] == "enumeration"


def test_gpu_model_proves_pipelines_on_degraded_hardware() -> None:
    """Point-to-point is priced by the GPU-level model exactly as the core prices it, so on
    too many placements to enumerate it still proves optimality. (An all-to-all was too while
    the core priced it by its slowest pair; across NVLink domains the core now prices it per
    domain, fabric bytes over NIC shares plus NVLink rounds, which the model does not state.)"""
    topology = Topology.preset("h100-superpod", nodes=2)
    state = gpuplace.ClusterState(topology)
    state.degrade(gpu=[0, 1, 2, 9], factor=0.1)
    job = Job(
        "moe",
        ep=2,
        pp=3,
        communication={"pp": Communication("p2p", 5e7)},
    )
    assert cpsat_gpus.exact_prices(job, topology)
    moe = Job(
        "moe",
        ep=2,
        pp=3,
        communication={
            "ep": Communication("all-to-all", 2e8),
            "pp": Communication("p2p", 5e7),
        },
    )
    assert not cpsat_gpus.exact_prices(moe, topology)
    assert math.perm(16, 6) > cpsat.ENUMERATE_MAX
    fits, why = auto.cpsat_fits(state, job)
    assert fits and "GPU-level" in why
    model = cpsat.solve(state, job, time_limit=30, shortcut=False)
    assert model.details["formulation"] == "gpus"
    assert model.optimal is True
    assert not set(model.gpus.tolist()) & {0, 1, 2, 9}
    cost = gpuplace.evaluate(topology, job, model.gpus, state=state)
    # All six ranks on the healthy GPUs of one host.
    assert cost.span_level == "node"
    for other in ("greedy", "refine", "first-fit"):
        found = gpuplace.place(state, job, other)
        assert cost.comm_seconds <= found.cost.comm_seconds * (1 + REL_TOL), other
    # Greedy's placement meets the core's lower bound here: cpsat returns it as proven
    # without building the model, at the model's cost.
    placement = gpuplace.place(state, job, "cpsat", time_limit=30)
    assert placement.details["formulation"] == "lower bound" and placement.optimal is True
    assert placement.cost.comm_seconds == pytest.approx(cost.comm_seconds, rel=REL_TOL)


def test_large_degraded_instances_claim_optimal_only_when_the_bound_meets_the_cost() -> None:
    """Too many GPUs for the GPU-level model: the relaxed block model gives a valid bound
    (healthy prices), and the answer is the cheapest of it, the healthy-GPU model and refine."""
    topology = Topology.preset("h100-superpod", nodes=8)
    state = gpuplace.ClusterState(topology)
    state.degrade(nic=f"{topology.hosts[0]}:mlx5_0", loss="1%")
    state.degrade(gpu=list(range(8, 16)), factor=0.2)
    job = tp_dp_job(8, 4, 1e9, 4e9)
    model = cpsat.solve(state, job, time_limit=5, shortcut=False)
    assert "relaxed" in model.details["formulation"]
    cost = gpuplace.evaluate(topology, job, model.gpus, state=state).comm_seconds
    refined = gpuplace.place(state, job, "refine")
    assert cost <= refined.cost.comm_seconds * (1 + REL_TOL)
    # Hosts 0 and 1 are slowed; the four healthy hosts cost the healthy price.
    used_hosts = {int(g) // 8 for g in model.gpus}
    assert not used_hosts & {0, 1}
    assert model.bound is not None
    assert model.bound <= cost * (1 + REL_TOL)
    healthy = gpuplace.evaluate(topology, job, model.gpus)
    assert cost == pytest.approx(healthy.comm_seconds)
    if model.optimal:
        assert cost <= model.bound * (1 + REL_TOL) + 1e-12
    # Greedy's four healthy hosts meet the core's lower bound: cpsat proves them optimal
    # without a model, at no more than the model's cost.
    placement = gpuplace.place(state, job, "cpsat", time_limit=5)
    assert placement.details["formulation"] == "lower bound" and placement.optimal is True
    assert placement.cost.comm_seconds <= cost * (1 + REL_TOL)


def test_pricing_view_matches_the_evaluator() -> None:
    state, _ = issue_scenario()
    view = state.pricing_view()
    assert view.usable.tolist() == state.free_mask().tolist()
    assert np.flatnonzero(view.degraded).tolist() == [2, 3, 4, 5]
    assert view.side_factors.shape == (16, 3)
    assert view.side_factors[2].tolist() == pytest.approx([0.05] * 3)
    matrix = view.bandwidth_matrix([2, 3, 6])
    healthy = state.topology.bandwidth_matrix([2, 3])[0, 1]
    assert matrix[0, 1] == pytest.approx(0.05 * healthy)
    assert matrix[1, 2] == pytest.approx(0.05 * healthy)
    assert np.isinf(matrix[0, 0])
    # A point-to-point transfer from degraded GPU 2 to GPU 6: the evaluator charges exactly the
    # view's price (ring collectives add NCCL's algorithms on top of the same bandwidths).
    steps, per_rank = gpuplace.cluster.pricing.collective_terms("p2p", 2, 1e9)
    pair = Job("p", pp=2, communication={"pp": Communication("p2p", 1e9)})
    latency = state.topology.levels[0].latency_us * 1e-6
    bandwidth = view.bandwidth_matrix([2, 6])[0, 1] * 1e9
    priced = gpuplace.evaluate(state.topology, pair, [2, 6], state=state).comm_seconds
    assert priced == pytest.approx(steps * latency + per_rank / bandwidth, rel=1e-12)
