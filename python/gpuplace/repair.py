"""Repairing a running job after hardware under it failed, was drained or degraded.

:func:`repair` keeps every surviving rank where it is and gives the lost ranks free healthy
GPUs at minimum cost (the Rust repair solver, ``rust/core/src/repair.rs``: confinement first,
greedy by proximity to the job's other ranks, then local improvement priced by the one cost
model). A confined group (by default a tp group inside its NVLink domain) whose domain has no
room for its lost ranks moves whole, and the result says so. The state is changed all or
nothing: a job that cannot be repaired raises :class:`gpuplace.Infeasible` naming what is
missing, and the state is left as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace.errors import InvalidJob, InvalidState
from gpuplace.job import Job
from gpuplace.placement import CostReport, Placement, evaluate
from gpuplace.state import _KIND_NAMES

if TYPE_CHECKING:
    from gpuplace.state import ClusterState

__all__ = ["MovedRank", "Repair", "repair"]

_REASONS = {0: "lost", 1: "group moved", 2: "improvement", 3: "evacuated"}
_STATUS = {1: "failed", 2: "drained"}


@dataclass(frozen=True)
class MovedRank:
    """One rank that changed GPU, and why (in words)."""

    rank: int
    old_gpu: int
    new_gpu: int
    #: ``lost`` (its GPU failed or was drained), ``group moved`` (its confined group had no
    #: room left in its domain), ``evacuated`` (moved under ``max_moves`` off degraded
    #: hardware, whole with its confined group, because that lowered the cost) or
    #: ``improvement`` (moved under ``max_moves`` to lower cost).
    kind: str
    reason: str


@dataclass(frozen=True)
class Repair:
    """The outcome of :func:`repair`, already applied to the state."""

    placement: Placement
    moved: list[MovedRank]
    #: The old placement priced as if the lost hardware still worked (degradations included).
    cost_before: CostReport
    cost_after: CostReport
    elapsed_s: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def moved_ranks(self) -> list[int]:
        return [m.rank for m in self.moved]

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.placement.job.name,
            "moved": [m.__dict__ for m in self.moved],
            "cost_before": self.cost_before.to_dict(),
            "cost_after": self.cost_after.to_dict(),
            "elapsed_s": self.elapsed_s,
            "placement": self.placement.to_dict(),
            **({"details": self.details} if self.details else {}),
        }


def repair(
    state: ClusterState,
    job_name: str | Job,
    *,
    max_moves: int = 0,
    spares: bool | str | None = None,
    solver: str = "auto",
    time_limit: float | None = None,
) -> Repair:
    """Repair a running job in ``state`` (in place, all or nothing).

    ``job_name`` names an allocated job; its spec is the one it was allocated with (a job
    allocated from bare GPU ids is repaired as one without communication or confinement), or
    pass the :class:`Job` itself. ``max_moves=k`` lets k surviving ranks move too when that
    lowers the cost, a confined group (a tp group) moving whole and counting as its size; it
    also works when nothing failed: groups on a degraded NIC, host or switch are evacuated to
    healthy hardware when that lowers the cost, and each such move names the component. ``spares``: None or True lets the repair take reserved spares as well as
    free GPUs (whichever costs less), False forbids them, ``"only"`` takes spares only.
    ``solver``: ``auto`` and ``heuristic`` run the Rust repair heuristic. ``time_limit``
    bounds its improvement steps (s).
    """
    if solver not in ("auto", "heuristic"):
        raise InvalidJob(f"unknown repair solver {solver!r}; use auto or heuristic")
    if not isinstance(max_moves, int) or isinstance(max_moves, bool) or max_moves < 0:
        raise InvalidJob(f"max_moves must be an integer >= 0, got {max_moves!r}")
    if time_limit is not None and not time_limit > 0:
        raise InvalidJob(f"time_limit must be > 0 seconds, got {time_limit!r}")
    policy = {None: "allow", True: "allow", False: "forbid", "only": "only"}.get(spares)  # type: ignore[arg-type]
    if policy is None:
        raise InvalidJob(f"spares must be None, True, False or 'only', got {spares!r}")
    if isinstance(job_name, Job):
        job, name = job_name, job_name.name
    else:
        name = job_name
        job = state.specs.get(name)
    old = state.job_gpus(name)
    if old is None:
        raise InvalidState(f"no job named {name!r} is allocated")
    if job is None:
        job = Job(name=name, dp=len(old), confine={})
    if job.gpus != len(old):
        raise InvalidJob(f"job {name!r} holds {len(old)} GPUs but its spec has {job.gpus} ranks")
    topology = state.topology
    health = state.health()
    cost_before = evaluate(topology, job, old, state=state)
    start = time.perf_counter()
    raw = state._core.repair(job.compile(topology), name, max_moves, policy, 24, time_limit)
    elapsed = time.perf_counter() - start
    state.specs[name] = job
    gpus = np.asarray(raw["gpus"], dtype=np.int64)
    cost_after = evaluate(topology, job, gpus, state=state)
    confined = {d: topology.level_index(lv) for d, lv in job.confine.items() if getattr(job, d) > 1}
    unhealthy = {(c["kind"], c["name"]): c for c in state.unhealthy()}
    left = {int(rank): (kind, a, b) for rank, kind, a, b in raw.get("evacuated", [])}
    moved = []
    for rank, old_gpu, new_gpu, code, level in raw["moves"]:
        where = f"{topology.host_of(old_gpu)}:{topology.local_index(old_gpu)}"
        if code == 0:
            reason = f"its GPU {where} is {_STATUS.get(int(health[old_gpu]), 'unusable')}"
        elif code == 1:
            dims = [d for d, lv in confined.items() if lv <= level] or ["confined"]
            reason = (
                f"its {'/'.join(dims)} group could not stay inside one "
                f"{topology.levels[level].name} next to its lost ranks, so the whole group moved"
            )
        elif code == 3:
            kind, a, b = left[int(rank)]
            what = state.component_name(kind, a, b)
            kind_name = _KIND_NAMES[kind]
            why = unhealthy.get((kind_name, what), {}).get("reason", "degraded")
            dims = [d for d, lv in confined.items() if lv == min(confined.values())]
            group = f"with its {'/'.join(dims)} group " if dims else ""
            reason = (
                f"evacuated {group}off degraded {kind_name} {what} ({why}) to "
                f"{topology.host_of(new_gpu)}, which lowered the cost (max_moves)"
            )
        else:
            reason = "moved to lower the cost (max_moves)"
        moved.append(MovedRank(int(rank), int(old_gpu), int(new_gpu), _REASONS[code], reason))
    placement = Placement(
        job=job,
        topology=topology,
        gpus=gpus,
        cost=cost_after,
        solver="repair-heuristic",
        elapsed_s=elapsed,
        details={"evaluations": raw["evaluations"]},
    )
    return Repair(
        placement=placement,
        moved=moved,
        cost_before=cost_before,
        cost_after=cost_after,
        elapsed_s=elapsed,
        details={"evaluations": raw["evaluations"]},
    )
