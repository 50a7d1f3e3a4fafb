"""Solvers written in Python, registered with :func:`gpuplace.register_solver` on import:
``cpsat`` (exact, OR-Tools CP-SAT), ``auto`` (cpsat where it proves optimality in time, the
best heuristic otherwise) and ``baselines`` (the peer schedulers' policies gpuplace is measured
against).
"""

from gpuplace.placement.solvers import auto, baselines, cpsat

__all__ = ["auto", "baselines", "cpsat"]
