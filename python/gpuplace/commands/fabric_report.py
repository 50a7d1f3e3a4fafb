"""What the CLI prints about jobs sharing the fabric (``gpuplace.fabric``): a placement's
slowdown from contention and the uplinks responsible, the running jobs hurt most and the
hottest uplinks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from gpuplace.placement import CostReport, Placement
    from gpuplace.state import ClusterState

__all__ = ["contention_rows", "fabric_doc", "placement_rows", "print_fabric", "print_power"]


def placement_rows(placement: Placement) -> list[tuple[str, str]]:
    """Rows for a placement table: storage I/O, the power phase of a staggered synchronised
    job, and slowdown and hot uplinks when priced among neighbours."""
    rows = []
    if placement.cost.io_seconds:
        rows.append(("storage I/O per step", f"{placement.cost.io_seconds * 1e3:.3f} ms"))
    if "phase_offset" in placement.details:
        rows.append(
            ("power phase", f"starts {placement.details['phase_offset']:g} of a step later")
        )
    return rows + contention_rows(placement.cost)


def contention_rows(cost: CostReport) -> list[tuple[str, str]]:
    """Rows for a placement table: slowdown and hot uplinks, when priced among neighbours."""
    if cost.alone_seconds is None:
        return []
    rows = [
        (
            "slowdown (contention)",
            f"x{cost.slowdown:.3f} (alone {cost.alone_seconds * 1e3:.3f} ms)",
        )
    ]
    for u in cost.hot_uplinks[:3]:
        others = ", ".join(f"{job} {gbps:.0f} GB/s" for job, gbps in list(u.jobs.items())[:3])
        rows.append(
            (
                f"  hot uplink {u.uplink} {u.direction}",
                f"{u.utilisation:.2f}x capacity {u.capacity_gbps:.0f} GB/s (with {others})",
            )
        )
    return rows


def fabric_doc(state: ClusterState, count: int = 5) -> dict[str, Any]:
    """The running jobs hurt most and the hottest uplinks, for ``status --format json``."""
    return {"jobs_hurt": state.jobs_hurt(count), "hottest_uplinks": state.hottest_uplinks(count)}


def print_fabric(state: ClusterState, console: Console, count: int = 5) -> None:
    """Tables of the running jobs' slowdown from contention and of the hottest uplinks;
    nothing while no running job loads the fabric."""
    hot = state.hottest_uplinks(count)
    if not hot:
        return
    table = Table(
        "job",
        "comm ms alone",
        "comm ms shared",
        "slowdown",
        title="running jobs by slowdown from contention",
        title_justify="left",
    )
    for row in state.jobs_hurt(count):
        table.add_row(
            row["job"],
            f"{row['alone_seconds'] * 1e3:.3f}",
            f"{row['contended_seconds'] * 1e3:.3f}",
            f"x{row['slowdown']:.3f}",
        )
    console.print(table)
    table = Table(
        "uplink",
        "direction",
        "load GB/s",
        "capacity GB/s",
        "utilisation",
        title="hottest uplinks",
        title_justify="left",
    )
    for u in hot:
        table.add_row(
            u["uplink"],
            u["direction"],
            f"{u['load_gbps']:.0f}",
            f"{u['capacity_gbps']:.0f}",
            f"{u['utilisation']:.2f}",
        )
    console.print(table)


def print_power(rows: list[dict[str, Any]], console: Console) -> None:
    """Budget, draw and headroom per power domain, with its synchronised jobs' phases."""
    if not rows:
        return
    table = Table(
        "power domain",
        "kind",
        "budget W",
        "draw W",
        "headroom W",
        "synchronised jobs (phase)",
        title="power",
        title_justify="left",
    )
    for r in rows:
        jobs = ", ".join(f"{name} ({offset:g})" for name, offset in r["synchronized_jobs"].items())
        table.add_row(
            r["domain"],
            r["kind"],
            f"{r['budget_w']:,.0f}",
            f"{r['draw_w']:,.0f}",
            f"{r['headroom_w']:,.0f}",
            jobs or "-",
        )
    console.print(table)
