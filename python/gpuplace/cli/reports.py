"""What the CLI prints about what jobs share: the fabric (a placement's slowdown from
contention and the uplinks responsible, the running jobs hurt most, the uplinks level by
level), the power domains and the pools."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from gpuplace.policy.fence import pool_masks

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.placement.result import CostReport, Placement

__all__ = [
    "contention_rows",
    "fabric_doc",
    "placement_rows",
    "pool_status",
    "print_fabric",
    "print_jobs_hurt",
    "print_pools",
    "print_power",
    "print_uplink_levels",
]


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
    """The running jobs hurt most, the hottest uplinks overall and per uplink level, for
    ``status`` and ``fabric`` with ``--format json``."""
    return {
        "jobs_hurt": state.jobs_hurt(count),
        "hottest_uplinks": state.hottest_uplinks(count),
        "uplink_levels": state.uplinks_by_level(count),
    }


def print_fabric(state: ClusterState, console: Console, count: int = 3) -> None:
    """Tables of the running jobs' slowdown from contention and of the uplinks level by level
    (each level's load and its ``count`` hottest uplinks, so saturated host NICs do not hide a
    hot leaf or spine); nothing while no running job loads the fabric."""
    levels = state.uplinks_by_level(count)
    if not levels:
        return
    print_jobs_hurt(state.jobs_hurt(5), console)
    print_uplink_levels(levels, console)


def print_jobs_hurt(rows: list[dict[str, Any]], console: Console) -> None:
    """The running jobs by slowdown from contention (``ClusterState.jobs_hurt`` rows)."""
    table = Table(
        "job",
        "comm ms alone",
        "comm ms shared",
        "slowdown",
        title="running jobs by slowdown from contention",
        title_justify="left",
    )
    for row in rows:
        table.add_row(
            row["job"],
            f"{row['alone_seconds'] * 1e3:.3f}",
            f"{row['contended_seconds'] * 1e3:.3f}",
            f"x{row['slowdown']:.3f}",
        )
    console.print(table)


def print_uplink_levels(levels: list[dict[str, Any]], console: Console) -> None:
    """One block per uplink level (``node -> leaf``: the host NICs; ``leaf -> spine``: the leaf
    uplinks): how many of its uplink directions carry load and how many are over capacity,
    then its hottest uplinks with their load over capacity."""
    table = Table(
        "uplinks",
        "loaded",
        "over",
        "hottest",
        "load / capacity GB/s",
        "util.",
        title="uplinks by level, the hottest of each",
        title_justify="left",
    )
    for lv in levels:
        head = (
            f"{lv['level']}->{lv['uplinks_to']}"
            + (f" ({lv['routing']})" if lv.get("routing", "adaptive") != "adaptive" else ""),
            f"{lv['loaded']}/{lv['directions']}",
            str(lv["over_capacity"]),
        )
        if not lv["hottest"]:
            table.add_row(*head, "-", "-", "-")
        for i, u in enumerate(lv["hottest"]):
            table.add_row(
                *(head if i == 0 else ("", "", "")),
                f"{u['uplink'].split(':', 1)[-1]} {u['direction']}",
                f"{u['load_gbps']:.0f} / {u['capacity_gbps']:.0f}",
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


def pool_status(state: ClusterState) -> list[dict[str, Any]]:
    """Per pool: its GPUs, those its own jobs hold, those lent to other pools' jobs, those its
    jobs borrowed elsewhere, and the free ones."""
    masks = pool_masks(state)
    if not masks:
        return []
    free = state.free_mask()
    rows: dict[str, dict[str, Any]] = {
        name: {"pool": name, "gpus": int(m.sum()), "used": 0, "lent": 0, "borrowed": 0}
        for name, m in masks.items()
    }
    for name, gpus in state.jobs.items():
        spec = state.specs.get(name)
        own = spec.policy.pool if spec is not None and spec.policy is not None else None
        for pool, mask in masks.items():
            held = int(mask[gpus].sum())
            if not held:
                continue
            if pool == own:
                rows[pool]["used"] += held
            else:
                rows[pool]["lent"] += held
                if own in rows:
                    rows[own]["borrowed"] += held
    for name, mask in masks.items():
        rows[name]["free"] = int((free & mask).sum())
        rows[name]["occupancy"] = (
            (rows[name]["used"] + rows[name]["lent"]) / rows[name]["gpus"]
            if rows[name]["gpus"]
            else 0.0
        )
    return list(rows.values())


def print_pools(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(
        "pool",
        "GPUs",
        "used by own jobs",
        "lent",
        "borrowed elsewhere",
        "free",
        "occupancy",
        title="pools",
        title_justify="left",
    )
    for r in rows:
        table.add_row(
            r["pool"],
            str(r["gpus"]),
            str(r["used"]),
            str(r["lent"]),
            str(r["borrowed"]),
            str(r["free"]),
            f"{100 * r['occupancy']:.0f} %",
        )
    console.print(table)
