"""One request in, one report out: the core's placement calls take the whole request and
return named results whose report carries what the placement shares (contention with the
running jobs, storage seconds), equal to what the separate bindings compute; a placement
passes the gate once whatever solver made it."""

from __future__ import annotations

import dataclasses
import pickle

import gpuplace
import numpy as np
import pytest
from gpuplace import _core
from gpuplace.model.storage import DataAccess, io_demands
from gpuplace.placement.place import shared_costs
from gpuplace.sim.workload import DEFAULT_MODEL


def _loaded(two_leaves) -> tuple[gpuplace.Topology, gpuplace.ClusterState, gpuplace.Job]:
    """Hosts 0 and 2 under different leaves run a job whose data-parallel ring crosses the
    spine; a new job of the same shape goes on hosts 1 and 3."""
    topo = two_leaves(lambda i: i % 2)
    state = gpuplace.ClusterState(topo)
    running = gpuplace.Job(name="running", tp=8, dp=2, model=DEFAULT_MODEL)
    state.allocate(name="running", gpus=np.r_[0:8, 16:24], job=running)
    return topo, state, gpuplace.Job(name="new", tp=8, dp=2, model=DEFAULT_MODEL)


def test_place_returns_a_named_result_whose_report_carries_the_contention(two_leaves) -> None:
    topo, state, job = _loaded(two_leaves)
    spec = job.compile(topo)
    placed = _core.place(state._core, spec, "first-fit")
    assert isinstance(placed, _core.PlaceResult)
    assert isinstance(placed.cost, _core.CostReport)
    assert placed.gpus.dtype == np.int64 and len(placed.gpus) == 16
    seen = _core.contention(state._core, spec, placed.gpus)
    assert placed.cost.alone_seconds == seen.alone_seconds
    assert placed.cost.comm_seconds == pytest.approx(seen.contended_seconds)
    assert [(u.uplink, u.direction) for u in placed.cost.hot_uplinks] == [
        (u.uplink, u.direction) for u in seen.uplinks
    ]
    assert placed.cost.io_seconds == 0.0
    # The public report names the same figures.
    report = gpuplace.evaluate(topo, job, placed.gpus, state=state)
    assert report.alone_seconds == seen.alone_seconds
    assert len(report.hot_uplinks) == len(seen.uplinks)
    # Nobody on the fabric: no contention part.
    empty = gpuplace.ClusterState(topo)
    alone = _core.place(empty._core, spec, "greedy").cost
    assert alone.alone_seconds is None and alone.hot_uplinks == []


def test_storage_seconds_come_with_the_report(two_leaves) -> None:
    base = two_leaves(lambda i: i % 2).to_dict()
    base["stores"] = {"lake": {"attach": "leaf:su1", "read_gbps": 2000, "write_gbps": 1000}}
    topo = gpuplace.Topology.from_dict(base)
    state = gpuplace.ClusterState(topo)
    job = gpuplace.Job(
        name="reader", tp=8, data=DataAccess(store="lake", input_bytes_per_step=40e9)
    )
    spec, io = job.compile(topo), io_demands(topo, job)
    gpus = np.arange(8, dtype=np.int64)  # host 0, under the other leaf
    report = _core.admit(state._core, spec, gpus, "test", True, io)
    level, domain, read_gbps, write_gbps, read, write = io[0]
    alone = _core.io_seconds(state._core, gpus, level, domain, read_gbps, write_gbps, read, write)
    assert report.io_seconds == alone > 0
    assert _core.evaluate(topo._core, spec, gpus, state._core, io).io_seconds == alone
    with pytest.raises(gpuplace.InvalidState, match="need a state"):
        _core.evaluate(topo._core, spec, gpus, None, io)


def test_refine_and_map_ranks_return_named_results(two_leaves) -> None:
    topo, state, job = _loaded(two_leaves)
    spec = job.compile(topo)
    start = _core.solve(state._core, spec, "first-fit")
    refined = _core.refine(state._core, spec, start, 0.05, 0, 2000)
    assert isinstance(refined, _core.RefineResult)
    assert refined.iterations >= refined.accepted >= 0
    assert refined.cost.comm_seconds <= _core.evaluate(
        topo._core, spec, start, state._core
    ).comm_seconds * (1 + 1e-12)
    assert refined.cost.alone_seconds is not None  # priced among the running jobs
    distance = np.array([[0.0, 1.0, 5.0], [1.0, 0.0, 5.0], [5.0, 5.0, 0.0]])
    traffic = np.array([[0.0, 9.0, 0.0], [9.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    mapping = _core.map_ranks(distance, 3, traffic_dense=traffic, time_limit=0.05)
    assert isinstance(mapping, _core.RankMapping)
    perm = mapping.perm.tolist()
    # The heavy pair sits on the close slots.
    assert {perm[0], perm[1]} == {0, 1}
    expected = sum(traffic[i, j] * distance[perm[i], perm[j]] for i in range(3) for j in range(3))
    assert mapping.cost == pytest.approx(expected)
    assert mapping.elapsed_s >= 0 and mapping.iterations >= 0


def test_solve_runs_the_solver_without_the_gate(two_leaves) -> None:
    topo = two_leaves(lambda i: i % 2)
    state = gpuplace.ClusterState(topo)
    spec = gpuplace.Job(name="j", tp=8, dp=2).compile(topo)
    assert np.array_equal(
        _core.solve(state._core, spec, "greedy"), _core.place(state._core, spec, "greedy").gpus
    )


@pytest.mark.parametrize("solver", ["greedy", "slurm-tree", "auto"])
def test_a_placement_passes_the_gate_once(solver: str, monkeypatch) -> None:
    """Python solvers, power slots and near-data views included: one gate per placement
    returned (a Rust solver's gate runs inside its one call)."""
    doc = {
        "format": "gpuplace.topology/1",
        "name": "racks",
        "levels": [
            {"name": "node", "bandwidth_gbps": 450, "latency_us": 1},
            {"name": "leaf", "bandwidth_gbps": 50, "latency_us": 2},
            {"name": "spine", "bandwidth_gbps": 50, "latency_us": 3},
        ],
        "node_types": {"box": {"gpus": 8, "gpu_model": "H100-SXM5-80GB"}},
        "nodes": [
            {"name": f"n{h}", "type": "box", "domains": {"leaf": f"l{h // 2}", "spine": "s"}}
            for h in range(8)
        ],
        "power_domains": [
            {"name": f"rack{r}", "hosts": f"n{2 * r},n{2 * r + 1}", "kind": "rack", "budget_w": 9e3}
            for r in range(4)
        ],
    }
    topo = gpuplace.Topology.from_dict(doc)
    state = gpuplace.ClusterState(topo)
    calls = {"admit": 0, "place": 0}
    admit, place = _core.admit, _core.place

    def counted(name, func):
        def run(*args, **kwargs):
            calls[name] += 1
            return func(*args, **kwargs)

        return run

    monkeypatch.setattr(_core, "admit", counted("admit", admit))
    monkeypatch.setattr(_core, "place", counted("place", place))
    placement = gpuplace.place(state, gpuplace.Job(name="j", tp=8), solver)
    # One power slot, one placement: exactly one gate.
    assert calls["admit"] + calls["place"] == 1, calls
    assert placement.cost.confinement_ok


def test_shared_costs_is_deprecated_and_agrees_with_the_report(two_leaves) -> None:
    topo, state, job = _loaded(two_leaves)
    gpus = np.r_[8:16, 24:32]
    with pytest.warns(DeprecationWarning, match="shared_costs is deprecated"):
        shared = shared_costs(topo, job, gpus, state)
    report = gpuplace.evaluate(topo, job, gpus, state=state)
    assert shared == {"alone_seconds": report.alone_seconds, "hot_uplinks": report.hot_uplinks}


def test_the_public_report_reads_the_cores_and_copies_as_a_plain_one(two_leaves) -> None:
    topo, state, job = _loaded(two_leaves)
    placement = gpuplace.place(state, job)
    report = placement.cost
    assert isinstance(report, gpuplace.CostReport)
    assert report.comm_seconds > 0 and report.alone_seconds is not None
    assert list(report.bytes_by_level) == topo.level_names
    assert report.class_seconds is report.class_seconds  # named once, then kept
    again = pickle.loads(pickle.dumps(report))
    assert type(again) is gpuplace.CostReport
    assert again == report and report == again and again.to_dict() == report.to_dict()
    changed = dataclasses.replace(report, io_seconds=1.5)
    assert type(changed) is gpuplace.CostReport and changed.io_seconds == 1.5
    assert changed.class_seconds == report.class_seconds and changed != report
    assert repr(report).startswith("CostReport(comm_seconds=")
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.comm_seconds = 0.0  # type: ignore[misc]
