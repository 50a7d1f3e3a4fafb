"""Why a job is (not) placed now: :func:`explain`.

The verdict is :func:`gpuplace.place`'s own: with a ``solver``, the placement is run (through
the same admission: the policy's fence, borrowing, the power budgets in every phase slot, the
GPUs in MIG mode, the gate), and the account of every constraint
(:func:`gpuplace.placement.constraints.account`) says which of them binds, naming the pool,
rule or power domain (and whether ``max_synchronized`` is the cause); a job that fits also gets
the contention it would meet among the running jobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuplace.errors import Constraint, Explanation, Infeasible
from gpuplace.placement.constraints import account
from gpuplace.placement.place import place

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job

__all__ = ["Constraint", "Explanation", "explain"]


def explain(
    state: ClusterState,
    job: Job,
    solver: str | None = None,
    *,
    borrow: bool | None = None,
    seed: int = 0,
    time_limit: float | None = None,
) -> Explanation:
    """The account of every constraint on placing ``job`` in ``state`` now (the state is not
    changed). With ``solver``, ``place(state, job, solver)`` is run and its verdict is the
    account's (its message kept as ``solver_message`` when it refuses); without, the greedy
    solver's verdict on the state as ``place`` admits the job. ``borrow``: count the pools
    lending to the job's pool as usable (default: when the job may borrow, as ``place``
    does)."""
    if solver is None:
        return account(state, job, borrow=borrow)
    try:
        placement = place(state, job, solver, seed=seed, time_limit=time_limit)
    except Infeasible as exc:
        return account(state, job, borrow=borrow, solver_message=str(exc), placeable=False)
    return account(state, job, borrow=borrow, placeable=True, placement=placement)
