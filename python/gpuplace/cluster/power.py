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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace.errors import Infeasible, InvalidState, InvalidTopology
from gpuplace.model.power import BOARD_POWER_W, gpu_power_w, job_power

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology

__all__ = ["check_budgets", "domain_draw", "place_within_power", "power_report", "power_view"]


@dataclass
class _Running:
    name: str
    gpus_in: dict[int, int]  # domain index -> GPUs there
    peak: float
    average: float
    synchronized: bool
    slot: int


def _running(state: ClusterState, extra: tuple[str, Job | None, Any, int] | None = None):
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


def power_view(state: ClusterState, job: Job) -> list[tuple[int, ClusterState]]:
    """For each phase slot, a copy of ``state`` in which each power domain's free GPUs beyond
    what ``job`` may take there are held back; slots where the job fits nowhere are left out.
    Without power domains: the state itself, slot 0."""
    topology = state.topology
    if not topology.power_domains:
        return [(0, state)]
    board = gpu_power_w(topology)
    if np.isnan(board).any():
        raise InvalidTopology(
            "power domains need every GPU's board power: give the host types power_w "
            f"or a known gpu_model ({', '.join(BOARD_POWER_W)})"
        )
    running = _running(state)
    phases = topology.power_phases
    host_gpus = [topology.host_gpus(h) for h in topology.hosts]
    out: list[tuple[int, ClusterState]] = []
    for slot in range(phases if _synchronized(job) else 1):
        view = state.copy()
        free = view.free_mask()
        held: list[int] = []
        for d, dom in enumerate(topology.power_domains):
            gpus = np.concatenate([host_gpus[h] for h in dom.hosts])
            peak, average, synced = job_power(job, float(np.max(board[gpus])))
            limit = dom.max_synchronized
            if synced and limit is not None and _sync_count(running, d, slot, phases) >= limit:
                allowed = 0
            else:
                draw, margin = domain_draw(topology, running, d)
                headroom = dom.budget_w - draw
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
                allowed = max(0, min(allowed, len(gpus))) if headroom >= 0 else 0
            mine = gpus[free[gpus]]
            if len(mine) > allowed:
                held.extend(int(g) for g in mine[allowed:])
                free[mine[allowed:]] = False
        if held:
            view.drain(gpu=held, reason="power budget")
        out.append((slot, view))
    return out


def _synchronized(job: Job) -> bool:
    power = getattr(job, "power", None)
    return power is not None and power.synchronized


def place_within_power(state: ClusterState, job: Job, solve: Any) -> tuple[Any, int]:
    """Run ``solve(view)`` on the power-limited views, phase slots in order; the first that
    places the job wins. Raises Infeasible naming the power budgets when none does."""
    last: Infeasible | None = None
    for slot, view in power_view(state, job):
        try:
            return solve(view), slot
        except Infeasible as exc:
            last = exc
    if not state.topology.power_domains or last is None:
        raise last or Infeasible("no placement")
    raise Infeasible(f"{last} (within the power budgets of {state.topology.name})")


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
