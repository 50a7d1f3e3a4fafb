"""What the readers produce before it becomes a native topology dictionary.

A :class:`NodeType` describes the inside of one host (from ``nvidia-smi topo -m`` or
``rocm-smi --showtopo``); a :class:`Fabric` describes the hosts and the switches between them
(from ibnetdiscover, Slurm, Kubernetes labels or EC2). :func:`to_topology_dict` combines one
of each into the ``gpuplace.topology/1`` dictionary that ``Topology.from_dict`` loads.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from gpuplace._util.hostlist import HostlistError, expand
from gpuplace.errors import InvalidTopology

__all__ = [
    "DEFAULT_GPUS_PER_NODE",
    "DEFAULT_LATENCY_US",
    "NVLINK_GBPS_PER_LINK",
    "PCIE_GBPS",
    "Fabric",
    "Host",
    "Link",
    "NodeType",
    "Switch",
    "ib_rate_gbit",
    "to_topology_dict",
]

#: NVLink bandwidth per link and direction (GB/s) by GPU generation, as NCCL models it in
#: src/graph/topo.h (SM60/SM70/SM80/SM86/SM90/SM100_NVLINK_BW).
NVLINK_GBPS_PER_LINK = {
    "pascal": 18.0,
    "volta": 20.0,
    "ampere": 20.0,
    "ampere-sm86": 12.0,
    "hopper": 20.6,
    "blackwell": 40.1,
}

#: PCIe x16 bandwidth per direction (GB/s) by the PCIe generation a GPU generation uses.
PCIE_GBPS = {
    "pascal": 16.0,
    "volta": 16.0,
    "ampere": 32.0,
    "ampere-sm86": 32.0,
    "hopper": 64.0,
    "blackwell": 64.0,
}

#: Default per-message latency (µs) by level name; unknown level names get the next rung.
DEFAULT_LATENCY_US = {
    "numa": 0.5,
    "socket": 0.5,
    "node": 1.0,
    "tray": 1.0,
    "rack": 2.0,
    "nvl": 2.0,
    "clique": 2.0,
    "block": 3.0,
    "leaf": 3.0,
    "su": 3.0,
    "spine": 4.0,
    "core": 5.0,
    "root": 6.0,
}

#: GPUs per host assumed when neither a node type nor the fabric says (an HGX/DGX board).
DEFAULT_GPUS_PER_NODE = 8

#: InfiniBand data rate per lane (Gbit/s) after line encoding, by speed name.
_IB_LANE_GBIT = {
    "SDR": 2.0,
    "DDR": 4.0,
    "QDR": 8.0,
    "FDR10": 10.0,
    "FDR": 13.64,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}
_IB_RATE = re.compile(r"^(\d{1,2})x([A-Z0-9]+)$")


def ib_rate_gbit(rate: str) -> float | None:
    """``4xNDR`` -> 400.0 Gbit/s; None when the rate is not a known width x speed."""
    m = _IB_RATE.match(rate.strip())
    if not m or m.group(2) not in _IB_LANE_GBIT:
        return None
    return int(m.group(1)) * _IB_LANE_GBIT[m.group(2)]


@dataclass
class NodeType:
    """The inside of one host: its GPUs, how they are linked, NUMA and NIC affinity."""

    name: str
    gpus: int
    gpu_model: str | None = None
    gpu_generation: str | None = None
    gpu_names: list[str] = field(default_factory=list)
    #: gpus x gpus tool link classes (X, NV#, PIX, PXB, PHB, NODE, SYS; XGMI/PCIE for ROCm).
    link_classes: list[list[str]] = field(default_factory=list)
    #: gpus x gpus per-direction bandwidth (GB/s); diagonal 0.
    bandwidth_gbps: list[list[float]] = field(default_factory=list)
    #: NUMA node of each GPU (None where the tool did not say).
    numa: list[int | None] = field(default_factory=list)
    nics: list[str] = field(default_factory=list)
    #: per GPU the index into ``nics`` of its closest NIC (its rail), None if no NIC.
    gpu_nic: list[int | None] = field(default_factory=list)
    #: per GPU the CPU list as the tool printed it (e.g. ``0-47,96-143``).
    cpu_affinity: list[str] = field(default_factory=list)
    #: GPUs per NVLink domain when it is larger than a host (GB200 NVL72: 72).
    nvlink_domain_gpus: int | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class Link:
    """One cable (or one logical port pair) between two fabric nodes."""

    a: str
    a_port: int | None
    b: str
    b_port: int | None
    rate: str | None = None  # e.g. 4xNDR
    gbit: float | None = None
    degraded: bool = False


@dataclass
class Switch:
    key: str  # GUID or configured name
    name: str  # human name (node description or the key)
    level: str | None = None
    parents: set[str] = field(default_factory=set)
    children: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    link_gbit: float | None = None
    #: Slurm ``LinkSpeed=`` as written (arbitrary units, per topology.conf(5)).
    link_speed: str | None = None


@dataclass
class Host:
    name: str
    gpus: int | None = None
    #: level name -> domain name, for every fabric level above the node.
    domains: dict[str, str] = field(default_factory=dict)
    #: (NIC or CA description, switch key) per network port, in rail order.
    rails: list[tuple[str, str]] = field(default_factory=list)
    gpu_model: str | None = None


@dataclass
class Fabric:
    """Hosts and the network above them, with everything the reader could not resolve."""

    #: level names above the node, bottom-up (e.g. ["leaf", "spine"]).
    levels: list[str] = field(default_factory=list)
    hosts: dict[str, Host] = field(default_factory=dict)
    switches: dict[str, Switch] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    degraded_links: list[Link] = field(default_factory=list)
    #: (a, b, number of cables) for node pairs joined by more than one cable.
    parallel_links: list[tuple[str, str, int]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: host port rate (Gbit/s), when the source says.
    host_link_gbit: float | None = None
    #: level -> uplink/downlink capacity ratio going from the level below into it (<= 1).
    oversubscription: dict[str, float] = field(default_factory=dict)
    #: ``level:domain`` -> uplink capacity (GB/s each direction) of a domain whose switches
    #: have less than the level's usual ratio (the topology's ``uplink_gbps``).
    uplink_gbps: dict[str, float] = field(default_factory=dict)
    #: ``level:domain`` -> fraction (< 1) of the non-blocking uplink capacity a domain has,
    #: when the source gives only relative speeds (Slurm ``LinkSpeed``).
    uplink_scale: dict[str, float] = field(default_factory=dict)
    #: level whose domains are NVLink domains (GB200 racks, nvidia.com/gpu.clique), if known.
    nvlink_level: str | None = None
    #: Slurm BlockSizes, when the source is a topology/block file.
    block_sizes: list[int] = field(default_factory=list)


_LEVEL_NAME = re.compile(r"^[a-z0-9_-]+$")


def _level_latency(name: str, rung: int, latencies: dict[str, float] | None) -> float:
    if latencies and name in latencies:
        return float(latencies[name])
    return DEFAULT_LATENCY_US.get(name, 1.0 + 1.5 * rung)


def _offdiag_min(matrix: list[list[float]], members: list[int] | None = None) -> float | None:
    idx = members if members is not None else list(range(len(matrix)))
    vals = [matrix[i][j] for i in idx for j in idx if i != j]
    return min(vals) if vals else None


def _host_gpus(node_type: NodeType | None, host: Host, default: int) -> int:
    if node_type is not None:
        return node_type.gpus
    return host.gpus or default


def _check_host_name(name: str, topo: str) -> None:
    """A host name must stand for itself in a hostlist (the native format reads every node name
    as a Slurm hostlist expression)."""
    try:
        ok = bool(name) and expand(name) == [name]
    except HostlistError:
        ok = False
    if not ok or any(ch.isspace() for ch in name):
        raise InvalidTopology(
            f"{topo}: host name {name!r} is not a plain host name (empty, whitespace, or "
            "hostlist syntax such as ',' or '[...]')"
        )


def link_label(fabric: Fabric, key: str, port: int | None) -> str:
    """``SWITCH-NAME[port]`` for a switch end, ``KEY[port]`` otherwise."""
    sw = fabric.switches.get(key)
    name = f"{sw.name} ({key})" if sw is not None and sw.name != key else key
    return f"{name}[{port}]" if port is not None else name


def provenance(fabric: Fabric | None, node_type: NodeType | None = None) -> dict:
    """The informational ``provenance`` entry of a native topology: reader warnings, and the
    fabric's degraded links (rate below the fabric's usual one) and parallel cables."""
    out: dict = {}
    warnings = list(node_type.warnings) if node_type is not None else []
    if fabric is not None:
        warnings += [w for w in fabric.warnings if w not in warnings]
        if fabric.degraded_links:
            out["degraded_links"] = [
                {
                    "a": link_label(fabric, lk.a, lk.a_port),
                    "b": link_label(fabric, lk.b, lk.b_port),
                    "rate": lk.rate or (f"{lk.gbit:g} Gbit/s" if lk.gbit else "unknown"),
                }
                for lk in fabric.degraded_links
            ]
        if fabric.parallel_links:
            out["parallel_links"] = len(fabric.parallel_links)
    if warnings:
        out["warnings"] = warnings
    return out


def to_topology_dict(
    node_type: NodeType | None,
    fabric: Fabric | None,
    *,
    name: str,
    bandwidths: dict[str, float] | None = None,
    latencies: dict[str, float] | None = None,
    gpus_per_node: int | None = None,
) -> dict:
    """Combine a host description and a fabric into the native topology dictionary.

    Without a node type, each host gets the GPU count its fabric source gives (Kubernetes,
    EC2), else ``gpus_per_node``, else :data:`DEFAULT_GPUS_PER_NODE` with a warning. Host
    names must be plain names (no hostlist syntax).

    Levels, bottom-up: ``numa`` (when every GPU has a NUMA node and there are several),
    ``node``, the fabric's levels, and ``root`` when the fabric's top level has more than one
    domain (the native format needs a single top domain). Bandwidths per GPU and direction:

    - inside the host: the smallest pairwise bandwidth among the GPUs the level groups (the
      full matrix is written too, so partial meshes are exact);
    - first network level: host port rate / GPUs per NIC, NICs counted from the fabric's rails
      (else the host's NIC affinity map, else one NIC);
    - each level above: the level below times the uplink/downlink ratio into it (never more);
    - ``bandwidths`` overrides any level by name.
    """
    if node_type is None and fabric is None:
        raise InvalidTopology(f"{name}: need a node type, a fabric or both")
    if node_type is not None and node_type.gpus < 1:
        raise InvalidTopology(f"{name}: node type {node_type.name!r} has no GPUs")
    if gpus_per_node is not None and not 1 <= gpus_per_node <= 64:
        raise InvalidTopology(f"{name}: gpus_per_node must be 1..64, got {gpus_per_node}")
    if fabric is None:
        assert node_type is not None  # one of the two is given (checked above)
        fabric = Fabric(hosts={f"{node_type.name}-0": Host(f"{node_type.name}-0")})
    if not fabric.hosts:
        raise InvalidTopology(f"{name}: the fabric has no hosts")
    for host_name in fabric.hosts:
        _check_host_name(host_name, name)
    default_gpus = gpus_per_node or DEFAULT_GPUS_PER_NODE
    if node_type is None:
        unknown = [h.name for h in fabric.hosts.values() if not h.gpus]
        if unknown and gpus_per_node is None:
            fabric.warnings.append(
                f"GPU count of {len(unknown)} hosts unknown ({', '.join(unknown[:3])}"
                f"{' ...' if len(unknown) > 3 else ''}); assumed {DEFAULT_GPUS_PER_NODE} per "
                "host (give a node type or gpus_per_node)"
            )
    for level in fabric.levels:
        if not _LEVEL_NAME.match(level) or level in ("node", "numa", "root"):
            raise InvalidTopology(f"{name}: fabric level {level!r} is not a usable level name")

    # -- node types ---------------------------------------------------------------------------
    node_types: dict[str, dict] = {}
    host_type: dict[str, str] = {}
    sublevels: list[str] = []
    if node_type is not None:
        for host in fabric.hosts.values():
            if host.gpus is not None and host.gpus != node_type.gpus:
                raise InvalidTopology(
                    f"{name}: host {host.name} has {host.gpus} GPUs but node type "
                    f"{node_type.name!r} has {node_type.gpus}"
                )
        entry: dict = {"gpus": node_type.gpus}
        if node_type.gpu_model:
            entry["gpu_model"] = node_type.gpu_model
        numa = node_type.numa
        if len(numa) == node_type.gpus and all(v is not None for v in numa) and len(set(numa)) > 1:
            order = {v: i for i, v in enumerate(dict.fromkeys(numa))}
            entry["sublevels"] = {"numa": [order[v] for v in numa]}
            sublevels = ["numa"]
        else:
            entry["sublevels"] = {}
        if node_type.bandwidth_gbps:
            entry["bandwidth_gbps"] = [list(row) for row in node_type.bandwidth_gbps]
        nv_classes = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS)$")
        if node_type.link_classes and all(
            nv_classes.match(c) for row in node_type.link_classes for c in row
        ):
            entry["link_classes"] = [list(row) for row in node_type.link_classes]
        if node_type.nics:
            entry["nics"] = list(node_type.nics)
            if node_type.gpu_nic and all(v is not None for v in node_type.gpu_nic):
                entry["gpu_nic"] = list(node_type.gpu_nic)
        node_types[node_type.name] = entry
        for host_name in fabric.hosts:
            host_type[host_name] = node_type.name
    else:
        for host in fabric.hosts.values():
            n = host.gpus or default_gpus
            if n > 64:
                raise InvalidTopology(
                    f"{name}: host {host.name} has {n} GPUs; at most 64 per host are supported"
                )
            tname = f"{n}gpu" if not host.gpu_model else _type_name(host.gpu_model, n)
            if tname not in node_types:
                node_types[tname] = {"gpus": n, "sublevels": {}}
                if host.gpu_model:
                    node_types[tname]["gpu_model"] = host.gpu_model
            host_type[host.name] = tname

    # -- domains ------------------------------------------------------------------------------
    levels = list(fabric.levels)
    warnings = fabric.warnings
    domains: dict[str, dict[str, str]] = {}
    for host in fabric.hosts.values():
        d = {}
        for level in levels:
            dom = host.domains.get(level)
            if dom is None:
                dom = f"unattached-{host.name}"
                warnings.append(f"host {host.name} has no {level} domain; it gets one of its own")
            d[level] = dom
        domains[host.name] = d
    # Nesting: a domain must have one parent. Readers build nested domains; a violation here
    # means the source is not a tree (a leaf under two spine groups), which we refuse.
    for lower, upper in itertools.pairwise(levels):
        parent: dict[str, str] = {}
        for d in domains.values():
            seen = parent.setdefault(d[lower], d[upper])
            if seen != d[upper]:
                raise InvalidTopology(
                    f"{name}: {lower} domain {d[lower]!r} sits under two {upper} domains "
                    f"({seen!r} and {d[upper]!r}); the fabric is not a tree"
                )
    top_needs_root = not levels or len({d[levels[-1]] for d in domains.values()}) > 1
    if top_needs_root and len(fabric.hosts) > 1:
        levels.append("root")
        for d in domains.values():
            d["root"] = "root"

    # -- NVLink domain ------------------------------------------------------------------------
    nvlink_domain = "node"
    if (
        node_type is not None
        and node_type.nvlink_domain_gpus
        and (node_type.nvlink_domain_gpus > node_type.gpus)
    ):
        nvlink_domain = _nvlink_level(node_type, fabric, levels, domains, warnings)
    elif fabric.nvlink_level and fabric.nvlink_level in levels:
        nvlink_domain = fabric.nvlink_level
    # Fabric levels up to the NVLink domain are NVLink (a GB200 rack); the network starts above.
    nvlink_levels = levels[: levels.index(nvlink_domain) + 1] if nvlink_domain in levels else []
    net_levels = levels[len(nvlink_levels) :]

    # -- bandwidths ---------------------------------------------------------------------------
    all_levels = [*sublevels, "node", *levels]
    bw: dict[str, float] = {}
    net: float | None = None
    if net_levels:
        gpus_per_host = [_host_gpus(node_type, h, default_gpus) for h in fabric.hosts.values()]
        gpus = min(gpus_per_host)
        rails = sorted(len(h.rails) for h in fabric.hosts.values() if h.rails)
        if rails:
            nics = rails[len(rails) // 2]
        elif (
            node_type is not None
            and node_type.gpu_nic
            and any(v is not None for v in node_type.gpu_nic)
        ):
            nics = len({v for v in node_type.gpu_nic if v is not None})
        else:
            nics = 1
        port_gbps = (fabric.host_link_gbit or 400.0) / 8.0
        if fabric.host_link_gbit is None:
            warnings.append(
                "host link speed unknown; assumed 400 Gbit/s (NDR) per NIC for the network levels"
            )
        net = port_gbps * nics / max(gpus, 1)
    matrix_min = None
    if node_type is not None and node_type.bandwidth_gbps:
        matrix = node_type.bandwidth_gbps
        matrix_min = _offdiag_min(matrix)
        if sublevels and matrix_min is not None:
            groups: dict[int, list[int]] = {}
            for gpu, dom in enumerate(node_types[node_type.name]["sublevels"]["numa"]):
                groups.setdefault(dom, []).append(gpu)
            vals = [v for v in (_offdiag_min(matrix, g) for g in groups.values()) if v is not None]
            bw["numa"] = min(vals) if vals else matrix_min
    if matrix_min is not None:
        bw["node"] = matrix_min
        if net is not None:
            net = min(net, matrix_min)
    else:
        # No GPU pair inside the host is described: the node level only has to stay out of
        # the network's way (the cost model takes the minimum over the levels a group spans).
        bw["node"] = max(PCIE_GBPS["ampere"], net or 0.0)
        if node_type is None or node_type.gpus > 1:
            warnings.append(
                f"bandwidth between the GPUs of a host unknown; assumed {bw['node']:g} GB/s "
                "(PCIe Gen4 x16); give a node type from nvidia-smi/rocm-smi"
            )
    for lv in sublevels:
        bw.setdefault(lv, bw["node"])
    for lv in nvlink_levels:
        bw[lv] = bw["node"]
    for lv in net_levels:
        assert net is not None
        net = net * min(1.0, fabric.oversubscription.get(lv, 1.0))
        bw[lv] = round(net, 3)
    if bandwidths:
        for lv, value in bandwidths.items():
            if lv not in all_levels:
                raise InvalidTopology(f"{name}: bandwidth given for unknown level {lv!r}")
            if not float(value) > 0:
                raise InvalidTopology(f"{name}: bandwidth of {lv!r} must be > 0, got {value!r}")
            bw[lv] = float(value)

    level_dicts = [
        {
            "name": lv,
            "bandwidth_gbps": round(float(bw[lv]), 3),
            "latency_us": _level_latency(lv, i, latencies),
        }
        for i, lv in enumerate(all_levels)
    ]

    nodes = [{"name": h, "type": host_type[h], "domains": dict(domains[h])} for h in fabric.hosts]
    out = {
        "format": "gpuplace.topology/1",
        "name": name,
        "levels": level_dicts,
        "node_level": "node",
        "nvlink_domain": nvlink_domain,
        "node_types": node_types,
        "nodes": nodes,
    }
    uplinks = dict(fabric.uplink_gbps)
    if fabric.uplink_scale:
        host_gpus = {h.name: _host_gpus(node_type, h, default_gpus) for h in fabric.hosts.values()}
        for key, scale in fabric.uplink_scale.items():
            lv, _, dom = key.partition(":")
            if lv not in levels or levels.index(lv) + 1 >= len(levels):
                continue
            under = sum(g for h, g in host_gpus.items() if domains[h][lv] == dom)
            above = min(float(bw[x]) for x in all_levels[: all_levels.index(lv) + 2])
            uplinks.setdefault(key, round(under * above * scale, 3))
    if uplinks:
        out["uplink_gbps"] = uplinks
    notes = provenance(fabric, node_type)
    if notes:
        out["provenance"] = notes
    return out


def _type_name(model: str, gpus: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "gpu"
    return f"{slug}-x{gpus}"


def _nvlink_level(
    node_type: NodeType,
    fabric: Fabric,
    levels: list[str],
    domains: dict[str, dict[str, str]],
    warnings: list[str],
) -> str:
    """Pick the fabric level whose domains are the NVLink domains of a multi-host NVLink
    system (GB200 NVL72): the fabric's declared one, else the highest level whose every domain
    holds at most ``nvlink_domain_gpus`` GPUs."""
    want = node_type.nvlink_domain_gpus or node_type.gpus

    def largest(lv: str) -> int:
        sizes: dict[str, int] = {}
        for d in domains.values():
            sizes[d[lv]] = sizes.get(d[lv], 0) + node_type.gpus
        return max(sizes.values())

    if fabric.nvlink_level in levels:
        return fabric.nvlink_level
    # Slurm topology/block exists for NVLink racks: a block is the NVLink domain when it fits
    # (the blockN levels above it group whole racks and must not be taken for one).
    if "block" in levels and largest("block") <= want:
        return "block"
    best = "node"
    for lv in levels:
        if largest(lv) <= want:
            best = lv
        else:
            break
    if best == "node":
        warnings.append(
            f"NVLink domains of {want} GPUs span several hosts but no fabric level groups "
            "hosts that finely; the NVLink domain is left at the node"
        )
    return best
