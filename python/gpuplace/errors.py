"""The one exception tree of gpuplace.

Every error gpuplace raises on purpose is a :class:`GpuplaceError`. Errors caused by the
caller's input (a malformed topology file, an impossible job) also subclass ``ValueError`` so
that generic callers can catch them as such. The Rust core's error enum maps onto these classes
in one place (``rust/py/src/errors.rs``).
"""

from __future__ import annotations

__all__ = [
    "GpuplaceError",
    "Infeasible",
    "InvalidJob",
    "InvalidState",
    "InvalidTopology",
]


class GpuplaceError(Exception):
    """Base class of every error gpuplace raises on purpose."""


class InvalidTopology(GpuplaceError, ValueError):
    """A topology (file, preset parameters or arrays) is malformed.

    The message names the file, line or field and says what was expected.
    """


class InvalidJob(GpuplaceError, ValueError):
    """A job specification is malformed or inconsistent."""


class InvalidState(GpuplaceError, ValueError):
    """A cluster state (snapshot or state file) is malformed, corrupted or does not match
    the topology, or an operation on it is not allowed (a GPU already taken, an unknown job)."""


class Infeasible(GpuplaceError, ValueError):
    """The request cannot be satisfied on this cluster in its current state.

    The message says why in the user's terms, e.g. "needs 16 GPUs inside one nvlink domain;
    the largest free one has 8". ``explanation`` (a :class:`gpuplace.explain.Explanation`,
    set by :func:`gpuplace.place`) gives the binding constraint at each level.
    """

    explanation: object | None = None
