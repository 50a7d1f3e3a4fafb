"""Power budgets in a live cluster: the draw of every power domain, recomputed from the
allocations (no counter to drift), and the views that keep placement within the budgets.

The declarations (domains, budgets, a job's draw) are in :mod:`gpuplace.model.power`.

Placement: :func:`power_view` hides, in a copy of the state, the free GPUs a job may not take
in each domain (its headroom divided by the job's per-GPU draw), trying the phase slots in
order, so no solver can exceed a budget; :meth:`ClusterState.allocate` checks the budgets again
and refuses an allocation that would exceed one. The state's draw is recomputed from the
allocations (no counter to drift).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace.errors import Infeasible, InvalidState, InvalidTopology
from gpuplace.model.power import BOARD_POWER_W, gpu_power_w, job_power

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = [
    "DomainLimit",
    "check_budgets",
    "domain_draw",
    "limiting_domains",
    "place_within_power",
    "power_limits",
    "power_report",
    "power_view",
]


@dataclass
class _Running:
    name: str
    gpus_in: dict[int, int]  # domain index -> GPUs there
    peak: float
    average: float
    synchronized: bool
    slot: int


def _running(
    state: ClusterState, extra: tuple[str, Job | None, Any, int] | None = None
) -> list[_Running]:
    topology = state.topology
    domains = topology.power_domains
    host_domains: dict[int, list[int]] = {}
    for d, dom in enumerate(domains):
        for h in dom.hosts:
            host_domains.setdefault(h, []).append(d)
    board = gpu_power_w(topology)
    host_of = topology.host_of_gpu
    jobs = [(n, state.specs.get(n), g, state.phase_slots.get(n, 0)) for n, g in state.jobs.items()]
    if extra is not None:
        jobs.append(extra)
    out: list[_Running] = []
    for name, spec, gpus, slot in jobs:
        gpus = np.asarray(gpus, dtype=np.int64)
        counts: dict[int, int] = {}
        for h in host_of[gpus]:
            for d in host_domains.get(int(h), ()):
                counts[d] = counts.get(d, 0) + 1
        watts = float(np.nanmax(board[gpus])) if len(gpus) else 0.0
        peak, average, synced = job_power(spec, watts)
        out.append(_Running(name, counts, peak, average, synced, slot))
    return out


def domain_draw(topology: Topology, running: list[_Running], d: int) -> tuple[float, list[float]]:
    """(draw W, per-slot synchronised peak margin W) of domain ``d``."""
    phases = topology.power_phases
    margin = [0.0] * phases
    total = 0.0
    for r in running:
        n = r.gpus_in.get(d, 0)
        if not n:
            continue
        total += n * r.average
        if r.synchronized:
            margin[r.slot % phases] += n * (r.peak - r.average)
    return total + max(margin), margin


def _sync_count(running: list[_Running], d: int, slot: int, phases: int) -> int:
    return sum(
        1 for r in running if r.synchronized and r.gpus_in.get(d) and r.slot % phases == slot
    )


def check_budgets(state: ClusterState, name: str, job: Job | None, gpus: Any, slot: int) -> None:
    """Raise InvalidState naming the domain when allocating ``gpus`` would exceed a budget or
    the synchronised-job limit."""
    topology = state.topology
    if not topology.power_domains:
        return
    running = _running(state, (name, job, gpus, slot))
    new = running[-1]
    for d, dom in enumerate(topology.power_domains):
        if not new.gpus_in.get(d):
            continue
        draw, _ = domain_draw(topology, running, d)
        if draw > dom.budget_w * (1 + 1e-12):
            raise InvalidState(
                f"power domain {dom.name!r}: job {name!r} would draw it to {draw:,.0f} W, "
                f"over its budget of {dom.budget_w:,.0f} W"
            )
        limit = dom.max_synchronized
        phases = topology.power_phases
        if new.synchronized and limit is not None:
            if _sync_count(running, d, slot % phases, phases) > limit:
                raise InvalidState(
                    f"power domain {dom.name!r}: at most {limit} synchronised job(s) may peak "
                    f"together (phase slot {slot % phases} of {phases})"
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
    board = gpu_power_w(topology)
    if np.isnan(board).any():
        raise InvalidTopology(
            "power domains need every GPU's board power: give the host types power_w "
            f"or a known gpu_model ({', '.join(BOARD_POWER_W)})"
        )
    running = _running(state)
    phases = topology.power_phases
    free = state.free_mask()
    domain_gpus = _domain_gpus(topology)
    # Per domain, what does not depend on the slot: the job's draw there and the domain's.
    fixed = [
        (
            job_power(job, float(np.max(board[gpus]))),
            domain_draw(topology, running, d),
            int(free[gpus].sum()),
            len(gpus),
        )
        for d, gpus in enumerate(domain_gpus)
    ]
    out: list[tuple[int, list[DomainLimit]]] = []
    for slot in range(phases if _synchronized(job) else 1):
        limits = []
        for d, dom in enumerate(topology.power_domains):
            (peak, average, synced), (draw, margin), n_free, size = fixed[d]
            limit = dom.max_synchronized
            headroom = dom.budget_w - draw
            cause = None
            if synced and limit is not None and _sync_count(running, d, slot, phases) >= limit:
                allowed = 0
                cause = "max_synchronized"
            else:
                # The job adds its average per GPU, and its peak margin to its slot's.
                extra = peak - average if synced else 0.0
                worst_other = (
                    max(m for s, m in enumerate(margin) if s != slot) if phases > 1 else 0.0
                )
                base = draw - max(margin)
                # draw' = base + n*avg + max(margin[slot] + n*extra, worst_other) <= budget
                allowed_a = (dom.budget_w - base - margin[slot]) / (average + extra)
                allowed_b = (dom.budget_w - base - worst_other) / average
                allowed = math.floor(min(allowed_a, allowed_b) + 1e-9)
                allowed = max(0, min(allowed, size)) if headroom >= 0 else 0
            if allowed < n_free and cause is None:
                cause = "budget"
            limits.append(
                DomainLimit(
                    domain=dom.name,
                    index=d,
                    free=n_free,
                    allowed=min(allowed, n_free),
                    cause=cause if allowed < n_free else None,
                    budget_w=dom.budget_w,
                    headroom_w=headroom,
                    max_synchronized=limit,
                )
            )
        out.append((slot, limits))
    return out


def _domain_gpus(topology: Topology) -> list[np.ndarray]:
    """The GPU ids of every power domain, in id order."""
    host_of = topology.host_of_gpu
    return [
        np.flatnonzero(np.isin(host_of, np.asarray(dom.hosts, dtype=np.int64)))
        for dom in topology.power_domains
    ]


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
    out: list[tuple[int, ClusterState]] = []
    domain_gpus = _domain_gpus(topology)
    for slot, limits in power_limits(state, job):
        view = state.copy()
        free = view.free_mask()
        held: list[int] = []
        for lim in limits:
            if lim.index in relax:
                continue
            gpus = domain_gpus[lim.index]
            mine = gpus[free[gpus]]
            if len(mine) > lim.allowed:
                held.extend(int(g) for g in mine[lim.allowed :])
                free[mine[lim.allowed :]] = False
        if held:
            view.drain_gpus(held)  # held back for the budget, in this copy only
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
    why = limiting_domains(state, job)
    raise Infeasible(f"{last} (within the power budgets: {why or 'no domain is limiting'})")


def power_report(state: ClusterState) -> list[dict[str, Any]]:
    """Per power domain: budget, draw, headroom (W), synchronised jobs and their phases."""
    topology = state.topology
    if not topology.power_domains:
        return []
    running = _running(state)
    phases = topology.power_phases
    out = []
    for d, dom in enumerate(topology.power_domains):
        draw, _ = domain_draw(topology, running, d)
        out.append(
            {
                "domain": dom.name,
                "kind": dom.kind,
                "budget_w": dom.budget_w,
                "draw_w": draw,
                "headroom_w": dom.budget_w - draw,
                "synchronized_jobs": {
                    r.name: (r.slot % phases) / phases
                    for r in running
                    if r.synchronized and r.gpus_in.get(d)
                },
            }
        )
    return out
