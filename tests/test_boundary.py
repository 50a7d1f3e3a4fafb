"""The typed Python <-> Rust boundary: the core's enums as Python enums defined once, typed
results (a cost report and a repair plan, not dicts), one crossing for place, and core errors
arriving as gpuplace errors."""

from __future__ import annotations

import gpuplace
import numpy as np
import pytest
from gpuplace import _core
from gpuplace.placement import registry as placement_module
from gpuplace.sim.workload import DEFAULT_MODEL
from hypothesis import given
from hypothesis import strategies as st
from strategies import fragmented_states, jobs, topologies


def test_enums_are_the_cores_with_labels_and_codes():
    assert [k.label for k in gpuplace.CollectiveKind.members()] == list(gpuplace.model.job.KINDS)
    assert gpuplace.CollectiveKind.from_label("p2p") == gpuplace.CollectiveKind.PointToPoint
    assert [int(h) for h in gpuplace.Health.members()] == [0, 1, 2]
    assert [c.label for c in gpuplace.ComponentKind.members()] == ["gpu", "host", "nic", "switch"]
    assert gpuplace.SparePolicy.from_label("only") == gpuplace.SparePolicy.Only
    with pytest.raises(gpuplace.InvalidJob, match="expected one of allow, forbid, only"):
        gpuplace.SparePolicy.from_label("sometimes")
    with pytest.raises(gpuplace.InvalidState, match="expected one of ok, failed, drained"):
        gpuplace.Health.from_label("sick")


def test_health_codes_and_components_come_back_as_enums():
    state = gpuplace.ClusterState(gpuplace.Topology.preset("dgx-h100"))
    state.fail_gpus([3])
    state.drain_gpus([4])
    health = state.health()
    assert health[3] == int(gpuplace.Health.Failed) and health[4] == int(gpuplace.Health.Drained)
    state.degrade(factor=0.5, gpu=[5])
    (kind, a, _, _, factor, _), *_ = (
        c for c in state._core.components() if c[3] == gpuplace.Condition.Degraded
    )
    assert kind == gpuplace.ComponentKind.Gpu and a == 5 and factor == 0.5
    assert state.unhealthy()[-1]["condition"] == "degraded"


def test_place_crosses_once_and_returns_a_typed_cost_report():
    topo = gpuplace.Topology.preset("h100-superpod", nodes=4)
    state = gpuplace.ClusterState(topo)
    job = gpuplace.Job(name="j", tp=8, dp=2, model=DEFAULT_MODEL)
    placed = _core.place(state._core, job.compile(topo), "greedy")
    assert isinstance(placed, _core.PlaceResult)
    gpus, report = placed.gpus, placed.cost
    assert isinstance(report, _core.CostReport)
    assert report.confinement_ok and report.violations == []
    assert len(report.class_seconds) == len(job.compile(topo).class_names)
    again = _core.evaluate(topo._core, job.compile(topo), gpus, state._core)
    assert again.comm_seconds == report.comm_seconds
    assert np.array_equal(again.bytes_by_level, report.bytes_by_level)


def test_repair_returns_a_typed_plan_with_move_reasons():
    topo = gpuplace.Topology.preset("h100-superpod", nodes=4)
    state = gpuplace.ClusterState(topo)
    job = gpuplace.Job(name="j", tp=8, dp=2)
    placement = gpuplace.place(state, job)
    state.allocate(placement)
    lost = int(placement.gpus[0])
    state.fail_gpus([lost])
    plan = state._core.repair(job.compile(topo), "j", 0, gpuplace.SparePolicy.Allow)
    assert isinstance(plan, _core.RepairPlan)
    assert plan.moves and all(isinstance(m, _core.RankMove) for m in plan.moves)
    reasons = {m.reason for m in plan.moves}
    assert reasons <= {gpuplace.MoveReason.Lost, gpuplace.MoveReason.GroupMoved}
    assert lost not in plan.gpus.tolist()
    grouped = [m for m in plan.moves if m.reason == gpuplace.MoveReason.GroupMoved]
    assert all(m.level is not None for m in grouped)


def test_binding_errors_are_gpuplace_errors_never_bare_value_errors():
    topo = gpuplace.Topology.preset("dgx-h100")
    state = gpuplace.ClusterState(topo)
    with pytest.raises(gpuplace.InvalidState, match="unknown component kind 9"):
        state._core.set_condition(
            np.array([9]), np.array([0]), np.array([0]), gpuplace.Condition.Failed, 1.0, ""
        )
    with pytest.raises(gpuplace.InvalidTopology, match="level 7 does not exist"):
        topo._core.domain_count(7)
    with pytest.raises(gpuplace.InvalidJob, match="unknown collective kind"):
        topo._core.collective_seconds_by_level("all-shout", 4, 1.0)
    with pytest.raises(gpuplace.InvalidState, match="GPU 99 does not exist"):
        state._core.owner_of(99)


@given(st.data())
def test_every_registered_solver_passes_the_gate_or_says_infeasible(data):
    """Whatever state and job, every registered solver (but the slow exact ones) either
    raises Infeasible or returns a placement that passed the gate: one free, healthy GPU per
    rank, none twice, confinement kept by the solvers that promise it."""
    topology = data.draw(topologies, label="topology")
    state = data.draw(fragmented_states(topology), label="state")
    job = data.draw(jobs(topology), label="job")
    free = state.free_mask()
    for name, info in placement_module._REGISTRY.items():
        if name in ("cpsat", "auto"):
            continue
        try:
            placed = gpuplace.place(state, job, name, time_limit=0.05)
        except gpuplace.Infeasible:
            continue
        except gpuplace.InvalidTopology as exc:  # a peer baseline that needs switch levels
            assert name in ("slurm-tree", "kueue-bestfit"), f"{name}: {exc}"
            continue
        gpus = placed.gpus
        assert len(gpus) == job.gpus and len(set(gpus.tolist())) == len(gpus), name
        assert free[gpus].all(), name
        if info.confining:
            assert placed.cost.confinement_ok, name
