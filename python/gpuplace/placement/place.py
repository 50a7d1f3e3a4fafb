"""Placing jobs: :func:`place`, :func:`evaluate` and :func:`refine`.

Every solver shares one signature and returns the GPU of each rank; :func:`place` then gates
the result and prices it with the one cost model in the Rust core, so costs are comparable
across solvers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace.cluster.fabric import contention
from gpuplace.cluster.power import place_within_power
from gpuplace.cluster.state import ClusterState
from gpuplace.cluster.storage import io_seconds, near_data_views
from gpuplace.errors import Infeasible, InvalidJob, InvalidState
from gpuplace.placement.elastic import place_elastic
from gpuplace.placement.registry import SolverInfo, solver_info
from gpuplace.placement.result import CostReport, Placement, SolveResult, cost_report
from gpuplace.placement.within_policy import place_within
from gpuplace.policy.fence import allowed_gpus, can_borrow, has_rules

if TYPE_CHECKING:
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = ["evaluate", "place", "place_near_data", "refine", "shared_costs"]


def evaluate(
    topology: Topology, job: Job, gpus: Any, *, state: ClusterState | None = None
) -> CostReport:
    """Price a placement (``gpus[rank]`` = GPU id) with the one cost model; with ``state``,
    on that state's hardware (degraded NICs and switches slow the paths through them) and
    with its running jobs on the fabric (the report then gives the slowdown from contention
    and the uplinks responsible)."""
    spec = job.compile(topology)
    core_state = None if state is None else state._core
    raw = _core.evaluate(topology._core, spec, np.asarray(gpus, dtype=np.int64), core_state)
    return cost_report(topology, job, gpus, spec, raw, **shared_costs(topology, job, gpus, state))


def shared_costs(
    topology: Topology, job: Job, gpus: Any, state: ClusterState | None
) -> dict[str, Any]:
    """What a placement shares with others: priced in a state whose running jobs load the
    fabric, its seconds alone and the hot uplinks on its paths; with stores, its storage I/O."""
    shared: dict[str, Any] = {}
    if state is not None and state.fabric_loaded():
        seen = contention(state, job, gpus)
        shared = {"alone_seconds": seen.alone_seconds, "hot_uplinks": seen.uplinks}
    if getattr(job, "data", None) is not None and topology.stores:
        shared["io_seconds"] = io_seconds(
            state if state is not None else ClusterState(topology), job, gpus
        )
    return shared


def refine(
    state: ClusterState,
    placement: Placement,
    *,
    time_limit: float = 0.5,
    seed: int = 0,
    max_iterations: int = 200_000,
) -> Placement:
    """Improve any placement by local search (rank swaps, moves to free GPUs near a rank's
    partners) on the one cost model, within ``time_limit`` seconds; never worse than the
    start and never breaking confinement. The GPUs of the start count as usable even when the
    job already holds them in ``state``. Deterministic for a seed when the iteration budget,
    not the time limit, ends the search."""
    if placement.topology is not state.topology:
        raise InvalidJob("the placement was made for another topology than the state's")
    start = time.perf_counter()
    view = state.fenced_view(
        allowed_gpus(state, placement.job) if has_rules(state, placement.job) else None
    )
    spec = placement.job.compile(state.topology)
    gpus, raw, _, iterations, accepted = _core.refine(
        view._core,
        spec,
        np.asarray(placement.gpus, dtype=np.int64),
        float(time_limit),
        int(seed),
        int(max_iterations),
    )
    elapsed = time.perf_counter() - start
    return Placement(
        job=placement.job,
        topology=state.topology,
        gpus=np.asarray(gpus, dtype=np.int64),
        # Priced on the state in the same call into the core.
        cost=cost_report(
            state.topology,
            placement.job,
            gpus,
            spec,
            raw,
            **shared_costs(state.topology, placement.job, gpus, state),
        ),
        solver=f"{placement.solver}+refine",
        elapsed_s=placement.elapsed_s + elapsed,
        details={"refine_iterations": iterations, "refine_accepted": accepted},
    )


def place(
    state: ClusterState,
    job: Job,
    solver: str = "greedy",
    *,
    seed: int = 0,
    time_limit: float | None = None,
    neighbours: bool = True,
    preempt: bool = False,
) -> Placement:
    """Place ``job`` on the free GPUs of ``state`` with a registered solver.

    Where running jobs load the fabric, the Rust solvers price a candidate with that load
    and, with ``neighbours`` (the default), add the time it would cost the running jobs. With
    power domains the solver sees only what the budgets leave free; a job with a dataset is
    also tried next to its data.

    Whatever solver made it, the placement passes one gate in the core before it is returned:
    one GPU per rank, no GPU twice, only free and healthy GPUs (no reserved spares, none the
    job's policy fences off), and the job's confinement rules when the solver promises them; it
    is priced on the state's hardware, among its running jobs, in the same call. A placement
    that fails the gate raises :class:`gpuplace.InvalidState` naming the solver and what is
    wrong.

    The state is not changed: call ``state.allocate(placement)`` to take the GPUs. The job's
    pool and hardware rules (``job.policy``) fence off the GPUs it may not use, for every
    solver. With ``preempt=True``, when nothing fits, the placement may propose preempting
    lower-priority preemptible jobs (``details["preemption"]``; apply it with
    :func:`gpuplace.apply_preemption`). Raises :class:`gpuplace.Infeasible` (saying why, with
    the full account as ``explanation``) when the job cannot be placed.
    """
    info = solver_info(solver)
    if time_limit is not None and not time_limit > 0:
        raise InvalidJob(f"time_limit must be > 0 seconds, got {time_limit!r}")

    if job.elastic is not None:
        return place_elastic(
            state,
            job,
            lambda st, concrete: place(
                st,
                concrete,
                solver,
                seed=seed,
                time_limit=time_limit,
                neighbours=neighbours,
                preempt=preempt,
            ),
            precheck=not (preempt or can_borrow(state, job)),
        )

    def solve(view: ClusterState) -> Placement:
        return _solve(view, job, info, seed, time_limit, neighbours)

    return place_within(state, job, solve, preempt=preempt)


def _solve(
    state: ClusterState,
    job: Job,
    info: SolverInfo,
    seed: int,
    time_limit: float | None,
    neighbours: bool,
) -> Placement:
    """One solver run on ``state`` (the job's fenced view), through the gate and priced."""
    start = time.perf_counter()
    solver = info.name
    spec = job.compile(state.topology)
    has_data = getattr(job, "data", None) is not None and bool(state.topology.stores)
    if info.rust and not state.topology.power_domains and not has_data:
        # Solver and gate in one call into the core.
        gpus, raw = _core.place(state._core, spec, solver, seed, time_limit, neighbours)
        result = SolveResult(gpus=gpus)
    else:

        def solve_here(view: ClusterState) -> SolveResult:
            if info.rust:
                found, _ = _core.place(view._core, spec, solver, seed, time_limit, neighbours)
                return SolveResult(gpus=found)
            found_result = info.func(view, job, seed, time_limit)
            if view is not state:
                # The gate on the view the solver was given (on the state itself, below).
                gpus = _gpu_ids(solver, found_result.gpus)
                _core.admit(view._core, spec, gpus, solver, info.confining)
            return found_result

        def solve(view: ClusterState) -> SolveResult:
            found = solve_here(view)
            if has_data:
                found = place_near_data(view, job, solve_here, found)
            return found

        if state.topology.power_domains:
            # Every phase slot is tried and the cheapest placement kept: a later slot inside
            # one rack beats slot 0 split across racks.
            result, slot = place_within_power(
                state,
                job,
                solve,
                cost=lambda found: _total_seconds(state, job, found.gpus),
                enough=lambda found: _tightest(state.topology, job, found.gpus),
            )
            phases = state.topology.power_phases
            extra = {"phase_slot": slot, "phase_offset": slot / phases} if phases > 1 else {}
            result = SolveResult(
                gpus=result.gpus,
                optimal=result.optimal,
                bound=result.bound,
                solver=result.solver,
                details={**result.details, **extra},
            )
        else:
            result = solve(state)
        gpus = _gpu_ids(solver, result.gpus)
        # The gate: length, no GPU twice, free and healthy GPUs, confinement as promised.
        raw = _core.admit(state._core, spec, gpus, solver, info.confining)
    elapsed = time.perf_counter() - start
    return Placement(
        job=job,
        topology=state.topology,
        gpus=np.asarray(gpus, dtype=np.int64),
        cost=cost_report(
            state.topology, job, gpus, spec, raw, **shared_costs(state.topology, job, gpus, state)
        ),
        solver=result.solver or solver,
        elapsed_s=elapsed,
        optimal=result.optimal,
        bound=result.bound,
        details=result.details,
    )


def _gpu_ids(solver: str, gpus: Any) -> np.ndarray:
    """A solver's GPU ids as an int64 array; InvalidState when they are not a 1-d array of
    integers."""
    array = np.asarray(gpus)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise InvalidState(
            f"solver {solver!r} returned an invalid placement: expected a 1-d array of GPU "
            f"ids, got {array.dtype} with shape {array.shape}"
        )
    return array.astype(np.int64)


def _tightest(topology: Topology, job: Job, gpus: Any) -> bool:
    """Whether ``gpus`` stay inside one domain of the lowest level (from the NVLink domain
    up) whose largest domain could hold the whole job: no other placement spans less."""
    path = topology.path[np.asarray(gpus, dtype=np.int64)]
    for level in range(topology.nvlink_level, len(topology.levels)):
        if int(topology.domain_sizes(level).max()) >= job.gpus:
            return bool((path[:, level] == path[0, level]).all())
    return True


def _total_seconds(state: ClusterState, job: Job, gpus: Any) -> float:
    """Communication (among the running jobs) plus storage I/O seconds per step of ``job`` on
    ``gpus`` in ``state``: what placements of one job are compared by."""
    seconds = evaluate(state.topology, job, _gpu_ids("place", gpus), state=state).comm_seconds
    if getattr(job, "data", None) is not None and state.topology.stores:
        seconds += io_seconds(state, job, gpus)
    return seconds


def place_near_data(state: ClusterState, job: Job, solve: Any, first: Any) -> Any:
    """The cheaper, by ``comm_seconds + io_seconds`` in ``state``, of ``first`` and the
    placements ``solve`` finds on the near-data views."""

    def total(result: Any) -> float:
        return _total_seconds(state, job, result.gpus)

    best, best_cost = first, total(first)
    for view in near_data_views(state, job):
        try:
            candidate = solve(view)
        except Infeasible:
            continue
        cost = total(candidate)
        if cost < best_cost * (1 - 1e-12):
            best, best_cost = candidate, cost
    return best
