"""Invariants over random topologies, jobs and cluster histories (hypothesis).

Every property is checked against plain-Python ground truth: the reference evaluator
(``tests/reference.py``), a recount of the state, or an exhaustive search on tiny instances.
"""

from __future__ import annotations

import math

import gpuplace
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from reference import ReferenceTopology, reference_evaluate
from strategies import fragmented_states, jobs, topologies, topology_dicts

SOLVERS = ("greedy", "first-fit", "random")


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@st.composite
def placements(draw, topology: gpuplace.Topology, job: gpuplace.Job) -> list[int]:
    """Any injective rank -> GPU map."""
    return draw(
        st.lists(
            st.integers(0, topology.num_gpus - 1),
            min_size=job.gpus,
            max_size=job.gpus,
            unique=True,
        )
    )


# --------------------------------------------------------------------------- cost model
@given(st.data())
def test_rust_cost_equals_reference_evaluator(data):
    topology = data.draw(topologies, label="topology")
    job = data.draw(jobs(topology), label="job")
    gpus = data.draw(placements(topology, job), label="gpus")
    got = gpuplace.evaluate(topology, job, gpus)
    want = reference_evaluate(topology, job, gpus)
    assert close(got.comm_seconds, want.comm_seconds), (got, want)
    assert got.class_seconds.keys() == want.class_seconds.keys()
    for key, seconds in want.class_seconds.items():
        assert close(got.class_seconds[key], seconds), key
    assert close(got.traffic_seconds, want.traffic_seconds)
    assert got.bytes_by_level.keys() == want.bytes_by_level.keys()
    for level, amount in want.bytes_by_level.items():
        assert math.isclose(got.bytes_by_level[level], amount, rel_tol=1e-9, abs_tol=1e-6), level
    assert got.span_level == want.span_level
    assert got.confinement_ok == want.confinement_ok, (got.violations, want.violations)
    assert got.confinement_ok == (not got.violations)


@given(topologies)
def test_reference_topology_agrees_with_the_public_queries(topology):
    """The oracle recomputes GPU -> host / domain from the topology's parts; its lowest common
    levels must agree with what ``domain_of`` reports, so both sides price the same tree."""
    ref = ReferenceTopology(topology)
    assert ref.num_gpus == topology.num_gpus
    for gpu in range(topology.num_gpus):
        assert topology.hosts[ref.gpu_host[gpu]] == topology.host_of(gpu)
        assert ref.gpu_local[gpu] == topology.local_index(gpu)
    for a in range(topology.num_gpus):
        for b in range(topology.num_gpus):
            public = next(
                level
                for level in range(len(topology.levels))
                if topology.domain_of(a, level) == topology.domain_of(b, level)
            )
            assert ref.lca(a, b) == public


# --------------------------------------------------------------------------- solvers
@pytest.mark.parametrize("solver", SOLVERS)
@given(data=st.data())
def test_solvers_give_distinct_free_healthy_gpus(solver, data):
    topology = data.draw(topologies, label="topology")
    state = data.draw(fragmented_states(topology), label="state")
    job = data.draw(jobs(topology), label="job")
    free_before = state.free_mask().copy()
    snapshot = state.snapshot()
    try:
        placement = gpuplace.place(state, job, solver, seed=data.draw(st.integers(0, 2**32)))
    except gpuplace.Infeasible:
        assert solver == "greedy" or job.gpus > state.free_gpus
        return
    gpus = [int(g) for g in placement.gpus]
    assert len(gpus) == job.gpus
    assert len(set(gpus)) == len(gpus), "a GPU was given twice"
    health = state.health()
    for g in gpus:
        assert free_before[g], f"GPU {g} was not free"
        assert health[g] == 0, f"GPU {g} is failed or drained"
        assert state.owner_of(g) is None
    # place() never changes the state.
    assert state.snapshot() == snapshot


@given(st.data())
def test_random_solver_is_deterministic_for_a_seed(data):
    topology = data.draw(topologies)
    state = data.draw(fragmented_states(topology))
    job = data.draw(jobs(topology))
    assume(job.gpus <= state.free_gpus)
    seed = data.draw(st.integers(0, 1000))
    a = gpuplace.place(state, job, "random", seed=seed)
    b = gpuplace.place(state, job, "random", seed=seed)
    assert a.gpus.tolist() == b.gpus.tolist()


@given(st.data())
def test_greedy_keeps_confinement_and_max_span(data):
    topology = data.draw(topologies, label="topology")
    state = data.draw(fragmented_states(topology), label="state")
    job = data.draw(jobs(topology), label="job")
    try:
        placement = gpuplace.place(state, job, "greedy")
    except gpuplace.Infeasible:
        return
    assert placement.cost.confinement_ok, placement.cost.violations
    assert reference_evaluate(topology, job, placement.gpus).confinement_ok
    if job.max_span is not None and placement.cost.span_level is not None:
        names = topology.level_names
        assert names.index(placement.cost.span_level) <= topology.level_index(job.max_span)


def exhaustively_feasible(topology: gpuplace.Topology, state, job: gpuplace.Job) -> bool:
    """Whether any injective rank -> free GPU map keeps every confined group (and the whole
    job) inside its level: a backtracking search over all maps, pruning a partial map as
    soon as an assigned part of a group already spans too high (spans only grow)."""
    ref = ReferenceTopology(topology)
    free = [int(g) for g in np.flatnonzero(state.free_mask())]
    n = job.gpus
    if n > len(free):
        return False
    names = topology.level_names
    constraints: list[tuple[list[int], int]] = []
    top = len(names) - 1
    max_span = top if job.max_span is None else topology.level_index(job.max_span)
    constraints.append((list(range(n)), max_span))
    if job.traffic is None:
        for dim, level in job.confine.items():
            if getattr(job, dim) >= 2:
                limit = topology.level_index(level)
                constraints.extend(([int(r) for r in g], limit) for g in job.rank_groups(dim))
    by_rank: list[list[tuple[list[int], int]]] = [[] for _ in range(n)]
    for group, limit in constraints:
        for r in group:
            by_rank[r].append((group, limit))
    assignment: list[int | None] = [None] * n
    used: set[int] = set()

    def ok(rank: int) -> bool:
        g = assignment[rank]
        for group, limit in by_rank[rank]:
            for other in group:
                h = assignment[other]
                if h is not None and other != rank and ref.lca(g, h) > limit:
                    return False
        return True

    def search(rank: int) -> bool:
        if rank == n:
            return True
        for g in free:
            if g in used:
                continue
            assignment[rank] = g
            used.add(g)
            if ok(rank) and search(rank + 1):
                return True
            used.discard(g)
            assignment[rank] = None
        return False

    return search(0)


@given(st.data())
def test_greedy_is_infeasible_only_when_no_placement_exists(data):
    topology = gpuplace.Topology.from_dict(
        data.draw(topology_dicts(max_hosts=4, max_gpus_per_host=3), label="topology")
    )
    state = data.draw(fragmented_states(topology), label="state")
    assume(state.free_gpus <= 9)
    job = data.draw(jobs(topology, max_gpus=5), label="job")
    feasible = exhaustively_feasible(topology, state, job)
    try:
        placement = gpuplace.place(state, job, "greedy")
    except gpuplace.Infeasible as exc:
        assert not feasible, f"greedy said {exc} but a placement exists"
        return
    assert feasible
    assert placement.cost.confinement_ok


# --------------------------------------------------------------------------- state
@given(st.data())
def test_allocate_then_release_restores_the_state(data):
    topology = data.draw(topologies)
    state = data.draw(fragmented_states(topology))
    job = data.draw(jobs(topology))
    try:
        placement = gpuplace.place(state, job, data.draw(st.sampled_from(SOLVERS)))
    except gpuplace.Infeasible:
        return
    before = state.snapshot()
    counts = [state.free_counts(level).tolist() for level in range(len(topology.levels))]
    state.allocate(placement)
    assert state.free_gpus == before_free(before, topology) - job.gpus
    released = state.release(job.name)
    assert sorted(released.tolist()) == sorted(placement.gpus.tolist())
    assert state.snapshot() == before
    assert [state.free_counts(lv).tolist() for lv in range(len(topology.levels))] == counts


def before_free(snapshot, topology) -> int:
    out = {
        c["gpu"]
        for c in snapshot["health"]["components"]
        if c["kind"] == "gpu" and c["condition"] in ("failed", "drained")
    }
    for job in snapshot["jobs"]:
        out |= set(job["gpus"])
    return topology.num_gpus - len(out)


@given(st.data())
def test_a_failed_allocate_changes_nothing(data):
    topology = data.draw(topologies)
    state = data.draw(fragmented_states(topology))
    n = topology.num_gpus
    free = [int(g) for g in np.flatnonzero(state.free_mask())]
    blocked = [g for g in range(n) if g not in free]
    bad = data.draw(
        st.sampled_from(["taken-or-unhealthy", "duplicate", "missing-gpu", "name-in-use"])
    )
    gpus = data.draw(st.lists(st.sampled_from(free), unique=True, max_size=3)) if free else []
    name = "new"
    if bad == "taken-or-unhealthy":
        assume(blocked)
        gpus = [*gpus, data.draw(st.sampled_from(blocked))]
    elif bad == "duplicate":
        assume(gpus)
        gpus = [*gpus, gpus[0]]
    elif bad == "missing-gpu":
        gpus = [*gpus, n + data.draw(st.integers(0, 5))]
    else:
        assume(state.jobs and gpus)
        name = next(iter(state.jobs))
    before = state.snapshot()
    counts = [state.free_counts(lv).tolist() for lv in range(len(topology.levels))]
    with pytest.raises(gpuplace.InvalidState):
        state.allocate(name=name, gpus=gpus)
    assert state.snapshot() == before
    assert [state.free_counts(lv).tolist() for lv in range(len(topology.levels))] == counts


@given(st.data())
def test_snapshot_restore_round_trips(data):
    topology = data.draw(topologies)
    state = data.draw(fragmented_states(topology))
    snapshot = state.snapshot()
    restored = gpuplace.ClusterState.restore(topology, snapshot)
    assert restored.snapshot() == snapshot
    assert restored.free_mask().tolist() == state.free_mask().tolist()
    for level in range(len(topology.levels)):
        assert restored.free_counts(level).tolist() == state.free_counts(level).tolist()


@given(st.data())
def test_free_counters_equal_a_recount(data):
    topology = data.draw(topologies)
    state = data.draw(fragmented_states(topology))
    # A job may also be placed, allocated and its GPUs recovered or failed afterwards.
    job = data.draw(jobs(topology))
    try:
        state.allocate(gpuplace.place(state, job, "first-fit"))
    except gpuplace.Infeasible:
        pass
    if data.draw(st.booleans()):
        state.recover_gpus(range(topology.num_gpus))
    state.check()  # the core's recount equals its counters
    free = state.free_mask()
    ref = ReferenceTopology(topology)
    for level in range(len(topology.levels)):
        counters = state._core.free_counts(level).tolist()
        # And a recount of our own, by domain identity.
        mine: dict[object, int] = {}
        for g in range(topology.num_gpus):
            mine[ref.domain(g, level)] = mine.get(ref.domain(g, level), 0) + int(free[g])
        assert sorted(counters) == sorted(mine.values())
    assert state.free_gpus == int(free.sum())
