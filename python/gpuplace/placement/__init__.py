"""Placing jobs: the solvers and their registry, :func:`place` (solver, gate and cost in one
call), :func:`evaluate`, :func:`refine`, rank mapping, repair after failures, elastic jobs,
placement under the policy (pools, borrowing, preemption) and "why not placed"."""

# The solvers written in Python register themselves on import.
from gpuplace.placement import solvers as _solvers  # noqa: F401
from gpuplace.placement.explain import explain
from gpuplace.placement.mapping import Mapping, map_ranks
from gpuplace.placement.place import evaluate, place, refine
from gpuplace.placement.registry import SolverInfo, register_solver, solvers
from gpuplace.placement.repair import MovedRank, Repair, repair
from gpuplace.placement.result import CostReport, Placement, SolveResult
from gpuplace.placement.within_policy import apply_preemption

__all__ = [
    "CostReport",
    "Mapping",
    "MovedRank",
    "Placement",
    "Repair",
    "SolveResult",
    "SolverInfo",
    "apply_preemption",
    "evaluate",
    "explain",
    "map_ranks",
    "place",
    "refine",
    "register_solver",
    "repair",
    "solvers",
]
