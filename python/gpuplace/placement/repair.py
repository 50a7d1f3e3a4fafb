"""Repairing a running job after hardware under it failed, was drained or degraded.

:func:`repair` keeps every surviving rank where it is and gives the lost ranks free healthy
GPUs at minimum cost (the Rust repair solver, ``rust/core/src/repair.rs``: confinement first,
greedy by proximity to the job's other ranks, then local improvement priced by the one cost
model). A confined group (by default a tp group inside its NVLink domain) whose domain has no
room for its lost ranks moves whole, and the result says so. Under ``max_moves``, groups on a
degraded GPU, host, NIC or switch are evacuated whole when that lowers the cost, also when
nothing was lost, and each move names the component it left. The state is changed all or
nothing: a job that cannot be repaired raises :class:`gpuplace.Infeasible` naming what is
missing, and the state is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace.cluster.power import power_report
from gpuplace.enums import Health, MoveReason, SparePolicy
from gpuplace.errors import Infeasible, InvalidJob, InvalidState
from gpuplace.model.job import Job
from gpuplace.model.storage import io_demands
from gpuplace.placement.result import CostReport, Placement, cost_report
from gpuplace.policy.fence import allowed_gpus, can_borrow, has_rules

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState

__all__ = ["MovedRank", "Repair", "repair", "spare_policy"]

_HEALTH = Health.members()


def spare_policy(spares: object) -> SparePolicy:
    """The :class:`gpuplace.SparePolicy` that ``spares`` names: a member, its label
    (``allow``, ``forbid``, ``only``), or None/True (allow) and False (forbid); anything else
    is an InvalidJob naming what is accepted."""
    if isinstance(spares, SparePolicy):
        return spares
    if spares is None or spares is True:
        return SparePolicy.Allow
    if spares is False:
        return SparePolicy.Forbid
    if isinstance(spares, str):
        return SparePolicy.from_label(spares)  # InvalidJob naming the labels
    labels = ", ".join(p.label for p in SparePolicy.members())
    raise InvalidJob(
        f"spares: expected None, True, False, a SparePolicy or one of {labels}, got {spares!r}"
    )


@dataclass(frozen=True)
class MovedRank:
    """One rank that changed GPU, and why (in words)."""

    rank: int
    old_gpu: int
    new_gpu: int
    #: ``lost`` (its GPU failed or was drained), ``group moved`` (its confined group had no
    #: room left in its domain), ``evacuated`` (moved under ``max_moves`` off degraded
    #: hardware, whole with its confined group, because that lowered the cost) or
    #: ``improvement`` (moved under ``max_moves`` to lower cost): the label of its
    #: :class:`gpuplace.MoveReason`.
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
    spares: bool | str | SparePolicy | None = None,
    solver: str = "auto",
    time_limit: float | None = None,
) -> Repair:
    """Repair a running job in ``state`` (in place, all or nothing).

    ``job_name`` names an allocated job; its spec is the one it was allocated with (a job
    allocated from bare GPU ids is repaired as one without communication or confinement), or
    pass the :class:`Job` itself. ``max_moves=k`` lets k surviving ranks move too when that
    lowers the cost, a confined group (a tp group) moving whole and counting as its size; it
    also works when nothing failed: groups on a degraded NIC, host or switch are evacuated to
    healthy hardware when that lowers the cost, and each such move names the component.
    ``spares`` (a :class:`gpuplace.SparePolicy` or its label): ``allow`` (also None or True)
    lets the repair take reserved spares as well as free GPUs (whichever costs less),
    ``forbid`` (also False) forbids them, ``only`` takes spares only.
    ``solver``: ``auto`` and ``heuristic`` run the Rust repair heuristic. ``time_limit``
    bounds its improvement steps (s).
    """
    if solver not in ("auto", "heuristic"):
        raise InvalidJob(f"unknown repair solver {solver!r}; use auto or heuristic")
    if not isinstance(max_moves, int) or isinstance(max_moves, bool) or max_moves < 0:
        raise InvalidJob(f"max_moves must be an integer >= 0, got {max_moves!r}")
    if time_limit is not None and not time_limit > 0:
        raise InvalidJob(f"time_limit must be > 0 seconds, got {time_limit!r}")
    policy = spare_policy(spares)
    job: Job | None
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
    spec = job.compile(topology)
    before = state._core.copy() if topology.power_domains else None
    allowed = (
        allowed_gpus(state, job, borrow=can_borrow(state, job)) if has_rules(state, job) else None
    )
    with state.fenced(allowed):
        # One call: the repair, and the full reports of both placements (what the old one
        # shared with the running jobs and its stores, seen before it moved, and the new one's).
        plan = state._core.repair(
            spec, name, max_moves, policy, 24, time_limit, io_demands(topology, job) or None
        )
    elapsed = plan.repair_seconds
    if before is not None:
        # All or nothing: a repair that would exceed a power budget changes nothing.

        over = [r for r in power_report(state) if r["headroom_w"] < -1e-9 * r["budget_w"]]
        if over:
            state._core = before
            raise Infeasible(
                f"repairing {name!r} would draw power domain {over[0]['domain']!r} to "
                f"{over[0]['draw_w']:,.0f} W, over its budget of {over[0]['budget_w']:,.0f} W"
            )
    state.specs[name] = job
    gpus = np.asarray(plan.gpus, dtype=np.int64)
    cost_before = cost_report(topology, job, old, spec, plan.report_before)
    # Nothing moved: the state and the placement are as they were, and so is the cost.
    cost_after = (
        cost_report(topology, job, gpus, spec, plan.report_after) if plan.moves else cost_before
    )
    confined = {d: topology.level_index(lv) for d, lv in job.confine.items() if getattr(job, d) > 1}
    unhealthy = {(c["kind"], c["name"]): c for c in state.unhealthy()}
    moved = []
    for m in plan.moves:
        where = f"{topology.host_of(m.old_gpu)}:{topology.local_index(m.old_gpu)}"
        if m.reason == MoveReason.Lost:
            reason = f"its GPU {where} is {_HEALTH[int(health[m.old_gpu])].label}"
        elif m.reason == MoveReason.GroupMoved:
            assert m.level is not None
            dims = [d for d, lv in confined.items() if lv <= m.level] or ["confined"]
            reason = (
                f"its {'/'.join(dims)} group could not stay inside one "
                f"{topology.levels[m.level].name} next to its lost ranks, so the whole group moved"
            )
        elif m.reason == MoveReason.Evacuated:
            assert m.component is not None
            kind, what = m.component[0].label, state.component_name(*m.component)
            why = unhealthy.get((kind, what), {}).get("reason", "degraded")
            dims = [d for d, lv in confined.items() if lv == min(confined.values())]
            group = f"with its {'/'.join(dims)} group " if dims else ""
            reason = (
                f"evacuated {group}off degraded {kind} {what} ({why}) to "
                f"{topology.host_of(m.new_gpu)}, which lowered the cost (max_moves)"
            )
        else:
            reason = "moved to lower the cost (max_moves)"
        moved.append(MovedRank(m.rank, m.old_gpu, m.new_gpu, m.reason.label, reason))
    placement = Placement(
        job=job,
        topology=topology,
        gpus=gpus,
        cost=cost_after,
        solver="repair-heuristic",
        elapsed_s=elapsed,
        details={"evaluations": plan.evaluations},
    )
    return Repair(
        placement=placement,
        moved=moved,
        cost_before=cost_before,
        cost_after=cost_after,
        elapsed_s=elapsed,
        details={"evaluations": plan.evaluations},
    )
