"""Built-in clusters, from public hardware figures (each cited beside its number).

Every preset returns the native topology dictionary (``docs/topology-format.md``), so a preset
can be saved, edited and loaded back like any other cluster.

Bandwidths are per GPU and per direction (GB/s), as the ring cost model uses them:

* NVLink per link, as NCCL models it (NVIDIA/nccl ``src/graph/topo.h``: ``SM80_NVLINK_BW
  20.0``, ``SM90_NVLINK_BW 20.6``, ``SM100_NVLINK_BW 40.1`` GB/s); H100 SXM has 18 NVLink 4
  links (NVIDIA H100 datasheet: 900 GB/s bidirectional), A100 SXM 12 NVLink 3 links (600 GB/s
  bidirectional), B200/GB200 18 NVLink 5 links (1.8 TB/s bidirectional).
* InfiniBand per 4x port: HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s; DGX H100 has eight
  ConnectX-7 NDR ports for compute, one per GPU (DGX H100 user guide), DGX A100 eight HDR ports.
* PCIe x16 per direction: Gen4 ~32 GB/s, Gen5 ~64 GB/s (PCI-SIG).

Latencies are assumed figures, not measurements: ~1 µs for an NVLink message, ~2.5 µs for an
InfiniBand message through one leaf switch, plus ~0.5 µs per further switch tier (each NDR
switch hop adds a few hundred ns; the rest is NIC and software overhead).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplace.errors import InvalidTopology
from gpuplace.model.inventory import NVLINK_GBPS_PER_LINK
from gpuplace.model.parts import FORMAT

__all__ = ["PRESETS", "build_preset", "hgx_node_type", "topology_document"]

NDR_GBPS = 50.0
HDR_GBPS = 25.0


@dataclass(frozen=True)
class Preset:
    description: str
    build: Callable[..., dict[str, Any]]
    params: dict[str, int]


def topology_document(
    name: str,
    levels: list[tuple[str, float, float]],
    node_types: dict[str, dict[str, Any]],
    nodes: list[dict[str, Any]],
    *,
    nvlink_domain: str = "node",
    oversubscription: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The native topology document (``docs/topology-format.md``) of a cluster built in code:
    ``levels`` bottom-up as (name, GB/s per GPU each direction, latency µs), hosts being the
    ``node`` level; ``oversubscription`` gives N for the levels whose uplinks are N:1."""
    rows: list[dict[str, Any]] = []
    for level, gbps, latency in levels:
        rows.append({"name": level, "bandwidth_gbps": gbps, "latency_us": latency})
        ratio = (oversubscription or {}).get(level, 1)
        if ratio != 1:
            rows[-1]["oversubscription"] = ratio
    return {
        "format": FORMAT,
        "name": name,
        "levels": rows,
        "node_level": "node",
        "nvlink_domain": nvlink_domain,
        "node_types": node_types,
        "nodes": nodes,
    }


def hgx_node_type(
    gpu_model: str, *, gpus: int = 8, power_w: float | None = None, nvls_gbps: float | None = None
) -> dict[str, Any]:
    """A host type with one NIC per GPU (one rail each), NIC ``mlx5_i`` serving GPU i, as
    ``nvidia-smi topo -m`` shows on HGX and GB200 trays; ``power_w`` is the GPU board power
    (W) and ``nvls_gbps`` the measured NVLS all-reduce bus bandwidth inside the NVLink domain."""
    host: dict[str, Any] = {"gpus": gpus, "gpu_model": gpu_model}
    if power_w is not None:
        host["power_w"] = power_w
    host["nics"] = [f"mlx5_{i}" for i in range(gpus)]
    host["gpu_nic"] = list(range(gpus))
    if nvls_gbps is not None:
        host["nvls_gbps"] = nvls_gbps
    return host


def _fabric_nodes(
    prefix: str,
    count: int,
    node_type: str,
    *,
    per_leaf: int,
    leaves_per_spine: int,
    width: int,
) -> tuple[list[dict[str, Any]], list[tuple[str, float, float]]]:
    """Hosts under rail-optimized leaf groups (scalable units), spine groups above, and a core
    level when there is more than one spine group."""
    leaves = -(-count // per_leaf)
    spines = -(-leaves // leaves_per_spine)
    nodes = []
    for leaf in range(leaves):
        first = leaf * per_leaf + 1
        last = min(count, first + per_leaf - 1)
        domains = {"leaf": f"su{leaf + 1:03d}", "spine": f"spine{leaf // leaves_per_spine + 1:02d}"}
        if spines > 1:
            domains["core"] = "core"
        name = (
            f"{prefix}{first:0{width}d}"
            if first == last
            else f"{prefix}[{first:0{width}d}-{last:0{width}d}]"
        )
        nodes.append({"name": name, "type": node_type, "domains": domains})
    levels = [("leaf", NDR_GBPS, 2.5), ("spine", NDR_GBPS, 3.0)]
    if spines > 1:
        levels.append(("core", NDR_GBPS, 3.5))
    return nodes, levels


def _dgx_h100_type() -> dict[str, Any]:
    # All GPU pairs are NV18 through the NVSwitch fabric; the NIC of GPU i is mlx5_i.
    return hgx_node_type(
        "H100-SXM5-80GB",
        power_w=700,  # H100 SXM board power (NVIDIA H100 datasheet)
        # NVLS all-reduce bus bandwidth inside the node: 470.73 GB/s measured by nccl-tests
        # all_reduce_perf at 2 GiB on 8 x H100 SXM with NCCL's default algorithm choice
        # (tests/data/nccl-tests/README.md; NVIDIA quotes ~480 GB/s for NVLS on HGX H100).
        nvls_gbps=470.0,
    )


def _check(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidTopology(
            f"preset parameter {name}: expected an integer {lo}..{hi}, got {value!r}"
        )
    return value


def dgx_h100() -> dict[str, Any]:
    """One DGX H100: 8 H100 SXM on NVSwitch (18 NVLink 4 links each), 8 NDR NICs."""
    nvlink = 18 * NVLINK_GBPS_PER_LINK["hopper"]
    return topology_document(
        "dgx-h100",
        [("node", nvlink, 1.0)],
        {"dgx-h100": _dgx_h100_type()},
        [{"name": "dgx001", "type": "dgx-h100", "domains": {}}],
    )


def h100_superpod(nodes: int = 256, oversubscription: int = 1) -> dict[str, Any]:
    """DGX H100 nodes in scalable units of 32 nodes on rail-optimized leaf switches (DGX
    SuperPOD H100 reference architecture: 32 DGX H100 per SU), spine groups of 4 SUs, a core
    tier above when there are several spine groups; NDR 400 Gb/s, non-blocking (≈1:1) as the
    reference architecture builds it, or with ``oversubscription=N`` leaf uplinks at N:1 (a
    cheaper build: each leaf's links to the spine carry 1/N of what its GPUs can send)."""
    nodes = _check("nodes", nodes, 1, 100_000)
    ratio = _check("oversubscription", oversubscription, 1, 64)
    nvlink = 18 * NVLINK_GBPS_PER_LINK["hopper"]
    hosts, fabric = _fabric_nodes(
        "dgx", nodes, "dgx-h100", per_leaf=32, leaves_per_spine=4, width=max(3, len(str(nodes)))
    )
    return topology_document(
        f"h100-superpod-{nodes}" + (f"-{ratio}to1" if ratio != 1 else ""),
        [("node", nvlink, 1.0), *fabric],
        {"dgx-h100": _dgx_h100_type()},
        hosts,
        oversubscription={"leaf": ratio},
    )


def gb200_nvl72(racks: int = 8) -> dict[str, Any]:
    """GB200 NVL72 racks: 18 compute trays x 4 Blackwell GPUs in one 72-GPU NVLink domain
    (NVLink 5, 18 links per GPU through the NVLink switch trays); trays reach the InfiniBand
    fabric through one 400 Gb/s ConnectX-7 per GPU; 8 racks per leaf group (DGX SuperPOD GB200
    reference architecture: scalable unit of 8 racks), spine above."""
    racks = _check("racks", racks, 1, 10_000)
    nvlink = 18 * NVLINK_GBPS_PER_LINK["blackwell"]
    nodes = []
    per_leaf = 8
    groups = -(-racks // per_leaf)
    for r in range(racks):
        domains = {"nvlink-domain": f"rack{r + 1:03d}", "leaf": f"su{r // per_leaf + 1:03d}"}
        if groups > 1:
            domains["spine"] = "spine01"
        nodes.append(
            {"name": f"rack{r + 1:03d}-tray[01-18]", "type": "gb200-tray", "domains": domains}
        )
    levels = [("node", nvlink, 1.0), ("nvlink-domain", nvlink, 1.5), ("leaf", NDR_GBPS, 2.5)]
    if groups > 1:
        levels.append(("spine", NDR_GBPS, 3.0))
    tray = hgx_node_type(
        "B200 (GB200 superchip)",
        gpus=4,
        power_w=1200,  # GB200 NVL72: ~1.2 kW per Blackwell GPU (NVIDIA GB200 NVL72 spec)
        # NVLS all-reduce bus bandwidth across one NVL72 rack: 834.57 GB/s measured by
        # nccl-tests all_reduce_perf at 8 GiB on 72 GB200 GPUs (multi-node NVLink,
        # CoreWeave nccl-tests README; tests/data/nccl-tests/README.md).
        nvls_gbps=834.0,
    )
    return topology_document(
        f"gb200-nvl72-{racks}",
        levels,
        {"gb200-tray": tray},
        nodes,
        nvlink_domain="nvlink-domain",
    )


def a100_pod(nodes: int = 140, oversubscription: int = 1) -> dict[str, Any]:
    """DGX A100 nodes: 8 A100 SXM4 on NVSwitch (12 NVLink 3 links each), 8 HDR 200 Gb/s NICs;
    scalable units of 20 nodes (DGX SuperPOD A100 reference architecture), spine groups of 4
    SUs, core above when needed; ``oversubscription=N`` for N:1 leaf uplinks."""
    nodes = _check("nodes", nodes, 1, 100_000)
    ratio = _check("oversubscription", oversubscription, 1, 64)
    nvlink = 12 * NVLINK_GBPS_PER_LINK["ampere"]
    hosts, fabric = _fabric_nodes(
        "dgxa", nodes, "dgx-a100", per_leaf=20, leaves_per_spine=4, width=max(3, len(str(nodes)))
    )
    fabric = [(n, HDR_GBPS, lat) for n, _, lat in fabric]
    return topology_document(
        f"a100-pod-{nodes}" + (f"-{ratio}to1" if ratio != 1 else ""),
        [("node", nvlink, 1.0), *fabric],
        # A100 SXM board power 400 W (NVIDIA A100 datasheet).
        {"dgx-a100": hgx_node_type("A100-SXM4-80GB", power_w=400)},
        hosts,
        oversubscription={"leaf": ratio},
    )


def pcie_cluster(nodes: int = 32) -> dict[str, Any]:
    """PCIe-only servers without NVLink: 8 GPUs, two per PCIe Gen5 switch, two switches per
    CPU socket (two NUMA domains); GPU pairs across sockets go through the CPU interconnect.
    Four 400 Gb/s NICs per server (one per PCIe switch pair, 25 GB/s per GPU), 32 servers per
    leaf, spine above."""
    nodes = _check("nodes", nodes, 1, 100_000)
    hosts, fabric = _fabric_nodes(
        "gpu", nodes, "pcie-8gpu", per_leaf=32, leaves_per_spine=4, width=max(3, len(str(nodes)))
    )
    fabric = [(n, NDR_GBPS / 2, lat) for n, _, lat in fabric]
    return topology_document(
        f"pcie-cluster-{nodes}",
        [
            ("pcie-switch", 64.0, 1.5),  # peer-to-peer through one Gen5 x16 switch
            ("numa", 32.0, 2.0),  # through the CPU root complex (assumed half of x16 Gen5)
            ("node", 16.0, 3.0),  # across sockets (SYS in nvidia-smi; assumed)
            *fabric,
        ],
        {
            "pcie-8gpu": {
                "gpus": 8,
                "gpu_model": "H100-PCIe-80GB",
                "power_w": 350,  # H100 PCIe board power (NVIDIA H100 datasheet)
                "sublevels": {
                    "pcie-switch": [0, 0, 1, 1, 2, 2, 3, 3],
                    "numa": [0, 0, 0, 0, 1, 1, 1, 1],
                },
                "nics": [f"mlx5_{i}" for i in range(4)],
                "gpu_nic": [0, 0, 1, 1, 2, 2, 3, 3],
            }
        },
        hosts,
    )


PRESETS: dict[str, Preset] = {
    "dgx-h100": Preset("one DGX H100 node: 8 H100 SXM on NVSwitch, 8 NDR NICs", dgx_h100, {}),
    "h100-superpod": Preset(
        "DGX H100 SuperPOD: 32-node scalable units on rail-optimized NDR leaves, spine, core "
        "(nodes=N, oversubscription=R for R:1 leaf uplinks)",
        h100_superpod,
        {"nodes": 256, "oversubscription": 1},
    ),
    "gb200-nvl72": Preset(
        "GB200 NVL72 racks: 72-GPU NVLink domains (18 trays x 4), NDR fabric above (racks=N)",
        gb200_nvl72,
        {"racks": 8},
    ),
    "a100-pod": Preset(
        "DGX A100 pod: 20-node scalable units on HDR leaves, spine, core (nodes=N, "
        "oversubscription=R for R:1 leaf uplinks)",
        a100_pod,
        {"nodes": 140, "oversubscription": 1},
    ),
    "pcie-cluster": Preset(
        "PCIe-only 8-GPU servers, two NUMA domains, no NVLink (nodes=N)",
        pcie_cluster,
        {"nodes": 32},
    ),
}


def build_preset(name: str, **params: Any) -> dict[str, Any]:
    """The native dictionary of a preset. Unknown names or parameters raise InvalidTopology."""
    preset = PRESETS.get(name)
    if preset is None:
        raise InvalidTopology(
            f"unknown cluster preset {name!r}; the presets are {', '.join(PRESETS)}"
        )
    given = {k: v for k, v in params.items() if v is not None}
    unknown = sorted(set(given) - set(preset.params))
    if unknown:
        accepted = ", ".join(preset.params) or "no parameters"
        raise InvalidTopology(f"preset {name!r} does not take {unknown[0]!r} (it takes {accepted})")
    return preset.build(**given)
