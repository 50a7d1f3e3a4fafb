"""Elastic jobs: a range of one parallel degree and layout alternatives, placed at the best
size and layout that fit now.

In a job file, one dimension may be a range and ``alternatives`` may give other layouts, each
with its own communication (``docs/job-format.md``)::

    parallelism: {tp: 8, pp: 4, dp: {min: 8, max: 16}}
    alternatives:
      - parallelism: {tp: 4, pp: 8, dp: {min: 8, max: 16}}
        communication: {tp: {kind: all-reduce, bytes: 6.5e7, count: 1280}}

:func:`place_elastic` (what :func:`gpuplace.place` runs for such a job) finds, for each
layout, the largest degree in the range that fits now (checked with the greedy solver, from
the top of the range down), places it with the requested solver, and keeps the layout with
the highest predicted throughput: tokens/s when the cost report gives it
(``cost.tokens_per_second``), else GPUs / communication seconds per step. The placement's
``details["elastic"]`` names the chosen layout, its throughput relative to the best layout at
the largest size that fits the cluster with nothing else running, and every alternative
rejected and why ("dp
16 (512 GPUs): needs 512 GPUs ...; dp 12 fits now at 0.78x throughput").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuplace.cluster.mig import MIG_JOB
from gpuplace.errors import Infeasible
from gpuplace.model.job import Elastic
from gpuplace.placement.probe import why_not_fits
from gpuplace.policy.fence import allowed_gpus

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job
    from gpuplace.placement.result import Placement

__all__ = ["place_elastic"]


def layout_name(job: Job) -> str:
    return ", ".join(f"{d} {v}" for d, v in job.degrees.items() if v > 1) or "1 GPU"


def throughput(placement: Placement) -> float:
    """Predicted throughput: tokens/s when the cost report has it, else GPUs per second of
    communication per step (a relative figure)."""
    tokens = getattr(placement.cost, "tokens_per_second", None)
    if tokens:
        return float(tokens)
    return len(placement.gpus) / max(placement.cost.comm_seconds, 1e-9)


def _concrete(job: Job, dim: str | None, size: int, name: str) -> Job:
    """One layout at one size, named as the elastic job (an alternative keeps the name the
    job was given, e.g. by ``place --name``)."""
    if dim is None:
        return dataclasses.replace(job, name=name, elastic=None)
    sized: dict[str, Any] = {dim: size}
    return dataclasses.replace(job, name=name, elastic=None, **sized)


def _fits(state: ClusterState, job: Job) -> str | None:
    """None when the greedy solver places ``job`` on the GPUs its policy allows, else why
    not."""
    return why_not_fits(state.fenced_view(allowed_gpus(state, job)), job)


def place_elastic(
    state: ClusterState,
    job: Job,
    place: Callable[[ClusterState, Job], Placement],
    *,
    precheck: bool = True,
) -> Placement:
    """Place an elastic job at its best layout and size now (see the module docstring);
    ``place(state, concrete_job)`` is the solver. ``precheck``: rule sizes out with the greedy
    solver on the GPUs the job's own policy allows before calling ``place`` (turn it off when
    ``place`` may borrow or preempt, which can fit what the precheck cannot, and when ``place``
    runs the greedy solver itself, so that no size is solved twice). Raises
    Infeasible listing every layout's reason when none fits at any size."""
    spec = job.elastic
    assert spec is not None
    layouts: list[tuple[Job, Elastic]] = [(job, spec)]
    for alt in spec.alternatives:
        layouts.append((alt, alt.elastic or Elastic()))
    chosen: list[tuple[float, Placement, Job]] = []
    rejected: list[dict[str, Any]] = []
    for layout, rng in layouts:
        sizes = rng.sizes() if rng.dim is not None else range(1, 0, -1)
        first_reason = None
        for size in sizes:
            candidate = _concrete(layout, rng.dim, size, job.name)
            why = _fits(state, candidate) if precheck else None
            if why is None:
                try:
                    placement = place(state, candidate)
                except Infeasible as exc:
                    why = str(exc)
                else:
                    chosen.append((throughput(placement), placement, candidate))
                    break
            if first_reason is None:
                first_reason = why
                rejected.append(
                    {
                        "layout": layout_name(candidate),
                        "gpus": candidate.gpus,
                        "reason": why,
                    }
                )
        else:
            if rng.dim is not None and rejected:
                rejected[-1]["reason"] += f" (and nothing down to {rng.dim} {rng.low} fits)"
    if not chosen:
        reasons = "; ".join(f"{r['layout']} ({r['gpus']} GPUs): {r['reason']}" for r in rejected)
        raise Infeasible(f"elastic job {job.name!r} fits at no size or layout now: {reasons}")
    chosen.sort(key=lambda c: -c[0])
    best_rate, best, best_job = chosen[0]
    ideal = _ideal_rate(state, job.name, layouts, place, precheck)
    relative = best_rate / ideal if ideal else 1.0
    for rate, _, candidate in chosen[1:]:
        rejected.append(
            {
                "layout": layout_name(candidate),
                "gpus": candidate.gpus,
                "reason": f"fits now at {rate / ideal if ideal else 1.0:.2f}x throughput, "
                f"below the chosen {relative:.2f}x",
            }
        )
    info = {
        "chosen": layout_name(best_job),
        "gpus": best_job.gpus,
        "relative_throughput": relative,
        "throughput_basis": "tokens/s"
        if getattr(best.cost, "tokens_per_second", None)
        else "GPUs / comm seconds per step",
        "rejected": rejected,
        "summary": _summary(best_job, relative, rejected),
    }
    return dataclasses.replace(best, details={**best.details, "elastic": info})


def _ideal_rate(
    state: ClusterState,
    name: str,
    layouts: list[tuple[Job, Elastic]],
    place: Callable[[ClusterState, Job], Placement],
    precheck: bool,
) -> float:
    """The best throughput of any layout at its largest size on the cluster with nothing
    else running (same hardware health, MIG-mode GPUs still out), the reference of the
    relative figures."""

    empty = state.scratch_copy()
    for held in list(empty.jobs):
        if held != MIG_JOB:  # MIG-mode GPUs never serve whole-GPU jobs
            empty.release(held)
    best = 0.0
    for layout, rng in layouts:
        for size in rng.sizes() if rng.dim is not None else (0,):
            candidate = _concrete(layout, rng.dim, size, name)
            if not precheck or _fits(empty, candidate) is None:
                try:
                    best = max(best, throughput(place(empty, candidate)))
                except Infeasible:
                    continue
                break
    return best


def _summary(chosen: Job, relative: float, rejected: list[dict[str, Any]]) -> str:
    parts = [f"{r['layout']} ({r['gpus']} GPUs): {r['reason']}" for r in rejected]
    parts.append(
        f"{layout_name(chosen)} ({chosen.gpus} GPUs) fits now at {relative:.2f}x throughput"
    )
    return "; ".join(parts)
