"""``gpuplace bench --contention``: the contention benchmark (:mod:`gpuplace.sim.contention`)
as tables, with CSV and JSON files."""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpuplace.cli.common import emit
from gpuplace.sim.contention import (
    CONTENTION_SOLVERS,
    ContentionSuite,
    contention_suite,
    quick_contention_suite,
    run_contention_suite,
)

__all__ = ["print_contention", "run_contention_bench"]


def _f(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def print_contention(suite: ContentionSuite, console: Console) -> None:
    """One row per instance and solver, then the summary against greedy."""
    table = Table(
        title="new job on a loaded 2:1 fabric: comm ms per step with its neighbours, slowdown "
        "over alone, ms it adds to the running jobs",
        title_justify="left",
    )
    for col in ("cluster", "occ", "seed", "job", "solver", "comm ms", "slowdown", "added ms"):
        table.add_column(col, justify="left" if col in ("cluster", "job", "solver") else "right")
    for r in suite.results:
        if r.status != "ok":
            table.add_row(r.cluster, f"{r.occupancy:.0%}", str(r.seed), r.job, r.solver, "-")
            continue
        table.add_row(
            r.cluster,
            f"{r.occupancy:.0%}",
            str(r.seed),
            r.job,
            r.solver,
            f"{(r.comm_seconds or 0) * 1e3:,.1f}",
            f"x{_f(r.slowdown)}",
            f"{(r.added_seconds or 0) * 1e3:,.1f}",
        )
    console.print(table)
    summary = Table(
        title="summary (geometric means over the instances both placed)", title_justify="left"
    )
    for col in (
        "solver",
        "placed",
        "mean slowdown",
        "max slowdown",
        "mean added to running",
        "greedy / solver (new job)",
        "greedy / solver (new + added)",
        "median solve ms",
    ):
        summary.add_column(col, justify="left" if col == "solver" else "right")
    for name, s in suite.summary().items():
        added = s["mean_added_fraction"]
        summary.add_row(
            name,
            str(s["placed"]),
            _f(s["mean_slowdown"]),
            _f(s["max_slowdown"]),
            "" if added is None else f"{100 * added:.2f} %",
            _f(s["greedy_over_solver"]),
            _f(s["greedy_over_solver_total"]),
            _f(s["median_solve_ms"], 2),
        )
    console.print(summary)


def run_contention_bench(
    quick: bool, solver_list: str | None, out_dir: str | None, fmt: str = "table"
) -> None:
    width = max(shutil.get_terminal_size((200, 50)).columns, 160)
    console = Console(highlight=False, width=width, stderr=fmt == "json")
    names = (
        [s.strip() for s in solver_list.split(",") if s.strip()]
        if solver_list
        else list(CONTENTION_SOLVERS)
    )
    suite = run_contention_suite(
        quick_contention_suite() if quick else contention_suite(),
        names,
        progress=lambda line: console.print(f"[dim]{line}[/dim]"),
    )
    paths = suite.write(Path(out_dir)) if out_dir is not None else []
    if fmt == "json":
        emit({**suite.to_json(), "files": [str(p) for p in paths]})
        return
    print_contention(suite, console)
    if paths:
        console.print("wrote " + ", ".join(str(p) for p in paths))
