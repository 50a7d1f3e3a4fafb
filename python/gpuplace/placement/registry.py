"""The solver registry: every solver shares one signature and is listed by :func:`solvers`.

The Rust solvers (greedy, refine, ...) are registered from the core; solvers written in Python
(:mod:`gpuplace.placement.solvers`) register themselves with :func:`register_solver`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuplace import _core
from gpuplace.errors import InvalidJob
from gpuplace.placement.result import SolveResult

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job

__all__ = ["Solver", "SolverInfo", "register_solver", "solver_info", "solvers"]


#: A solver: (state, job, seed, time_limit) -> SolveResult.
Solver = Callable[["ClusterState", "Job", int, "float | None"], SolveResult]


@dataclass(frozen=True)
class SolverInfo:
    name: str
    description: str
    func: Solver
    #: The solver promises to keep the job's confinement rules; the placement gate refuses a
    #: placement of it that breaks them.
    confining: bool = False
    #: Implemented in Rust: :func:`place` runs it, the gate and the pricing in one call into
    #: the core.
    rust: bool = False


_REGISTRY: dict[str, SolverInfo] = {}


def register_solver(
    name: str, description: str, *, confining: bool = False
) -> Callable[[Solver], Solver]:
    """Decorator that adds a solver to :func:`solvers` and :func:`place`. ``confining``: the
    solver promises to keep the job's confinement rules (the gate in :func:`place` checks it)."""

    def wrap(func: Solver) -> Solver:
        _REGISTRY[name] = SolverInfo(name, description, func, confining)
        return func

    return wrap


def solvers() -> dict[str, str]:
    """Registered solvers: name -> one-line description."""
    return {name: info.description for name, info in _REGISTRY.items()}


def _rust_solver(name: str) -> Solver:
    def run(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
        # The solver alone: the placement passes the gate once, in gpuplace.place.
        gpus = _core.solve(state._core, job.compile(state.topology), name, seed, time_limit)
        return SolveResult(gpus=gpus)

    return run


for _name, _description, _confining in _core.rust_solvers():
    _REGISTRY[_name] = SolverInfo(_name, _description, _rust_solver(_name), _confining, rust=True)


def solver_info(name: str) -> SolverInfo:
    """The registered solver ``name``; InvalidJob naming the solvers when there is none."""
    info = _REGISTRY.get(name)
    if info is None:
        raise InvalidJob(f"unknown solver {name!r}; the solvers are {', '.join(_REGISTRY)}")
    return info
