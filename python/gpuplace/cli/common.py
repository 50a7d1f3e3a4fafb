"""What the CLI commands share: the console, the cluster options and ``load_cluster``, and
the placement table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from gpuplace.cli.reports import placement_rows
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import InvalidState, InvalidTopology
from gpuplace.model.presets import PRESETS
from gpuplace.model.topology import Topology
from gpuplace.placement.compare import add_step_rows
from gpuplace.placement.result import Placement

__all__ = [
    "cluster_options",
    "describe_policy",
    "fmt_bytes",
    "load_cluster",
    "open_state",
    "out",
    "print_placement",
    "state_options",
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


def state_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--state",
            "state_path",
            required=True,
            type=click.Path(dir_okay=False),
            help="State file (read, changed all or nothing, written atomically).",
        ),
        click.option(
            "--cluster",
            "-c",
            default=None,
            help="A preset name or a topology file (default: the one the state file names).",
        ),
        click.option("--nodes", type=int, default=None, help="Preset size in hosts."),
        click.option("--racks", type=int, default=None, help="Preset size in racks (gb200-nvl72)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def open_state(
    state_path: str, cluster: str | None, nodes: int | None, racks: int | None
) -> ClusterState:
    """The state in ``state_path`` on its cluster; a new empty state when the file does not
    exist (then ``--cluster`` is required)."""
    exists = Path(state_path).exists()
    remembered = ClusterState.cluster_of(state_path) if exists else None
    if cluster is not None:
        topology = load_cluster(cluster, nodes, racks)
    elif remembered is not None:
        topology = _rebuild(remembered, state_path)
    elif exists:
        raise InvalidState(
            f"{state_path}: the state file does not name its cluster; give --cluster"
        )
    else:
        raise InvalidState(f"{state_path}: no such state file; give --cluster to start a new one")
    if not exists:
        return ClusterState(topology)
    return ClusterState.load(topology, state_path)


def _rebuild(cluster: dict[str, Any], state_path: str) -> Topology:
    if isinstance(cluster.get("preset"), str):
        params = cluster.get("params") or {}
        if not isinstance(params, dict):
            raise InvalidState(f"{state_path}: cluster.params: expected a mapping")
        return Topology.preset(cluster["preset"], **params)
    if isinstance(cluster.get("file"), str):
        try:
            return Topology.load(cluster["file"])
        except InvalidTopology as exc:
            raise InvalidState(
                f"{state_path}: the cluster it names cannot be read: {exc}"
            ) from None
    raise InvalidState(f"{state_path}: cluster: expected a preset or a file; give --cluster")
