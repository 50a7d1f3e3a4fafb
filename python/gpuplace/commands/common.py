"""What the CLI commands share: the console, the cluster options and ``load_cluster``, and
the placement table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from gpuplace.commands.fabric_report import placement_rows
from gpuplace.errors import InvalidTopology
from gpuplace.placement import Placement
from gpuplace.presets import PRESETS
from gpuplace.topology import Topology

__all__ = [
    "cluster_options",
    "describe_policy",
    "fmt_bytes",
    "load_cluster",
    "out",
    "print_placement",
    "with_cluster",
]

out = Console(highlight=False, soft_wrap=True)


def load_cluster(cluster: str, nodes: int | None = None, racks: int | None = None) -> Topology:
    """A preset name (with --nodes / --racks) or a topology file."""
    if cluster in PRESETS:
        return Topology.preset(cluster, nodes=nodes, racks=racks)
    path = Path(cluster)
    if not path.exists():
        raise InvalidTopology(
            f"unknown cluster {cluster!r}: neither a preset ({', '.join(PRESETS)}) nor an existing file"
        )
    if nodes is not None or racks is not None:
        raise InvalidTopology("--nodes and --racks apply to presets, not to a topology file")
    return Topology.load(path)


def fmt_bytes(b: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def print_placement(p: Placement, comparison: dict[str, Any] | None = None) -> None:
    """The placement as a table: comm per class (with the NCCL algorithm priced), bytes per
    level, step time and MFU, and the comparison line against first-fit when given."""
    from gpuplace.report import add_step_rows

    table = Table(
        title=f"{p.job.name} on {p.topology.name}", show_header=False, title_justify="left"
    )
    table.add_column(style="bold")
    table.add_column()
    table.add_row("solver", p.solver + (" (proven optimal)" if p.optimal else ""))
    table.add_row("GPUs", str(len(p.gpus)))
    table.add_row("hosts", f"{len(p.nodes)}: {p.hostlist()}")
    table.add_row("spans", p.cost.span_level or "one GPU")
    table.add_row("comm per step", f"{p.cost.comm_seconds * 1e3:.3f} ms (no overlap assumed)")
    for name, seconds in p.cost.class_seconds.items():
        algorithm = p.cost.class_algorithms.get(name)
        table.add_row(
            f"  {name}", f"{seconds * 1e3:.3f} ms" + (f" ({algorithm})" if algorithm else "")
        )
    if p.cost.traffic_seconds:
        table.add_row("  explicit traffic", f"{p.cost.traffic_seconds * 1e3:.3f} ms")
    for level, b in p.cost.bytes_by_level.items():
        table.add_row(f"bytes via {level}", fmt_bytes(b))
    table.add_row("confinement", "ok" if p.cost.confinement_ok else "; ".join(p.cost.violations))
    for label, value in placement_rows(p):
        table.add_row(label, value)
    add_step_rows(table, p.cost, comparison)
    if p.bound is not None:
        table.add_row("bound / gap", f"{p.bound * 1e3:.3f} ms / {100 * (p.gap or 0):.2f} %")
    table.add_row("solve time", f"{p.elapsed_s * 1e3:.2f} ms")
    for key, value in describe_policy(p.details).items():
        table.add_row(key, value)
    out.print(table)


def describe_policy(details: dict[str, Any]) -> dict[str, str]:
    """Rows for what the policy layer did: pool, borrowing, rules, preemption."""
    rows: dict[str, str] = {}
    info = details.get("policy", {})
    if "pool" in info:
        rows["pool"] = info["pool"] + (
            f" (borrowed {info['borrowed_gpus']} GPUs from {', '.join(info['borrowed_from'])})"
            if info.get("borrowed_gpus")
            else ""
        )
    if info.get("rules"):
        rows["hardware rules"] = "; ".join(info["rules"])
    if details.get("elastic"):
        rows["elastic"] = details["elastic"]["summary"]
    pre = details.get("preemption")
    if pre:
        victims = ", ".join(
            f"{v['job']} ({v['gpus']} GPUs, {v['priority_class']})" for v in pre["victims"]
        )
        rows["preempts"] = f"{victims}; {pre['cost']['gpus']} GPUs in total"
    return rows


cluster_options: list[Callable[[Any], Any]] = [
    click.option("--cluster", "-c", required=True, help="A preset name or a topology file."),
    click.option("--nodes", type=int, default=None, help="Preset size in hosts."),
    click.option("--racks", type=int, default=None, help="Preset size in racks (gb200-nvl72)."),
]


def with_cluster(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(cluster_options):
        func = option(func)
    return func
