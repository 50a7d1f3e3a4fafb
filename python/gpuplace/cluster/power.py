"""Power budgets in a live cluster: the draw of every power domain, recomputed from the
allocations (no counter to drift), and the views that keep placement within the budgets.

The declarations (domains, budgets, a job's draw) are in :mod:`gpuplace.model.power`; the
arithmetic (a domain's draw per phase slot, the budget check, the GPUs a job may take per
domain and slot) is the core's (``rust/core/src/power.rs``), asked through a ledger of the
state's running jobs (:func:`_ledger`).

Placement: a Rust solver's request carries the budgets (:func:`power_request`) and the core
tries the phase slots, fencing off per slot the free GPUs the job may not take in each domain
(its headroom divided by the job's per-GPU draw); for a Python solver :func:`power_view` hides
them in a copy of the state per slot (:func:`place_within_power`). So no solver can exceed a
budget; :meth:`ClusterState.allocate` checks the budgets again and refuses an allocation that
would exceed one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace.errors import Infeasible, InvalidState, InvalidTopology
from gpuplace.model.power import BOARD_POWER_W, declared_power

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = [
    "DomainLimit",
    "check_budgets",
    "limiting_domains",
    "place_within_power",
    "power_limits",
    "power_report",
    "power_request",
    "power_view",
    "refusal",
]


def _ledger(state: ClusterState) -> _core.PowerLedger:
    """The core's account of the state's running jobs: each one's declared draw and phase
    slot, its GPUs per domain."""
    # declared_power, inlined: this runs twice per placement over every running job.
    powers = {
        name: (p.peak_w, p.average_w, p.synchronized)
        for name, spec in state.specs.items()
        if (p := getattr(spec, "power", None)) is not None
    }
    return state.topology.power_model.ledger(state._core, powers, state.phase_slots)


def power_request(
    state: ClusterState, job: Job
) -> tuple[_core.PowerLedger, tuple[float | None, float | None, bool] | None] | None:
    """What a placement request into the core carries for the power budgets: the ledger of
    the state's running jobs and the job's declared draw (``_core.place(..., power=)``, which
    tries the phase slots and holds back what each domain's headroom does not allow); None
    without power domains."""
    topology = state.topology
    if not topology.power_domains:
        return None
    _boards_known(topology)
    return _ledger(state), declared_power(job)


def refusal(state: ClusterState, job: Job, exc: Infeasible) -> Infeasible:
    """The refusal of a job no phase slot places, naming the limiting power domains."""
    why = limiting_domains(state, job)
    return Infeasible(f"{exc} (within the power budgets: {why or 'no domain is limiting'})")


def check_budgets(state: ClusterState, name: str, job: Job | None, gpus: Any, slot: int) -> None:
    """Raise InvalidState naming the domain when allocating ``gpus`` would exceed a budget or
    the synchronised-job limit."""
    topology = state.topology
    if not topology.power_domains:
        return
    phases = topology.power_phases
    gpus = np.asarray(gpus, dtype=np.int64)
    over = _ledger(state).check(gpus, declared_power(job), int(slot) % phases)
    if over is None:
        return
    d, cause, draw, at = over
    dom = topology.power_domains[d]
    if cause == "budget":
        raise InvalidState(
            f"power domain {dom.name!r}: job {name!r} would draw it to {draw:,.0f} W, "
            f"over its budget of {dom.budget_w:,.0f} W"
        )
    raise InvalidState(
        f"power domain {dom.name!r}: at most {dom.max_synchronized} synchronised job(s) may "
        f"peak together (phase slot {at} of {phases})"
    )


@dataclass(frozen=True)
class DomainLimit:
    """What one power domain lets a job take in one phase slot."""

    #: The power domain's name and index in ``topology.power_domains``.
    domain: str
    index: int
    #: Free GPUs of the domain, and how many of them the job may take within the budget.
    free: int
    allowed: int
    #: Why ``allowed`` is below ``free``: ``"budget"`` (the watts left), ``"max_synchronized"``
    #: (that many synchronised jobs already peak in this slot), or None when it is not.
    cause: str | None
    budget_w: float
    #: Budget minus the domain's draw now (W).
    headroom_w: float
    max_synchronized: int | None

    def describe(self, phases: int, slot: int) -> str:
        where = f" in phase slot {slot} of {phases}" if phases > 1 else ""
        if self.cause == "max_synchronized":
            return (
                f"power domain {self.domain}: max_synchronized {self.max_synchronized} reached "
                f"(that many synchronised jobs already peak together{where}), so none of its "
                f"{self.free} free GPUs"
            )
        return (
            f"power domain {self.domain}: budget {self.budget_w:,.0f} W, headroom "
            f"{self.headroom_w:,.0f} W{where}, so {self.allowed} of its {self.free} free GPUs"
        )


def power_limits(state: ClusterState, job: Job) -> list[tuple[int, list[DomainLimit]]]:
    """Per phase slot the job may take (every slot for a synchronised job, else slot 0),
    what each power domain lets it take there. Empty without power domains."""
    topology = state.topology
    if not topology.power_domains:
        return []
    _boards_known(topology)
    ledger = _ledger(state)
    free = state.free_mask()
    declared = declared_power(job)
    out: list[tuple[int, list[DomainLimit]]] = []
    for slot in range(topology.power_phases if _synchronized(job) else 1):
        limits = [
            DomainLimit(
                domain=dom.name,
                index=d,
                free=n_free,
                allowed=allowed,
                cause=cause,
                budget_w=dom.budget_w,
                headroom_w=headroom,
                max_synchronized=dom.max_synchronized,
            )
            for d, (dom, (n_free, allowed, cause, headroom)) in enumerate(
                zip(topology.power_domains, ledger.limits(free, declared, slot), strict=True)
            )
        ]
        out.append((slot, limits))
    return out


def _boards_known(topology: Topology) -> None:
    if not topology.power_model.boards_known():
        raise InvalidTopology(
            "power domains need every GPU's board power: give the host types power_w "
            f"or a known gpu_model ({', '.join(BOARD_POWER_W)})"
        )


def power_view(
    state: ClusterState, job: Job, *, relax: frozenset[int] = frozenset()
) -> list[tuple[int, ClusterState]]:
    """For each phase slot, a copy of ``state`` in which each power domain's free GPUs beyond
    what ``job`` may take there are held back (domains whose index is in ``relax`` are not
    limited: what explaining a refusal asks). Without power domains: the state itself,
    slot 0."""
    topology = state.topology
    if not topology.power_domains:
        return [(0, state)]
    _boards_known(topology)
    ledger = _ledger(state)
    free = state.free_mask()
    declared = declared_power(job)
    out: list[tuple[int, ClusterState]] = []
    for slot in range(topology.power_phases if _synchronized(job) else 1):
        held = ledger.held(free, declared, slot, sorted(relax))
        view = state.copy()
        if len(held):
            view.drain_gpus(held.tolist())  # held back for the budget, in this copy only
        out.append((slot, view))
    return out


def _synchronized(job: Job) -> bool:
    power = getattr(job, "power", None)
    return power is not None and power.synchronized


def limiting_domains(state: ClusterState, job: Job) -> str:
    """The power domains that hold GPUs back from ``job`` in its least limited slot, in words
    (for a refusal); empty when none does."""
    best: tuple[int, int, list[DomainLimit]] | None = None
    for slot, limits in power_limits(state, job):
        held = sum(lim.free - lim.allowed for lim in limits)
        if best is None or held < best[0]:
            best = (held, slot, limits)
    if best is None:
        return ""
    _, slot, limits = best
    phases = state.topology.power_phases
    binding = [lim for lim in limits if lim.cause is not None and lim.free]
    binding.sort(key=lambda lim: lim.allowed - lim.free)
    words = [lim.describe(phases, slot) for lim in binding[:3]]
    if len(binding) > 3:
        words.append(f"{len(binding) - 3} more domains limited")
    return "; ".join(words)


def place_within_power(
    state: ClusterState,
    job: Job,
    solve: Callable[[ClusterState], Any],
    cost: Callable[[Any], float] | None = None,
    enough: Callable[[Any], bool] | None = None,
) -> tuple[Any, int]:
    """Run ``solve(view)`` on the power-limited view of each phase slot. Without ``cost`` the
    first slot that places the job wins; with it, every slot is tried and the cheapest
    placement wins (the earliest slot on a tie), so a job staggered into a later slot inside
    one rack is preferred over one split across racks in slot 0; a placement for which
    ``enough`` holds (no later slot can keep it tighter) ends the search early. Raises
    Infeasible naming the limiting power domains when no slot places the job."""
    last: Infeasible | None = None
    best: tuple[float, Any, int] | None = None
    for slot, view in power_view(state, job):
        try:
            found = solve(view)
        except Infeasible as exc:
            last = exc
            continue
        if cost is None or (best is None and enough is not None and enough(found)):
            return found, slot
        price = cost(found)
        if best is None or price < best[0] * (1 - 1e-12):
            best = (price, found, slot)
    if best is not None:
        return best[1], best[2]
    if not state.topology.power_domains or last is None:
        raise last or Infeasible("no placement")
    raise refusal(state, job, last)


def power_report(state: ClusterState) -> list[dict[str, Any]]:
    """Per power domain: budget, draw, headroom (W), synchronised jobs and their phases."""
    topology = state.topology
    if not topology.power_domains:
        return []
    ledger = _ledger(state)
    phases = topology.power_phases
    out = []
    for d, (dom, draw) in enumerate(zip(topology.power_domains, ledger.draws(), strict=True)):
        out.append(
            {
                "domain": dom.name,
                "kind": dom.kind,
                "budget_w": dom.budget_w,
                "draw_w": draw,
                "headroom_w": dom.budget_w - draw,
                "synchronized_jobs": {
                    name: slot / phases for name, slot in ledger.synchronized_jobs(d)
                },
            }
        )
    return out
