"""Solvers written in Python, registered with :func:`gpuplace.register_solver` on import.

``baselines`` holds the peer schedulers' policies that gpuplace is measured against.
"""

from gpuplace.placers import baselines

__all__ = ["baselines"]
