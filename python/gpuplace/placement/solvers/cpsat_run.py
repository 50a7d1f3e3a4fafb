"""Running CP-SAT so that Ctrl-C reaches the caller: shared by the block model
(:mod:`gpuplace.placement.solvers.cpsat`) and the GPU-level model
(:mod:`gpuplace.placement.solvers.cpsat_gpus`)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

__all__ = ["solve_stoppable"]


def solve_stoppable(solver: cp_model.CpSolver, model: cp_model.CpModel) -> Any:
    """``solver.solve(model)`` on a worker thread, so Ctrl-C reaches Python while CP-SAT
    searches: the search is stopped and KeyboardInterrupt raised (CP-SAT's own SIGINT
    handler would end the search quietly and return its incumbent as if nothing happened)."""
    solver.parameters.catch_sigint_signal = False
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["status"] = solver.solve(model)
        except BaseException as exc:  # re-raised on the caller's thread
            out["error"] = exc

    worker = threading.Thread(target=run, name="gpuplace-cpsat", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
    except KeyboardInterrupt:
        solver.stop_search()
        worker.join()
        raise
    if "error" in out:
        raise out["error"]
    return out["status"]
