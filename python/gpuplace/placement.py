"""Placing jobs: the solver registry, :func:`place`, :func:`evaluate` and the result types.

Every solver shares one signature and returns the GPU of each rank; :func:`place` then prices
the result with the one cost model in the Rust core, so costs are comparable across solvers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace.admission import place_within
from gpuplace.elastic import place_elastic
from gpuplace.errors import InvalidJob, InvalidState
from gpuplace.hostlist import compress
from gpuplace.policy import allowed_gpus, can_borrow, fenced_view, has_rules
from gpuplace.step import step_details

if TYPE_CHECKING:
    from gpuplace.job import Job
    from gpuplace.state import ClusterState
    from gpuplace.topology import Topology

__all__ = [
    "CostReport",
    "Placement",
    "SolveResult",
    "SolverInfo",
    "evaluate",
    "place",
    "refine",
    "register_solver",
    "solvers",
]


@dataclass(frozen=True)
class CostReport:
    """The cost model's verdict on one placement.

    ``comm_seconds`` is the estimated communication time per step (s): for each collective
    class (e.g. all tp all-reduces) the slowest member, summed over classes, plus explicit
    traffic; no overlap with computation is assumed. ``bytes_by_level`` gives the bytes per
    step whose path's lowest common level is each level.
    """

    comm_seconds: float
    class_seconds: dict[str, float]
    traffic_seconds: float
    bytes_by_level: dict[str, float]
    span_level: str | None
    confinement_ok: bool
    violations: list[str]
    nvlink_level: str
    #: Step time per step (s): compute + pipeline bubble + exposed communication, when the
    #: job declares its compute (``gpuplace.step``); None otherwise, like the four below.
    step_seconds: float | None = None
    #: Communication not hidden under compute (s).
    exposed_comm_seconds: float | None = None
    #: Compute per step without the bubble (s).
    compute_seconds: float | None = None
    #: Model FLOPs utilisation (0..1).
    mfu: float | None = None
    tokens_per_second: float | None = None
    #: The rest of the core's step report (bubble, per-class exposed time, peak, GPU model).
    step_details: dict[str, Any] = field(default_factory=dict)
    #: The NCCL algorithm priced for each class's slowest collective (ring, tree, nvls,
    #: pairwise, p2p; ``rust/core/src/nccl.rs``).
    class_algorithms: dict[str, str] = field(default_factory=dict)
    #: Priced in a state whose running jobs load the fabric: the same placement's seconds
    #: with nobody else on it, and the uplinks over capacity on its paths
    #: (``gpuplace.fabric``); ``comm_seconds`` is then the contended time.
    alone_seconds: float | None = None
    hot_uplinks: tuple[Any, ...] = ()
    #: Seconds per step reading the job's dataset and writing its checkpoints over the path
    #: to their stores (``gpuplace.storage``); not part of ``comm_seconds``.
    io_seconds: float = 0.0

    @property
    def slowdown(self) -> float:
        """Contended over alone communication time (1.0 when nobody slows the job)."""
        if self.alone_seconds is None or self.alone_seconds <= 0:
            return 1.0
        return self.comm_seconds / self.alone_seconds

    @property
    def fabric_bytes(self) -> float:
        """Bytes per step that leave the NVLink domain (cross the scale-out fabric)."""
        names = list(self.bytes_by_level)
        start = names.index(self.nvlink_level) + 1
        return float(sum(self.bytes_by_level[n] for n in names[start:]))

    def bytes_above(self, level: str) -> float:
        """Bytes per step whose lowest common level is ``level`` or higher."""
        names = list(self.bytes_by_level)
        if level not in names:
            return 0.0
        return float(sum(self.bytes_by_level[n] for n in names[names.index(level) :]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "comm_seconds": self.comm_seconds,
            "class_seconds": self.class_seconds,
            "class_algorithms": self.class_algorithms,
            "traffic_seconds": self.traffic_seconds,
            "bytes_by_level": self.bytes_by_level,
            "fabric_bytes": self.fabric_bytes,
            "span_level": self.span_level,
            "confinement_ok": self.confinement_ok,
            "violations": self.violations,
            "step_seconds": self.step_seconds,
            "exposed_comm_seconds": self.exposed_comm_seconds,
            "compute_seconds": self.compute_seconds,
            "mfu": self.mfu,
            "tokens_per_second": self.tokens_per_second,
            **({"step": self.step_details} if self.step_details else {}),
            **({"io_seconds": self.io_seconds} if self.io_seconds else {}),
            **(
                {
                    "alone_seconds": self.alone_seconds,
                    "slowdown": self.slowdown,
                    "hot_uplinks": [u.to_dict() for u in self.hot_uplinks],
                }
                if self.alone_seconds is not None
                else {}
            ),
        }


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
    return _cost_report(topology, job, gpus, spec, raw, **_shared_costs(topology, job, gpus, state))


def _shared_costs(
    topology: Topology, job: Job, gpus: Any, state: ClusterState | None
) -> dict[str, Any]:
    """What a placement shares with others: priced in a state whose running jobs load the
    fabric, its seconds alone and the hot uplinks on its paths; with stores, its storage I/O."""
    shared: dict[str, Any] = {}
    if state is not None and _core.hottest_uplinks(state._core, 1):
        from gpuplace.fabric import contention

        seen = contention(state, job, gpus)
        shared = {"alone_seconds": seen.alone_seconds, "hot_uplinks": seen.uplinks}
    if getattr(job, "data", None) is not None and topology.stores:
        from gpuplace.state import ClusterState as _State
        from gpuplace.storage import io_seconds

        shared["io_seconds"] = io_seconds(
            state if state is not None else _State(topology), job, gpus
        )
    return shared


def _cost_report(
    topology: Topology,
    job: Job,
    gpus: Any,
    spec: _core.JobSpec,
    raw: _core.CostReport,
    **shared: Any,
) -> CostReport:
    """The core's cost report with level and class names, the step details, and what the
    placement shares."""
    names = topology.level_names
    span = raw.span_level
    return CostReport(
        comm_seconds=raw.comm_seconds,
        class_seconds=dict(zip(spec.class_names, raw.class_seconds, strict=True)),
        traffic_seconds=raw.traffic_seconds,
        bytes_by_level={n: float(b) for n, b in zip(names, raw.bytes_by_level, strict=True)},
        span_level=None if span is None else names[span],
        confinement_ok=raw.confinement_ok,
        violations=raw.violations,
        nvlink_level=names[topology.nvlink_level],
        class_algorithms=dict(zip(spec.class_names, raw.class_algorithms, strict=True)),
        step_seconds=raw.step_seconds,
        exposed_comm_seconds=raw.exposed_comm_seconds,
        compute_seconds=raw.compute_seconds,
        mfu=raw.mfu,
        tokens_per_second=raw.tokens_per_second,
        step_details=step_details(topology, job, gpus, spec.class_names, raw),
        **shared,
    )


@dataclass(frozen=True)
class Placement:
    """Where a job runs: ``gpus[rank]`` is the GPU id of each rank."""

    job: Job
    topology: Topology
    gpus: np.ndarray
    cost: CostReport
    solver: str
    elapsed_s: float
    #: True when an exact solver proved this placement optimal; None for heuristics.
    optimal: bool | None = None
    #: Best proven lower bound on comm_seconds (s), when an exact solver gives one.
    bound: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """Relative gap between the cost and the proven bound (0 when optimal)."""
        if self.bound is None:
            return None
        if self.cost.comm_seconds <= 0:
            return 0.0
        return max(0.0, (self.cost.comm_seconds - self.bound) / self.cost.comm_seconds)

    @property
    def nodes(self) -> list[str]:
        """Hosts used, in order of their first rank."""
        seen: dict[str, None] = {}
        for g in self.gpus:
            seen.setdefault(self.topology.host_of(int(g)), None)
        return list(seen)

    def hostlist(self) -> str:
        """The hosts as a compressed Slurm hostlist (``dgx[001-004,010]``)."""
        return compress(sorted(self.nodes))

    def cuda_visible_devices(self) -> dict[str, str]:
        """Per host, ``CUDA_VISIBLE_DEVICES`` listing its GPUs in rank order."""
        out: dict[str, list[str]] = {}
        for g in self.gpus:
            out.setdefault(self.topology.host_of(int(g)), []).append(
                str(self.topology.local_index(int(g)))
            )
        return {h: ",".join(v) for h, v in out.items()}

    def rank_table(self) -> list[dict[str, Any]]:
        """One row per rank: global rank, host, local rank on that host, CUDA device."""
        rows = []
        local_rank: dict[str, int] = {}
        for rank, g in enumerate(self.gpus):
            host = self.topology.host_of(int(g))
            lr = local_rank.get(host, 0)
            local_rank[host] = lr + 1
            rows.append(
                {
                    "rank": rank,
                    "host": host,
                    "local_rank": lr,
                    "device": self.topology.local_index(int(g)),
                }
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job.name,
            "gpus": [int(g) for g in self.gpus],
            "nodes": self.nodes,
            "hostlist": self.hostlist(),
            "cost": self.cost.to_dict(),
            "solver": self.solver,
            "optimal": self.optimal,
            "bound": self.bound,
            "gap": self.gap,
            "elapsed_s": self.elapsed_s,
            **({"details": self.details} if self.details else {}),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)


@dataclass(frozen=True)
class SolveResult:
    """What a solver returns: the GPU of each rank and, for exact solvers, a proof."""

    gpus: np.ndarray
    optimal: bool | None = None
    bound: float | None = None
    #: The solver that actually ran (``auto`` names its choice).
    solver: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


#: A solver: (state, job, seed, time_limit) -> SolveResult.
Solver = Callable[["ClusterState", "Job", int, "float | None"], SolveResult]


@dataclass(frozen=True)
class SolverInfo:
    name: str
    description: str
    func: Solver
    #: The solver promises to keep the job's confinement rules; the placement gate refuses a
    #: placement of it that breaks them.
    confining: bool = False
    #: Implemented in Rust: :func:`place` runs it and the gate in one call into the core.
    rust: bool = False


_REGISTRY: dict[str, SolverInfo] = {}


def register_solver(
    name: str, description: str, *, confining: bool = False
) -> Callable[[Solver], Solver]:
    """Decorator that adds a solver to :func:`solvers` and :func:`place`. ``confining``: the
    solver promises to keep the job's confinement rules (the gate in :func:`place` checks it)."""

    def wrap(func: Solver) -> Solver:
        _REGISTRY[name] = SolverInfo(name, description, func, confining)
        return func

    return wrap


def solvers() -> dict[str, str]:
    """Registered solvers: name -> one-line description."""
    return {name: info.description for name, info in _REGISTRY.items()}


def _rust_solver(name: str) -> Solver:
    def run(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
        gpus, _ = _core.place(state._core, job.compile(state.topology), name, seed, time_limit)
        return SolveResult(gpus=gpus)

    return run


for _name, _description, _confining in _core.rust_solvers():
    _REGISTRY[_name] = SolverInfo(_name, _description, _rust_solver(_name), _confining, rust=True)


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
    view = fenced_view(
        state, allowed_gpus(state, placement.job) if has_rules(state, placement.job) else None
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
        cost=_cost_report(
            state.topology,
            placement.job,
            gpus,
            spec,
            raw,
            **_shared_costs(state.topology, placement.job, gpus, state),
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
    info = _REGISTRY.get(solver)
    if info is None:
        raise InvalidJob(f"unknown solver {solver!r}; the solvers are {', '.join(_REGISTRY)}")
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
                from gpuplace.storage import place_near_data

                found = place_near_data(view, job, solve_here, found)
            return found

        if state.topology.power_domains:
            from gpuplace.power import place_within_power

            result, slot = place_within_power(state, job, solve)
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
        cost=_cost_report(
            state.topology, job, gpus, spec, raw, **_shared_costs(state.topology, job, gpus, state)
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
