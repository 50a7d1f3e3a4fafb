"""The one exception tree of gpuplace.

Every error gpuplace raises on purpose is a :class:`GpuplaceError`. Errors caused by the
caller's input (a malformed topology file, an impossible job) also subclass ``ValueError`` so
that generic callers can catch them as such. The Rust core's error enum maps onto these classes
in one place (``rust/py/src/errors.rs``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "Constraint",
    "Explanation",
    "GpuplaceError",
    "Infeasible",
    "InvalidJob",
    "InvalidState",
    "InvalidTopology",
    "MissingExtra",
    "StateConflict",
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


class StateConflict(InvalidState):
    """A state file changed on disk since this process loaded (or last saved) it: another
    process wrote it. Saving would silently drop that process's change, so nothing is written;
    load the file again and redo the change (or use :meth:`gpuplace.ClusterState.transaction`,
    which holds the file's lock from load to save)."""


class Infeasible(GpuplaceError, ValueError):
    """The request cannot be satisfied on this cluster in its current state.

    The message says why in the user's terms, e.g. "needs 16 GPUs inside one nvlink domain;
    the largest free one has 8". ``explanation`` (an :class:`Explanation`, set by
    :func:`gpuplace.place`) gives the binding constraint at each level.
    """

    explanation: Explanation | None = None


class MissingExtra(GpuplaceError, ImportError):
    """An optional dependency is not installed; the message names the extra to install
    (``pip install 'gpuplace[ray]'``)."""


# The account an Infeasible carries: what each constraint needs and has (gpuplace.explain).
@dataclass(frozen=True)
class Constraint:
    """One constraint's account. ``kind`` is ``capacity``, ``pool``, ``exclusion``,
    ``confinement``, ``span``, ``combination`` or (for MIG requests, ``gpuplace.cluster.mig``)
    ``mig``; ``needed`` and ``available`` count GPUs (for confinement: groups; for MIG
    capacity: compute slices)."""

    kind: str
    #: The rule or constraint in a few words ("avoid firmware <96.00.99", "pool training").
    name: str
    level: str | None
    needed: int
    available: int
    binding: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Explanation:
    """Why ``job`` does (not) fit ``state`` now."""

    job: str
    gpus: int
    placeable: bool
    constraints: list[Constraint]
    solver_message: str | None = None

    @property
    def binding(self) -> list[Constraint]:
        return [c for c in self.constraints if c.binding]

    def summary(self) -> str:
        if self.placeable:
            pools = [c.name for c in self.constraints if c.kind == "pool" and "borrowing" in c.name]
            return f"{self.job} ({self.gpus} GPUs) fits now" + (f" in {pools[0]}" if pools else "")
        reasons = "; ".join(c.detail for c in self.binding) or (self.solver_message or "")
        return f"{self.job} ({self.gpus} GPUs) does not fit: {reasons}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "gpus": self.gpus,
            "placeable": self.placeable,
            "binding": [c.kind for c in self.binding],
            "constraints": [c.to_dict() for c in self.constraints],
            "solver_message": self.solver_message,
        }
