"""Solvers written in Python. Importing this package registers them with
:func:`gpuplace.placement.register_solver`: ``cpsat`` (exact, OR-Tools CP-SAT) and ``auto``.

``import gpuplace`` imports this package, which rebinds the attribute ``gpuplace.solvers``
from the function :func:`gpuplace.placement.solvers` to this package; calling the package
forwards to that function, so ``gpuplace.solvers()`` keeps working.
"""

import sys
import types
from typing import Any

from gpuplace import placement
from gpuplace.solvers import auto, cpsat

__all__ = ["auto", "cpsat"]


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, str]:
        return placement.solvers(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
