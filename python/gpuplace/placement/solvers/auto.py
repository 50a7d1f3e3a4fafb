"""``solver="auto"``: CP-SAT where it proves optimality within the time limit, else the fallback.

First, greedy's placement is returned as proven optimal where its cost meets the core's lower
bound (:func:`gpuplace.placement.solvers.cpsat.proven_by_bound`), without a model.

The size rule (:func:`cpsat_fits`) is derived from ``benches/bench_cpsat.py`` (2 workers on a
2-core machine, 10 s limit; see :data:`RULE`). The fallback lives in one place,
:func:`fallback`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gpuplace.errors import GpuplaceError
from gpuplace.placement.registry import register_solver, solver_info
from gpuplace.placement.result import SolveResult
from gpuplace.placement.solvers import cpsat, cpsat_gpus

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job

__all__ = ["FALLBACK", "RULE", "cpsat_fits", "fallback"]

#: The solver used when the instance is too large for CP-SAT to prove in time.
FALLBACK = "refine"  # greedy, then local search on the cost model

#: Largest CP-SAT models (number of model variables, per formulation) that ``auto`` hands to
#: CP-SAT. Measured with benches/bench_cpsat.py (Philly-fragmented clusters, 2 workers):
#:
#: * count model: every measured instance was proven optimal, the slowest in 0.35 s; the
#:   largest had 379 variables (tp8 x pp8 x dp2, 128 ranks on 38 hosts). The limit stays at the
#:   measured range rounded up.
#: * assignment model: every instance with at most 1,500 variables was proven within 4.2 s
#:   (e.g. 16 ranks on 52 PCIe-switch sites: 1,050-1,496 variables, 0.5-4.2 s; ep x dp up to
#:   32 ranks on 29 hosts: 1,180 variables, 0.44 s). Above that, proofs took 1.4 s (ep8 dp8,
#:   2,052 variables), 2.1 s (tp8 pp2 dp2 on NVL72, 1,870) or missed 10 s (PCIe clusters with
#:   pp, 1,878-2,616; tp8 pp4 dp2 on NVL72, 4,166): size alone does not separate them, so the
#:   limit is the largest size with no miss.
RULE = {"count": 400, "assignment": 1_500}
#: Above this many main variables (blocks x sites, or stages x sites) the model is not built.
_PRESCREEN = 20_000


def cpsat_fits(state: ClusterState, job: Job) -> tuple[bool, str]:
    """Whether ``auto`` should run CP-SAT on this instance, and why (for ``details``)."""
    try:
        inst = cpsat.analyse(state, job)
    except GpuplaceError as exc:
        return False, str(exc)
    if inst.infeasible is not None:
        return True, "infeasible: cpsat says why"
    candidates = cpsat.candidate_gpus(inst)
    if state.pricing_view().any_degraded(candidates):
        exact = cpsat_gpus.exact_prices(job, state.topology)
        placements = math.perm(len(candidates), job.gpus)
        if not exact and placements <= cpsat.ENUMERATE_MAX:
            return True, f"enumeration of {placements} placements, some GPUs degraded"
        if exact and cpsat_gpus.fits(job.gpus, len(candidates)):
            return True, f"GPU-level model over {len(candidates)} GPUs, some of them degraded"
    limit = RULE[inst.formulation]
    if inst.size > _PRESCREEN:
        return False, f"{inst.formulation} model with {inst.size} main variables"
    variables = cpsat.model_variables(inst)
    verdict = "within" if variables <= limit else "above"
    why = f"{inst.formulation} model with {variables} variables, {verdict} the limit of {limit}"
    return variables <= limit, why


def fallback(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
    """The solver for instances beyond CP-SAT's proving range."""
    result = solver_info(FALLBACK).func(state, job, seed, time_limit)
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
    confining=True,
)
def _auto(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
    proven = cpsat.proven_by_bound(state, job, seed)
    if proven is not None:
        details = {**proven.details, "auto": "greedy meets the cost model's lower bound"}
        return SolveResult(
            gpus=proven.gpus,
            optimal=True,
            bound=proven.bound,
            solver=proven.solver,
            details=details,
        )
    fits, why = cpsat_fits(state, job)
    if fits:
        result = cpsat.solve(state, job, time_limit=time_limit, seed=seed)
    else:
        result = fallback(state, job, seed, time_limit)
    return SolveResult(
        gpus=result.gpus,
        optimal=result.optimal,
        bound=result.bound,
        solver=result.solver,
        details={**result.details, "auto": why},
    )
