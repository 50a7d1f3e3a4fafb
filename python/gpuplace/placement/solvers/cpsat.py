"""Exact placement with OR-Tools CP-SAT (``solver="cpsat"``).

What is optimised
-----------------
The objective is the one cost model of the Rust core (``rust/core/src/cost.rs``), restated per
*span level*: on a topology whose hosts have no bandwidth matrix, a collective whose group's
lowest common level is ``l`` costs ``count * (steps * latency[l] + bytes_per_rank / B[l])``,
where ``B[l]`` is the smallest level bandwidth among levels ``0..=l`` (the slowest ring hop)
and ``steps`` / ``bytes_per_rank`` follow the ring formulas of ``cost.rs`` (all-reduce
``2(n-1)`` steps and ``2(n-1)/n * S`` bytes, the other kinds ``n-1`` and ``(n-1)/n * S``,
point-to-point 1 and ``S``). A class of collectives (e.g. every tp all-reduce) costs its slowest
member; classes are summed. Explicit-traffic jobs cost ``sum T[i,j] / B[lca(i,j)]``. So a
placement's cost depends only on *which lowest-level domain* ("site": a host, or a PCIe switch
on hosts with sublevels) each rank lands in: GPUs of one site are interchangeable.

That restatement is exact inside NVLink domains without NVLS. The core also prices NCCL's
algorithms (``rust/core/src/nccl.rs``): a hop out of the NVLink domain drives one NIC share per
GPU of the group on its smaller side, and each all-reduce takes the fastest of ring, tree and
NVLS. Those depend on how many of a group's GPUs share each host, not only on the span level,
so the per-level prices (``cost::collective_seconds_by_level``) are lower bounds there: the
model is a relaxation, its ``bound`` stays valid, its answer is polished by the core's
``refine`` on the true cost, and ``optimal`` is claimed only when the evaluated cost meets the
bound. Where it does not and the instance is tiny (at most :data:`ENUMERATE_MAX` placements:
candidate GPUs permuting the ranks), every placement is priced by the core's evaluator instead,
a proof by enumeration.

Formulation
-----------
*Blocks.* Ranks whose groups are confined to the lowest level (tp inside an NVLink domain when
the NVLink domain is the lowest level, as on HGX) must share a site, so they are placed as one
block of ``beta`` ranks; a site with ``f`` free GPUs holds ``f // beta`` blocks. Collectives
inside a block always cost their level-0 price.

*Count model* (used when the ranks outside the blocks form at most one collective dimension R,
e.g. dp, and at most one pipeline dimension P, e.g. pp: the Megatron shapes tp x dp x pp,
dp-only, tp x pp, ...). Integer ``m[k, s]`` = number of blocks of pipeline stage ``k`` in site
``s``. The R groups of stage ``k`` are exactly that stage's blocks, so their span is the lowest
level with a domain holding all ``r`` of them: booleans ``w[k, l, D]`` with
``r*w <= M[k,l,D] <= r - 1 + w`` (``M`` = count summed over the sites of domain ``D``, so ``w``
is exact in both directions). Which R index a block gets is ours to choose afterwards, so the
p2p pairs between stages ``k`` and ``k+1`` can all stay inside level-``l`` domains iff both
stages have the same count in every level-``l`` domain (Hall's condition on a laminar family):
boolean ``e[k, l]`` implies those equalities. The concrete pairing is built afterwards by
matching stage ``k+1``'s blocks to stage ``k``'s bottom-up (same site first, then same level-1
domain, ...), which attains every ``e[k, l]`` the model chose. That pairing minimises the
highest level of any pair, which is what the class price needs when the p2p price grows with
the level; when it does not (user latencies that fall with the level) the assignment model is
used instead (this happens on the ``pcie-cluster`` preset, whose leaf latency is below its
cross-socket latency while the bandwidth stays at the cross-socket figure).

*Assignment model* (every other shape: several collective dimensions outside the blocks, expert
or context parallelism, explicit traffic, tp confined above the lowest level as on NVL72):
boolean ``x[b, s]`` per (block, site), with the same exact ``w`` indicators per communicating
or confined group and level. Groups with the same block set are priced once.

*Costs.* Per class, booleans ``S[c, l]`` = "some member spans level >= l" (monotone chain,
``S[c, l+1] >= 1 - within_l(group)``) and cost ``f(0) + sum_l (f(l) - f(l-1)) * S[c, l]``: only
groups that communicate get indicators. Where a class's price is not increasing with the level
(possible with user latencies), an integer class cost bounded below by every member's exact
price is used instead.

Every class also gets *reach* booleans ``reach[c, l]`` >= "some member spans level >= l" (the
``S`` chain above; for non-monotone prices an extra bound ``cost >= floor(0) + sum_l (floor(l) -
floor(l-1)) * reach[c, l]`` with the increasing envelope ``floor(l) = min(f(l), f(l+1), ...)``).

*Capacity cuts* (assignment model). If every class of a subset ``F`` keeps each of its groups
inside one level-``l`` domain, each connected component of the union of their groups lies
inside one level-``l`` domain, since overlapping groups share a domain. When the free capacity
of the level's domains cannot hold those components side by side (for every size ``u``, the
components of at least ``u`` blocks exceed ``sum_D floor(cap_D / u)``), some class of ``F`` must
reach level ``l + 1``: the clause ``OR_{c in F} reach[c, l+1]``. Confinement rules join the
subsets as families known to stay inside their level. The cuts hold for every placement, so
they cost no optimality; they are the pigeonhole arguments the LP relaxation of the ``w``
indicators cannot see (it spreads every group fractionally over domains and prices every
class at level 0). On PCIe hosts, where the sites (PCIe switches of 2 GPUs) lie below tp's
confinement level (the 8-GPU node), they state e.g. that tp pairs and the dp rings through them
cannot all stay on NUMA domains of 4 GPUs, which closed gaps of 10-30 % at 10 s.

*Symmetry.* Sibling sites with the same block capacity, and sibling domains whose subtrees have
the same capacities, are interchangeable: their loads are ordered (non-increasing by id). In the
assignment model, every dimension but pipelines (p2p) is interchangeable: permuting its index
maps groups onto groups. With those dimensions ``d_1..d_m``, the lowest site index among the
blocks with ``d_1..d_{j-1} = 0`` and ``d_j = v`` is non-decreasing in ``v``, for every ``j`` (all
these orders hold together: sort ``d_1`` first, whose key is a minimum over every later
coordinate, then ``d_2``, ...). The greedy placement (if greedy succeeds), relabelled to meet
that order, is given as a hint, and returned instead when CP-SAT's placement is not cheaper.

Rounding
--------
Every price is an integer number of quanta ``q = U / 10**8`` seconds, where ``U`` is the sum over
priced terms (classes and traffic pairs) of their largest price, so the objective stays below
``10**8``. Each of the ``K`` priced terms is rounded to the nearest quantum, hence for every
placement ``|q * objective - comm_seconds| <= K * q / 2`` (``details["rounding_bound_s"]``). The
returned ``bound`` is ``q * best_objective_bound - K * q / 2`` (a valid lower bound on the
cost of any placement), and ``optimal=True`` means CP-SAT proved optimality for the rounded
objective: the cost is then within ``K * q`` of the true optimum (a relative ``K * 1e-8``).
The placement's reported cost is always recomputed by the Rust evaluator.

Proof without a model
---------------------
Before any model is built, greedy's placement is priced on the state (degraded hardware and
running jobs included) and compared with the core's lower bound on the cost of every placement
that meets the job's rules (``cost::lower_bound``): each class at the cheapest level its groups
can span on the free GPUs (a group takes its members' confined groups along into its domain),
with NCCL's algorithms at their most favourable and at most as many members per NVLink domain as
whole confined groups fit there; traffic at the fastest level's bandwidth. When the cost meets
the bound (relative ``1e-9``) the placement is optimal and is returned as such (``details``:
``formulation="lower bound"``, ``status="OPTIMAL"``, ``rounding_bound_s=0``): a job without
communication, a job inside one NVLink domain where the fastest domain type is free, tp8 x dpN
on whole hosts of one leaf. Heterogeneous host types, degraded GPUs, contention with running
jobs or a loose bound leave greedy's cost above it, and the model decides as below. Fences,
power domains and data placement reach the solver as the state it is given (a view), so the
bound is taken on that view. ``solve(..., shortcut=False)`` skips it.

Degraded hardware
-----------------
Everything above assumes GPUs of one site are interchangeable, which degraded hardware breaks
(the state's pricing view, :mod:`gpuplace.cluster.pricing`, says which GPUs are slowed). When some
candidate GPU is degraded and the placements number at most :data:`ENUMERATE_MAX` (candidates
permuting the ranks), :func:`solve` prices every one with the core's evaluator: a proof by
enumeration. Otherwise it uses the GPU-level model of
:mod:`gpuplace.placement.solvers.cpsat_gpus` when it fits. Its prices are the core's for point-to-point
and explicit traffic, so there its ``optimal`` is a proof on the real prices. Ring collectives
follow NCCL's ring order and algorithms and an all-to-all across NVLink domains NCCL's
per-domain rounds, which that model only approximates: its
placement is then one candidate, and the answer is the cheapest on the real prices of it,
greedy, this module's model on the GPUs no degradation touches, this model on every candidate
priced healthy (every price a lower bound, so its bound stays valid) and ``refine``;
``optimal`` is then claimed only when that cost meets the bound.

Limits
------
Hosts with a GPU-GPU bandwidth matrix (``bandwidth_gbps`` in the node type) are not modelled:
their price depends on which GPUs of the host are taken and on the ring order. The solver raises
:class:`gpuplace.GpuplaceError` for them (``solver="auto"`` routes such instances to greedy).

Workers and time
----------------
``max_time_in_seconds`` is always set: ``time_limit`` or :data:`DEFAULT_TIME_LIMIT_S`.
``num_workers`` is always explicit: the argument of :func:`solve`, else the environment variable
``GPUPLACE_CPSAT_WORKERS``, else the number of physical cores.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplace import _core
from gpuplace._util.lazy import LazyModule
from gpuplace.errors import GpuplaceError, Infeasible
from gpuplace.placement.place import evaluate
from gpuplace.placement.registry import register_solver
from gpuplace.placement.result import SolveResult
from gpuplace.placement.solvers import cpsat_gpus
from gpuplace.placement.solvers.cpsat_run import solve_stoppable

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

    from gpuplace.cluster.pricing import PricingView
    from gpuplace.cluster.state import ClusterState
    from gpuplace.model.job import Job
    from gpuplace.model.topology import Topology
else:
    cp_model = LazyModule("ortools.sat.python.cp_model")

__all__ = [
    "DEFAULT_TIME_LIMIT_S",
    "ENUMERATE_MAX",
    "OBJECTIVE_RANGE",
    "WORKERS_ENV",
    "Instance",
    "analyse",
    "candidate_gpus",
    "default_num_workers",
    "model_variables",
    "proven_by_bound",
    "solve",
]

#: Time limit (s) when the caller gives none.
DEFAULT_TIME_LIMIT_S = 10.0
#: Most placements (candidates permute ranks) enumerated outright on degraded hardware, where
#: the GPU-level model's prices are not the core's: 50,000 evaluations take about 0.1 s.
ENUMERATE_MAX = 50_000
#: Environment variable overriding the default number of CP-SAT workers.
WORKERS_ENV = "GPUPLACE_CPSAT_WORKERS"
#: The objective's scale: the largest possible objective is about this many quanta.
OBJECTIVE_RANGE = 10**8

_KIND_P2P = "p2p"
#: Largest number of group families (priced classes and confinement rules) whose subsets get
#: capacity cuts (2**n subsets per level).
_CUT_FAMILIES = 6


# --------------------------------------------------------------------------- workers
def _physical_cores() -> int:
    """Physical cores (not hyper-threads) of this machine, best effort."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
        if n:
            return int(n)
    except ImportError:
        pass
    try:
        with open("/proc/cpuinfo", encoding="ascii") as f:
            cores: set[tuple[str, str]] = set()
            physical = core = ""
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    physical = value.strip()
                elif key == "core id":
                    core = value.strip()
                    cores.add((physical, core))
            if cores:
                return len(cores)
    except OSError:
        pass
    return os.cpu_count() or 1


def default_num_workers() -> int:
    """``$GPUPLACE_CPSAT_WORKERS`` if set, else the number of physical cores."""
    raw = os.environ.get(WORKERS_ENV)
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise GpuplaceError(f"{WORKERS_ENV}={raw!r}: expected a positive integer") from None
        if value < 1:
            raise GpuplaceError(f"{WORKERS_ENV}={raw!r}: expected a positive integer")
        return value
    return _physical_cores()


# --------------------------------------------------------------------------- analysis
@dataclass
class PricedClass:
    """Groups priced together: the class costs its slowest member (``price[l]`` seconds when
    that member's lowest common level is ``l``). A traffic pair is a class of one group."""

    name: str
    price: list[float]
    #: Each group as a tuple of block ids (assignment model) or a stage index (count model).
    groups: list[tuple[int, ...]] = field(default_factory=list)


@dataclass
class Instance:
    """A job on a cluster state, reduced to what the CP-SAT model needs.

    Sites are the lowest-level domains holding at least one block; ``site_domain[l][s]`` is the
    level-``l`` domain id of site ``s``; ``site_blocks[s]`` how many blocks it can hold.
    """

    job: Job
    topology: Topology
    num_levels: int
    max_span: int
    block_size: int
    num_blocks: int
    #: Rank -> block id, and rank -> index inside its block.
    rank_block: np.ndarray
    rank_slot: np.ndarray
    site_ids: np.ndarray
    site_blocks: np.ndarray
    site_gpus: list[np.ndarray]
    site_domain: np.ndarray
    #: "count" or "assignment".
    formulation: str
    classes: list[PricedClass]
    #: Confinement: (level, groups as block tuples) that must each stay inside one domain.
    confined: list[tuple[int, list[tuple[int, ...]]]]
    #: Count model only: R size, P size, block id of (r index, stage), and P's price class.
    ring_size: int = 1
    stages: int = 1
    block_of: np.ndarray | None = None
    ring_confine: int | None = None
    chain_confine: int | None = None
    ring_class: PricedClass | None = None
    chain_class: PricedClass | None = None
    #: Assignment model: each block's coordinates along the outer dimensions, and the columns
    #: of the interchangeable dimensions (whose index can be permuted without changing any
    #: cost: every one but pipelines), for :meth:`_Builder.order_interchangeable`.
    block_coords: np.ndarray | None = None
    interchangeable: list[int] = field(default_factory=list)
    #: Why the instance cannot be placed, found before solving (None: not known).
    infeasible: str | None = None

    @property
    def size(self) -> int:
        """Number of main decision variables (count or assignment variables)."""
        if self.formulation == "count":
            return self.stages * len(self.site_ids)
        return self.num_blocks * len(self.site_ids)


def _collective_price(
    topo: Topology, kind: str, n: int, size_bytes: float, count: float
) -> list[float]:
    """Seconds per step of ``count`` calls of one collective of ``n`` ranks at each span level,
    from the core's cost formulas (``cost::collective_seconds_by_level``): exactly what the
    evaluator charges inside the NVLink domain (without NVLS), and a lower bound above it,
    where the evaluator's price also depends on how many GPUs of the group share each host
    (NIC shares) and on the NCCL algorithm chosen. The bound stays valid; ``optimal`` is
    claimed only when the evaluated cost meets it."""
    per_call = topo._core.collective_seconds_by_level(kind, n, float(size_bytes))
    return [count * t for t in per_call]


def _coordinates(job: Job, topo: Topology) -> dict[str, np.ndarray]:
    """Coordinate of every rank along every dimension, from the core's rank layout."""
    coords = job.compile(topo).coordinates()
    return {d: coords[:, i] for i, d in enumerate(job.rank_order)}


def _not_enough(state: ClusterState, n: int) -> str | None:
    """The core's "needs n GPUs but only ... are free and healthy" message, or None when n
    GPUs are free and healthy (one message for every solver)."""
    try:
        state._core.check_capacity(n)
    except Infeasible as exc:
        return str(exc)
    return None


def _matrix_hosts(topology: Topology) -> np.ndarray:
    """Boolean per host: its node type has a bandwidth matrix."""
    flags = {t: nt.bandwidth_gbps is not None for t, nt in topology.node_types.items()}
    return np.array([flags[t] for t in topology.host_types], dtype=bool)


def _block_coordinates(
    outer: list[str], coords: dict[str, np.ndarray], rank_block: np.ndarray
) -> np.ndarray:
    """Coordinates of every block along the outer dimensions (``num_blocks x len(outer)``)."""
    out = np.zeros((int(rank_block.max()) + 1, len(outer)), dtype=np.int64)
    for j, d in enumerate(outer):
        out[rank_block, j] = coords[d]
    return out


def _value_blocks(block_coords: np.ndarray, dims: list[int], j: int) -> list[list[int]]:
    """For the ``j``-th interchangeable dimension: per index value, the blocks whose earlier
    interchangeable coordinates are all 0 (see :meth:`_Builder.order_interchangeable`)."""
    col = dims[j]
    rest = np.all(block_coords[:, dims[:j]] == 0, axis=1)
    size = int(block_coords[:, col].max()) + 1
    return [np.flatnonzero(rest & (block_coords[:, col] == v)).tolist() for v in range(size)]


def _canonical_hint(inst: Instance, block_site: np.ndarray) -> np.ndarray:
    """The same placement relabelled (a job symmetry, so the same cost) to meet the order of
    :meth:`_Builder.order_interchangeable`, so that it stays a feasible hint."""
    coords = inst.block_coords
    if coords is None:
        return block_site
    index = {tuple(c): b for b, c in enumerate(coords.tolist())}
    site = block_site.copy()
    for j, col in enumerate(inst.interchangeable):
        keys = [min(site[b] for b in bs) for bs in _value_blocks(coords, inst.interchangeable, j)]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        new = site.copy()
        for b, c in enumerate(coords.tolist()):
            c[col] = order[c[col]]
            new[b] = site[index[tuple(c)]]
        site = new
    return site


def analyse(state: ClusterState, job: Job) -> Instance:
    """Reduce (state, job) to blocks, sites and priced classes; cheap (no solving).

    Raises :class:`GpuplaceError` for topologies this model does not cover (see Limits)."""
    topo = state.topology
    job.compile(topo)  # validates level names in the job against this topology
    nl = len(topo.levels)
    bw = np.asarray(topo._core.effective_bandwidth_gbps) * 1e9  # bytes/s, slowest hop
    max_span = nl - 1 if job.max_span is None else topo.level_index(job.max_span)
    n = job.gpus

    # --- blocks: ranks tied to one site by lowest-level confinement
    classes: list[PricedClass] = []
    confined: list[tuple[int, list[tuple[int, ...]]]] = []
    if job.traffic is not None:
        internal: list[str] = []
        outer: list[str] = []
        coords: dict[str, np.ndarray] = {}
        rank_block = np.arange(n, dtype=np.int64)
        rank_slot = np.zeros(n, dtype=np.int64)
        block_size = 1
    else:
        confine = {d: topo.level_index(lv) for d, lv in job.confine.items()}
        dims = [d for d in job.rank_order if getattr(job, d) > 1]
        internal = [d for d in dims if confine.get(d, nl) == 0]
        outer = [d for d in dims if d not in internal]
        coords = _coordinates(job, topo)
        rank_block = np.zeros(n, dtype=np.int64)
        rank_slot = np.zeros(n, dtype=np.int64)
        for d in reversed(outer):
            rank_block = rank_block * getattr(job, d) + coords[d]
        for d in reversed(internal):
            rank_slot = rank_slot * getattr(job, d) + coords[d]
        block_size = int(np.prod([getattr(job, d) for d in internal], dtype=np.int64))
    num_blocks = n // block_size

    # --- sites: lowest-level domains with room for a block, inside allowed max-span domains
    path = topo.path
    free = state.free_mask()
    matrix_hosts = _matrix_hosts(topo)
    free_ids = np.flatnonzero(free)
    site_of_gpu = path[free_ids, 0]
    uniq, counts = np.unique(site_of_gpu, return_counts=True)
    site_blocks_all = counts // block_size
    keep = site_blocks_all > 0
    site_ids = uniq[keep]
    site_blocks = site_blocks_all[keep].astype(np.int64)
    first_gpu = {int(s): int(g) for s, g in zip(site_of_gpu[::-1], free_ids[::-1], strict=True)}
    site_domain = np.array([path[first_gpu[int(s)]] for s in site_ids], dtype=np.int64).T.reshape(
        nl, len(site_ids)
    )
    infeasible = _not_enough(state, n)
    if len(site_ids):
        top_cap: dict[int, int] = defaultdict(int)
        for s, cap in zip(site_domain[max_span], site_blocks, strict=True):
            top_cap[int(s)] += int(cap)
        allowed = {d for d, cap in top_cap.items() if cap >= num_blocks}
        mask = np.array([int(d) in allowed for d in site_domain[max_span]], dtype=bool)
        site_ids, site_blocks, site_domain = site_ids[mask], site_blocks[mask], site_domain[:, mask]
    if infeasible is None and int(site_blocks.sum()) < num_blocks:
        where = (
            "in the cluster"
            if max_span == nl - 1
            else f"inside one {topo.levels[max_span].name} (the job's max_span)"
        )
        what = (
            f"{num_blocks} blocks of {block_size} GPUs, each inside one {topo.levels[0].name} "
            f"(the groups of {', '.join(internal)} are confined there)"
            if block_size > 1
            else f"{n} free GPUs"
        )
        infeasible = f"needs {what} {where}; the free GPUs cannot hold that now"
    host_of_site = [topo.host_of_gpu[first_gpu[int(s)]] for s in site_ids]
    bad = [h for h in host_of_site if matrix_hosts[h]]
    if bad:
        host = topo.hosts[bad[0]]
        raise GpuplaceError(
            f"cpsat does not model hosts with a GPU bandwidth matrix (host {host}, type "
            f"{topo.host_types[bad[0]]}); use solver='greedy' or 'auto'"
        )
    gpu_site = {int(s): i for i, s in enumerate(site_ids)}
    site_gpus: list[list[int]] = [[] for _ in site_ids]
    for g, s in zip(free_ids, site_of_gpu, strict=True):
        i = gpu_site.get(int(s))
        if i is not None:
            site_gpus[i].append(int(g))

    inst = Instance(
        job=job,
        topology=topo,
        num_levels=nl,
        max_span=max_span,
        block_size=block_size,
        num_blocks=num_blocks,
        rank_block=rank_block,
        rank_slot=rank_slot,
        site_ids=site_ids,
        site_blocks=site_blocks,
        site_gpus=[np.array(g, dtype=np.int64) for g in site_gpus],
        site_domain=site_domain,
        formulation="assignment",
        classes=classes,
        confined=confined,
        infeasible=infeasible,
    )

    # --- priced classes
    if job.traffic is not None:
        pair_bytes: dict[tuple[int, int], float] = defaultdict(float)
        for a, b, t in job.traffic:
            i, j = int(a), int(b)
            pair_bytes[(min(i, j), max(i, j))] += float(t)
        for (i, j), t in sorted(pair_bytes.items()):
            price = [t / bw[lv] for lv in range(nl)]
            classes.append(PricedClass(f"traffic {i}-{j}", price, [(i, j)]))
        return inst

    comm = job.resolved_communication()
    confine = {d: topo.level_index(lv) for d, lv in job.confine.items()}
    for d in outer:
        c = comm.get(d)
        groups = job.rank_groups(d)
        block_groups = sorted({tuple(int(b) for b in rank_block[g]) for g in groups})
        if d in confine and confine[d] < max_span:
            confined.append((confine[d], block_groups))
        if c is None:
            continue
        if c.kind == _KIND_P2P:
            spec = job.compile(topo)
            pairs = spec.class_groups(spec.class_names.index(f"{d} {c.kind}"))
            block_groups = sorted({tuple(int(b) for b in rank_block[p]) for p in pairs})
        price = _collective_price(
            topo, c.kind, 2 if c.kind == _KIND_P2P else getattr(job, d), c.bytes, c.count
        )
        classes.append(PricedClass(f"{d} {c.kind}", price, block_groups))
    # Collectives inside a block cost their level-0 price whatever the placement.
    for d in internal:
        c = comm.get(d)
        if c is not None:
            n_d = 2 if c.kind == _KIND_P2P else getattr(job, d)
            price0 = _collective_price(topo, c.kind, n_d, c.bytes, c.count)[0]
            classes.append(PricedClass(f"{d} {c.kind}", [price0] * nl, []))

    # --- count model when the outer dimensions are one collective dim R and one chain dim P
    ring: list[str] = []
    chain: list[str] = []
    free_dims: list[str] = []
    for d in outer:
        c = comm.get(d)
        if c is None and d not in confine:
            free_dims.append(d)
        elif c is not None and c.kind == _KIND_P2P:
            chain.append(d)
        elif c is None:
            free_dims.append(d)  # confined only: either slot expresses its confinement
        else:
            ring.append(d)
    for d in free_dims:
        if not ring:
            ring.append(d)
        elif not chain:
            chain.append(d)
        else:
            ring.append(d)  # too many: forces the assignment model
    # The pairing of stages is chosen after solving, bottom-up, which minimises the highest
    # level of any pair: that minimises the class price only when the price grows with the
    # level (it may not, with user latencies that fall with the level).
    chain_price = next(
        (c.price for c in classes if chain and c.name.startswith(f"{chain[0]} ")), []
    )
    chain_monotone = all(b >= a for a, b in itertools.pairwise(chain_price[: max_span + 1]))
    if len(ring) <= 1 and len(chain) <= 1 and chain_monotone:
        r_dim = ring[0] if ring else None
        p_dim = chain[0] if chain else None
        r = getattr(job, r_dim) if r_dim else 1
        p = getattr(job, p_dim) if p_dim else 1
        block_of = np.zeros((r, p), dtype=np.int64)
        for rank in range(n):
            i = int(coords[r_dim][rank]) if r_dim else 0
            k = int(coords[p_dim][rank]) if p_dim else 0
            block_of[i, k] = rank_block[rank]
        inst.formulation = "count"
        inst.ring_size, inst.stages, inst.block_of = r, p, block_of
        inst.ring_confine = confine.get(r_dim) if r_dim else None
        inst.chain_confine = confine.get(p_dim) if p_dim else None
        for cls in classes:
            if r_dim and cls.name.startswith(f"{r_dim} "):
                inst.ring_class = cls
            if p_dim and cls.name.startswith(f"{p_dim} "):
                inst.chain_class = cls
    else:
        inst.block_coords = _block_coordinates(outer, coords, rank_block)
        inst.interchangeable = [
            j for j, d in enumerate(outer) if comm.get(d) is None or comm[d].kind != _KIND_P2P
        ]
    return inst


def _component_sizes(num_blocks: int, groups: list[tuple[int, ...]]) -> list[int]:
    """Sizes (in blocks) of the connected components of the union of ``groups``; blocks in
    no group are left out."""
    parent = list(range(num_blocks))

    def root(b: int) -> int:
        while parent[b] != b:
            parent[b] = parent[parent[b]]
            b = parent[b]
        return b

    used: set[int] = set()
    for g in groups:
        used.update(g)
        for a, b in itertools.pairwise(g):
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[ra] = rb
    sizes: dict[int, int] = defaultdict(int)
    for b in used:
        sizes[root(b)] += 1
    return sorted(sizes.values(), reverse=True)


def _fits_side_by_side(sizes: list[int], capacities: Any) -> bool:
    """A necessary condition for packing disjoint components of ``sizes`` blocks into domains
    of ``capacities`` blocks, one component inside one domain: for every size ``u``, the
    components of at least ``u`` blocks fit ``sum floor(cap / u)``."""
    caps = list(capacities)
    for u in sorted(set(sizes)):
        if sum(1 for c in sizes if c >= u) > sum(c // u for c in caps):
            return False
    return True


# --------------------------------------------------------------------------- model
class _Builder:
    """Builds the CP-SAT model of an :class:`Instance`."""

    def __init__(self, inst: Instance):
        self.inst = inst
        self.model = cp_model.CpModel()
        self.num_sites = len(inst.site_ids)
        self.top = inst.max_span  # within_l = 1 for l >= max_span
        # Domains per level among the candidate sites: domain id -> site indices.
        self.members: list[dict[int, list[int]]] = []
        for lv in range(inst.num_levels):
            groups: dict[int, list[int]] = defaultdict(list)
            for s in range(self.num_sites):
                groups[int(inst.site_domain[lv, s])].append(s)
            self.members.append(dict(groups))
        self.capacity = [
            {d: int(inst.site_blocks[ss].sum()) for d, ss in self.members[lv].items()}
            for lv in range(inst.num_levels)
        ]
        self.objective_terms: list[Any] = []
        self.constant = 0
        self.quantum = 1.0
        self.priced_terms = 0

    # ----------------------------------------------------------------- pricing
    def set_quantum(self) -> None:
        """Choose the quantum so the largest possible objective is ~OBJECTIVE_RANGE."""
        top = self.top
        upper = sum(max(c.price[: top + 1]) for c in self.inst.classes)
        self.quantum = upper / OBJECTIVE_RANGE if upper > 0 else 1.0
        self.priced_terms = len(self.inst.classes)

    def quantise(self, price: list[float]) -> list[int]:
        return [round(p / self.quantum) for p in price[: self.top + 1]]

    def price_class(
        self, cls: PricedClass, within: list[list[Any]], exact: bool
    ) -> list[Any] | None:
        """Add a class's cost: ``within[g][l]`` (l < max_span) says group g stays inside one
        level-l domain. ``exact``: the within indicators are exact in both directions.

        Returns the class's reach indicators ``reach[l]`` (``1 <= l <= max_span``; index 0 is
        unused): booleans at least "some group of the class spans level >= l", which the
        objective pushes down to exactly that; None when the class's price is a constant."""
        f = self.quantise(cls.price)
        if not within or all(v == f[0] for v in f):
            self.constant += f[0]
            return None
        top = self.top
        m = self.model
        reach: list[Any] = [1]
        for lv in range(1, top + 1):
            s = m.new_bool_var(f"span[{cls.name}]>={lv}")
            if lv > 1:
                m.add(reach[-1] >= s)
            for w in within:
                m.add(s + w[lv - 1] >= 1)
            reach.append(s)
        if all(b >= a for a, b in itertools.pairwise(f)):
            # reach[l] = the class's slowest member spans level >= l; pay each increment once.
            self.constant += f[0]
            for lv in range(1, top + 1):
                if f[lv] != f[lv - 1]:
                    self.objective_terms.append((f[lv] - f[lv - 1]) * reach[lv])
            return reach
        if not exact:
            raise AssertionError("non-monotone prices need exact span indicators")
        cost = m.new_int_var(min(f), max(f), f"cost[{cls.name}]")
        for w in within:
            # price(span) = f[top] - sum_l (f[l+1] - f[l]) * within_l, exact when within is.
            m.add(cost >= f[top] - sum((f[lv + 1] - f[lv]) * w[lv] for lv in range(top)))
        # The same cost through the reach indicators, priced by the increasing lower envelope
        # floor[l] = min(f[l:]): a member spans exactly the highest level l reached and costs
        # f[l] >= floor[l]. Redundant, but linear in few booleans, which the cuts of
        # :meth:`component_cuts` act on.
        floor = [min(f[lv:]) for lv in range(top + 1)]
        m.add(
            cost
            >= floor[0] + sum((floor[lv] - floor[lv - 1]) * reach[lv] for lv in range(1, top + 1))
        )
        self.objective_terms.append(cost)
        return reach

    # ----------------------------------------------------------------- helpers
    def within_indicators(self, load: Any, size: int, name: str) -> list[Any]:
        """Per level below max_span, an exact boolean "all ``size`` units of ``load`` lie in
        one domain" as a linear expression; ``load(level, domain)`` is their count there."""
        m = self.model
        out = []
        for lv in range(self.top):
            ws = []
            for d, cap in self.capacity[lv].items():
                if cap < size:
                    continue
                w = m.new_bool_var(f"in[{name},{lv},{d}]")
                c = load(lv, d)
                m.add(size * w <= c)
                m.add(c <= size - 1 + w)
                ws.append(w)
            out.append(sum(ws) if ws else 0)
        for a, b in itertools.pairwise(out):
            if not (isinstance(a, int) or isinstance(b, int)):
                m.add(a <= b)  # inside one level-l domain implies inside one above it
        return out

    def require(self, indicator: Any) -> None:
        """A confinement rule: the indicator (a 0/1 expression, or 0 when no domain of the
        level is large enough) must be 1."""
        if isinstance(indicator, int):
            if indicator != 1:
                self.model.add_bool_or([])  # no domain can hold the group: infeasible
            return
        self.model.add(indicator == 1)

    def component_cuts(self, families: list[tuple[list[tuple[int, ...]], list[Any]]]) -> None:
        """Capacity cuts between group families (classes, confinement rules).

        ``families``: each family's groups (block tuples) and its reach list (``reach[l]``
        is a 0/1 expression at least "some group of the family spans level >= l", 0 when
        the family is known to stay below ``l``, None when unknown). If every family of a
        subset ``F`` keeps each of its groups inside one level-``l`` domain, then each
        connected component of the union of their groups lies inside one level-``l``
        domain (overlapping groups share a domain, and the domains of a level partition
        the GPUs). When the level's free capacity cannot hold those components side by
        side, some family of ``F`` reaches level ``l + 1``: ``sum_F reach[l+1] >= 1``.
        The cuts are implied by the model (valid for every placement), so they cost no
        optimality; they give the solver the pigeonhole arguments its LP cannot see, e.g.
        on PCIe hosts that a tp pair and the dp ring through it cannot both stay on one
        NUMA domain of four GPUs. Subsets of at most :data:`_CUT_FAMILIES` families."""
        if not families or len(families) > _CUT_FAMILIES:
            return
        m = self.model
        nb = self.inst.num_blocks
        done: list[tuple[int, frozenset[int]]] = []
        for size in range(1, len(families) + 1):
            for subset in itertools.combinations(range(len(families)), size):
                comps: list[int] | None = None
                for lv in range(self.top):
                    if any(done_lv == lv and done_set <= set(subset) for done_lv, done_set in done):
                        continue  # a subset of these families already gave a stronger cut
                    terms = [families[i][1][lv + 1] for i in subset]
                    if any(t is None for t in terms):
                        continue
                    if comps is None:
                        comps = _component_sizes(nb, [g for i in subset for g in families[i][0]])
                    if _fits_side_by_side(comps, self.capacity[lv].values()):
                        continue
                    # An empty cut (only families known to stay below) means infeasible.
                    m.add_bool_or([t for t in terms if not isinstance(t, int)])
                    done.append((lv, frozenset(subset)))

    def order_interchangeable(self, x: list[list[Any]]) -> None:
        """Break the job's symmetries. Permuting the index of an interchangeable dimension
        maps every group onto a group of the same kind (collectives other than p2p are priced
        as sets, confinement holds per group), so the cost is unchanged. With such dimensions
        ``d_1..d_m`` and ``key_j(v)`` = the lowest site index of the blocks with
        ``d_1..d_{j-1} = 0`` and ``d_j = v`` (any other coordinates), every ``key_j`` may be
        required non-decreasing at once: sort ``d_1`` first (its key is a minimum over every
        later coordinate, so later permutations keep it), then ``d_2`` among the blocks with
        ``d_1 = 0``, and so on (:func:`_canonical_hint` does exactly that to the hint)."""
        inst = self.inst
        if inst.block_coords is None:
            return
        m = self.model
        ns = self.num_sites
        site_of = [sum(s * x[b][s] for s in range(1, ns)) for b in range(len(x))]
        for j in range(len(inst.interchangeable)):
            values = _value_blocks(inst.block_coords, inst.interchangeable, j)
            cpsat_gpus.order_by_first_position(m, site_of, values, ns - 1, f"first_site[{j}]")

    def symmetry_sites(self, load: list[Any]) -> None:
        """Order the loads of interchangeable sibling sites and sibling domains."""
        inst = self.inst
        m = self.model
        # signature of each domain: its capacity structure, bottom-up
        sig: list[dict[int, Any]] = []
        for lv in range(inst.num_levels):
            level_sig: dict[int, Any] = {}
            for d, ss in self.members[lv].items():
                if lv == 0:
                    level_sig[d] = int(inst.site_blocks[ss[0]])
                else:
                    kids = sorted({int(inst.site_domain[lv - 1, s]) for s in ss})
                    level_sig[d] = tuple(sorted(repr(sig[lv - 1][k]) for k in kids))
            sig.append(level_sig)
        for lv in range(inst.num_levels - 1):
            by_key: dict[tuple[int, str], list[int]] = defaultdict(list)
            for d, ss in self.members[lv].items():
                parent = int(inst.site_domain[lv + 1, ss[0]])
                by_key[(parent, repr(sig[lv][d]))].append(d)
            for twins in by_key.values():
                twins.sort()
                for a, b in itertools.pairwise(twins):
                    la = sum(load[s] for s in self.members[lv][a])
                    lb = sum(load[s] for s in self.members[lv][b])
                    m.add(la >= lb)

    def max_span_choice(self, load: list[Any], total: int) -> None:
        """The job lies inside one domain of its max_span level."""
        ms = self.inst.max_span
        if len(self.members[ms]) <= 1:
            return
        m = self.model
        z = []
        for d, ss in self.members[ms].items():
            zd = m.new_bool_var(f"job_in[{d}]")
            m.add(sum(load[s] for s in ss) == total * zd)
            z.append(zd)
        m.add_exactly_one(z)

    # ----------------------------------------------------------------- count model
    def build_count(self, hint: np.ndarray | None) -> None:
        inst = self.inst
        m = self.model
        r, p = inst.ring_size, inst.stages
        cap = inst.site_blocks
        counts = [
            [m.new_int_var(0, min(int(cap[s]), r), f"m[{k},{s}]") for s in range(self.num_sites)]
            for k in range(p)
        ]
        self.counts = counts
        for k in range(p):
            m.add(sum(counts[k]) == r)
        load = [sum(counts[k][s] for k in range(p)) for s in range(self.num_sites)]
        for s in range(self.num_sites):
            m.add(load[s] <= int(cap[s]))
        self.max_span_choice(load, inst.num_blocks)
        self.symmetry_sites(load)
        if hint is not None:
            for k in range(p):
                for s in range(self.num_sites):
                    m.add_hint(counts[k][s], int(hint[k, s]))

        def stage_load(k: int) -> Any:
            return lambda lv, d: sum(counts[k][s] for s in self.members[lv][d])

        rc = inst.ring_class
        ring_needed = r > 1 and (rc is not None or inst.ring_confine is not None)
        if ring_needed:
            within = [self.within_indicators(stage_load(k), r, f"R{k}") for k in range(p)]
            lc = inst.ring_confine
            if lc is not None and lc < self.top:
                for k in range(p):
                    self.require(within[k][lc])
            if rc is not None:
                self.price_class(rc, within, exact=True)
        cc = inst.chain_class
        if p > 1 and (cc is not None or inst.chain_confine is not None):
            within = []
            for k in range(p - 1):
                row = []
                for lv in range(self.top):
                    # Only "e => equal counts": the price is non-decreasing (analyse checks),
                    # so the solver sets e whenever the counts allow.
                    e = m.new_bool_var(f"pair[{k},{lv}]")
                    for d in self.members[lv]:
                        m.add(stage_load(k)(lv, d) == stage_load(k + 1)(lv, d)).only_enforce_if(e)
                    row.append(e)
                for a, b in itertools.pairwise(row):
                    m.add(a <= b)
                within.append(row)
            lc = inst.chain_confine
            if lc is not None and lc < self.top:
                for row in within:
                    self.require(row[lc])
            if cc is not None:
                self.price_class(cc, within, exact=True)
        for cls in inst.classes:
            if cls is not rc and cls is not cc:
                self.price_class(cls, [], exact=True)  # block-internal: constant

    # ----------------------------------------------------------------- assignment model
    def build_assignment(self, hint: np.ndarray | None) -> None:
        inst = self.inst
        m = self.model
        nb, ns = inst.num_blocks, self.num_sites
        x = [[m.new_bool_var(f"x[{b},{s}]") for s in range(ns)] for b in range(nb)]
        self.x = x
        for b in range(nb):
            m.add_exactly_one(x[b])
        load = [sum(x[b][s] for b in range(nb)) for s in range(ns)]
        for s in range(ns):
            m.add(load[s] <= int(inst.site_blocks[s]))
        self.max_span_choice(load, nb)
        self.symmetry_sites(load)
        self.order_interchangeable(x)
        if hint is not None:
            hint = _canonical_hint(inst, hint)
            for b in range(nb):
                for s in range(ns):
                    m.add_hint(x[b][s], int(hint[b] == s))

        cache: dict[tuple[int, ...], list[Any]] = {}

        def within(group: tuple[int, ...]) -> list[Any]:
            key = tuple(sorted(group))
            if key not in cache:
                cache[key] = self.within_indicators(
                    lambda lv, d: sum(x[b][s] for b in key for s in self.members[lv][d]),
                    len(key),
                    "G" + "_".join(map(str, key)),
                )
            return cache[key]

        families: list[tuple[list[tuple[int, ...]], list[Any]]] = []
        for lc, groups in inst.confined:
            for g in groups:
                self.require(within(g)[lc])
            # Known to stay inside level lc; unknown below it (no indicators of its own).
            families.append((groups, [None if lv <= lc else 0 for lv in range(self.top + 1)]))
        for cls in inst.classes:
            reach = self.price_class(cls, [within(g) for g in cls.groups], exact=True)
            if reach is not None:
                families.append((cls.groups, reach))
        self.component_cuts(families)

    def objective(self) -> None:
        self.model.minimize(sum(self.objective_terms) + self.constant)


def model_variables(inst: Instance) -> int:
    """Number of CP-SAT variables of the instance's model (builds it; no solving)."""
    builder = _Builder(inst)
    builder.set_quantum()
    if inst.formulation == "count":
        builder.build_count(None)
    else:
        builder.build_assignment(None)
    return len(builder.model.proto.variables)


# --------------------------------------------------------------------------- extraction
def _chains(inst: Instance, stage_sites: list[list[int]]) -> np.ndarray:
    """Site of block (r index, stage): pair each stage's blocks with the previous stage's,
    bottom-up (same site, then same level-1 domain, ...), so the worst pair's level is the
    lowest the stage counts allow."""
    r, p = inst.ring_size, inst.stages
    out = np.zeros((r, p), dtype=np.int64)
    out[:, 0] = sorted(stage_sites[0])
    for k in range(1, p):
        pending = list(range(r))
        pool = list(stage_sites[k])
        for lv in range(inst.num_levels):
            by_domain: dict[int, list[int]] = defaultdict(list)
            for s in pool:
                by_domain[int(inst.site_domain[lv, s])].append(s)
            still = []
            for i in pending:
                d = int(inst.site_domain[lv, out[i, k - 1]])
                if by_domain.get(d):
                    out[i, k] = by_domain[d].pop()
                else:
                    still.append(i)
            pending = still
            pool = [s for ss in by_domain.values() for s in ss]
            if not pending:
                break
        # Anything left (only if the pools were unbalanced, which the model forbids).
        for i, s in zip(pending, pool, strict=False):
            out[i, k] = s
    return out


def _gpus_from_blocks(inst: Instance, block_site: np.ndarray) -> np.ndarray:
    """Concrete GPUs: each block takes the next ``block_size`` free GPUs of its site."""
    next_free = [0] * len(inst.site_ids)
    block_gpus = np.zeros((inst.num_blocks, inst.block_size), dtype=np.int64)
    for b in range(inst.num_blocks):
        s = int(block_site[b])
        start = next_free[s]
        block_gpus[b] = inst.site_gpus[s][start : start + inst.block_size]
        next_free[s] = start + inst.block_size
    return block_gpus[inst.rank_block, inst.rank_slot]


def _hint_sites(inst: Instance, gpus: np.ndarray) -> np.ndarray | None:
    """Site index of each block in a placement, or None if some block straddles sites or
    leaves the candidates (then the placement cannot be a hint)."""
    site_index = {int(s): i for i, s in enumerate(inst.site_ids)}
    level0 = inst.topology.path[gpus, 0]
    block_site = np.full(inst.num_blocks, -1, dtype=np.int64)
    for rank, dom in enumerate(level0):
        s = site_index.get(int(dom))
        b = inst.rank_block[rank]
        if s is None or block_site[b] not in (-1, s):
            return None
        block_site[b] = s
    return block_site


# --------------------------------------------------------------------------- solve
def solve(
    state: ClusterState,
    job: Job,
    *,
    time_limit: float | None = None,
    num_workers: int | None = None,
    seed: int = 0,
    shortcut: bool = True,
) -> SolveResult:
    """Place ``job`` on the free GPUs of ``state`` with CP-SAT (see the module docstring).

    ``time_limit`` (s) defaults to :data:`DEFAULT_TIME_LIMIT_S`; ``num_workers`` to
    :func:`default_num_workers`. With ``shortcut`` (the default), greedy's placement is
    returned as the proven optimum without building a model when its cost meets the core's
    lower bound (:func:`proven_by_bound`). Raises :class:`gpuplace.Infeasible` when no placement
    exists, and :class:`gpuplace.GpuplaceError` for a model bug or an unsupported topology.
    """
    start = time.perf_counter()
    greedy_gpus: np.ndarray | None = None
    greedy_error: str | None = None
    try:
        # The greedy solver alone (the gate runs once, on the placement cpsat returns).
        greedy_gpus = _core.solve(state._core, job.compile(state.topology), "greedy", seed)
    except Infeasible as exc:
        greedy_error = str(exc)
    if shortcut and greedy_gpus is not None:
        proven = _meets_bound(state, job, greedy_gpus, start)
        if proven is not None:
            return proven
    limit = DEFAULT_TIME_LIMIT_S if time_limit is None else float(time_limit)
    workers = default_num_workers() if num_workers is None else int(num_workers)

    inst = analyse(state, job)
    if inst.infeasible is not None:
        raise Infeasible(f"{job.name}: {greedy_error or inst.infeasible}")
    view = state.pricing_view()
    candidates = candidate_gpus(inst)
    if view.any_degraded(candidates):
        return _solve_degraded(
            state, job, inst, view, candidates, greedy_gpus, greedy_error, limit, workers, seed
        )
    result = _solve_blocks(state, job, inst, greedy_gpus, greedy_error, limit, workers, seed, start)
    placements = math.perm(len(candidates), job.gpus)
    if result.optimal or placements > ENUMERATE_MAX:
        return result
    # The block model's prices are lower bounds where NCCL's algorithms depend on more than
    # the span level; a tiny instance is then settled by enumeration.
    best = _enumerate(state, job, candidates)
    if best is None:  # cannot happen: the block model's placement meets the rules
        return result
    cost, gpus = best
    details = {
        "formulation": "enumeration",
        "placements": placements,
        "block_model": result.details,
        "placement_from": "enumeration",
        "wall_s": time.perf_counter() - start,
        "gap": 0.0,
    }
    return SolveResult(gpus=gpus, optimal=True, bound=cost, solver="cpsat", details=details)


def proven_by_bound(state: ClusterState, job: Job, seed: int = 0) -> SolveResult | None:
    """Greedy's placement with ``optimal=True`` when its cost meets the core's lower bound
    (see :func:`_meets_bound`), else None: the proof without a CP-SAT model."""
    start = time.perf_counter()
    try:
        gpus = _core.solve(state._core, job.compile(state.topology), "greedy", seed)
    except Infeasible:
        return None
    return _meets_bound(state, job, gpus, start)


def _meets_bound(
    state: ClusterState, job: Job, gpus: np.ndarray, start: float
) -> SolveResult | None:
    """``gpus`` as a proven optimum when their cost on ``state`` (its degraded hardware and
    running jobs included, as every placement is priced here) meets the core's lower bound
    on the cost of any placement (``cost::lower_bound``: each class at the cheapest level its
    groups can span on the free GPUs, with NCCL's algorithms at their most favourable), else
    None. This settles the common trivial cases without a model: a job without communication,
    a job inside one NVLink domain where every NVLink domain prices it alike, whole hosts of
    one leaf for a data-parallel ring of one GPU per host. Where heterogeneous host types,
    degraded GPUs or running neighbours make greedy's placement dearer than the bound, or the
    bound is loose, the model decides; the bound is None (no shortcut) on hosts with a GPU
    bandwidth matrix."""
    spec = job.compile(state.topology)
    bound = _core.lower_bound(state._core, spec)
    if bound is None:
        return None
    report = _core.evaluate(state.topology._core, spec, gpus, state._core)
    cost = float(report.comm_seconds)
    if not report.confinement_ok or cost > bound + 1e-9 * cost:
        return None
    details: dict[str, Any] = {
        "status": "OPTIMAL",
        "formulation": "lower bound",
        "placement_from": "greedy",
        # The bound is the core's own, unrounded: the objective is the evaluated cost.
        "objective_s": cost,
        "rounding_bound_s": 0.0,
        "wall_s": time.perf_counter() - start,
        "gap": 0.0,
    }
    return SolveResult(
        gpus=np.asarray(gpus, dtype=np.int64),
        optimal=True,
        bound=float(bound),
        solver="cpsat",
        details=details,
    )


def candidate_gpus(inst: Instance) -> np.ndarray:
    """Every GPU a placement of the instance can use: the free GPUs of the sites that hold a
    block, inside the domains of the job's max_span level that hold the job."""
    if not inst.site_gpus:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.concatenate(inst.site_gpus)).astype(np.int64)


def _solve_blocks(
    state: ClusterState,
    job: Job,
    inst: Instance,
    greedy_gpus: np.ndarray | None,
    greedy_error: str | None,
    limit: float,
    workers: int,
    seed: int,
    start: float,
) -> SolveResult:
    """The block (count or assignment) model, priced at the healthy level bandwidths: exact
    when no candidate GPU is degraded, else a relaxation (every price a lower bound)."""
    topo = state.topology
    hint_blocks = None if greedy_gpus is None else _hint_sites(inst, greedy_gpus)
    builder = _Builder(inst)
    builder.set_quantum()
    if inst.formulation == "count":
        hint = None
        if hint_blocks is not None and inst.block_of is not None:
            hint = np.zeros((inst.stages, len(inst.site_ids)), dtype=np.int64)
            for i in range(inst.ring_size):
                for k in range(inst.stages):
                    hint[k, hint_blocks[inst.block_of[i, k]]] += 1
        builder.build_count(hint)
    else:
        builder.build_assignment(hint_blocks)
    builder.objective()
    model = builder.model
    build_s = time.perf_counter() - start

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, limit - build_s)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    status = solve_stoppable(solver, model)
    status_name = solver.status_name(status)
    q = builder.quantum
    rounding = 0.5 * q * builder.priced_terms

    if status == cp_model.MODEL_INVALID:
        raise GpuplaceError(
            f"cpsat built an invalid model for {job.name} (a bug in gpuplace): {model.validate()}"
        )
    if status == cp_model.INFEASIBLE:
        if greedy_gpus is not None:
            raise GpuplaceError(
                f"cpsat: the model of {job.name} is infeasible although greedy placed it "
                "(a bug in gpuplace's model)"
            )
        reason = greedy_error or (
            f"{job.name}: no placement satisfies the confinement rules "
            f"({dict(job.confine)}, max_span={job.max_span}) on the free GPUs"
        )
        raise Infeasible(reason)

    details: dict[str, Any] = {
        "status": status_name,
        "formulation": inst.formulation,
        "variables": len(model.proto.variables),
        "constraints": len(model.proto.constraints),
        "sites": len(inst.site_ids),
        "blocks": inst.num_blocks,
        "block_size": inst.block_size,
        "num_workers": workers,
        "time_limit_s": limit,
        "quantum_s": float(q),
        "rounding_bound_s": float(rounding),
    }
    bound: float | None = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
        raw_bound = solver.best_objective_bound
        if math.isfinite(raw_bound):
            bound = float(max(0.0, q * raw_bound - rounding))
    gpus: np.ndarray | None = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        details["objective_s"] = float(q * solver.objective_value)
        if inst.formulation == "count":
            assert inst.block_of is not None
            stage_sites = []
            for k in range(inst.stages):
                sites_k: list[int] = []
                for s, v in enumerate(builder.counts[k]):
                    sites_k.extend([s] * solver.value(v))
                stage_sites.append(sites_k)
            chain_sites = _chains(inst, stage_sites)
            block_site = np.zeros(inst.num_blocks, dtype=np.int64)
            block_site[inst.block_of.reshape(-1)] = chain_sites.reshape(-1)
        else:
            block_site = np.array(
                [
                    next(s for s, v in enumerate(row) if solver.boolean_value(v))
                    for row in builder.x
                ],
                dtype=np.int64,
            )
        gpus = _gpus_from_blocks(inst, block_site)
    chosen = "cpsat"
    if greedy_gpus is not None:
        greedy_cost = evaluate(topo, job, greedy_gpus, state=state)
        if greedy_cost.confinement_ok:
            details["greedy_cost_s"] = greedy_cost.comm_seconds
            cost = None if gpus is None else evaluate(topo, job, gpus, state=state).comm_seconds
            if cost is None or cost > greedy_cost.comm_seconds:
                gpus, chosen = greedy_gpus, "greedy"
    if gpus is None:
        raise GpuplaceError(
            f"cpsat found no placement of {job.name} within {limit:g} s ({status_name}); "
            "raise time_limit or use solver='greedy'"
        )
    # The model's prices above the NVLink domain are lower bounds (see _collective_price):
    # polish on the evaluator's cost by the core's local search, which never makes it worse.
    refined = _core.refine(
        state._core, job.compile(topo), np.asarray(gpus, dtype=np.int64), 0.2, seed, 20_000
    )
    polished = refined.gpus
    if (
        refined.accepted
        and evaluate(topo, job, polished).comm_seconds < evaluate(topo, job, gpus).comm_seconds
    ):
        gpus, chosen = np.asarray(polished, dtype=np.int64), f"{chosen}+refine"
    details["placement_from"] = chosen
    details["wall_s"] = time.perf_counter() - start
    optimal = status == cp_model.OPTIMAL
    if bound is not None:
        cost = evaluate(topo, job, gpus, state=state).comm_seconds
        details["gap"] = 0.0 if cost <= 0 else float(max(0.0, (cost - bound) / cost))
        # Above the NVLink domain the model's prices are lower bounds (the evaluator's NIC
        # shares depend on GPUs per host, see _collective_price): optimal only when the
        # evaluated cost meets the bound.
        optimal = bool(optimal and cost <= bound + 2 * rounding + 1e-9 * cost)
    else:
        optimal = False
    return SolveResult(gpus=gpus, optimal=optimal, bound=bound, solver="cpsat", details=details)


def _interchangeable_ranks(job: Job, topo: Topology) -> list[list[list[int]]]:
    """The job's symmetries for the GPU-level model: every dimension but pipelines (p2p) can
    have its index permuted without changing any cost (see
    :meth:`_Builder.order_interchangeable`); per such dimension, per index value, the ranks
    whose earlier such coordinates are 0 and whose own is that value."""
    if job.traffic is not None:
        return []
    comm = job.resolved_communication()
    dims = [
        d
        for d in job.rank_order
        if getattr(job, d) > 1 and (d not in comm or comm[d].kind != _KIND_P2P)
    ]
    if not dims:
        return []
    coords = _coordinates(job, topo)
    rank_coords = np.stack([coords[d] for d in dims], axis=1)
    columns = list(range(len(dims)))
    return [_value_blocks(rank_coords, columns, j) for j in columns]


def _enumerate(
    state: ClusterState, job: Job, candidates: np.ndarray
) -> tuple[float, np.ndarray] | None:
    """The cheapest placement on the real prices among every injective map of the ranks onto
    ``candidates`` that meets the job's rules, priced by the core's evaluator (about 2 us
    each); None when none meets them."""
    topo_core, state_core = state.topology._core, state._core
    spec = job.compile(state.topology)
    best: tuple[float, np.ndarray] | None = None
    for perm in itertools.permutations(candidates.tolist(), job.gpus):
        gpus = np.asarray(perm, dtype=np.int64)
        report = _core.evaluate(topo_core, spec, gpus, state_core)
        if report.confinement_ok and (best is None or report.comm_seconds < best[0]):
            best = (report.comm_seconds, gpus)
    return best


def _solve_degraded(
    state: ClusterState,
    job: Job,
    inst: Instance,
    view: PricingView,
    candidates: np.ndarray,
    greedy_gpus: np.ndarray | None,
    greedy_error: str | None,
    limit: float,
    workers: int,
    seed: int,
) -> SolveResult:
    """Some candidate GPU is degraded, so GPUs of one site are no longer interchangeable.

    Small instances get the GPU-level model (:mod:`gpuplace.placement.solvers.cpsat_gpus`). Where its
    prices are the core's (:func:`cpsat_gpus.exact_prices`: point-to-point, all-to-all and
    explicit traffic), its ``optimal`` is a proof on the real prices. Otherwise its placement is
    one candidate among: the block model on the GPUs no degradation touches (exact there), the
    block model on every candidate priced healthy (a relaxation: every price is a lower bound,
    so its bound is valid for the real prices), greedy and ``refine``; the cheapest on the real
    prices wins, and ``optimal`` is claimed only when its real cost meets that bound."""
    start = time.perf_counter()
    topo = state.topology

    def real_cost(gpus: np.ndarray) -> float:
        report = evaluate(topo, job, gpus, state=state)
        return report.comm_seconds if report.confinement_ok else math.inf

    def infeasible() -> Infeasible:
        return Infeasible(
            greedy_error
            or f"{job.name}: no placement satisfies the confinement rules "
            f"({dict(job.confine)}, max_span={job.max_span}) on the free GPUs"
        )

    options: list[tuple[float, np.ndarray, str]] = []
    if greedy_gpus is not None:
        options.append((real_cost(greedy_gpus), greedy_gpus, "greedy"))
    details: dict[str, Any] = {"degraded_candidates": int(view.degraded[candidates].sum())}
    bound: float | None = None
    proven = False
    exact_prices = cpsat_gpus.exact_prices(job, topo)
    if not exact_prices and math.perm(len(candidates), job.gpus) <= ENUMERATE_MAX:
        best = _enumerate(state, job, candidates)
        if best is None:
            raise infeasible()
        details.update(formulation="enumeration", placements=math.perm(len(candidates), job.gpus))
        details["placement_from"] = "enumeration"
        details["wall_s"] = time.perf_counter() - start
        details["gap"] = 0.0
        cost, gpus = best
        return SolveResult(gpus=gpus, optimal=True, bound=cost, solver="cpsat", details=details)
    gpu_model = cpsat_gpus.fits(job.gpus, len(candidates))
    if gpu_model:
        exact = cpsat_gpus.solve_gpus(
            view,
            job,
            topo,
            candidates,
            max_span=inst.max_span,
            time_limit=limit if exact_prices else limit / 2,
            num_workers=workers,
            seed=seed,
            hint=greedy_gpus,
            interchangeable=_interchangeable_ranks(job, topo),
        )
        if exact.status == "INFEASIBLE":
            if greedy_gpus is not None:
                raise GpuplaceError(
                    f"cpsat: the GPU model of {job.name} is infeasible although greedy placed "
                    "it (a bug in gpuplace's model)"
                )
            raise infeasible()
        if exact.gpus is not None:
            options.append((real_cost(exact.gpus), exact.gpus, "cpsat"))
        if exact_prices:
            details.update(exact.details)
            bound, proven = exact.bound, exact.optimal
        else:
            details["gpu_model"] = exact.details
    if not (gpu_model and exact_prices):
        details["formulation"] = inst.formulation + " (relaxed: degraded hardware priced healthy)"
        share = max(0.01, (limit - (time.perf_counter() - start)) / 2)
        try:
            relaxed = _solve_blocks(
                state,
                job,
                inst,
                greedy_gpus,
                greedy_error,
                share,
                workers,
                seed,
                time.perf_counter(),
            )
        except Infeasible:
            raise  # the relaxation has the same rules on the same GPUs: nothing fits
        except GpuplaceError as exc:
            details["relaxed_model"] = str(exc)
        else:
            options.append((real_cost(relaxed.gpus), relaxed.gpus, "cpsat-relaxed"))
            bound = relaxed.bound
            details["relaxed_status"] = relaxed.details.get("status")
            details["rounding_bound_s"] = relaxed.details.get("rounding_bound_s", 0.0)
        healthy_state = state.copy()
        unusable = candidates[view.degraded[candidates]]
        healthy_state.drain_gpus(unusable)
        try:
            healthy_inst = analyse(healthy_state, job)
            if healthy_inst.infeasible is None:
                healthy = _solve_blocks(
                    healthy_state,
                    job,
                    healthy_inst,
                    None,
                    None,
                    share,
                    workers,
                    seed,
                    time.perf_counter(),
                )
                options.append((real_cost(healthy.gpus), healthy.gpus, "cpsat-healthy"))
        except GpuplaceError as exc:
            details["healthy_model"] = str(exc)
        refined = _core.solve(state._core, job.compile(state.topology), "refine", seed)
        options.append((real_cost(refined), refined, "refine"))
    options = [o for o in options if math.isfinite(o[0])]
    if not options:
        raise GpuplaceError(
            f"cpsat found no placement of {job.name} within {limit:g} s; raise time_limit or "
            "use solver='greedy'"
        )
    cost, gpus, chosen = min(options, key=lambda o: o[0])
    rounding = float(details.get("rounding_bound_s", 0.0))
    optimal = bool(proven) or (bound is not None and cost <= bound + 2 * rounding + 1e-15)
    details["placement_from"] = chosen
    details["wall_s"] = time.perf_counter() - start
    if bound is not None and math.isfinite(cost):
        details["gap"] = 0.0 if cost <= 0 else float(max(0.0, (cost - bound) / cost))
    return SolveResult(
        gpus=np.asarray(gpus, dtype=np.int64),
        optimal=optimal,
        bound=bound,
        solver="cpsat",
        details=details,
    )


@register_solver(
    "cpsat",
    "exact (OR-Tools CP-SAT) over the tree cost model, greedy as hint; proves optimality on "
    "small instances; time-limited",
    confining=True,
)
def _cpsat(state: ClusterState, job: Job, seed: int, time_limit: float | None) -> SolveResult:
    return solve(state, job, time_limit=time_limit, seed=seed)
