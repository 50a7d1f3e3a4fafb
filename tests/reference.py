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
* A ring collective (all-reduce, all-gather, reduce-scatter) over ``n`` GPUs visits hosts in
  the order of their lowest rank, each host's GPUs in id order (``rust/core/src/nccl.rs``).
  Bandwidth = its slowest hop, a hop that leaves the NVLink domain counting its bandwidth
  times the group's GPUs on the smaller side (NIC shares); latency = that of the highest level
  a hop spans (a host with fewer NICs than GPUs gives ``k`` GPUs ``min(k, nics)`` NICs of
  ``gpus / nics`` shares each). all-reduce: ``2(n-1)`` latency steps and ``2(n-1)/n * S`` bytes per rank;
  all-gather / reduce-scatter: ``n-1`` steps and ``(n-1)/n * S`` bytes.
* An all-reduce takes the fastest of the ring, NVLS (inside one NVLink domain whose hosts have
  ``nvls_gbps``: a fixed 25 µs plus ``2(n-1)/n * S`` at that bus bandwidth) and the tree (across
  NVLink domains: latency ``2((k_max-1) * intra + ceil(log2 H) * span)``, bytes
  ``max(2S / intra bandwidth, 2(H-1)/H * S / inter bandwidth) / 0.92``), and CollNet where
  every switch level up to the span has ``sharp``; each algorithm's bandwidth term is divided
  by the topology's ``algorithm_efficiency`` of it (1 when not given).
* all-to-all: ``n-1`` steps at the latency of the highest level any pair spans; every ordered
  pair moves ``S/n`` bytes. Inside one NVLink domain ``(n-1)/n * S`` at the slowest pair;
  across domains each domain's fabric bytes over its NIC shares plus its NVLink rounds (PXN
  included), the slowest domain setting the pace (``nccl::alltoall_bytes_seconds``).
* NVLS-tree (all-reduce across NVLink domains whose hosts have ``nvls_gbps``, two or more of
  the group's GPUs in each): ``max(2(k-1)/k * S / nvls, F * S / inter) / 0.92`` with F = 1
  for two domains and 2 beyond, latency ``25 µs + 2 ceil(log2 H) * span``.
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

import math
from dataclasses import dataclass, field
from typing import Any

LATENCY_UNIT = 1e-6  # µs -> s
BANDWIDTH_UNIT = 1e9  # GB/s -> B/s
NVLS_LATENCY_S = 25e-6  # NVLS all-reduce fixed latency (rust/core/src/nccl.rs)
TREE_EFFICIENCY = 0.92  # NCCL's tree bandwidth derating


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


def _shares(ref: ReferenceTopology, gpu: int, k: int) -> float:
    """NIC shares ``k`` GPUs of the group drive: one per GPU, or with fewer NICs than GPUs on
    ``gpu``'s host type, ``min(k, nics)`` NICs of ``gpus / nics`` shares."""
    nt = ref.topology.node_types[ref.topology.host_types[ref.gpu_host[gpu]]]
    nics = len(nt.nics)
    if nics == 0 or nics >= nt.gpus:
        return float(k)
    return min(k, nics) * nt.gpus / nics


def _nccl_ring(ref: ReferenceTopology, members: list[int]) -> tuple[list[int], dict[int, int]]:
    """NCCL's ring over ``members`` (rank order): NVLink domains in the order of their lowest
    rank, each domain's GPUs consecutively in id order; and per GPU, the group's GPUs in its
    domain."""
    nvlink = ref.topology.nvlink_level
    unit = {g: ref.domain(g, nvlink) for g in members}
    order: list[Any] = []
    for g in members:
        if unit[g] not in order:
            order.append(unit[g])
    ring = sorted(members, key=lambda g: (order.index(unit[g]), g))
    count = {h: sum(unit[g] == h for g in members) for h in order}
    return ring, {g: count[unit[g]] for g in members}


def _one_call(
    ref: ReferenceTopology,
    kind: str,
    size: float,
    members: list[int],
    add_bytes: Any,
    share: float = 1.0,
) -> float:
    """Seconds of one call of a collective over ``members`` (GPU ids); reports the bytes of
    one call per level through ``add_bytes(level, bytes)``. ``share`` (contention) scales the
    bandwidth of the hops that leave the NVLink domain (p2p and all-to-all: the whole)."""
    n = len(members)
    if n < 2:
        return 0.0
    if kind == "p2p":
        src, dst = members[0], members[1]
        level = ref.lca(src, dst)
        add_bytes(level, size)
        return ref.latency(level) + size / (ref.bandwidth(src, dst) * share * BANDWIDTH_UNIT)
    if kind == "all-reduce":
        steps = 2 * (n - 1)
        per_rank = 2 * (n - 1) / n * size
    else:  # all-gather, reduce-scatter, all-to-all
        steps = n - 1
        per_rank = (n - 1) / n * size
    slowest = float("inf")
    highest = 0
    if kind == "all-to-all":
        return _all_to_all(ref, size, sorted(members), add_bytes, share, steps)
    # NCCL's ring (see _nccl_ring); "hosts" are NCCL's nodes: NVLink domains (the host on HGX,
    # the rack on NVL72). on_host: per GPU, the group's GPUs in its domain.
    nvlink = ref.topology.nvlink_level
    ring, on_host = _nccl_ring(ref, members)
    intra = inter = float("inf")
    for i in range(n):
        a, b = ring[i], ring[(i + 1) % n]
        level = ref.lca(a, b)
        add_bytes(level, per_rank)
        highest = max(highest, level)
        if level > nvlink:
            # A hop out of the NVLink domain drives one NIC share per GPU of the group on the
            # smaller side.
            lanes = min(_shares(ref, a, on_host[a]), _shares(ref, b, on_host[b]))
            inter = min(inter, lanes * ref.bandwidth(a, b))
        else:
            intra = min(intra, ref.bandwidth(a, b))
    inter *= share
    slowest = min(intra, inter)
    eff = {
        a: ref.topology.algorithm_efficiency.get(a, 1.0)
        for a in ("ring", "tree", "nvls", "collnet")
    }
    best = steps * ref.latency(highest) + per_rank / (slowest * eff["ring"] * BANDWIDTH_UNIT)
    if kind != "all-reduce":
        return best
    if highest <= nvlink:
        nvls = min(
            ref.topology.node_types[ref.topology.host_types[ref.gpu_host[g]]].nvls_gbps or 0.0
            for g in members
        )
        if nvls > 0:
            healthy = min(ref.levels[lv].bandwidth_gbps for lv in range(highest + 1))
            factor = min(1.0, slowest / healthy)
            best = min(
                best, NVLS_LATENCY_S + per_rank / (nvls * factor * eff["nvls"] * BANDWIDTH_UNIT)
            )
    else:
        hosts = len({ref.domain(g, nvlink) for g in members})
        k_max = max(on_host.values())
        log2 = math.ceil(math.log2(hosts))
        latency = 2 * (
            (k_max - 1) * ref.latency(min(nvlink, highest)) + log2 * ref.latency(highest)
        )
        chain = 2 * size / (intra * BANDWIDTH_UNIT) if k_max > 1 and intra != float("inf") else 0.0
        fabric = 2 * (hosts - 1) / hosts * size / (inter * BANDWIDTH_UNIT)
        best = min(best, latency + max(chain, fabric) / TREE_EFFICIENCY / eff["tree"])
        nvls = min(
            ref.topology.node_types[ref.topology.host_types[ref.gpu_host[g]]].nvls_gbps or 0.0
            for g in members
        )
        if nvls > 0 and min(on_host.values()) >= 2 and intra != float("inf"):
            # NVLS-tree: NVLS inside each domain, NCCL's tree between domains (S per domain
            # for two domains, 2 S beyond), pipelined: the slower stage sets the pace.
            healthy = min(ref.levels[lv].bandwidth_gbps for lv in range(nvlink + 1))
            factor = min(1.0, intra / healthy)
            inside = 2 * (k_max - 1) / k_max * size / (nvls * factor * eff["nvls"] * BANDWIDTH_UNIT)
            between = (1 if hosts <= 2 else 2) * size / (inter * BANDWIDTH_UNIT)
            nvls_tree = (
                NVLS_LATENCY_S
                + 2 * log2 * ref.latency(highest)
                + max(inside, between) / TREE_EFFICIENCY / eff["tree"]
            )
            best = min(best, nvls_tree)
        if all(ref.levels[lv].sharp for lv in range(nvlink + 1, highest + 1)):
            # CollNet: reduce-scatter/all-gather inside hosts, each host sends S to the
            # reducing switches once.
            intra_lat = ref.latency(min(nvlink, highest))
            local = (
                2 * (k_max - 1) / k_max * size / (intra * BANDWIDTH_UNIT)
                if k_max > 1 and intra != float("inf")
                else 0.0
            )
            collnet = (
                2 * (intra_lat + ref.latency(highest))
                + max(local, size / (inter * BANDWIDTH_UNIT)) / eff["collnet"]
            )
            best = min(best, collnet)
    return best


def _all_to_all(
    ref: ReferenceTopology,
    size: float,
    members: list[int],
    add_bytes: Any,
    share: float,
    steps: float,
) -> float:
    """An all-to-all as NCCL runs it: per NVLink domain, its fabric bytes (the larger of out
    and in, each pair at its bandwidth) over its NIC shares, plus its NVLink rounds (peers in
    the domain, and PXN's copy of the fabric bytes bound for another rail); the slowest
    domain sets the pace. Inside one domain: ``(n-1)/n * S`` at the slowest pair."""
    n = len(members)
    pair = size / n
    nvlink = ref.topology.nvlink_level
    unit = {g: ref.domain(g, nvlink) for g in members}
    highest = 0
    out: dict[int, float] = {}
    into: dict[int, float] = {}
    slow: dict[int, float] = {}
    for a in members:
        for b in members:
            if a == b:
                continue
            level = ref.lca(a, b)
            add_bytes(level, pair)
            highest = max(highest, level)
            if unit[a] == unit[b]:
                slow[unit[a]] = min(slow.get(unit[a], float("inf")), ref.bandwidth(a, b))
            else:
                t = pair / (ref.bandwidth(a, b) * BANDWIDTH_UNIT)
                out[unit[a]] = out.get(unit[a], 0.0) + t
                into[unit[b]] = into.get(unit[b], 0.0) + t
    if highest > nvlink:
        share = share if share > 0 else 1.0
    else:
        share = 1.0
    worst = 0.0
    for u in set(unit.values()):
        gpus_u = [g for g in members if unit[g] == u]
        k = len(gpus_u)
        remote = n - k
        fabric = 0.0
        if remote:
            fabric = max(out.get(u, 0.0), into.get(u, 0.0)) / _shares(ref, gpus_u[0], k) / share
        nvl = 0.0
        if k > 1:
            nt = ref.topology.node_types[ref.topology.host_types[ref.gpu_host[gpus_u[0]]]]
            rails = len(nt.nics) if nt.nics else nt.gpus
            rails = max(1, min(rails, nt.gpus, k))
            pxn = 1 - 1 / rails if remote else 0.0
            nvl = ((k - 1) + pxn * remote) * pair / (slow[u] * BANDWIDTH_UNIT)
        worst = max(worst, fabric + nvl)
    return steps * ref.latency(highest) + worst


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


# --------------------------------------------------------------------------- contention
#
# Jobs sharing the fabric (``rust/core/src/fabric.rs`` module docs), in words:
#
# * every domain from the NVLink domain up to below the top level has an uplink; its capacity
#   (GB/s, each direction) is its GPUs times the smallest level bandwidth up to the level above,
#   divided by its level's ``oversubscription``, unless ``topology.uplink_gbps`` names it;
# * a collective's flows: a ring sends from every member to the next in NCCL's ring order at
#   the bandwidth the cost model gives the healthy ring (hops out of the NVLink domain at their
#   NIC shares), an all-to-all from every member to every other at ``1/(n-1)`` of the rate the
#   cost model runs it at (each flow carries ``S/n`` in its time), a point-to-point one flow; a flow between GPUs meeting at level ``L``
#   leaves through the sender's uplinks below ``L`` (up) and enters through the receiver's (down);
# * a job's load on an uplink direction is its heaviest class's sum of flows there;
# * a collective priced among neighbours gets, on every uplink direction its flows cross,
#   ``min(1, capacity / (neighbours' load + its own flows there))``; the bandwidth of its hops
#   out of the NVLink domain (the only ones that reach an uplink) is scaled by the smallest
#   such share. On an oversubscribed fabric (some uplink below its non-blocking
#   capacity) "its own flows" are its class's flows there (at least its own): the concurrent
#   collectives of a class share the uplinks too.


def _open_capacity(ref: ReferenceTopology) -> dict[tuple[int, Any], float]:
    """Non-blocking capacity of every uplink."""
    top = len(ref.levels) - 1
    sizes: dict[tuple[int, Any], int] = {}
    for g in range(ref.num_gpus):
        for level in range(ref.topology.nvlink_level, top):
            key = (level, ref.domain(g, level))
            sizes[key] = sizes.get(key, 0) + 1
    return {
        (level, dom): size * min(lv.bandwidth_gbps for lv in ref.levels[: level + 2])
        for (level, dom), size in sizes.items()
    }


def _uplink_capacity(ref: ReferenceTopology) -> dict[tuple[int, Any], float]:
    topology = ref.topology
    top = len(ref.levels) - 1
    sizes: dict[tuple[int, Any], int] = {}
    for g in range(ref.num_gpus):
        for level in range(topology.nvlink_level, top):
            key = (level, ref.domain(g, level))
            sizes[key] = sizes.get(key, 0) + 1
    capacity = {}
    for (level, dom), size in sizes.items():
        above = min(lv.bandwidth_gbps for lv in ref.levels[: level + 2])
        capacity[(level, dom)] = size * above / ref.levels[level].oversubscription
    for name, gbps in topology.uplink_gbps.items():
        wanted, _, short = name.rpartition(":")
        for level in range(topology.nvlink_level, top):
            if wanted and ref.level_names[level] != wanted:
                continue
            for key in capacity:
                dom = key[1]
                label = topology.hosts[dom[1]] if dom[0] == "host" else dom[-1]
                if key[0] == level and label == short:
                    capacity[key] = float(gbps)
    return capacity


def _flows(ref: ReferenceTopology, kind: str, members: list[int]) -> list[tuple[int, int, float]]:
    """(from, to, GB/s) of one collective."""
    n = len(members)
    if n < 2:
        return []
    if kind == "p2p":
        pairs = [(members[0], members[1], 1.0)]
    elif kind == "all-to-all":
        ring = sorted(members)
        # At the rate the cost model runs it: each of a GPU's n-1 flows carries S/n in the
        # collective's (bandwidth) time.
        seconds = _all_to_all(ref, 1e9, ring, lambda *_: None, 1.0, 0.0)
        rate = (n - 1) / n / seconds
        return [(a, b, rate / (n - 1)) for a in ring for b in ring if a != b]
    else:
        ring, on_host = _nccl_ring(ref, members)
        nvlink = ref.topology.nvlink_level
        rates = []
        for i in range(n):
            a, b = ring[i], ring[(i + 1) % n]
            lanes = 1.0
            if ref.lca(a, b) > nvlink:
                lanes = min(_shares(ref, a, on_host[a]), _shares(ref, b, on_host[b]))
            rates.append(lanes * ref.bandwidth(a, b))
        rate = min(rates)
        return [(ring[i], ring[(i + 1) % n], rate) for i in range(n)]
    rate = min(ref.bandwidth(a, b) for a, b, _ in pairs)
    return [(a, b, rate * f) for a, b, f in pairs]


def _crossed(ref: ReferenceTopology, a: int, b: int) -> list[tuple[str, int, Any]]:
    out = []
    for level in range(ref.topology.nvlink_level, ref.lca(a, b)):
        out.append(("up", level, ref.domain(a, level)))
        out.append(("down", level, ref.domain(b, level)))
    return out


def _collectives(job: Any, gpus: list[int]) -> list[tuple[str, str, list[int], Any]]:
    """(class key, kind, member GPUs, comm) of every collective of a job."""
    out = []
    for dim, comm in sorted(job.resolved_communication().items()):
        groups = [list(row) for row in job.rank_groups(dim)]
        if comm.kind == "p2p":
            groups = [[g[i], g[i + 1]] for g in groups for i in range(len(g) - 1)]
        for group in groups:
            out.append((f"{dim} {comm.kind}", comm.kind, [gpus[int(r)] for r in group], comm))
    return out


def reference_load(topology: Any, job: Any, gpus: Any) -> dict[tuple[str, int, Any], float]:
    """A placed job's load (GB/s) per uplink direction: its heaviest class's flows."""
    ref = ReferenceTopology(topology)
    gpus = [int(g) for g in gpus]
    per_class: dict[str, dict[tuple[str, int, Any], float]] = {}
    for key, kind, members, comm in _collectives(job, gpus):
        if comm.bytes <= 0 or comm.count <= 0:
            continue
        load = per_class.setdefault(key, {})
        for a, b, rate in _flows(ref, kind, members):
            for link in _crossed(ref, a, b):
                load[link] = load.get(link, 0.0) + rate
    peak: dict[tuple[str, int, Any], float] = {}
    for load in per_class.values():
        for link, v in load.items():
            peak[link] = max(peak.get(link, 0.0), v)
    return peak


def reference_contended(
    topology: Any, job: Any, gpus: Any, neighbours: list[tuple[Any, Any]]
) -> float:
    """Communication seconds per step of ``job`` on ``gpus`` among ``neighbours`` ((job,
    gpus) pairs already running), explicit traffic excluded."""
    ref = ReferenceTopology(topology)
    capacity = _uplink_capacity(ref)
    background: dict[tuple[str, int, Any], float] = {}
    for other, other_gpus in neighbours:
        for link, v in reference_load(topology, other, other_gpus).items():
            background[link] = background.get(link, 0.0) + v
    gpus = [int(g) for g in gpus]
    # On an oversubscribed fabric a collective's class shares the uplinks with it.
    open_capacity = _open_capacity(ref)
    oversubscribed = any(cap < open_capacity[key] * (1 - 1e-12) for key, cap in capacity.items())
    class_load: dict[str, dict[tuple[str, int, Any], float]] = {}
    for key, kind, members, comm in _collectives(job, gpus):
        if comm.bytes <= 0 or comm.count <= 0:
            continue
        load = class_load.setdefault(key, {})
        for a, b, rate in _flows(ref, kind, members):
            for link in _crossed(ref, a, b):
                load[link] = load.get(link, 0.0) + rate
    class_seconds: dict[str, float] = {}
    for key, kind, members, comm in _collectives(job, gpus):
        own: dict[tuple[str, int, Any], float] = {}
        for a, b, rate in _flows(ref, kind, members):
            for link in _crossed(ref, a, b):
                own[link] = own.get(link, 0.0) + rate
        share = 1.0
        for link, v in own.items():
            mine = max(v, class_load.get(key, {}).get(link, 0.0)) if oversubscribed else v
            demand = background.get(link, 0.0) + mine
            cap = capacity[(link[1], link[2])]
            if demand > cap * (1 + 1e-9):
                share = min(share, cap / demand)
        seconds = _one_call_scaled(ref, kind, comm.bytes, members, share)
        class_seconds[key] = max(class_seconds.get(key, 0.0), comm.count * seconds)
    return sum(class_seconds.values())


def _one_call_scaled(
    ref: ReferenceTopology, kind: str, size: float, members: list[int], share: float
) -> float:
    """:func:`_one_call` with the fabric hops' bandwidth scaled by a fair share."""
    return _one_call(ref, kind, size, members, lambda *_: None, share)
