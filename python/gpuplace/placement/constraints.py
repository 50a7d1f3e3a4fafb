"""The account of every constraint on placing a job now: what :func:`gpuplace.explain` shows
and what every :class:`gpuplace.Infeasible` raised by :func:`gpuplace.place` carries.

:func:`account` gives the full account a scheduler shows its users (as Kueue's and Slurm's
pending reasons do): for the cluster, the GPUs in MIG mode, the job's pool, each hardware
rule, each power domain that limits the job, each confined dimension and the job's span
limit, what the job needs, what is available, and whether that constraint is *binding*. A
pool, hardware rule, power domain or the MIG GPUs are binding when the job fits without that
one constraint but not with it (checked by running the greedy solver on the state as
:func:`gpuplace.place` admits it: fenced by the policy, limited by the power budgets in each
phase slot); capacity, confinement and span are binding when the free GPUs the job may use
cannot hold what it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpuplace.cluster.mig import MIG_JOB
from gpuplace.cluster.power import DomainLimit, power_limits, power_view
from gpuplace.enums import Health
from gpuplace.errors import Constraint, Explanation, InvalidTopology
from gpuplace.placement.probe import why_not_fits
from gpuplace.policy.fence import Restriction, can_borrow, restrictions

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job
    from gpuplace.placement.result import Placement

__all__ = ["Constraint", "Explanation", "account"]


def _fits(
    state: ClusterState,
    job: Job,
    allowed: np.ndarray,
    relax: frozenset[int] | None = None,
) -> bool:
    """Whether the greedy solver places ``job`` on the GPUs ``allowed`` within the power
    budgets (in some phase slot; the domains in ``relax`` unlimited; ``relax=None``: no
    power limit at all)."""
    fenced = state.fenced_view(allowed)
    if relax is None or not state.topology.power_domains:
        return why_not_fits(fenced, job) is None
    return any(why_not_fits(view, job) is None for _, view in power_view(fenced, job, relax=relax))


def _mask(rules: list[Restriction], n: int, skip: int | None = None) -> np.ndarray:
    allowed = np.ones(n, dtype=bool)
    for i, r in enumerate(rules):
        if i != skip:
            allowed &= ~r.excluded
    return allowed


def account(
    state: ClusterState,
    job: Job,
    *,
    borrow: bool | None = None,
    solver_message: str | None = None,
    placeable: bool | None = None,
    placement: Placement | None = None,
) -> Explanation:
    """The account of every constraint on placing ``job`` in ``state`` now (the state is not
    changed). ``borrow``: count the pools lending to the job's pool as usable (default: when
    the job may borrow, as :func:`gpuplace.place` would). ``placeable``: the verdict when the
    caller ran the placement itself (default: the greedy solver's, as :func:`gpuplace.place`
    admits the job); ``placement``: that placement, whose contention with the running jobs is
    then reported."""
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
    every: frozenset[int] = frozenset()
    if placeable is None:
        placeable = _fits(state, job, allowed, every)
    out: list[Constraint] = []

    allocated = sum(len(g) for g in state.jobs.values())
    mig_gpus = state.job_gpus(MIG_JOB) if state.mig is not None else None
    in_mig = 0 if mig_gpus is None else len(mig_gpus)
    out.append(
        Constraint(
            "capacity",
            "free GPUs",
            topo.levels[-1].name,
            needed,
            int(free.sum()),
            bool(free.sum() < needed),
            f"the cluster has {int(free.sum())} free GPUs of {n} ({allocated - in_mig} "
            f"allocated to jobs, {in_mig} in MIG mode, "
            f"{int((health != int(Health.Ok)).sum())} failed or drained, {len(state.spares)} "
            f"spares held back); the job needs {needed}",
        )
    )
    if in_mig:
        without = state.scratch_copy()
        without.release(MIG_JOB)
        binding = not placeable and _fits(without, job, allowed, every)
        out.append(
            Constraint(
                "mig",
                "GPUs in MIG mode",
                None,
                needed,
                int(free.sum()),
                binding,
                f"{in_mig} GPUs are in MIG mode (serving MIG instances, not whole-GPU jobs)"
                + ("; the job would fit if they left MIG mode" if binding else ""),
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
            binding = _fits(state, job, _mask(rules, n, skip=i), every)
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
    out.extend(_power(state, job, allowed, placeable))

    path = topo.path
    for d, level_name in job.confine.items():
        size = getattr(job, d)
        try:
            level = topo.level_index(level_name)
        except InvalidTopology:
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
    if placement is not None and placement.cost.alone_seconds is not None:
        out.append(_contention(placement))
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


def _power(state: ClusterState, job: Job, allowed: np.ndarray, placeable: bool) -> list[Constraint]:
    """One row per power domain that holds back free GPUs the job may use, in the phase slot
    where it holds back least; binding when the job fits with that domain's limit lifted
    (every slot tried), or, when no single domain's does, the limiting domains together."""
    topo = state.topology
    if not topo.power_domains:
        return []
    fenced = state.fenced_view(allowed)
    slots = power_limits(fenced, job)
    phases = topo.power_phases
    best: dict[int, tuple[int, DomainLimit]] = {}
    for slot, limits in slots:
        for lim in limits:
            seen = best.get(lim.index)
            if seen is None or (
                seen[1].cause is not None and (lim.cause is None or lim.allowed > seen[1].allowed)
            ):
                best[lim.index] = (slot, lim)
    limiting = [(slot, lim) for slot, lim in best.values() if lim.cause is not None]
    power_binds = not placeable and _fits(state, job, allowed, None)
    if not limiting:
        # Each domain leaves the job room in some slot, but no slot leaves it room everywhere.
        per_slot = [
            f"slot {slot}: " + ", ".join(lim.domain for lim in limits if lim.cause is not None)
            for slot, limits in slots
            if any(lim.cause is not None for lim in limits)
        ]
        if not power_binds or not per_slot:
            return []
        return [
            Constraint(
                "power",
                "power budgets in every phase slot",
                None,
                job.gpus,
                0,
                True,
                "every phase slot has a power domain that holds back GPUs the job needs ("
                + "; ".join(per_slot)
                + "); the job fits without the power limits",
            )
        ]
    singles = {
        lim.index: power_binds and _fits(state, job, allowed, frozenset({lim.index}))
        for _, lim in limiting
    }
    together = power_binds and not any(singles.values())
    rows = []
    for slot, lim in sorted(limiting, key=lambda item: item[1].allowed - item[1].free):
        every_slot = phases > 1 and all(
            next(x for x in limits if x.index == lim.index).cause == lim.cause
            for _, limits in slots
        )
        detail = lim.describe(phases, slot)
        if every_slot and lim.cause == "max_synchronized":
            detail += " in every phase slot"
        binding = singles[lim.index] or together
        if binding:
            detail += (
                "; lifting this limit lets the job fit"
                if singles[lim.index]
                else "; the job fits only if these power domains together allowed more"
            )
        rows.append(
            Constraint(
                "power",
                f"power domain {lim.domain}"
                + (" (max_synchronized)" if lim.cause == "max_synchronized" else " (budget)"),
                None,
                job.gpus,
                lim.allowed,
                binding,
                detail,
            )
        )
    return rows


def _contention(placement: Placement) -> Constraint:
    """The placement's slowdown among the running jobs and the uplinks responsible (never
    binding: contention slows a job, it does not keep it out)."""
    cost = placement.cost
    hot = cost.hot_uplinks[:2]
    where = "; ".join(
        f"{u.uplink} {u.direction} at {u.utilisation:.2f}x its {u.capacity_gbps:.0f} GB/s"
        + (f" (with {', '.join(list(u.jobs)[:3])})" if u.jobs else "")
        for u in hot
    )
    return Constraint(
        "contention",
        "shared uplinks",
        None,
        placement.job.gpus,
        len(placement.gpus),
        False,
        f"placed, its communication runs x{cost.slowdown:.3f} its time alone "
        f"({cost.alone_seconds * 1e3 if cost.alone_seconds else 0:.3f} ms alone)"
        + (f": {where}" if where else ": no uplink on its paths is over capacity"),
    )
