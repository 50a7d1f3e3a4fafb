"""CP-SAT at GPU granularity: the exact model for small instances on degraded hardware.

The block and count models of :mod:`gpuplace.placement.solvers.cpsat` rest on GPUs of one lowest
domain being interchangeable. Degraded hardware breaks that: a GPU behind a lossy NIC, or a
GPU degraded itself, prices differently from its neighbours, and the ring visits the group's
GPUs in id order, so even *where in the ring* a slow GPU sits matters (a slow GPU between two
neighbours of its host only slows NVLink hops; at the host's edge it slows a fabric hop). This
model decides the GPU of every rank and prices every group exactly as the cost model does
(``rust/core/src/cost.rs``), with the path bandwidths of the state's pricing view
(:mod:`gpuplace.cluster.pricing`):

* ``x[r, i]``: rank ``r`` on candidate GPU ``i`` (candidates sorted by GPU id); ``y[G, i]`` =
  ``sum_{r in G} x[r, i]`` says whether group ``G`` uses GPU ``i``.
* *Latency* of a group: ``steps * latency[span]``, with exact span indicators: ``w[G, l, D]``
  is 1 iff all of G lies in level-``l`` domain ``D`` (``|G| w <= load_D <= |G| - 1 + w``).
* *Bandwidth* of a group: ``W_G >= bytes / B(i, j) * hop(i, j)`` for every candidate pair, where
  ``hop(i, j)`` is a linear expression that is 1 when ``(i, j)`` is a hop of the group and at
  most 0 otherwise: for a ring, both used and no used GPU between them
  (``y_i + y_j - 1 - sum_{i<k<j} y_k``), or the wrap-around hop (no used GPU outside them);
  for an all-to-all or a pair, both used. Minimising pushes ``W_G`` down to the slowest hop.
* A class costs at least every member's ``count * (latency + W)``; explicit traffic costs
  ``T / B(i, j)`` per rank pair placed on ``(i, j)``. Confinement and ``max_span`` use the same
  exact indicators.

These are the cost model's prices for point-to-point and explicit traffic (and for an
all-to-all inside one NVLink domain; across domains the core prices each domain's fabric bytes
over its NIC shares, which this model does not state), so for jobs that communicate only that
way (:func:`exact_prices`) the model's optimum is the cost
model's optimum (up to rounding to quanta), and ``optimal=True`` is a proof on the state's real
prices. Ring collectives (all-reduce, all-gather, reduce-scatter) are priced by the core as NCCL
runs them: in NCCL's ring order (NVLink domains by lowest rank), with NIC shares on fabric hops
and, for all-reduce, the fastest of ring, tree, NVLS and CollNet (``rust/core/src/nccl.rs``).
The id-order ring above is then only an approximation, neither above nor below the real price,
so :mod:`gpuplace.placement.solvers.cpsat` uses the model's placement as a candidate and takes its bound
and any optimality claim from the relaxed block model instead. The model has ``ranks x candidates``
assignment variables and ``candidates**2`` hop constraints per group (each a few terms: the
count of used GPUs before each candidate is a running sum), so it is used only up to
:data:`MAX_CANDIDATES` GPUs and :data:`MAX_ASSIGNMENTS` assignment variables. The job's
symmetries are broken as in the block model (every dimension but pipelines can have its index
permuted without changing any cost).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace._util.lazy import LazyModule
from gpuplace.cluster.pricing import collective_terms
from gpuplace.placement.solvers.cpsat_run import solve_stoppable

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

    from gpuplace.cluster.pricing import PricingView
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology
else:
    cp_model = LazyModule("ortools.sat.python.cp_model")

__all__ = [
    "MAX_ASSIGNMENTS",
    "MAX_CANDIDATES",
    "GpuModelResult",
    "exact_prices",
    "fits",
    "order_by_first_position",
    "solve_gpus",
]

#: Most candidate GPUs the GPU-level model takes.
MAX_CANDIDATES = 24
#: Most assignment variables (ranks x candidate GPUs) the GPU-level model takes. Measured on
#: h100-superpod with 2-4 hosts partly busy, degraded GPUs and a degraded host, 2 workers:
#: up to 128 assignments (16 GPUs x 8 ranks) every shape tried (tp2 dp2, dp4, tp2 pp2, dp6,
#: tp2 dp4, dp8) was proven within 1.6 s, the hardest being tp2 dp4; at 168 (21 x 8) tp2 dp4
#: took 5 s, and without the symmetry order 10 s and no proof.
MAX_ASSIGNMENTS = 128
#: The objective's scale, as in the block models.
_OBJECTIVE_RANGE = 10**8


def order_by_first_position(
    model: cp_model.CpModel, position: list[Any], values: list[list[int]], upper: int, name: str
) -> None:
    """Symmetry order of one interchangeable dimension: ``values[v]`` lists the units (ranks or
    blocks) with index value ``v``; the lowest ``position`` (an expression in ``0..upper``)
    among each value's units is required non-decreasing in ``v``."""
    keys = []
    for v, units in enumerate(values):
        if len(units) == 1:
            keys.append(position[units[0]])
            continue
        key = model.new_int_var(0, upper, f"{name}[{v}]")
        model.add_min_equality(key, [position[u] for u in units])
        keys.append(key)
    for a, b in itertools.pairwise(keys):
        model.add(a <= b)


def fits(num_ranks: int, num_candidates: int) -> bool:
    """Whether the GPU-level model is small enough to build and prove."""
    return num_candidates <= MAX_CANDIDATES and num_ranks * num_candidates <= MAX_ASSIGNMENTS


#: Kinds whose price the model states exactly as the core's cost model does. An all-to-all
#: is not among them: across NVLink domains the core prices it by each domain's fabric bytes
#: over its NIC shares plus its NVLink rounds (``nccl::alltoall_bytes_seconds``), which the
#: slowest-pair bound below does not state.
_EXACT_KINDS = frozenset({"p2p"})


def exact_prices(job: Job, topology: Topology) -> bool:
    """Whether the model's prices are the core's for this job on this topology: explicit
    traffic or only point-to-point collectives (ring collectives follow NCCL's ring order and
    algorithms, an all-to-all NCCL's per-domain rounds, see the module docs), no host-count factors, and no fabric
    contention (every level's uplinks at full capacity, so running jobs slow nobody)."""
    if topology.host_count_factors or topology.uplink_gbps:
        return False
    if any(lv.oversubscription != 1 for lv in topology.levels):
        return False
    if job.traffic is not None:
        return True
    return all(c.kind in _EXACT_KINDS for c in job.resolved_communication().values())


@dataclass
class GpuModelResult:
    """Outcome of :func:`solve_gpus` (``gpus`` None when no placement was found in time)."""

    gpus: np.ndarray | None
    status: str
    optimal: bool
    #: A valid lower bound on the cost of any placement (s), rounding accounted for.
    bound: float | None
    details: dict[str, Any]


@dataclass
class _Group:
    ranks: tuple[int, ...]
    kind: str
    #: Seconds of the latency part at each span level, and bytes each rank sends, per step.
    latency_s: list[float]
    per_rank_bytes: float


def _groups(job: Job, topology: Topology) -> tuple[list[list[_Group]], list[tuple[int, list]]]:
    """Priced groups per class, and confinement rules (level, rank groups)."""
    latency = np.asarray([lv.latency_us for lv in topology.levels]) * 1e-6
    classes: list[list[_Group]] = []
    confined: list[tuple[int, list]] = []
    for d, lv in job.confine.items():
        if getattr(job, d) > 1:
            confined.append((topology.level_index(lv), [tuple(g) for g in job.rank_groups(d)]))
    spec = job.compile(topology)
    for d, c in sorted(job.resolved_communication().items()):
        # The class's groups from the core's job compilation (a pipeline gives its pairs).
        groups = spec.class_groups(spec.class_names.index(f"{d} {c.kind}"))
        n = groups.shape[1]
        steps, per_rank = collective_terms(c.kind, n, c.bytes)
        classes.append(
            [
                _Group(
                    tuple(int(r) for r in g),
                    c.kind,
                    [c.count * steps * float(t) for t in latency],
                    c.count * per_rank,
                )
                for g in groups
            ]
        )
    return classes, confined


def solve_gpus(
    view: PricingView,
    job: Job,
    topology: Topology,
    candidates: np.ndarray,
    *,
    max_span: int,
    time_limit: float,
    num_workers: int,
    seed: int,
    hint: np.ndarray | None,
    interchangeable: list[list[list[int]]] | None = None,
) -> GpuModelResult:
    """Solve the GPU-level model over ``candidates`` (GPU ids allowed for the job).

    ``interchangeable``: the job's symmetries, as in the block model's
    ``order_interchangeable``: for the ``j``-th dimension whose index can be permuted without
    changing any cost (every one but pipelines), per index value the ranks whose earlier such
    coordinates are all 0 and whose ``j``-th is that value. The lowest candidate position
    among each value's ranks is required non-decreasing in the value."""
    cands = np.sort(np.asarray(candidates, dtype=np.int64))
    nc, n = len(cands), job.gpus
    path = topology.path[cands]
    top = max_span
    bw = view.bandwidth_matrix(cands) * 1e9  # bytes/s
    with np.errstate(divide="ignore"):
        inv_bw = np.where(np.isfinite(bw), 1.0 / bw, 0.0)
    classes, confined = ([], []) if job.traffic is not None else _groups(job, topology)
    traffic: dict[tuple[int, int], float] = {}
    if job.traffic is not None:
        for a, b, t in job.traffic:
            i, j = sorted((int(a), int(b)))
            if i != j and float(t):
                traffic[(i, j)] = traffic.get((i, j), 0.0) + float(t)

    # Quantum: the largest objective is about _OBJECTIVE_RANGE quanta.
    worst_inv = float(inv_bw.max()) if nc > 1 else 0.0
    upper = sum(
        max(max(g.latency_s[: top + 1]) + g.per_rank_bytes * worst_inv for g in cls)
        for cls in classes
    ) + sum(t * worst_inv for t in traffic.values())
    q = upper / _OBJECTIVE_RANGE if upper > 0 else 1.0
    terms = len(classes) + len(traffic)
    rounding = q * terms  # latency and bandwidth parts each round by at most q/2

    m = cp_model.CpModel()
    x = [[m.new_bool_var(f"x[{r},{i}]") for i in range(nc)] for r in range(n)]
    for r in range(n):
        m.add_exactly_one(x[r])
    for i in range(nc):
        m.add_at_most_one(x[r][i] for r in range(n))

    # Domains of each level among the candidates.
    members: list[dict[int, list[int]]] = []
    for lv in range(path.shape[1]):
        doms: dict[int, list[int]] = {}
        for i in range(nc):
            doms.setdefault(int(path[i, lv]), []).append(i)
        members.append(doms)

    within_cache: dict[tuple[int, ...], list[Any]] = {}

    def within(group: tuple[int, ...]) -> list[Any]:
        """Per level below max_span: 1 iff the group lies inside one domain of the level."""
        key = tuple(sorted(group))
        if key in within_cache:
            return within_cache[key]
        size = len(key)
        out: list[Any] = []
        for lv in range(top):
            ws = []
            for d, idx in members[lv].items():
                if len(idx) < size:
                    continue
                w = m.new_bool_var(f"in[{key[0]},{lv},{d}]")
                load = sum(x[r][i] for r in key for i in idx)
                m.add(size * w <= load)
                m.add(load <= size - 1 + w)
                ws.append(w)
            out.append(sum(ws) if ws else 0)
        within_cache[key] = out
        return out

    def require(indicator: Any) -> None:
        if isinstance(indicator, int):
            if indicator != 1:
                m.add_bool_or([])
            return
        m.add(indicator == 1)

    if top < len(members) - 1:
        zs = []
        for d, idx in members[top].items():
            if len(idx) < n:
                continue
            z = m.new_bool_var(f"job_in[{d}]")
            m.add(sum(x[r][i] for r in range(n) for i in idx) == n * z)
            zs.append(z)
        m.add_exactly_one(zs) if zs else m.add_bool_or([])
    for lv, groups in confined:
        if lv < top:
            for g in groups:
                require(within(g)[lv])

    objective: list[Any] = []
    for ci, cls in enumerate(classes):
        cost = m.new_int_var(0, 4 * _OBJECTIVE_RANGE, f"class[{ci}]")
        objective.append(cost)
        for gi, g in enumerate(cls):
            lat = [round(t / q) for t in g.latency_s[: top + 1]]
            span_terms = within(g.ranks)
            latency_expr = lat[0] + sum(
                (lat[lv] - lat[lv - 1]) * (1 - span_terms[lv - 1]) for lv in range(1, top + 1)
            )
            size = len(g.ranks)
            y = []
            for i in range(nc):
                used = m.new_bool_var(f"y[{ci},{gi},{i}]")
                m.add(used == sum(x[r][i] for r in g.ranks))
                y.append(used)
            wvar = m.new_int_var(0, 2 * _OBJECTIVE_RANGE, f"W[{ci},{gi}]")
            ring = g.kind not in ("all-to-all", "p2p") and size > 2
            if ring:
                # before[k]: GPUs of the group among candidates 0..k-1, so that "no member
                # between i and j" is one difference, not a sum over the candidates.
                before: list[Any] = [0]
                for i in range(nc):
                    running = m.new_int_var(0, size, f"P[{ci},{gi},{i + 1}]")
                    m.add(running == before[-1] + y[i])
                    before.append(running)
            for i, j in itertools.combinations(range(nc), 2):
                price = round(g.per_rank_bytes * inv_bw[i, j] / q)
                if price == 0:
                    continue
                if not ring:
                    m.add(wvar >= price * (y[i] + y[j] - 1))
                    continue
                between = before[j] - before[i + 1]
                outside = before[i] + size - before[j + 1]
                m.add(wvar >= price * (y[i] + y[j] - 1 - between))
                m.add(wvar >= price * (y[i] + y[j] - 1 - outside))
            m.add(cost >= latency_expr + wvar)
    for (a, b), t in traffic.items():
        tv = m.new_int_var(0, 2 * _OBJECTIVE_RANGE, f"T[{a},{b}]")
        objective.append(tv)
        for i in range(nc):
            for j in range(nc):
                if i != j:
                    price = round(t * inv_bw[i, j] / q)
                    if price:
                        m.add(tv >= price * (x[a][i] + x[b][j] - 1))
    m.minimize(sum(objective))

    position = [sum(i * x[r][i] for i in range(1, nc)) for r in range(n)]
    pos = {int(g): i for i, g in enumerate(cands)}
    for j, values in enumerate(interchangeable or []):
        order_by_first_position(m, position, values, nc - 1, f"first[{j}]")
    if hint is not None:
        # A hint out of that order is not a solution; CP-SAT then only starts near it.
        if all(int(g) in pos for g in hint):
            for r, g in enumerate(hint):
                for i in range(nc):
                    m.add_hint(x[r][i], int(pos[int(g)] == i))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = seed
    status = solve_stoppable(solver, m)
    details: dict[str, Any] = {
        "status": solver.status_name(status),
        "formulation": "gpus",
        "variables": len(m.proto.variables),
        "constraints": len(m.proto.constraints),
        "candidates": nc,
        "quantum_s": float(q),
        "rounding_bound_s": float(rounding),
    }
    bound = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
        if np.isfinite(solver.best_objective_bound):
            bound = float(max(0.0, q * solver.best_objective_bound - rounding))
    gpus = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        details["objective_s"] = float(q * solver.objective_value)
        gpus = np.array(
            [cands[next(i for i in range(nc) if solver.boolean_value(x[r][i]))] for r in range(n)],
            dtype=np.int64,
        )
    if status == cp_model.INFEASIBLE:
        bound = None
    return GpuModelResult(
        gpus=gpus,
        status=solver.status_name(status),
        optimal=status == cp_model.OPTIMAL,
        bound=bound,
        details=details,
    )
