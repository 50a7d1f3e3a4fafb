"""Real clusters from the shared traces, as topologies to simulate on.

* :func:`lingjun` -- Alibaba's Lingjun 3-tier Clos (Crux, SIGCOMM'24, ``topo.csv``): 847 hosts
  under 119 ToR switches (ASW, keyed by their PSW since ASW names repeat across PSWs), 3
  aggregation switches (PSW) and one core (DSW). The file gives hosts and switches only; each
  host is taken as an 8-GPU HGX H800-class server (the form factor of the clusters the paper
  describes) with the ``h100-superpod`` preset's NVLink and 400 Gb/s-per-GPU figures -- an
  assumption, not a reading of the file.
* :func:`pai` -- Alibaba PAI's machine list (``pai_machine_spec.csv``, NSDI'22): its GPU
  machines (6,742 GPUs) with their GPU types and counts; CPU-only machines are left out. The file
  has no network: machines are put 32 to a leaf in file order, leaves 8 to a spine (assumed),
  at 25 Gb/s (3.125 GB/s) per GPU; inside a host GPUs talk over PCIe Gen3 (12 GB/s), except
  8-GPU V100 hosts, given NVLink 2 (2 links x 25 GB/s between each pair, assumed). Each host
  type keeps its GPU model, so a job's step runs at the peak of the GPUs it gets (T4 65, P100
  21.2, V100 125 TFLOPS; ``MISC``, unnamed in the file, assumed P100-class).

Both files ship gzip-compressed in ``gpuplace/sim/data`` (provenance in its README), so
``gpuplace simulate --cluster lingjun`` and ``--cluster pai`` work from a clean install.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from gpuplace._util.documents import text_lines
from gpuplace.errors import InvalidTopology
from gpuplace.model.inventory import NVLINK_GBPS_PER_LINK
from gpuplace.model.presets import NDR_GBPS, hgx_node_type, topology_document
from gpuplace.model.topology import Topology
from gpuplace.sim.traces import _open_text, _trace_rows

__all__ = ["CLUSTERS", "cluster", "lingjun", "pai"]


def _three_tiers(
    host: tuple[float, float], per_gpu_gbps: float, latency_us: tuple[float, float, float]
) -> list[tuple[str, float, float]]:
    """The levels of a 3-tier Clos: the host's (GB/s, µs), then leaf, spine and core at the
    same per-GPU bandwidth (GB/s) and their latencies (µs)."""
    tiers = zip(("leaf", "spine", "core"), latency_us, strict=True)
    return [("node", *host), *((name, per_gpu_gbps, latency) for name, latency in tiers)]


def lingjun(path: str | Path | None = None) -> Topology:
    """The Lingjun 3-tier topology (see the module docstring)."""
    text, source = _open_text(path, "lingjun_topo.csv.gz", InvalidTopology)
    reader = csv.DictReader(text_lines(text))
    try:
        fieldnames = reader.fieldnames
    except csv.Error as exc:
        raise InvalidTopology(f"{source} line 1: not valid CSV: {exc}") from None
    if fieldnames is None or not {"ip", "DSW", "PSW", "ASW"} <= set(fieldnames):
        raise InvalidTopology(f"{source}: expected columns ip,DSW,PSW,ASW")
    nodes: list[dict[str, Any]] = []
    for line, row in _trace_rows(reader, source, InvalidTopology):
        if not all(row.get(k) for k in ("ip", "DSW", "PSW", "ASW")):
            raise InvalidTopology(f"{source} line {line}: every host needs ip, DSW, PSW and ASW")
        domains = {"leaf": f"{row['PSW']}-{row['ASW']}", "spine": row["PSW"], "core": row["DSW"]}
        nodes.append({"name": f"h{row['ip'][:12]}", "type": "hgx-h800", "domains": domains})
    nodes.sort(key=lambda n: (n["domains"]["spine"], n["domains"]["leaf"], n["name"]))
    nvlink = 18 * NVLINK_GBPS_PER_LINK["hopper"]
    document = topology_document(
        "lingjun",
        _three_tiers((nvlink, 1.0), NDR_GBPS, (2.5, 3.0, 3.5)),
        {"hgx-h800": hgx_node_type("H800 (assumed)")},
        nodes,
    )
    return Topology.from_dict(document, source=source)


_PCIE3_GBPS = 12.0
#: PAI's ``MISC`` machines hold GPU models the trace does not name (the NSDI'22 paper lists
#: them as older types besides T4, P100 and V100): assumed P100-class, 21.2 TFLOPS FP16.
_MISC_PEAK_TFLOPS = 21.2
_PAI_NIC_GBPS = 25 / 8


def pai(
    path: str | Path | None = None, *, per_leaf: int = 32, leaves_per_spine: int = 8
) -> Topology:
    """The PAI GPU machines (see the module docstring)."""
    text, source = _open_text(path, "pai_machine_spec.csv.gz", InvalidTopology)
    node_types: dict[str, dict[str, Any]] = {}
    nodes: list[dict[str, Any]] = []
    for line, row in _trace_rows(csv.reader(text_lines(text)), source, InvalidTopology):
        if not row:
            continue
        if len(row) != 5:
            raise InvalidTopology(
                f"{source} line {line}: expected machine,gpu_type,cap_cpu,cap_mem,cap_gpu"
            )
        machine, gpu_type, _, _, cap_gpu = row
        try:
            gpus = int(float(cap_gpu))
        except (ValueError, OverflowError):  # "x", "nan"; "inf"
            raise InvalidTopology(
                f"{source} line {line}: cap_gpu: expected a number, got {cap_gpu!r}"
            ) from None
        if gpus <= 0:
            continue
        tname = f"{gpu_type.lower()}-{gpus}gpu"
        if tname not in node_types:
            node_type: dict[str, Any] = {"gpus": gpus, "gpu_model": gpu_type}
            if gpu_type.upper() == "MISC":
                node_type["peak_tflops"] = _MISC_PEAK_TFLOPS
            if gpu_type.upper().startswith("V100") and gpus == 8:
                link = 2 * 25.0
                node_type["bandwidth_gbps"] = [
                    [0.0 if i == j else link for j in range(gpus)] for i in range(gpus)
                ]
            node_types[tname] = node_type
        index = len(nodes)
        leaf = index // per_leaf
        nodes.append(
            {
                "name": f"m{machine[:12]}",
                "type": tname,
                "domains": {
                    "leaf": f"leaf{leaf + 1:03d}",
                    "spine": f"spine{leaf // leaves_per_spine + 1:02d}",
                    "core": "core",
                },
            }
        )
    if not nodes:
        raise InvalidTopology(f"{source}: no GPU machines")
    document = topology_document(
        "pai", _three_tiers((_PCIE3_GBPS, 3.0), _PAI_NIC_GBPS, (5.0, 6.0, 7.0)), node_types, nodes
    )
    return Topology.from_dict(document, source=source)


#: Cluster names ``gpuplace simulate --cluster`` accepts besides the presets and files.
CLUSTERS = {"lingjun": lingjun, "pai": pai}


def cluster(name: str) -> Topology:
    """One of :data:`CLUSTERS` by name, read from the file shipped with gpuplace."""
    build = CLUSTERS.get(name)
    if build is None:
        raise InvalidTopology(f"unknown cluster {name!r}; expected one of {', '.join(CLUSTERS)}")
    return build()
