"""Cluster topologies: named levels with bandwidths, hosts of typed nodes, and the domain tree.

A :class:`Topology` is built from the native dictionary form (``docs/topology-format.md``),
from a file (:meth:`Topology.load`), from a preset (:meth:`Topology.preset`) or from a networkx
graph. It compiles to flat arrays owned by the Rust core (``self._core``), which prices
traffic and indexes domains; this class keeps the names.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from gpuplace import _core
from gpuplace._util.documents import dump_document, read_document, write_atomically
from gpuplace._util.hostlist import compress, expand
from gpuplace.errors import InvalidState, InvalidTopology
from gpuplace.model import graph as tree_graph
from gpuplace.model import options as cluster_options
from gpuplace.model import presets, schema
from gpuplace.model.inventory import to_topology_dict
from gpuplace.model.parts import FORMAT, Level, NodeType
from gpuplace.model.policy import ClusterPolicy
from gpuplace.model.power import power_model

__all__ = ["FORMAT", "Level", "Nics", "NodeType", "Topology", "nics_of"]


def _peak_tflops(node_type: NodeType) -> float | None:
    """Dense peak TFLOPS of one GPU of a host type: its ``peak_tflops``, else its
    ``gpu_model`` in the core's table (``rust/core/src/gpu.rs``); None when unknown."""
    if node_type.peak_tflops is not None:
        return float(node_type.peak_tflops)
    if node_type.gpu_model:
        return _core.gpu_peak_tflops(node_type.gpu_model)
    return None


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
        host_count_factors: Sequence[float] = (),
        algorithm_efficiency: Mapping[str, float] | None = None,
        uplink_gbps: Mapping[str, float] | None = None,
        power_domains: Sequence[Any] = (),
        power_phases: int = 1,
        stores: Mapping[str, Any] | None = None,
    ):
        """Build from parts; ``host_domains[h]`` names host h's domain at each level above the
        node level. Prefer :meth:`from_dict`, which validates field by field."""
        self.name = name
        #: Informational notes of an import (``sources``, ``warnings``, ``degraded_links``,
        #: ``parallel_links``); not part of the cost model nor of the fingerprint.
        self.provenance: dict[str, Any] = dict(provenance or {})
        #: Correction of a collective's time by the number of hosts it spans (entry k-1 for k
        #: hosts, the last beyond the end), fitted by :func:`gpuplace.calibrate`; () for none.
        self.host_count_factors: tuple[float, ...] = tuple(float(f) for f in host_count_factors)
        #: Bandwidth efficiency of NCCL's algorithms (``ALGORITHMS``; 1 when not given), fitted
        #: by :func:`gpuplace.calibrate`.
        self.algorithm_efficiency: dict[str, float] = {
            a: float(v) for a, v in (algorithm_efficiency or {}).items() if v != 1.0
        }
        self.levels: tuple[Level, ...] = tuple(levels)
        self.node_level = node_level
        self.nvlink_level: int = nvlink_level
        self.node_types: dict[str, NodeType] = dict(node_types)
        self.hosts: tuple[str, ...] = tuple(hosts)
        self.host_types: tuple[str, ...] = tuple(host_types)
        self.host_domains: tuple[tuple[str, ...], ...] = tuple(tuple(d) for d in host_domains)
        self._host_index = {h: i for i, h in enumerate(self.hosts)}
        #: How to rebuild this topology (a preset and its parameters, or a file), if known.
        self.origin: dict[str, Any] | None = None
        #: Explicit uplink capacities (GB/s each direction) of single switches or hosts, by
        #: name (``"su003"`` or ``"leaf:su003"``); they override the level's ratio.
        self.uplink_gbps: dict[str, float] = dict(uplink_gbps or {})
        #: Racks, PDUs and rows with a budget for their GPUs' draw (``gpuplace.cluster.power``), and
        #: the number of phase slots synchronised jobs may be staggered over.
        self.power_domains: tuple[Any, ...] = tuple(power_domains)
        self.power_phases = int(power_phases)
        #: Dataset and checkpoint stores by name (``gpuplace.model.storage``).
        self.stores: dict[str, Any] = dict(stores or {})
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
        #: Host type of every GPU (an index into ``_type_names``): the slowest type of a
        #: placement without a walk over its hosts.
        self._type_of_gpu = host_type_ids[host_of_gpu]
        self._type_names = tuple(type_names)
        self._gpu_local = local
        core = _core.Topology(
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
        nvls = [self.node_types[t].nvls_gbps or 0.0 for t in type_names]
        nics = [len(self.node_types[t].nics) for t in type_names]
        sharp = [lv.sharp for lv in self.levels]
        eff = self.algorithm_efficiency
        # The GPU peak of each host type (0: unknown), for step time and MFU in the core.
        peaks = [_peak_tflops(self.node_types[t]) or 0.0 for t in type_names]
        if any(nvls) or any(nics) or self.host_count_factors or any(sharp) or eff or any(peaks):
            core = _core.topology_with_fabric(
                core,
                nvls,
                nics,
                list(self.host_count_factors),
                sharp if any(sharp) else [],
                (
                    eff.get("ring", 1.0),
                    eff.get("tree", 1.0),
                    eff.get("nvls", 1.0),
                    eff.get("collnet", 1.0),
                ),
                peaks if any(peaks) else [],
            )
        p2p = [self.node_types[t].p2p for t in type_names]
        gdr = [self.node_types[t].gpudirect_rdma for t in type_names]
        if not all(p2p) or not all(gdr):
            core = _core.with_transports(core, p2p, gdr)
        if not all(lv.rail_aligned for lv in self.levels):
            core = _core.with_rail_alignment(core, [lv.rail_aligned for lv in self.levels])
        core = _with_uplink_capacity(self, core)
        routing = [lv.routing for lv in self.levels]
        qps = [lv.qps_per_connection for lv in self.levels]
        if any(r != "adaptive" for r in routing) or any(q != 1 for q in qps):
            try:
                core = _core.with_routing(core, routing, qps)
            except InvalidTopology as exc:
                raise InvalidTopology(f"{self.name}: {exc}") from None
        return core

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
        raise InvalidTopology(
            f"{self.name}: no level named {name!r} (levels: {', '.join(self.level_names)}; "
            "nvlink_domain and node name the NVLink-domain and host levels)"
        )

    def _gpu_id(self, gpu: int) -> int:
        """``gpu`` as an int, checked to exist (a negative id would index from the end)."""
        g = int(gpu)
        if not 0 <= g < self.num_gpus:
            raise InvalidTopology(
                f"{self.name}: GPU {gpu} does not exist (GPU ids are 0..{self.num_gpus - 1})"
            )
        return g

    def host_of(self, gpu: int) -> str:
        """Host name of a GPU."""
        return self.hosts[int(self._host_of_gpu[self._gpu_id(gpu)])]

    def local_index(self, gpu: int) -> int:
        """Index of a GPU inside its host (its CUDA device ordinal)."""
        return int(self._gpu_local[self._gpu_id(gpu)])

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

    def parents(self, level: int | str) -> np.ndarray:
        """For each domain of ``level``, the index of its parent domain one level up."""
        lvl = level if isinstance(level, int) else self.level_index(level)
        return self._core.parents(lvl)

    def domain_sizes(self, level: int | str) -> np.ndarray:
        """GPUs in each domain of a level."""
        lvl = level if isinstance(level, int) else self.level_index(level)
        return self._core.domain_sizes(lvl)

    def domain_of(self, gpu: int, level: int | str) -> str:
        lvl = level if isinstance(level, int) else self.level_index(level)
        return self.domain_names[lvl][int(self.path[self._gpu_id(gpu), lvl])]

    def bandwidth_matrix(self, gpus: Any = None) -> np.ndarray:
        """Bandwidth (GB/s) between every pair of ``gpus`` (default: all) as the cost model
        prices it on healthy hardware; 0 on the diagonal. ``1 / (B * 1e9)`` is the seconds per
        byte to use as a :func:`gpuplace.map_ranks` distance."""
        ids = np.arange(self.num_gpus) if gpus is None else np.asarray(gpus, dtype=np.int64)
        return self._core.bandwidth_matrix(ids.astype(np.int64))

    @cached_property
    def power_model(self) -> _core.PowerModel:
        """The power domains compiled for the core's budget arithmetic
        (:func:`gpuplace.model.power.power_model`)."""
        return power_model(self)

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

    # ----------------------------------------------------------------- names
    @cached_property
    def nics(self) -> Nics:
        """The NICs: dense ids, names (``host:nic``) and each GPU's NIC."""
        return Nics(self)

    def resolve_host(self, name: Any) -> int:
        """A host index from its name."""
        index = self._host_index.get(str(name))
        if index is None:
            raise InvalidState(f"unknown host {name!r} in cluster {self.name!r}")
        return index

    def resolve_nic(self, name: Any) -> int:
        """A NIC id from ``"host:nic"``."""
        index = self.nics.index.get(str(name))
        if index is None:
            example = self.nics.names[0] if self.nics.names else "host:mlx5_0"
            raise InvalidState(f"unknown NIC {name!r} (NICs are named host:nic, e.g. {example})")
        return index

    def resolve_gpu(self, gpu: Any) -> int:
        """A GPU id from an int or ``"host:index"``."""
        if isinstance(gpu, int | np.integer) and not isinstance(gpu, bool):
            if not 0 <= int(gpu) < self.num_gpus:
                raise InvalidState(f"GPU {gpu} does not exist (the cluster has {self.num_gpus})")
            return int(gpu)
        text = str(gpu)
        if text.isdigit():
            return self.resolve_gpu(int(text))
        host, _, local = text.rpartition(":")
        gpus = self.host_gpus(host) if host in self._host_index else None
        if gpus is None or not local.isdigit() or int(local) >= len(gpus):
            raise InvalidState(
                f"unknown GPU {gpu!r} (give an id or host:index, e.g. {self.hosts[0]}:0)"
            )
        return int(gpus[int(local)])

    @property
    def nic_transport(self) -> str:
        """The transport of the links a NIC drives: that of the first level above the NVLink
        domain (what packet loss on a NIC, host or GPU costs; ``docs/architecture.md``,
        "Lossy links")."""
        return self.levels[min(self.nvlink_level + 1, len(self.levels) - 1)].transport

    def resolve_switch(self, name: Any) -> tuple[int, int]:
        """(level, domain) of a switch named ``"su003"`` or ``"leaf:su003"``."""
        text = str(name)
        topo = self
        levels = range(topo.node_level + 1, len(topo.levels))
        wanted_level, _, short = text.partition(":") if ":" in text else ("", "", text)
        hits = [
            (lvl, topo.domain_names[lvl].index(short))
            for lvl in levels
            if (not wanted_level or topo.levels[lvl].name == wanted_level)
            and short in topo.domain_names[lvl]
        ]
        if not hits:
            above = ", ".join(topo.levels[lvl].name for lvl in levels) or "none"
            raise InvalidState(
                f"unknown switch {name!r} "
                f"(switches are domains of the levels above the host: {above})"
            )
        if len(hits) > 1:
            raise InvalidState(f"switch {name!r} names domains at several levels; write level:name")
        return hits[0]

    def component_name(self, kind: _core.ComponentKind, a: int, b: int) -> str:
        if kind == _core.ComponentKind.Gpu:
            return f"{self.host_of(a)}:{self.local_index(a)}"
        if kind == _core.ComponentKind.Host:
            return self.hosts[a]
        if kind == _core.ComponentKind.Nic:
            return self.nics.names[a]
        return f"{self.levels[a].name}:{self.domain_names[a][b]}"

    # ----------------------------------------------------------------- native format
    @classmethod
    def from_dict(cls, document: Any, *, source: str | None = None) -> Topology:
        """Build from the native dictionary form, validating every field
        (:mod:`gpuplace.model.schema`).

        Raises :class:`gpuplace.InvalidTopology` naming ``source`` (a file name) and the field.
        """
        return schema.parse(cls, document, source)

    def to_dict(self) -> dict[str, Any]:
        """The native dictionary form; consecutive hosts with the same type and domains are
        written as one hostlist entry."""
        out: dict[str, Any] = {"format": FORMAT, "name": self.name}
        out["levels"] = [
            {"name": lv.name, "bandwidth_gbps": lv.bandwidth_gbps, "latency_us": lv.latency_us}
            | ({"sharp": True} if lv.sharp and lv.routing != "sharp" else {})
            | ({"oversubscription": lv.oversubscription} if lv.oversubscription != 1 else {})
            | ({"routing": lv.routing} if lv.routing != "adaptive" else {})
            | ({"qps_per_connection": lv.qps_per_connection} if lv.qps_per_connection != 1 else {})
            | ({"transport": lv.transport} if lv.transport != "roce" else {})
            | ({"rail_aligned": False} if not lv.rail_aligned else {})
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
        if self.host_count_factors:
            out["host_count_factors"] = list(self.host_count_factors)
        if self.algorithm_efficiency:
            out["algorithm_efficiency"] = dict(self.algorithm_efficiency)
        if self.uplink_gbps:
            out["uplink_gbps"] = dict(self.uplink_gbps)
        if self.power_domains:
            out["power_domains"] = [d.to_dict(self.hosts) for d in self.power_domains]
        if self.power_phases != 1:
            out["power_phases"] = self.power_phases
        if self.stores:
            out["stores"] = {name: s.to_dict() for name, s in self.stores.items()}
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
        return {name: p.description for name, p in presets.PRESETS.items()}

    @classmethod
    def preset(cls, name: str, **params: Any) -> Topology:
        """Build a preset cluster, e.g. ``Topology.preset("h100-superpod", nodes=256)``."""
        topology = cls.from_dict(presets.build_preset(name, **params), source=f"preset {name}")
        given = {k: v for k, v in params.items() if v is not None}
        topology.origin = {"preset": name, "params": given}
        return topology

    @classmethod
    def from_spec(cls, cluster: str, options: Mapping[str, Any] | None = None) -> Topology:
        """A preset (by name) or a topology file (by path), with ``options``: the preset's
        parameters and the topology options of :mod:`gpuplace.model.options` (what the
        command line's ``-p KEY=VALUE`` gives), e.g. ``Topology.from_spec("h100-superpod",
        {"nodes": 64, "power.leaf.budget_w": 4e5})``. Its :attr:`origin` records all of
        them, so a state file rebuilds the same cluster (:meth:`from_origin`)."""
        given = {k: v for k, v in (options or {}).items() if v is not None}
        settings = {k: v for k, v in given.items() if cluster_options.is_option(k)}
        params = {k: v for k, v in given.items() if k not in settings}
        origin: dict[str, Any]
        if cluster in presets.PRESETS:
            takes = presets.PRESETS[cluster].params
            unknown = sorted(set(params) - set(takes))
            if unknown:
                raise InvalidTopology(
                    f"preset {cluster!r} does not take {unknown[0]!r} (its parameters: "
                    f"{', '.join(takes) or 'none'}; topology options: "
                    f"{', '.join(cluster_options.OPTION_KEYS)})"
                )
            document = presets.build_preset(cluster, **params)
            origin = {"preset": cluster, "params": params}
            source = f"preset {cluster}"
        else:
            path = Path(cluster)
            if not path.exists():
                raise InvalidTopology(
                    f"unknown cluster {cluster!r}: neither a preset "
                    f"({', '.join(presets.PRESETS)}) nor an existing file"
                )
            if params:
                raise InvalidTopology(
                    f"{cluster}: {sorted(params)[0]!r} is a preset parameter, not an option of "
                    f"a topology file (options: {', '.join(cluster_options.OPTION_KEYS)})"
                )
            document = read_document(path, InvalidTopology)
            origin = {"file": str(path)}
            source = str(path)
        if settings:
            if not isinstance(document, dict):
                raise InvalidTopology(f"{source}: expected a mapping at the top level")
            document = cluster_options.apply_options(document, settings)
            origin["options"] = settings
            source += " with " + " ".join(f"{k}={v}" for k, v in settings.items())
        topology = cls.from_dict(document, source=source)
        topology.origin = origin
        return topology

    @classmethod
    def from_origin(cls, origin: Mapping[str, Any]) -> Topology:
        """The topology an :attr:`origin` describes (as a state file records it): a preset
        with its parameters, or a file, each with its options. InvalidTopology when it
        names neither or its fields are malformed."""
        options = origin.get("options") or {}
        params = origin.get("params") or {}
        if not isinstance(options, Mapping) or not isinstance(params, Mapping):
            raise InvalidTopology("cluster.params and cluster.options: expected mappings")
        if isinstance(origin.get("preset"), str):
            if origin["preset"] not in presets.PRESETS:
                raise InvalidTopology(f"unknown cluster preset {origin['preset']!r}")
            return cls.from_spec(origin["preset"], {**params, **options})
        if isinstance(origin.get("file"), str):
            return cls.from_spec(origin["file"], options)
        raise InvalidTopology("cluster: expected a preset or a file")

    # ----------------------------------------------------------------- networkx
    def to_networkx(self) -> Any:
        """A directed tree (networkx.DiGraph) of the domains and GPUs; see
        :func:`gpuplace.model.graph.to_networkx`."""
        return tree_graph.to_networkx(self)

    @classmethod
    def from_networkx(cls, graph: Any) -> Topology:
        """Inverse of :meth:`to_networkx`."""
        return tree_graph.from_networkx(cls, graph)


class Nics:
    """The NICs of a topology: dense ids, names (``host:nic``) and each GPU's NIC."""

    def __init__(self, topology: Topology):
        names: list[str] = []
        gpu_nic = np.full(topology.num_gpus, -1, dtype=np.int64)
        first_gpu = 0
        for host, tname in zip(topology.hosts, topology.host_types, strict=True):
            nt = topology.node_types[tname]
            base = len(names)
            names.extend(f"{host}:{nic}" for nic in nt.nics)
            if nt.nics and nt.gpu_nic is not None:
                gpu_nic[first_gpu : first_gpu + nt.gpus] = base + np.asarray(nt.gpu_nic)
            first_gpu += nt.gpus
        self.names = names
        self.index = {n: i for i, n in enumerate(names)}
        self.gpu_nic = gpu_nic


def nics_of(topology: Topology) -> Nics:
    """The NIC table of a topology (cached on it)."""
    return topology.nics


def _with_uplink_capacity(topology: Topology, core: _core.Topology) -> _core.Topology:
    """The compiled topology with the levels' oversubscription and the explicit per-switch
    capacities applied; unchanged when there are none."""
    ratios = [lv.oversubscription for lv in topology.levels]
    if all(r == 1 for r in ratios) and not topology.uplink_gbps:
        return core
    levels, domains, capacity = _core.uplinks(core)
    top = len(topology.levels) - 1
    for index, ratio in enumerate(ratios):
        if ratio == 1:
            continue
        if index < topology.nvlink_level or index == top:
            where = "the top level" if index == top else "a level inside the NVLink domain"
            raise InvalidTopology(
                f"levels[{index}].oversubscription: {topology.levels[index].name!r} is {where}; "
                "only levels from the NVLink domain up to below the top have uplinks"
            )
        capacity[levels == index] /= ratio
    first = {(int(lv), int(d)): u for u, (lv, d) in enumerate(zip(levels, domains, strict=True))}
    for name, gbps in topology.uplink_gbps.items():
        wanted, _, short = name.rpartition(":")
        hits = [
            (lv, topology.domain_names[lv].index(short))
            for lv in range(topology.nvlink_level, top)
            if (not wanted or topology.levels[lv].name == wanted)
            and short in topology.domain_names[lv]
        ]
        if len(hits) != 1:
            above = ", ".join(lv.name for lv in topology.levels[topology.nvlink_level : top])
            problem = (
                "names domains at several levels; write level:name"
                if hits
                else (f"is not a switch or host with an uplink (levels {above or 'none'})")
            )
            raise InvalidTopology(f"uplink_gbps.{name}: {problem}")
        capacity[first[hits[0]]] = float(gbps)
    return _core.with_uplink_gbps(core, capacity)
