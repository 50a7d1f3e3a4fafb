"""Repair: surviving ranks stay (up to max_moves), lost ranks land on usable GPUs, confined
groups move whole when they must, infeasible repairs change nothing."""

from __future__ import annotations

import gpuplace
import numpy as np
import pytest
from gpuplace.sim.workload import fragment, training_job
from hypothesis import given
from hypothesis import strategies as st


def _placed(topo: gpuplace.Topology, size: int, occupancy: float = 0.0, seed: int = 0):
    state = gpuplace.ClusterState(topo)
    if occupancy:
        fragment(state, occupancy, seed=seed)
    job = training_job("llama", size, pp=2)
    state.allocate(gpuplace.place(state, job))
    return state, job


def test_failed_node_moves_only_its_ranks(superpod: gpuplace.Topology) -> None:
    state, _job = _placed(superpod, 128)
    old = state.jobs["llama"].copy()
    host = superpod.host_of(int(old[50]))
    state.fail(host=host)
    r = gpuplace.repair(state, "llama")
    lost = set(np.flatnonzero(state.health()[old] != 0).tolist())
    assert set(r.moved_ranks) == lost
    assert all(m.kind == "lost" for m in r.moved)
    assert (state.health()[state.jobs["llama"]] == 0).all()
    assert r.cost_after.confinement_ok
    state.check()


def test_tp_group_moves_whole_when_its_node_has_no_room(superpod: gpuplace.Topology) -> None:
    state, _job = _placed(superpod, 64)
    old = state.jobs["llama"].copy()
    state.fail(gpu=int(old[3]))  # one GPU of a full node: the tp group cannot stay
    r = gpuplace.repair(state, "llama")
    assert sorted(r.moved_ranks) == list(range(8))
    kinds = {m.rank: m.kind for m in r.moved}
    assert kinds[3] == "lost" and {kinds[i] for i in range(8) if i != 3} == {"group moved"}
    assert "tp group" in next(m.reason for m in r.moved if m.kind == "group moved")
    new = state.jobs["llama"]
    assert len({superpod.host_of(int(g)) for g in new[:8]}) == 1


def test_lost_rank_stays_in_its_node_when_there_is_room(superpod: gpuplace.Topology) -> None:
    state = gpuplace.ClusterState(superpod)
    job = gpuplace.Job(
        name="tp4", tp=4, dp=2, communication={"tp": gpuplace.Communication("all-reduce", 1e8)}
    )
    state.allocate(name="tp4", gpus=[0, 1, 2, 3, 8, 9, 10, 11])
    state.specs["tp4"] = job
    state.fail(gpu=2)
    r = gpuplace.repair(state, "tp4")
    assert r.moved_ranks == [2]
    assert superpod.host_of(r.moved[0].new_gpu) == "dgx001"


def test_infeasible_repair_names_what_is_missing_and_changes_nothing(
    superpod: gpuplace.Topology,
) -> None:
    state = gpuplace.ClusterState(superpod)
    state.allocate(gpuplace.place(state, training_job("llama", 64)))
    state.allocate(name="rest", gpus=[g for g in range(1024) if g >= 64])
    state.fail(host="dgx001")
    before = state.snapshot()
    with pytest.raises(gpuplace.Infeasible, match="free healthy GPUs inside one node"):
        gpuplace.repair(state, "llama")
    assert state.snapshot() == before


def test_spares_are_used_by_repair_only(superpod: gpuplace.Topology) -> None:
    state = gpuplace.ClusterState(superpod)
    spares = state.reserve_spares(hosts=["dgx032"])
    state.allocate(gpuplace.place(state, training_job("llama", 64)))
    state.allocate(
        name="rest", gpus=[g for g in range(1024) if g >= 64 and g not in set(spares.tolist())]
    )
    state.fail(host="dgx001")
    with pytest.raises(gpuplace.Infeasible):
        gpuplace.repair(state, "llama", spares=False)
    r = gpuplace.repair(state, "llama")
    assert {superpod.host_of(m.new_gpu) for m in r.moved} == {"dgx032"}
    assert len(state.spares) == 0
    state.check()


def test_repair_prefers_healthy_leaf(superpod: gpuplace.Topology) -> None:
    state = gpuplace.ClusterState(superpod)
    state.allocate(gpuplace.place(state, training_job("llama", 128)))
    # Fill the job's leaf but one host, and degrade that host's NICs.
    used = set(state.jobs["llama"].tolist())
    state.allocate(name="bg", gpus=[g for g in range(248) if g not in used])
    state.degrade(host="dgx032", loss=0.05)
    state.fail(host=superpod.host_of(int(state.jobs["llama"][0])))
    r = gpuplace.repair(state, "llama")
    assert (
        r.cost_after.comm_seconds
        <= gpuplace.evaluate(
            superpod, r.placement.job, _swap_to(state, r, "dgx032"), state=state
        ).comm_seconds
    )


def _swap_to(state: gpuplace.ClusterState, r: gpuplace.Repair, host: str) -> np.ndarray:
    gpus = r.placement.gpus.copy()
    target = state.topology.host_gpus(host)
    for m, g in zip(r.moved, target, strict=False):
        gpus[m.rank] = g
    return gpus


@given(
    seed=st.integers(0, 1000),
    max_moves=st.integers(0, 16),
    kind=st.sampled_from(["host", "gpu", "leaf", "drain"]),
)
def test_surviving_ranks_move_only_within_max_moves(
    superpod: gpuplace.Topology, seed: int, max_moves: int, kind: str
) -> None:
    state, _job = _placed(superpod, 96, occupancy=0.4, seed=seed)
    old = state.jobs["llama"].copy()
    rng = np.random.default_rng(seed)
    victim = int(old[rng.integers(len(old))])
    if kind == "host":
        state.fail(host=superpod.host_of(victim))
    elif kind == "gpu":
        state.fail(gpu=victim)
    elif kind == "drain":
        state.drain(gpu=victim)
    else:
        state.fail(switch=superpod.domain_of(victim, "leaf"))
    lost = set(np.flatnonzero(state.health()[old] != 0).tolist())
    before = state.snapshot()
    try:
        r = gpuplace.repair(state, "llama", max_moves=max_moves)
    except gpuplace.Infeasible:
        assert state.snapshot() == before
        return
    new = state.jobs["llama"]
    moved = set(np.flatnonzero(new != old).tolist())
    assert moved == set(r.moved_ranks)
    group_moves = {m.rank for m in r.moved if m.kind == "group moved"}
    extra = moved - lost - group_moves
    assert len(extra) <= max_moves
    assert all(m.kind == "improvement" for m in r.moved if m.rank in extra)
    assert (state.health()[new] == 0).all()
    assert r.cost_after.confinement_ok
    state.check()
