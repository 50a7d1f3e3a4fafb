"""A deliberately simple, pure-Python evaluator of gpuplace's one cost model: a test oracle.

It is written from the model's documentation (``rust/core/src/cost.rs`` module docs,
``docs/topology-format.md``, ``DESIGN.md``), with plain loops and no call into
``gpuplace._core``. It reads only public attributes of :class:`gpuplace.Topology` (levels,
node_types, hosts, host_types, host_domains, node_level) and of :class:`gpuplace.Job`
(``resolved_communication()``, ``rank_groups()``, degrees, traffic rows, confine, max_span).

The model, in words:

* Two GPUs meet at their *lowest common level*: the lowest level at which both lie in the same
  domain. A GPU's domain below the node level is its host's sublevel index, at the node level
  its host, above it the host's named domain.
* The bandwidth between two distinct GPUs is the host matrix entry when both sit in one host
  whose type has a matrix, else the smallest level bandwidth among levels ``0..=lca`` (GB/s).
* A ring collective (all-reduce, all-gather, reduce-scatter) over ``n`` GPUs visits them in
  GPU-id order. Bandwidth = its slowest hop; latency = that of the highest level a hop spans.
  all-reduce: ``2(n-1)`` latency steps and ``2(n-1)/n * S`` bytes per rank;
  all-gather / reduce-scatter: ``n-1`` steps and ``(n-1)/n * S`` bytes.
* all-to-all: ``n-1`` steps, ``(n-1)/n * S`` bytes, bandwidth of the slowest of all pairs,
  latency of the highest level any pair spans; every ordered pair moves ``S/n`` bytes.
* point-to-point (between neighbouring pipeline stages): 1 step, ``S`` bytes.
* one call costs ``steps * latency + bytes / bandwidth``; a collective costs ``count`` calls;
  a class (all collectives of one dimension) costs its slowest member; classes add up.
* explicit traffic: every (src, dst, bytes) row costs ``bytes / bandwidth(src, dst)`` and rows
  add up (no latency term).
* ``bytes_by_level``: bytes per step whose lowest common level is each level, counting every
  ring hop (``bytes per rank * count``), every all-to-all ordered pair (``S/n * count``),
  every point-to-point transfer (``S * count``) and every traffic row.
* span: the lowest level whose one domain holds every GPU (None for a single GPU).
* confinement: every group of every confined dimension (degree >= 2) stays inside one domain
  of its level, and the job's span is at most ``max_span``.

Where the documentation leaves a choice open, the Rust code (``rust/core/src/cost.rs``) was
read and this oracle follows it:

* point-to-point pays the latency of the two GPUs' lowest common level; a ring pays the latency
  of the highest level any of its hops reaches (the same as the group's span);
* a host matrix replaces only the bandwidth of a pair inside one host, never its latency, and
  only the hops of the GPU-id ring count (not every pair of the group);
* a ring of two GPUs has two hops (a -> b and b -> a), both counted in ``bytes_by_level``;
* explicit traffic has no latency term, and a row whose two ranks share a GPU costs nothing;
* a group of one GPU costs nothing; dimensions of degree 1 carry no traffic even when given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LATENCY_UNIT = 1e-6  # µs -> s
BANDWIDTH_UNIT = 1e9  # GB/s -> B/s


@dataclass
class ReferenceReport:
    comm_seconds: float
    #: Keyed like ``CostReport.class_seconds``: "<dim> <kind>".
    class_seconds: dict[str, float]
    traffic_seconds: float
    bytes_by_level: dict[str, float]
    span_level: str | None
    confinement_ok: bool
    violations: list[str] = field(default_factory=list)


class ReferenceTopology:
    """GPU -> host / local index / domain per level, recomputed from the topology's parts."""

    def __init__(self, topology: Any):
        self.topology = topology
        self.levels = list(topology.levels)
        self.level_names = [lv.name for lv in self.levels]
        self.node_level = topology.node_level
        self.gpu_host: list[int] = []
        self.gpu_local: list[int] = []
        # GPU ids follow hosts in file order, local index fastest (docs/topology-format.md).
        for h, tname in enumerate(topology.host_types):
            for local in range(topology.node_types[tname].gpus):
                self.gpu_host.append(h)
                self.gpu_local.append(local)

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_host)

    def domain(self, gpu: int, level: int) -> tuple[Any, ...]:
        """A hashable identity of the GPU's domain at ``level``."""
        h = self.gpu_host[gpu]
        if level < self.node_level:
            tname = self.topology.host_types[h]
            sub = self.topology.node_types[tname].sublevels[self.level_names[level]]
            return ("sub", h, sub[self.gpu_local[gpu]])
        if level == self.node_level:
            return ("host", h)
        # Domains above the node level are identified by name: two hosts naming the same
        # leaf share it (the file format makes names global per level).
        return ("named", self.topology.host_domains[h][level - self.node_level - 1])

    def lca(self, a: int, b: int) -> int:
        for level in range(len(self.levels)):
            if self.domain(a, level) == self.domain(b, level):
                return level
        return len(self.levels) - 1

    def bandwidth(self, a: int, b: int) -> float:
        """GB/s between two distinct GPUs."""
        if self.gpu_host[a] == self.gpu_host[b]:
            tname = self.topology.host_types[self.gpu_host[a]]
            matrix = self.topology.node_types[tname].bandwidth_gbps
            if matrix is not None:
                return float(matrix[self.gpu_local[a]][self.gpu_local[b]])
        top = self.lca(a, b)
        return min(self.levels[level].bandwidth_gbps for level in range(top + 1))

    def latency(self, level: int) -> float:
        return self.levels[level].latency_us * LATENCY_UNIT

    def span(self, gpus: list[int]) -> int | None:
        if len(gpus) < 2:
            return None
        highest = 0
        for a in gpus:
            for b in gpus:
                highest = max(highest, self.lca(a, b))
        return highest


def _level_of(topology: Any, name: str) -> int:
    """A level name, or the aliases the job format allows (nvlink_domain, node)."""
    names = [lv.name for lv in topology.levels]
    if name in names:
        return names.index(name)
    if name in ("nvlink_domain", "nvlink-domain"):
        return topology.nvlink_level
    if name in ("node", "host"):
        return topology.node_level
    raise KeyError(name)


def _one_call(
    ref: ReferenceTopology, kind: str, size: float, members: list[int], add_bytes: Any
) -> float:
    """Seconds of one call of a collective over ``members`` (GPU ids); reports the bytes of
    one call per level through ``add_bytes(level, bytes)``."""
    n = len(members)
    if n < 2:
        return 0.0
    if kind == "p2p":
        src, dst = members[0], members[1]
        level = ref.lca(src, dst)
        add_bytes(level, size)
        return ref.latency(level) + size / (ref.bandwidth(src, dst) * BANDWIDTH_UNIT)
    if kind == "all-reduce":
        steps = 2 * (n - 1)
        per_rank = 2 * (n - 1) / n * size
    else:  # all-gather, reduce-scatter, all-to-all
        steps = n - 1
        per_rank = (n - 1) / n * size
    ring = sorted(members)
    slowest = float("inf")
    highest = 0
    if kind == "all-to-all":
        for a in ring:
            for b in ring:
                if a == b:
                    continue
                level = ref.lca(a, b)
                add_bytes(level, size / n)
                highest = max(highest, level)
                slowest = min(slowest, ref.bandwidth(a, b))
    else:
        for i in range(n):
            a, b = ring[i], ring[(i + 1) % n]
            level = ref.lca(a, b)
            add_bytes(level, per_rank)
            highest = max(highest, level)
            slowest = min(slowest, ref.bandwidth(a, b))
    return steps * ref.latency(highest) + per_rank / (slowest * BANDWIDTH_UNIT)


def reference_evaluate(topology: Any, job: Any, gpus: Any) -> ReferenceReport:
    """Price ``gpus[rank]`` for ``job`` on ``topology`` with the documented cost model."""
    ref = ReferenceTopology(topology)
    gpus = [int(g) for g in gpus]
    if len(gpus) != job.gpus:
        raise ValueError(f"{len(gpus)} GPUs for {job.gpus} ranks")
    if len(set(gpus)) != len(gpus) or any(g < 0 or g >= ref.num_gpus for g in gpus):
        raise ValueError("GPUs must be distinct, existing ids")

    bytes_by_level = [0.0] * len(ref.levels)
    class_seconds: dict[str, float] = {}
    # Classes are ordered by dimension name, as CostReport lists them.
    for dim, comm in sorted(job.resolved_communication().items()):
        key = f"{dim} {comm.kind}"
        slowest_member = 0.0
        groups = [list(row) for row in job.rank_groups(dim)]
        if comm.kind == "p2p":
            # Neighbouring stages of each pipeline, no wrap-around.
            groups = [[g[i], g[i + 1]] for g in groups for i in range(len(g) - 1)]
        for group in groups:
            members = [gpus[int(r)] for r in group]

            def add(level: int, amount: float, count: float = comm.count) -> None:
                bytes_by_level[level] += amount * count

            seconds = comm.count * _one_call(ref, comm.kind, comm.bytes, members, add)
            slowest_member = max(slowest_member, seconds)
        class_seconds[key] = slowest_member

    traffic_seconds = 0.0
    if job.traffic is not None:
        for src, dst, amount in job.traffic:
            a, b = gpus[int(src)], gpus[int(dst)]
            if a == b or amount == 0:
                continue
            bytes_by_level[ref.lca(a, b)] += float(amount)
            traffic_seconds += float(amount) / (ref.bandwidth(a, b) * BANDWIDTH_UNIT)

    comm_seconds = sum(class_seconds.values()) + traffic_seconds

    span = ref.span(gpus)
    violations: list[str] = []
    top = len(ref.levels) - 1
    max_span = top if job.max_span is None else _level_of(topology, job.max_span)
    if span is not None and span > max_span:
        violations.append(f"job spans {ref.level_names[span]}")
    if job.traffic is None:
        for dim, limit_name in job.confine.items():
            if getattr(job, dim) < 2:
                continue
            limit = _level_of(topology, limit_name)
            for group in job.rank_groups(dim):
                group_span = ref.span([gpus[int(r)] for r in group])
                if group_span is not None and group_span > limit:
                    violations.append(f"{dim} group {list(group)} spans {group_span}")

    return ReferenceReport(
        comm_seconds=comm_seconds,
        class_seconds=class_seconds,
        traffic_seconds=traffic_seconds,
        bytes_by_level=dict(zip(ref.level_names, bytes_by_level, strict=True)),
        span_level=None if span is None else ref.level_names[span],
        confinement_ok=not violations,
        violations=violations,
    )


def confinement_holds(topology: Any, job: Any, gpus: Any) -> bool:
    """Whether a placement keeps every confined group and the job inside their levels."""
    return reference_evaluate(topology, job, gpus).confinement_ok
