"""Admitting a job under the cluster's policy: fence, borrow, preempt, explain.

:func:`gpuplace.place` runs every solver through :func:`place_within`:

1. the solver sees only the GPUs the job's pool and hardware rules allow (a fenced copy of the
   state, :meth:`gpuplace.ClusterState.fenced_view`);
2. if nothing fits and the job's class is preemptible, it may borrow the free GPUs of pools
   that lend to its pool;
3. with ``preempt=True``, if still nothing fits, it proposes preempting running jobs of lower
   priority whose class is preemptible (never a job of a non-preemptible class, nor one without
   a class), as few GPUs as it finds; the placement's ``details["preemption"]`` lists the
   victims and the cost, and :func:`apply_preemption` applies it all or nothing;
4. otherwise the Infeasible raised carries an :class:`~gpuplace.Explanation` and
   names the binding rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace.enums import Health
from gpuplace.errors import GpuplaceError, Infeasible, InvalidJob, InvalidState
from gpuplace.model.policy import DEFAULT_CLASS, PriorityClass
from gpuplace.placement.constraints import account
from gpuplace.policy.fence import allowed_gpus, can_borrow, has_rules, job_class, pool_masks

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job
    from gpuplace.placement.result import Placement

__all__ = ["apply_preemption", "place_within"]

#: A solver bound to a job: (state the solver may use) -> Placement.
Solve = Callable[["ClusterState"], "Placement"]


def place_within(
    state: ClusterState, job: Job, solve: Solve, *, preempt: bool = False
) -> Placement:
    """Run ``solve`` on the GPUs the job's policy allows; borrow, preempt or explain as the
    module docstring says. ``state`` is never changed."""
    if job.policy is not None and job.policy.priority_class is not None:
        job_class(state.effective_policy(), job)  # an unknown class is an input error, always
    if not preempt and not has_rules(state, job):
        try:
            return solve(state)
        except Infeasible as exc:
            raise _explained(exc, state, job) from None
    allowed = allowed_gpus(state, job)
    try:
        return _annotate(solve(state.fenced_view(allowed)), state, job, allowed)
    except Infeasible as exc:
        failure = exc
    borrow = can_borrow(state, job)
    if borrow:
        wider = allowed_gpus(state, job, borrow=True)
        try:
            return _annotate(solve(state.fenced_view(wider)), state, job, allowed)
        except Infeasible:
            pass
    if preempt:
        proposal = _preemption(state, job, solve, borrow)
        if proposal is not None:
            return proposal
    raise _explained(failure, state, job, preempt=preempt) from None


def _annotate(placement: Placement, state: ClusterState, job: Job, own: np.ndarray) -> Placement:
    """Record the pool and what was borrowed in ``details["policy"]``."""
    jp = job.policy
    info: dict[str, Any] = {}
    if jp is not None and jp.pool is not None:
        info["pool"] = jp.pool
        outside = [int(g) for g in placement.gpus if not own[int(g)]]
        if outside:
            info["borrowed_gpus"] = len(outside)
            info["borrowed_from"] = sorted(
                {pool for g in outside if (pool := pool_of_gpu(state, g)) is not None}
            )
    if jp is not None and jp.rules:
        info["rules"] = [str(r) for r in jp.rules]
    if not info:
        return placement
    return dataclasses.replace(placement, details={**placement.details, "policy": info})


def pool_of_gpu(state: ClusterState, gpu: int) -> str | None:
    """The pool holding a GPU (None: no pool)."""

    for name, mask in pool_masks(state).items():
        if mask[gpu]:
            return name
    return None


def _class_of(state: ClusterState, name: str) -> PriorityClass:
    spec = state.specs.get(name)
    if spec is None:
        return DEFAULT_CLASS
    try:
        return job_class(state.effective_policy(), spec)
    except InvalidJob:
        # A class removed from the policy since the job started: treat it as unknown, which
        # never makes a job preemptible.
        return DEFAULT_CLASS


def _preemption(state: ClusterState, job: Job, solve: Solve, borrow: bool) -> Placement | None:
    """Fewest victims (lowest priority first) that let the job fit, or None."""
    mine = job_class(state.effective_policy(), job)
    allowed = allowed_gpus(state, job, borrow=borrow)
    candidates = []
    for name, gpus in state.jobs.items():
        klass = _class_of(state, name)
        if not klass.preemptible or klass.priority >= mine.priority:
            continue
        useful = int(allowed[gpus].sum())
        if useful:
            candidates.append((klass.priority, -useful, name, klass, len(gpus)))
    if not candidates:
        return None
    candidates.sort()
    chosen: list[tuple[str, PriorityClass, int]] = []
    view = state.scratch_copy()
    free_allowed = int((view.free_mask() & allowed).sum())
    placement = None
    for _, neg_useful, name, klass, size in candidates:
        view.release(name)
        chosen.append((name, klass, size))
        free_allowed += -neg_useful
        if free_allowed < job.gpus:
            continue
        try:
            placement = solve(view.fenced_view(allowed))
            break
        except Infeasible:
            continue
    if placement is None:
        return None
    # Drop victims that turn out unnecessary, largest first.
    for name, _, _ in sorted(chosen, key=lambda v: -v[2]):
        if len(chosen) == 1:
            break
        trial = state.scratch_copy()
        for other, _, _ in chosen:
            if other != name:
                trial.release(other)
        try:
            placement = solve(trial.fenced_view(allowed))
        except Infeasible:
            continue
        chosen = [v for v in chosen if v[0] != name]
    final = state.scratch_copy()
    for name, _, _ in chosen:
        final.release(name)
    placement = solve(final.fenced_view(allowed))
    victims: list[dict[str, Any]] = [
        {
            "job": name,
            "priority_class": klass.name,
            "priority": klass.priority,
            "gpus": size,
        }
        for name, klass, size in chosen
    ]
    info = {
        "victims": victims,
        "cost": {
            "jobs": len(victims),
            "gpus": sum(v["gpus"] for v in victims),
            "priority_weighted_gpus": sum(v["gpus"] * v["priority"] for v in victims),
        },
    }
    placement = _annotate(placement, state, job, allowed_gpus(state, job))
    return dataclasses.replace(placement, details={**placement.details, "preemption": info})


def apply_preemption(state: ClusterState, placement: Placement) -> list[str]:
    """Release the victims a ``place(..., preempt=True)`` proposed and allocate the placement,
    all or nothing; returns the victims' names. Raises InvalidState and changes nothing when
    the state no longer allows it (a victim gone, a GPU taken or out of service)."""
    victims = [v["job"] for v in placement.details.get("preemption", {}).get("victims", [])]
    held = np.zeros(state.topology.num_gpus, dtype=bool)
    for name in victims:
        gpus = state.job_gpus(name)
        if gpus is None:
            raise InvalidState(f"preemption: victim {name!r} is no longer allocated")
        held[gpus] = True
    usable = state.free_mask() | (held & (state.health() == int(Health.Ok)) & ~_spare_mask(state))
    missing = [int(g) for g in placement.gpus if not usable[int(g)]]
    if missing:
        owner = state.owner_of(missing[0])
        raise InvalidState(
            f"preemption: GPU {missing[0]} is no longer available"
            + (f" (held by {owner!r})" if owner else "")
        )
    if placement.job.name in state.jobs and placement.job.name not in victims:
        raise InvalidState(f"job {placement.job.name!r} is already allocated")
    for name in victims:
        state.release(name)
    state.allocate(placement)
    return victims


def _spare_mask(state: ClusterState) -> np.ndarray:
    mask = np.zeros(state.topology.num_gpus, dtype=bool)
    mask[state.spares] = True
    return mask


def _explained(
    exc: Infeasible, state: ClusterState, job: Job, *, preempt: bool = False
) -> Infeasible:
    """The Infeasible to raise: the solver's message, the binding rules named, and the full
    account attached as ``explanation``."""

    try:
        explanation = account(state, job, solver_message=str(exc), placeable=False)
    except GpuplaceError:
        return exc
    message = str(exc)
    rules = [c for c in explanation.binding if c.kind in ("pool", "exclusion")]
    power = [c for c in explanation.binding if c.kind == "power"]
    if power and not rules:
        message = (
            f"job {job.name!r} needs {job.gpus} GPUs and does not fit within the power "
            "budgets; binding: " + "; ".join(c.detail for c in power)
        )
    elif rules:
        message = (
            f"job {job.name!r} needs {job.gpus} GPUs and does not fit within its policy; "
            "blocked by " + "; ".join(c.detail for c in rules)
        )
    elif has_rules(state, job):
        message += " (counting only the GPUs its policy allows)"
    if preempt:
        message += "; no lower-priority preemptible job frees enough room"
    out = Infeasible(message)
    out.explanation = explanation
    return out
