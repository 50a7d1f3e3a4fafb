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
from gpuplace.errors import InvalidJob
from gpuplace.hostlist import compress

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
            "traffic_seconds": self.traffic_seconds,
            "bytes_by_level": self.bytes_by_level,
            "fabric_bytes": self.fabric_bytes,
            "span_level": self.span_level,
            "confinement_ok": self.confinement_ok,
            "violations": self.violations,
        }


def evaluate(
    topology: Topology, job: Job, gpus: Any, *, state: ClusterState | None = None
) -> CostReport:
    """Price a placement (``gpus[rank]`` = GPU id) with the one cost model; with ``state``,
    on that state's hardware (degraded NICs and switches slow the paths through them)."""
    spec = job.compile(topology)
    core_state = None if state is None else state._core
    raw = _core.evaluate(topology._core, spec, np.asarray(gpus, dtype=np.int64), core_state)
    names = topology.level_names
    classes = job.class_names()
    span = raw["span_level"]
    return CostReport(
        comm_seconds=raw["comm_seconds"],
        class_seconds=dict(zip(classes, raw["class_seconds"], strict=True)),
        traffic_seconds=raw["traffic_seconds"],
        bytes_by_level={n: float(b) for n, b in zip(names, raw["bytes_by_level"], strict=True)},
        span_level=None if span is None else names[span],
        confinement_ok=raw["confinement_ok"],
        violations=list(raw["violations"]),
        nvlink_level=names[topology.nvlink_level],
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


_REGISTRY: dict[str, SolverInfo] = {}


def register_solver(name: str, description: str) -> Callable[[Solver], Solver]:
    """Decorator that adds a solver to :func:`solvers` and :func:`place`."""

    def wrap(func: Solver) -> Solver:
        _REGISTRY[name] = SolverInfo(name, description, func)
        return func

    return wrap


def solvers() -> dict[str, str]:
    """Registered solvers: name -> one-line description."""
    return {name: info.description for name, info in _REGISTRY.items()}


def _rust_solver(name: str) -> Solver:
    def run(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
        gpus = _core.place(state._core, job.compile(state.topology), name, seed, time_limit)
        return SolveResult(gpus=gpus)

    return run


register_solver(
    "greedy",
    "hierarchical best-fit in Rust: tightest domain that holds the job, tp groups inside NVLink "
    "domains, heaviest traffic on the lowest levels",
)(_rust_solver("greedy"))
register_solver(
    "refine",
    "greedy, then local search in Rust on the cost model: rank swaps and moves to free GPUs next "
    "to each rank's partners, within time_limit (default 0.5 s); never worse than greedy",
)(_rust_solver("refine"))
register_solver("first-fit", "baseline: the lowest free GPU ids, ranks in order (topology-blind)")(
    _rust_solver("first-fit")
)
register_solver("random", "baseline: random free GPUs in random rank order (seeded)")(
    _rust_solver("random")
)


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
    gpus, _, _, iterations, accepted = _core.refine(
        state._core,
        placement.job.compile(state.topology),
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
        cost=evaluate(state.topology, placement.job, gpus, state=state),
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
) -> Placement:
    """Place ``job`` on the free GPUs of ``state`` with a registered solver.

    The state is not changed: call ``state.allocate(placement)`` to take the GPUs. Raises
    :class:`gpuplace.Infeasible` (saying why) when the job cannot be placed.
    """
    info = _REGISTRY.get(solver)
    if info is None:
        raise InvalidJob(f"unknown solver {solver!r}; the solvers are {', '.join(_REGISTRY)}")
    if time_limit is not None and not time_limit > 0:
        raise InvalidJob(f"time_limit must be > 0 seconds, got {time_limit!r}")
    start = time.perf_counter()
    result = info.func(state, job, seed, time_limit)
    elapsed = time.perf_counter() - start
    cost = evaluate(state.topology, job, result.gpus, state=state)
    return Placement(
        job=job,
        topology=state.topology,
        gpus=np.asarray(result.gpus, dtype=np.int64),
        cost=cost,
        solver=result.solver or solver,
        elapsed_s=elapsed,
        optimal=result.optimal,
        bound=result.bound,
        details=result.details,
    )
