"""Repair evacuates degraded hardware: under ``max_moves=k`` a whole confined group (counted
as its size) leaves a degraded NIC, host or switch when that lowers the cost, and the result
says which component it left."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

import gpuplace
import numpy as np
import pytest
from gpuplace import Job, TransformerModel
from gpuplace.sim.workload import fragment, training_job
from hypothesis import given
from hypothesis import strategies as st


@cache
def llama_405b() -> tuple[gpuplace.ClusterState, Job, str]:
    """The issue's case: tp8 pp16 dp128 (16,384 GPUs) on h100-superpod with 2,112 nodes, the
    NIC mlx5_0 of the host of rank 800 at 1 % loss. Returns (state, job, that NIC)."""
    topology = gpuplace.Topology.preset("h100-superpod", nodes=2112)
    state = gpuplace.ClusterState(topology)
    job = Job(
        name="llama",
        tp=8,
        pp=16,
        dp=128,
        model=TransformerModel(
            parameters=405e9,
            layers=126,
            hidden_size=16384,
            sequence_length=8192,
            micro_batches=16,
        ),
    )
    state.allocate(gpuplace.place(state, job))
    nic = f"{topology.host_of(int(state.jobs['llama'][800]))}:mlx5_0"
    return state, job, nic


def test_405b_job_leaves_the_lossy_nic_by_moving_one_tp_group() -> None:
    base, job, nic = llama_405b()
    healthy = gpuplace.evaluate(base.topology, job, base.jobs["llama"]).comm_seconds
    # tp all-reduce on NVLS 0.516 s, dp rings over the fabric 0.252 s, pp 0.022 s.
    assert healthy == pytest.approx(0.790, abs=5e-4)
    state = base.copy()
    state.degrade(nic=nic, loss="1%")
    slowed = gpuplace.evaluate(state.topology, job, state.jobs["llama"], state=state)
    # The lossy NIC (the preset names no transport: RoCE-like go-back-N, 45 % at 1 %) slows
    # the dp rings through it, and the pipeline sends from that host.
    assert slowed.comm_seconds == pytest.approx(1.123, abs=5e-4)

    # A tp group is 8 ranks: 7 moves cannot take it off the NIC, and nothing else may move.
    stuck = gpuplace.repair(state.copy(), "llama", max_moves=7)
    assert stuck.moved == []
    assert stuck.cost_after.comm_seconds == slowed.comm_seconds

    result = gpuplace.repair(state, "llama", max_moves=8)
    assert sorted(result.moved_ranks) == list(range(800, 808))  # rank 800's tp group
    assert {m.kind for m in result.moved} == {"evacuated"}
    assert all(nic in m.reason and "packet loss 1%" in m.reason for m in result.moved)
    assert result.cost_before.comm_seconds == slowed.comm_seconds
    # Back to the healthy figure (the group's pipeline neighbours now sit a leaf further).
    assert result.cost_after.comm_seconds == pytest.approx(healthy, rel=1e-4)
    assert result.cost_after.confinement_ok
    new_hosts = {state.topology.host_of(m.new_gpu) for m in result.moved}
    assert len(new_hosts) == 1
    assert not state.pricing_view().any_degraded(state.jobs["llama"])
    state.check()


@given(
    seed=st.integers(0, 1000),
    max_moves=st.sampled_from([0, 4, 8, 16, 64]),
    where=st.sampled_from(["nic", "host", "leaf"]),
)
def test_evacuation_moves_whole_groups_within_max_moves_and_never_raises_the_cost(
    superpod: gpuplace.Topology, seed: int, max_moves: int, where: str
) -> None:
    state = gpuplace.ClusterState(superpod)
    fragment(state, 0.4, seed=seed)
    job = training_job("llama", 64, pp=2)
    state.allocate(gpuplace.place(state, job))
    old = state.jobs["llama"].copy()
    rng = np.random.default_rng(seed)
    victim = int(old[rng.integers(len(old))])
    if where == "nic":
        host = superpod.host_of(victim)
        state.degrade(nic=f"{host}:mlx5_{superpod.local_index(victim)}", loss="1%")
    elif where == "host":
        state.degrade(host=superpod.host_of(victim), factor=0.3)
    else:
        state.degrade(switch=superpod.domain_of(victim, "leaf"), loss="2%")
    before = gpuplace.evaluate(superpod, job, old, state=state).comm_seconds
    result = gpuplace.repair(state, "llama", max_moves=max_moves)
    new = state.jobs["llama"]
    moved = np.flatnonzero(new != old)
    assert sorted(moved.tolist()) == sorted(result.moved_ranks)
    assert len(moved) <= max_moves
    assert len(moved) % 8 == 0  # whole tp groups only
    assert {m.kind for m in result.moved} <= {"evacuated", "improvement"}
    assert result.cost_after.comm_seconds <= before
    if len(moved):
        assert result.cost_after.comm_seconds < before
    assert result.cost_after.confinement_ok
    assert (state.health()[new] == 0).all()
    state.check()


def test_cli_repair_max_moves_evacuates(tmp_path) -> None:
    topology = gpuplace.Topology.preset("h100-superpod", nodes=8)
    state = gpuplace.ClusterState(topology)
    job = training_job("llama", 32, pp=2)
    state.allocate(gpuplace.place(state, job))
    rank = 9
    gpu = int(state.jobs["llama"][rank])
    nic = f"{topology.host_of(gpu)}:mlx5_{topology.local_index(gpu)}"
    state.degrade(nic=nic, loss="1%")
    state.save(tmp_path / "state.json")
    args = ["repair", "--state", "state.json", "-c", "h100-superpod", "--nodes", "8"]
    args += ["-j", "llama", "--max-moves", "8", "--format", "json"]
    result = subprocess.run(
        [sys.executable, "-m", "gpuplace.cli", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert len(document["moved"]) == 8
    assert {m["kind"] for m in document["moved"]} == {"evacuated"}
    assert rank in {m["rank"] for m in document["moved"]}
    assert document["cost_after"]["comm_seconds"] < document["cost_before"]["comm_seconds"]
    saved = gpuplace.ClusterState.load(topology, tmp_path / "state.json")
    assert not saved.pricing_view().any_degraded(saved.jobs["llama"])


def test_evacuation_reason_is_a_typed_move_reason_naming_the_component() -> None:
    topology = gpuplace.Topology.preset("h100-superpod", nodes=8)
    state = gpuplace.ClusterState(topology)
    job = training_job("llama", 32, pp=2)
    state.allocate(gpuplace.place(state, job))
    gpu = int(state.jobs["llama"][9])
    nic = f"{topology.host_of(gpu)}:mlx5_{topology.local_index(gpu)}"
    state.degrade(nic=nic, loss="1%")
    plan = state._core.repair(
        job.compile(topology), "llama", 8, gpuplace.SparePolicy.Allow, 24, None
    )
    assert len(plan.moves) == 8
    assert {m.reason for m in plan.moves} == {gpuplace.MoveReason.Evacuated}
    assert gpuplace.MoveReason.Evacuated.label == "evacuated"
    assert {m.component[0] for m in plan.moves} == {gpuplace.ComponentKind.Nic}
    assert {state.component_name(*m.component) for m in plan.moves} == {nic}
    assert all(m.level is None for m in plan.moves)
    # The repair's own report is what the state charges for the repaired placement.
    again = gpuplace.evaluate(topology, job, plan.gpus, state=state)
    assert plan.report_after.comm_seconds == again.comm_seconds == plan.cost_after
