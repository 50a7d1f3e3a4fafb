"""Cluster topologies: named levels with bandwidths, hosts of typed nodes, and the domain tree.

A :class:`Topology` is built from the native dictionary form (``docs/topology-format.md``),
from a file (:meth:`Topology.load`), from a preset (:meth:`Topology.preset`) or from a networkx
graph. It compiles to flat arrays owned by the Rust core (``self._core``), which prices
traffic and indexes domains; this class keeps the names.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from gpuplace import _core
from gpuplace._validate import Checker, dump_document, read_document, write_atomically
from gpuplace.errors import InvalidTopology
from gpuplace.hostlist import HostlistError, compress, expand
from gpuplace.policy import ClusterPolicy

__all__ = ["FORMAT", "Level", "NodeType", "Topology"]

FORMAT = "gpuplace.topology/1"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True)
class Level:
    """One level of the hierarchy, bottom-up.

    ``bandwidth_gbps`` is the per-GPU, one-direction bandwidth (GB/s) of traffic whose lowest
    common level is this one; ``latency_us`` the latency of one message at this level (µs).
    """

    name: str
    bandwidth_gbps: float
    latency_us: float


@dataclass(frozen=True)
class NodeType:
    """A kind of host: its GPUs and what connects them."""

    name: str
    gpus: int
    gpu_model: str | None = None
    power_w: float | None = None
    #: Level name -> domain index of each local GPU, for levels below the node level.
    sublevels: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: Optional ``gpus x gpus`` bandwidth (GB/s) overriding the levels inside the host.
    bandwidth_gbps: tuple[tuple[float, ...], ...] | None = None
    #: Optional ``gpus x gpus`` nvidia-smi link classes (X, NV#, PIX, ...), informational.
    link_classes: tuple[tuple[str, ...], ...] | None = None
    nics: tuple[str, ...] = ()
    #: Per local GPU, the index into ``nics`` of its NIC (its rail).
    gpu_nic: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpus": self.gpus}
        if self.gpu_model:
            out["gpu_model"] = self.gpu_model
        if self.power_w is not None:
            out["power_w"] = self.power_w
        if self.sublevels:
            out["sublevels"] = {k: list(v) for k, v in self.sublevels.items()}
        if self.bandwidth_gbps is not None:
            out["bandwidth_gbps"] = [list(r) for r in self.bandwidth_gbps]
        if self.link_classes is not None:
            out["link_classes"] = [list(r) for r in self.link_classes]
        if self.nics:
            out["nics"] = list(self.nics)
        if self.gpu_nic is not None:
            out["gpu_nic"] = list(self.gpu_nic)
        return out


class Topology:
    """A cluster: levels, host types, hosts and their domains.

    GPU ids run host by host in file order, local index fastest. ``domain_names[l][d]`` names
    domain ``d`` of level ``l``.
    """

    def __init__(
        self,
        *,
        name: str,
        levels: Sequence[Level],
        node_level: int,
        nvlink_level: int,
        node_types: Mapping[str, NodeType],
        hosts: Sequence[str],
        host_types: Sequence[str],
        host_domains: Sequence[Sequence[str]],
        provenance: Mapping[str, Any] | None = None,
    ):
        """Build from parts; ``host_domains[h]`` names host h's domain at each level above the
        node level. Prefer :meth:`from_dict`, which validates field by field."""
        self.name = name
        #: Informational notes of an import (``sources``, ``warnings``, ``degraded_links``,
        #: ``parallel_links``); not part of the cost model nor of the fingerprint.
        self.provenance: dict[str, Any] = dict(provenance or {})
        self.levels: tuple[Level, ...] = tuple(levels)
        self.node_level = node_level
        self.nvlink_level = nvlink_level
        self.node_types: dict[str, NodeType] = dict(node_types)
        self.hosts: tuple[str, ...] = tuple(hosts)
        self.host_types: tuple[str, ...] = tuple(host_types)
        self.host_domains: tuple[tuple[str, ...], ...] = tuple(tuple(d) for d in host_domains)
        self._host_index = {h: i for i, h in enumerate(self.hosts)}
        #: How to rebuild this topology (a preset and its parameters, or a file), if known.
        self.origin: dict[str, Any] | None = None
        #: Hardware attributes, pools and priority classes from the file (``gpuplace.policy``).
        self.policy = ClusterPolicy()
        self._core = self._compile()

    # ----------------------------------------------------------------- compilation
    def _compile(self) -> _core.Topology:
        nl = len(self.levels)
        nlev = self.node_level
        type_names = list(self.node_types)
        type_index = {t: i for i, t in enumerate(type_names)}
        gpus_per_host = np.array([self.node_types[t].gpus for t in self.host_types], dtype=np.int64)
        host_of_gpu = np.repeat(np.arange(len(self.hosts), dtype=np.int64), gpus_per_host)
        starts = np.concatenate(([0], np.cumsum(gpus_per_host)[:-1]))
        local = np.arange(int(gpus_per_host.sum()), dtype=np.int64) - starts[host_of_gpu]
        path = np.zeros((len(host_of_gpu), nl), dtype=np.int64)
        self.domain_names: list[list[str]] = [[] for _ in range(nl)]

        # Levels above the node: ids in order of first appearance.
        for offset, level in enumerate(range(nlev + 1, nl)):
            ids: dict[str, int] = {}
            host_ids = np.empty(len(self.hosts), dtype=np.int64)
            for h, domains in enumerate(self.host_domains):
                host_ids[h] = ids.setdefault(domains[offset], len(ids))
            self.domain_names[level] = list(ids)
            path[:, level] = host_ids[host_of_gpu]
        path[:, nlev] = host_of_gpu
        self.domain_names[nlev] = list(self.hosts)

        # Levels below the node: per host, the type's sublevel indices made globally unique.
        for level in range(nlev):
            lname = self.levels[level].name
            names: list[str] = []
            next_id = 0
            per_host_first = np.empty(len(self.hosts), dtype=np.int64)
            local_maps: dict[str, tuple[np.ndarray, list[int]]] = {}
            for t in type_names:
                sub = self.node_types[t].sublevels[lname]
                order: list[int] = []
                for v in sub:
                    if v not in order:
                        order.append(v)
                remap = np.array([order.index(v) for v in sub], dtype=np.int64)
                local_maps[t] = (remap, order)
            for h, t in enumerate(self.host_types):
                remap, order = local_maps[t]
                per_host_first[h] = next_id
                names.extend(f"{self.hosts[h]}/{lname}{v}" for v in order)
                next_id += len(order)
            remaps = {t: m[0] for t, m in local_maps.items()}
            sub_local = np.empty(len(host_of_gpu), dtype=np.int64)
            for h, t in enumerate(self.host_types):
                s = starts[h]
                sub_local[s : s + gpus_per_host[h]] = remaps[t]
            path[:, level] = per_host_first[host_of_gpu] + sub_local
            self.domain_names[level] = names

        matrices = []
        for t in type_names:
            m = self.node_types[t].bandwidth_gbps
            matrices.append(None if m is None else np.asarray(m, dtype=np.float64))
        host_type_ids = np.array([type_index[t] for t in self.host_types], dtype=np.int64)
        self._host_of_gpu = host_of_gpu
        self._gpu_local = local
        return _core.Topology(
            [lv.name for lv in self.levels],
            [lv.bandwidth_gbps for lv in self.levels],
            [lv.latency_us for lv in self.levels],
            self.node_level,
            self.nvlink_level,
            path,
            type_names,
            [self.node_types[t].gpus for t in type_names],
            matrices,
            host_type_ids,
            local,
        )

    # ----------------------------------------------------------------- queries
    @property
    def num_gpus(self) -> int:
        return self._core.num_gpus

    @property
    def level_names(self) -> list[str]:
        return [lv.name for lv in self.levels]

    def level_index(self, name: str) -> int:
        """Index of a level by name; ``nvlink_domain`` and ``node`` are accepted as aliases of
        the NVLink-domain and host levels."""
        for i, lv in enumerate(self.levels):
            if lv.name == name:
                return i
        if name in ("nvlink_domain", "nvlink-domain"):
            return self.nvlink_level
        if name in ("node", "host"):
            return self.node_level
        raise KeyError(name)

    def host_of(self, gpu: int) -> str:
        """Host name of a GPU."""
        return self.hosts[int(self._host_of_gpu[gpu])]

    def local_index(self, gpu: int) -> int:
        """Index of a GPU inside its host (its CUDA device ordinal)."""
        return int(self._gpu_local[gpu])

    def host_gpus(self, host: str) -> np.ndarray:
        """GPU ids of a host, by local index."""
        h = self._host_index.get(host)
        if h is None:
            raise InvalidTopology(f"{self.name}: no host named {host!r}")
        return np.flatnonzero(self._host_of_gpu == h)

    @property
    def host_of_gpu(self) -> np.ndarray:
        """Host index of every GPU."""
        return self._host_of_gpu

    def domain_count(self, level: int | str) -> int:
        lvl = level if isinstance(level, int) else self.level_index(level)
        return self._core.domain_count(lvl)

    def domain_of(self, gpu: int, level: int | str) -> str:
        lvl = level if isinstance(level, int) else self.level_index(level)
        return self.domain_names[lvl][int(self._core.path()[gpu, lvl])]

    def bandwidth_matrix(self, gpus: Any = None) -> np.ndarray:
        """Bandwidth (GB/s) between every pair of ``gpus`` (default: all) as the cost model
        prices it on healthy hardware; 0 on the diagonal. ``1 / (B * 1e9)`` is the seconds per
        byte to use as a :func:`gpuplace.map_ranks` distance."""
        ids = np.arange(self.num_gpus) if gpus is None else np.asarray(gpus, dtype=np.int64)
        return self._core.bandwidth_matrix(ids.astype(np.int64))

    @cached_property
    def path(self) -> np.ndarray:
        """Domain id of every GPU at every level, shape (num_gpus, num_levels)."""
        return self._core.path()

    @property
    def warnings(self) -> list[str]:
        """What the readers of an imported topology could not resolve (empty otherwise)."""
        return list(self.provenance.get("warnings", []))

    def __repr__(self) -> str:
        levels = ", ".join(f"{lv.name}[{self.domain_count(i)}]" for i, lv in enumerate(self.levels))
        return f"Topology({self.name!r}, {self.num_gpus} GPUs, levels: {levels})"

    # ----------------------------------------------------------------- native format
    @classmethod
    def from_dict(cls, document: Any, *, source: str | None = None) -> Topology:
        """Build from the native dictionary form, validating every field.

        Raises :class:`gpuplace.InvalidTopology` naming ``source`` (a file name) and the field.
        """
        c = Checker(InvalidTopology, source)
        doc = c.mapping(document, "")
        c.keys(
            doc,
            "",
            {
                "format",
                "name",
                "levels",
                "node_level",
                "nvlink_domain",
                "node_types",
                "nodes",
                "provenance",
                *ClusterPolicy.SECTIONS,
            },
        )
        if doc.get("format") != FORMAT:
            raise c.fail("format", f"expected {FORMAT!r}, got {doc.get('format')!r}")
        name = c.string(doc.get("name", source or "topology"), "name")

        levels: list[Level] = []
        raw_levels = c.sequence(doc.get("levels"), "levels")
        if not raw_levels:
            raise c.fail("levels", "at least one level is required")
        for i, raw in enumerate(raw_levels):
            p = f"levels[{i}]"
            lv = c.mapping(raw, p)
            c.keys(lv, p, {"name", "bandwidth_gbps", "latency_us"})
            lname = c.string(lv.get("name"), f"{p}.name")
            if not _NAME.match(lname):
                raise c.fail(f"{p}.name", f"use lowercase letters, digits, '-', '_'; got {lname!r}")
            if any(existing.name == lname for existing in levels):
                raise c.fail(f"{p}.name", f"duplicate level name {lname!r}")
            levels.append(
                Level(
                    lname,
                    c.number(lv.get("bandwidth_gbps"), f"{p}.bandwidth_gbps", positive=True),
                    c.number(lv.get("latency_us", 0.0), f"{p}.latency_us", minimum=0.0),
                )
            )
        names = [lv.name for lv in levels]

        def level_ref(key: str, default: int) -> int:
            if key not in doc:
                return default
            value = c.string(doc[key], key)
            if value not in names:
                raise c.fail(key, f"expected one of the levels ({', '.join(names)}), got {value!r}")
            return names.index(value)

        node_level = level_ref("node_level", 0)
        nvlink_level = level_ref("nvlink_domain", node_level)
        if nvlink_level < node_level:
            raise c.fail("nvlink_domain", "must be the node level or a level above it")
        below = names[:node_level]
        above = names[node_level + 1 :]

        node_types: dict[str, NodeType] = {}
        raw_types = c.mapping(doc.get("node_types"), "node_types")
        if not raw_types:
            raise c.fail("node_types", "at least one node type is required")
        for tname, raw in raw_types.items():
            node_types[tname] = _node_type(c, f"node_types.{tname}", tname, raw, below)

        hosts: list[str] = []
        host_types: list[str] = []
        host_domains: list[tuple[str, ...]] = []
        seen: dict[str, str] = {}
        raw_nodes = c.sequence(doc.get("nodes"), "nodes")
        if not raw_nodes:
            raise c.fail("nodes", "at least one node is required")
        for i, raw in enumerate(raw_nodes):
            p = f"nodes[{i}]"
            entry = c.mapping(raw, p)
            c.keys(entry, p, {"name", "type", "domains"})
            expr = c.string(entry.get("name"), f"{p}.name")
            try:
                names_here = expand(expr)
            except HostlistError as exc:
                raise c.fail(f"{p}.name", str(exc)) from None
            if not names_here:
                raise c.fail(f"{p}.name", f"hostlist {expr!r} names no host")
            tname = c.string(entry.get("type"), f"{p}.type")
            if tname not in node_types:
                raise c.fail(
                    f"{p}.type",
                    f"expected one of the node_types ({', '.join(node_types)}), got {tname!r}",
                )
            domains = c.mapping(entry.get("domains", {}), f"{p}.domains")
            missing = [lv for lv in above if lv not in domains]
            if missing:
                raise c.fail(f"{p}.domains", f"missing a domain for level {missing[0]!r}")
            extra = [k for k in domains if k not in above]
            if extra:
                raise c.fail(
                    f"{p}.domains.{extra[0]}",
                    f"not a level above the node level (expected {', '.join(above) or 'none'})",
                )
            path = tuple(_domain_name(c, domains[lv], f"{p}.domains.{lv}") for lv in above)
            for host in names_here:
                if host in seen:
                    raise c.fail(f"{p}.name", f"host {host!r} is already defined in {seen[host]}")
                seen[host] = p
                hosts.append(host)
                host_types.append(tname)
                host_domains.append(path)
            if len(hosts) > 2_000_000:
                raise c.fail("nodes", "more than 2,000,000 hosts")
        notes = _provenance(c, doc.get("provenance", {}))
        try:
            topology = cls(
                name=name,
                levels=levels,
                node_level=node_level,
                nvlink_level=nvlink_level,
                node_types=node_types,
                hosts=hosts,
                host_types=host_types,
                host_domains=host_domains,
                provenance=notes,
            )
        except InvalidTopology as exc:
            raise c.fail("", _domain_message(str(exc), levels, host_domains, hosts)) from None
        topology.policy = ClusterPolicy.from_dict(doc, c)
        topology.policy.check(topology, c)
        return topology

    def to_dict(self) -> dict[str, Any]:
        """The native dictionary form; consecutive hosts with the same type and domains are
        written as one hostlist entry."""
        out: dict[str, Any] = {"format": FORMAT, "name": self.name}
        out["levels"] = [
            {"name": lv.name, "bandwidth_gbps": lv.bandwidth_gbps, "latency_us": lv.latency_us}
            for lv in self.levels
        ]
        out["node_level"] = self.levels[self.node_level].name
        out["nvlink_domain"] = self.levels[self.nvlink_level].name
        out["node_types"] = {t: nt.to_dict() for t, nt in self.node_types.items()}
        above = self.level_names[self.node_level + 1 :]
        nodes: list[dict[str, Any]] = []
        run: list[str] = []
        key: tuple[str, tuple[str, ...]] | None = None

        def flush() -> None:
            if run and key is not None:
                expr = compress(run)
                if expand(expr) != run:  # keep file order exact
                    for host in run:
                        nodes.append(
                            {
                                "name": host,
                                "type": key[0],
                                "domains": dict(zip(above, key[1], strict=True)),
                            }
                        )
                else:
                    nodes.append(
                        {
                            "name": expr,
                            "type": key[0],
                            "domains": dict(zip(above, key[1], strict=True)),
                        }
                    )

        for host, t, doms in zip(self.hosts, self.host_types, self.host_domains, strict=True):
            if (t, doms) != key:
                flush()
                run, key = [], (t, doms)
            run.append(host)
        flush()
        out["nodes"] = nodes
        if self.provenance:
            out["provenance"] = json.loads(json.dumps(self.provenance))
        out.update(self.policy.to_dict())
        return out

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the canonical native form without ``provenance``: state files name the
        topology they belong to."""
        doc = self.to_dict()
        # Neither import notes nor policy (attributes, pools, classes) change the hardware.
        for key in ("provenance", *ClusterPolicy.SECTIONS):
            doc.pop(key, None)
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @classmethod
    def load(cls, path: str | Path) -> Topology:
        """Read a topology file (YAML, or JSON when the suffix is ``.json``)."""
        topology = cls.from_dict(read_document(path, InvalidTopology), source=str(path))
        # Where it came from, so a state file can name its cluster (ClusterState.snapshot).
        topology.origin = {"file": str(path)}
        return topology

    def save(self, path: str | Path) -> None:
        """Write the native form (YAML, or JSON for ``.json``), atomically."""
        write_atomically(path, dump_document(path, self.to_dict()))

    @classmethod
    def from_parts(
        cls,
        node_type: Any = None,
        fabric: Any = None,
        *,
        name: str = "cluster",
        gpus_per_node: int | None = None,
        bandwidths: Mapping[str, float] | None = None,
        latencies: Mapping[str, float] | None = None,
        sources: Sequence[str] = (),
    ) -> Topology:
        """Build from what the readers in :mod:`gpuplace.io` return: a host description
        (``gpuplace.io.NodeType`` from nvidia-smi/rocm-smi) and/or a network
        (``gpuplace.io.Fabric`` from Slurm, ibnetdiscover, Kubernetes or EC2).

        Every host of the fabric gets ``node_type``; without one, the GPU count the fabric
        gives, else ``gpus_per_node``, else 8 (with a warning). Without a fabric the result is
        one host. ``bandwidths`` (GB/s per GPU and direction) and ``latencies`` (µs) override
        levels by name; ``sources`` (file names) are kept in :attr:`provenance` with the
        readers' warnings and the fabric's degraded links. Raises
        :class:`gpuplace.InvalidTopology` when the parts do not fit together.
        """
        from gpuplace.io.model import to_topology_dict

        doc = to_topology_dict(
            node_type,
            fabric,
            name=name,
            bandwidths=dict(bandwidths) if bandwidths else None,
            latencies=dict(latencies) if latencies else None,
            gpus_per_node=gpus_per_node,
        )
        if sources:
            doc.setdefault("provenance", {})
            doc["provenance"] = {"sources": [str(s) for s in sources], **doc["provenance"]}
        return cls.from_dict(doc, source=name)

    # ----------------------------------------------------------------- presets
    @staticmethod
    def presets() -> dict[str, str]:
        """Preset names with a one-line description each."""
        from gpuplace.presets import PRESETS

        return {name: p.description for name, p in PRESETS.items()}

    @classmethod
    def preset(cls, name: str, **params: Any) -> Topology:
        """Build a preset cluster, e.g. ``Topology.preset("h100-superpod", nodes=256)``."""
        from gpuplace.presets import build_preset

        topology = cls.from_dict(build_preset(name, **params), source=f"preset {name}")
        given = {k: v for k, v in params.items() if v is not None}
        topology.origin = {"preset": name, "params": given}
        return topology

    # ----------------------------------------------------------------- networkx
    def to_networkx(self) -> Any:
        """A directed tree (networkx.DiGraph): one vertex per domain and per GPU, edges from
        parent to child. Vertices carry ``kind`` ("domain"/"gpu"), ``level`` and ``name``; the
        graph carries the levels and node types, so :meth:`from_networkx` restores the
        topology."""
        import networkx as nx

        g = nx.DiGraph(
            name=self.name,
            levels=[(lv.name, lv.bandwidth_gbps, lv.latency_us) for lv in self.levels],
            node_level=self.node_level,
            nvlink_level=self.nvlink_level,
            node_types={t: nt.to_dict() for t, nt in self.node_types.items()},
        )
        nl = len(self.levels)
        for level in range(nl):
            parents = self._core.parents(level) if level + 1 < nl else None
            for d, dname in enumerate(self.domain_names[level]):
                v = ("domain", level, d)
                attrs: dict[str, Any] = {
                    "kind": "domain",
                    "level": self.levels[level].name,
                    "name": dname,
                }
                if level == self.node_level:
                    attrs["node_type"] = self.host_types[d]
                g.add_node(v, **attrs)
                if parents is not None:
                    g.add_edge(("domain", level + 1, int(parents[d])), v)
        path = self.path
        for gpu in range(self.num_gpus):
            g.add_node(
                ("gpu", gpu),
                kind="gpu",
                level="gpu",
                name=f"{self.host_of(gpu)}:{self.local_index(gpu)}",
            )
            g.add_edge(("domain", 0, int(path[gpu, 0])), ("gpu", gpu))
        return g

    @classmethod
    def from_networkx(cls, graph: Any) -> Topology:
        """Inverse of :meth:`to_networkx`."""
        try:
            levels = [Level(n, float(b), float(lat)) for n, b, lat in graph.graph["levels"]]
            node_level = int(graph.graph["node_level"])
            names = [lv.name for lv in levels]
            doc: dict[str, Any] = {
                "format": FORMAT,
                "name": graph.graph.get("name", "topology"),
                "levels": [
                    {
                        "name": lv.name,
                        "bandwidth_gbps": lv.bandwidth_gbps,
                        "latency_us": lv.latency_us,
                    }
                    for lv in levels
                ],
                "node_level": names[node_level],
                "nvlink_domain": names[int(graph.graph["nvlink_level"])],
                "node_types": graph.graph["node_types"],
            }
            hosts = sorted(
                (
                    v
                    for v, a in graph.nodes(data=True)
                    if a.get("kind") == "domain" and a.get("level") == names[node_level]
                ),
                key=lambda v: v[2],
            )
            nodes = []
            for v in hosts:
                domains = {}
                cur = v
                for lname in names[node_level + 1 :]:
                    (cur,) = list(graph.predecessors(cur))
                    domains[lname] = graph.nodes[cur]["name"]
                nodes.append(
                    {
                        "name": graph.nodes[v]["name"],
                        "type": graph.nodes[v]["node_type"],
                        "domains": domains,
                    }
                )
            doc["nodes"] = nodes
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise InvalidTopology(
                f"networkx graph: not a gpuplace topology graph (missing or bad {exc})"
            ) from None
        return cls.from_dict(doc, source="networkx graph")


def _domain_name(c: Checker, value: Any, path: str) -> str:
    """A domain name: a string, or an integer (YAML reads `leaf: 3` as one)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return c.string(value, path)


def _node_type(c: Checker, p: str, tname: str, raw: Any, below: list[str]) -> NodeType:
    nt = c.mapping(raw, p)
    c.keys(
        nt,
        p,
        {
            "gpus",
            "gpu_model",
            "power_w",
            "sublevels",
            "bandwidth_gbps",
            "link_classes",
            "nics",
            "gpu_nic",
        },
    )
    gpus = c.integer(nt.get("gpus"), f"{p}.gpus", minimum=1)
    if gpus > 64:
        raise c.fail(f"{p}.gpus", f"at most 64 GPUs per host are supported, got {gpus}")
    sub_raw = c.mapping(nt.get("sublevels", {}), f"{p}.sublevels")
    sublevels: dict[str, tuple[int, ...]] = {}
    for lname in below:
        if lname not in sub_raw:
            raise c.fail(f"{p}.sublevels", f"missing the level {lname!r} below the node level")
    for lname, values in sub_raw.items():
        if lname not in below:
            raise c.fail(
                f"{p}.sublevels.{lname}",
                f"not a level below the node level (expected {', '.join(below) or 'none'})",
            )
        seq = c.sequence(values, f"{p}.sublevels.{lname}")
        if len(seq) != gpus:
            raise c.fail(f"{p}.sublevels.{lname}", f"expected {gpus} entries, got {len(seq)}")
        sublevels[lname] = tuple(
            c.integer(v, f"{p}.sublevels.{lname}[{i}]", minimum=0) for i, v in enumerate(seq)
        )
    # A GPU's lower-level domains must nest in its higher ones inside the host.
    for lo, hi in itertools.pairwise(below):
        parent: dict[int, int] = {}
        for a, b in zip(sublevels[lo], sublevels[hi], strict=True):
            if parent.setdefault(a, b) != b:
                raise c.fail(
                    f"{p}.sublevels.{lo}",
                    f"domain {a} lies in two {hi} domains; sublevels must nest",
                )
    matrix = None
    if "bandwidth_gbps" in nt:
        rows = c.sequence(nt["bandwidth_gbps"], f"{p}.bandwidth_gbps")
        if len(rows) != gpus:
            raise c.fail(f"{p}.bandwidth_gbps", f"expected {gpus} rows, got {len(rows)}")
        parsed = []
        for i, row in enumerate(rows):
            cells = c.sequence(row, f"{p}.bandwidth_gbps[{i}]")
            if len(cells) != gpus:
                raise c.fail(
                    f"{p}.bandwidth_gbps[{i}]", f"expected {gpus} entries, got {len(cells)}"
                )
            parsed.append(
                tuple(
                    c.number(v, f"{p}.bandwidth_gbps[{i}][{j}]", minimum=0.0)
                    for j, v in enumerate(cells)
                )
            )
        for i in range(gpus):
            for j in range(gpus):
                if i != j and parsed[i][j] <= 0:
                    raise c.fail(
                        f"{p}.bandwidth_gbps[{i}][{j}]", "off-diagonal entries must be > 0"
                    )
                if abs(parsed[i][j] - parsed[j][i]) > 1e-9 * max(1.0, abs(parsed[i][j])):
                    raise c.fail(f"{p}.bandwidth_gbps[{i}][{j}]", "the matrix must be symmetric")
        matrix = tuple(parsed)
    classes = None
    if "link_classes" in nt:
        rows = c.sequence(nt["link_classes"], f"{p}.link_classes")
        if len(rows) != gpus or any(
            len(c.sequence(r, f"{p}.link_classes[{i}]")) != gpus for i, r in enumerate(rows)
        ):
            raise c.fail(f"{p}.link_classes", f"expected a {gpus}x{gpus} matrix")
        classes = tuple(tuple(str(x) for x in r) for r in rows)
    nics = tuple(
        c.string(v, f"{p}.nics[{i}]")
        for i, v in enumerate(c.sequence(nt.get("nics", []), f"{p}.nics"))
    )
    gpu_nic = None
    if "gpu_nic" in nt:
        seq = c.sequence(nt["gpu_nic"], f"{p}.gpu_nic")
        if len(seq) != gpus:
            raise c.fail(f"{p}.gpu_nic", f"expected {gpus} entries, got {len(seq)}")
        gpu_nic = tuple(c.integer(v, f"{p}.gpu_nic[{i}]", minimum=0) for i, v in enumerate(seq))
        if nics and max(gpu_nic) >= len(nics):
            raise c.fail(f"{p}.gpu_nic", f"entries must index nics (0..{len(nics) - 1})")
    power = None
    if nt.get("power_w") is not None:
        power = c.number(nt["power_w"], f"{p}.power_w", positive=True)
    model = nt.get("gpu_model")
    if model is not None:
        model = c.string(model, f"{p}.gpu_model")
    return NodeType(
        name=tname,
        gpus=gpus,
        gpu_model=model,
        power_w=power,
        sublevels=sublevels,
        bandwidth_gbps=matrix,
        link_classes=classes,
        nics=nics,
        gpu_nic=gpu_nic,
    )


def _provenance(c: Checker, raw: Any) -> dict[str, Any]:
    """Validate the informational ``provenance`` entry (kept, never interpreted)."""
    doc = c.mapping(raw, "provenance")
    c.keys(doc, "provenance", {"sources", "warnings", "degraded_links", "parallel_links"})
    out: dict[str, Any] = {}
    for key in ("sources", "warnings"):
        if key in doc:
            seq = c.sequence(doc[key], f"provenance.{key}")
            out[key] = [c.string(v, f"provenance.{key}[{i}]") for i, v in enumerate(seq)]
    if "degraded_links" in doc:
        links = []
        raw_links = c.sequence(doc["degraded_links"], "provenance.degraded_links")
        for i, raw_link in enumerate(raw_links):
            p = f"provenance.degraded_links[{i}]"
            link = c.mapping(raw_link, p)
            c.keys(link, p, {"a", "b", "rate"})
            links.append({k: c.string(link.get(k), f"{p}.{k}") for k in ("a", "b", "rate")})
        out["degraded_links"] = links
    if "parallel_links" in doc:
        out["parallel_links"] = c.integer(
            doc["parallel_links"], "provenance.parallel_links", minimum=0
        )
    return out


def _domain_message(
    message: str,
    levels: Sequence[Level],
    host_domains: Sequence[tuple[str, ...]],
    hosts: Sequence[str],
) -> str:
    """Re-word a core nesting error with domain names instead of ids."""
    if "do not nest" not in message and "exactly one" not in message:
        return message
    nodes_above = [lv.name for lv in levels]
    # Find the first domain with two parents, by name.
    for offset in range(len(host_domains[0]) - 1 if host_domains else 0):
        parent: dict[str, tuple[str, str]] = {}
        for h, doms in enumerate(host_domains):
            child, up = doms[offset], doms[offset + 1]
            if child in parent and parent[child][0] != up:
                return (
                    f"domains do not nest: {nodes_above[-len(doms) + offset]} {child!r} lies in "
                    f"{parent[child][0]!r} (host {parent[child][1]}) and in {up!r} (host {hosts[h]})"
                )
            parent.setdefault(child, (up, hosts[h]))
    return message
