"""Does a job fit now? The greedy solver's answer on a state, without pricing the placement:
what elastic jobs and "why not placed" ask before (or instead of) placing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuplace import _core
from gpuplace.errors import Infeasible

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job

__all__ = ["why_not_fits"]


def why_not_fits(state: ClusterState, job: Job) -> str | None:
    """None when the greedy solver places ``job`` on the free GPUs of ``state`` (a fenced
    view, for a job with rules), else the solver's reason."""
    try:
        _core.solve(state._core, job.compile(state.topology), "greedy", 0, None)
    except Infeasible as exc:
        return str(exc)
    return None
