"""Why a job is not placed: the binding constraint at each level.

:func:`explain` gives the full account a scheduler shows its users (as Kueue's and Slurm's
pending reasons do): for the cluster, the job's pool, each hardware rule, each confined
dimension and the job's span limit, what the job needs, what is available, and whether that
constraint is *binding*. A pool or hardware rule is binding when the job fits without it
but not with it (checked by running the greedy solver on the fenced state); capacity,
confinement and span are binding when the free GPUs the job may use cannot hold what it
needs. Every :class:`gpuplace.Infeasible` raised by :func:`gpuplace.place` carries one as
``explanation``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpuplace.enums import Health
from gpuplace.errors import Constraint, Explanation
from gpuplace.placement.probe import why_not_fits
from gpuplace.policy.fence import Restriction, can_borrow, restrictions

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job

__all__ = ["Constraint", "Explanation", "explain"]


def _fits(state: ClusterState, job: Job, allowed: np.ndarray) -> bool:
    return why_not_fits(state.fenced_view(allowed), job) is None


def _mask(rules: list[Restriction], n: int, skip: int | None = None) -> np.ndarray:
    allowed = np.ones(n, dtype=bool)
    for i, r in enumerate(rules):
        if i != skip:
            allowed &= ~r.excluded
    return allowed


def explain(
    state: ClusterState,
    job: Job,
    *,
    borrow: bool | None = None,
    solver_message: str | None = None,
) -> Explanation:
    """The account of every constraint on placing ``job`` in ``state`` now (the state is not
    changed). ``borrow``: count the pools lending to the job's pool as usable (default: when
    the job may borrow, as :func:`gpuplace.place` would)."""
    if borrow is None:
        borrow = can_borrow(state, job)
    topo = state.topology
    n = topo.num_gpus
    needed = job.gpus
    free = state.free_mask()
    health = state.health()
    rules = restrictions(state, job, borrow=borrow)
    allowed = _mask(rules, n)
    usable = free & allowed
    placeable = _fits(state, job, allowed)
    out: list[Constraint] = []

    allocated = sum(len(g) for g in state.jobs.values())
    out.append(
        Constraint(
            "capacity",
            "free GPUs",
            topo.levels[-1].name,
            needed,
            int(free.sum()),
            bool(free.sum() < needed),
            f"the cluster has {int(free.sum())} free GPUs of {n} ({allocated} allocated, "
            f"{int((health != int(Health.Ok)).sum())} failed or drained, {len(state.spares)} spares held "
            f"back); the job needs {needed}",
        )
    )
    within = free.copy()
    for i, r in enumerate(rules):
        before = int(within.sum())
        within &= ~r.excluded
        after = int(within.sum())
        if placeable:
            binding = False
        elif after < needed <= before:
            binding = True
        else:
            binding = _fits(state, job, _mask(rules, n, skip=i))
        if r.constraint == "pool":
            detail = (
                f"{r.rule}: {int((~r.excluded).sum())} GPUs, {int((free & ~r.excluded).sum())} "
                f"of them free"
            )
        else:
            detail = (
                f"{r.rule}: excludes {before - after} of the {before} free GPUs left; "
                f"{after} remain"
            )
        out.append(Constraint(r.constraint, r.rule, None, needed, after, binding, detail))

    path = topo.path
    for d, level_name in job.confine.items():
        size = getattr(job, d)
        try:
            level = topo.level_index(level_name)
        except KeyError:
            continue
        if size <= 1 and level_name == "nvlink_domain":
            continue
        groups = needed // max(size, 1)
        counts = np.bincount(path[usable, level], minlength=topo.domain_count(level))
        fit = int((counts // max(size, 1)).sum())
        out.append(
            Constraint(
                "confinement",
                f"{d} inside one {topo.levels[level].name}",
                topo.levels[level].name,
                groups,
                fit,
                not placeable and fit < groups,
                f"each {d} group ({size} GPUs) must stay inside one {topo.levels[level].name}: "
                f"{fit} of the {groups} groups fit in the free GPUs the job may use "
                f"(the largest free {topo.levels[level].name} has {int(counts.max(initial=0))})",
            )
        )
    span_level = topo.level_index(job.max_span) if job.max_span else len(topo.levels) - 1
    for level in range(topo.nvlink_level, len(topo.levels)):
        counts = np.bincount(path[usable, level], minlength=topo.domain_count(level))
        largest = int(counts.max(initial=0))
        name = topo.levels[level].name
        if level == span_level:
            limit = "the job may span at most one" if job.max_span else "the whole cluster is one"
            out.append(
                Constraint(
                    "span" if job.max_span else "capacity",
                    f"max_span {name}" if job.max_span else "free GPUs the job may use",
                    name,
                    needed,
                    largest,
                    not placeable and largest < needed,
                    f"{limit} {name}: the largest has {largest} free GPUs the job may use, "
                    f"it needs {needed}",
                )
            )
            break
        out.append(
            Constraint(
                "capacity",
                f"largest free {name}",
                name,
                needed,
                largest,
                False,
                f"largest free {name}: {largest} GPUs the job may use "
                f"({int((counts >= needed).sum())} of {len(counts)} hold the whole job)",
            )
        )
    if not placeable and not any(c.binding for c in out):
        out.append(
            Constraint(
                "combination",
                "all constraints together",
                None,
                needed,
                int(usable.sum()),
                True,
                "no single constraint blocks the job; together they do"
                + (f" ({solver_message})" if solver_message else ""),
            )
        )
    return Explanation(job.name, needed, placeable, out, solver_message)
