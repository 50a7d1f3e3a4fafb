"""Placing jobs: :func:`place`, :func:`evaluate` and :func:`refine`.

Every solver shares one signature and returns the GPU of each rank; :func:`place` then gates
the result and prices it with the one cost model in the Rust core, so costs are comparable
across solvers. One request goes into the core (the compiled job, the state with the policy's
fence and the running jobs, the job's storage traffic, the power budgets) and one report comes
out (the gate's verdict, communication alone and among the running jobs, hot uplinks, storage
seconds, step time, the power phase slot): a Rust solver, its gate and its pricing are one
call; a Python solver's placement passes the gate once.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace.cluster.power import place_within_power, power_request, refusal
from gpuplace.cluster.state import ClusterState
from gpuplace.cluster.storage import near_data_views
from gpuplace.errors import Infeasible, InvalidJob, InvalidState
from gpuplace.model.storage import io_demands
from gpuplace.placement.elastic import place_elastic
from gpuplace.placement.registry import SolverInfo, solver_info
from gpuplace.placement.result import CostReport, Placement, SolveResult, cost_report
from gpuplace.placement.within_policy import place_within
from gpuplace.policy.fence import allowed_gpus, can_borrow, has_rules

if TYPE_CHECKING:
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = ["evaluate", "place", "place_near_data", "refine"]


def evaluate(
    topology: Topology, job: Job, gpus: Any, *, state: ClusterState | None = None
) -> CostReport:
    """Price a placement (``gpus[rank]`` = GPU id) with the one cost model; with ``state``,
    on that state's hardware (degraded NICs and switches slow the paths through them) and
    with its running jobs on the fabric (the report then gives the slowdown from contention
    and the uplinks responsible)."""
    spec = job.compile(topology)
    io = io_demands(topology, job)
    if io and state is None:
        # Storage seconds are priced on a state: an empty one prices as the topology does.
        state = ClusterState(topology)
    core_state = None if state is None else state._core
    gpus = np.asarray(gpus, dtype=np.int64)
    raw = _core.evaluate(topology._core, spec, gpus, core_state, io or None)
    return cost_report(topology, job, gpus, spec, raw)


def shared_costs(
    topology: Topology, job: Job, gpus: Any, state: ClusterState | None
) -> dict[str, Any]:
    """Deprecated (the report of :func:`evaluate` carries these; removed in the next
    release): what a placement shares with others, as keyword arguments of the report."""
    warnings.warn(
        "shared_costs is deprecated: evaluate(..., state=) reports alone_seconds, hot_uplinks "
        "and io_seconds",
        DeprecationWarning,
        stacklevel=2,
    )
    report = evaluate(topology, job, gpus, state=state)
    shared: dict[str, Any] = {}
    if report.alone_seconds is not None:
        shared = {"alone_seconds": report.alone_seconds, "hot_uplinks": report.hot_uplinks}
    if getattr(job, "data", None) is not None and topology.stores:
        shared["io_seconds"] = report.io_seconds
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
    refined = _core.refine(
        view._core,
        spec,
        np.asarray(placement.gpus, dtype=np.int64),
        float(time_limit),
        int(seed),
        int(max_iterations),
        io_demands(state.topology, placement.job) or None,
    )
    elapsed = time.perf_counter() - start
    gpus = refined.gpus
    return Placement(
        job=placement.job,
        topology=state.topology,
        gpus=gpus,
        # Priced on the state, contention and storage included, in the same call.
        cost=cost_report(state.topology, placement.job, gpus, spec, refined.cost),
        solver=f"{placement.solver}+refine",
        elapsed_s=placement.elapsed_s + elapsed,
        details={"refine_iterations": refined.iterations, "refine_accepted": refined.accepted},
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
            # The greedy probe rules sizes out before a costlier solver runs; for greedy
            # itself the placement is the probe, and no size is solved twice.
            precheck=info.name != "greedy" and not (preempt or can_borrow(state, job)),
        )

    def solve(view: ClusterState) -> Placement:
        return _solve(view, job, info, seed, time_limit, neighbours)

    return place_within(state, job, solve, preempt=preempt)


@dataclass(frozen=True)
class _Gated:
    """A solver's answer after the gate: what it returned, its GPUs, the core's report."""

    result: SolveResult
    gpus: np.ndarray
    raw: _core.CostReport

    @property
    def seconds(self) -> float:
        """Communication (among the running jobs) plus storage seconds per step: what
        placements of one job are compared by."""
        return float(self.raw.comm_seconds + self.raw.io_seconds)

    @property
    def data_key(self) -> tuple[float, float]:
        """What placements near and far from a job's data are compared by: the step time
        first, which holds the storage as the job spends it (reads prefetched under the step,
        checkpoint writes a stall: ``rust/core/src/storage.rs``), so a placement far from
        the data loses where its reads no longer hide under the step; then (and alone,
        without a priced step) communication plus storage seconds, so that on a tie the
        placement that moves fewer bytes to its stores wins."""
        raw = self.raw
        step = raw.step_seconds
        return (self.seconds if step is None else float(step), self.seconds)


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
    io = io_demands(state.topology, job) or None
    has_data = getattr(job, "data", None) is not None and bool(state.topology.stores)

    if info.rust and not has_data:
        # The common case: solver, gate and pricing in one call into the core, which also
        # tries the power phase slots within the budgets (rust/core/src/request.rs).
        power = power_request(state, job)
        try:
            placed = _core.place(state._core, spec, solver, seed, time_limit, neighbours, io, power)
        except Infeasible as exc:
            if power is None:
                raise
            raise refusal(state, job, exc) from None
        gpus = placed.gpus
        phases = state.topology.power_phases
        details = {}
        if power is not None and phases > 1:
            slot = placed.phase_slot
            details = {"phase_slot": slot, "phase_offset": slot / phases}
        return Placement(
            job=job,
            topology=state.topology,
            gpus=gpus,
            cost=cost_report(state.topology, job, gpus, spec, placed.cost),
            solver=solver,
            elapsed_s=time.perf_counter() - start,
            details=details,
        )

    def solve_here(view: ClusterState) -> _Gated:
        """The solver on ``view``, then the gate on that view, once: a placement it admits is
        free and healthy in ``state`` too (a view only holds GPUs back), and priced alike
        (holding GPUs back changes no path's price)."""
        if info.rust:
            # Solver, gate and pricing in one call into the core.
            placed = _core.place(view._core, spec, solver, seed, time_limit, neighbours, io)
            gpus = placed.gpus
            return _Gated(SolveResult(gpus=gpus), gpus, placed.cost)
        found = info.func(view, job, seed, time_limit)
        gpus = _gpu_ids(solver, found.gpus)
        raw = _core.admit(view._core, spec, gpus, solver, info.confining, io)
        return _Gated(found, gpus, raw)

    def solve(view: ClusterState) -> _Gated:
        found = solve_here(view)
        if has_data:
            found = place_near_data(view, job, solve_here, found)
        return found

    if state.topology.power_domains:
        # Every phase slot is tried and the cheapest placement kept: a later slot inside
        # one rack beats slot 0 split across racks.
        gated, slot = place_within_power(
            state,
            job,
            solve,
            cost=lambda found: found.seconds,
            enough=lambda found: _tightest(state.topology, job, found.gpus),
        )
        phases = state.topology.power_phases
        if phases > 1:
            extra = {"phase_slot": slot, "phase_offset": slot / phases}
            details = {**gated.result.details, **extra}
            gated = replace(gated, result=replace(gated.result, details=details))
    else:
        gated = solve(state)
    result = gated.result
    elapsed = time.perf_counter() - start
    return Placement(
        job=job,
        topology=state.topology,
        gpus=gated.gpus,
        cost=cost_report(state.topology, job, gated.gpus, spec, gated.raw),
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


def place_near_data(state: ClusterState, job: Job, solve: Any, first: Any) -> Any:
    """The cheaper, by step time with its storage, then communication plus storage seconds
    per step (``data_key``), of ``first`` and the placements ``solve`` finds on the near-data
    views."""
    best = first
    for view in near_data_views(state, job):
        try:
            candidate = solve(view)
        except Infeasible:
            continue
        (step, seconds), (best_step, best_seconds) = candidate.data_key, best.data_key
        if step < best_step * (1 - 1e-12) or (
            step <= best_step * (1 + 1e-12) and seconds < best_seconds * (1 - 1e-12)
        ):
            best = candidate
    return best
