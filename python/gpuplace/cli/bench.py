"""``gpuplace bench``: the solver comparison benchmark (:mod:`gpuplace.sim.compare`) as a table,
CSV and JSON files, and a PNG bar chart with the ``plot`` extra."""

from __future__ import annotations

import shutil
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from gpuplace.cli.bench_contention import run_contention_bench
from gpuplace.cli.common import emit, format_option
from gpuplace.sim.compare import SuiteReport, quick_suite, run_suite, suite

__all__ = ["bench", "print_report", "write_png"]


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:,.1f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def print_report(report: SuiteReport, console: Console) -> None:
    """One row per instance (each solver's comm ms per step, x its ratio to the best), then the
    summary and greedy's head-to-head ratios on the fragmented states."""
    table = Table(
        title="comm ms per step, x its ratio to the best solver on the instance, MFU where the "
        "job declares its compute; ! breaks confinement, - infeasible for that policy",
        title_justify="left",
    )
    for col in ("cluster", "occ", "job"):
        table.add_column(col)
    for name in report.solvers:
        table.add_column(name, justify="right")
    rows: dict[tuple[str, float, str], dict[str, str]] = {}
    for r in report.results:
        cell = rows.setdefault(r.instance, {})
        if r.status == "ok":
            mark = "" if r.confinement_ok else "!"
            cell[r.solver] = f"{_ms(r.comm_seconds)}{mark} x{r.ratio_to_best:.2f}"
            if r.mfu is not None:
                cell[r.solver] += f" MFU {100 * r.mfu:.0f}%"
            if r.gap_to_optimum is not None:
                cell[r.solver] += f" gap {100 * r.gap_to_optimum:.1f}%"
        else:
            cell[r.solver] = "-" if r.status == "infeasible" else "n/a"
    for (cluster, occupancy, job), cells in rows.items():
        table.add_row(cluster, f"{occupancy:.0%}", job, *(cells.get(n, "") for n in report.solvers))
    console.print(table)

    summary = Table(
        title="summary: geometric-mean cost ratio to the best solver per instance",
        title_justify="left",
    )
    for col in (
        "solver",
        "all placed",
        "fragmented",
        "placed",
        "infeasible",
        "skipped",
        "confinement broken",
        "median solve ms",
        "mean MFU",
    ):
        summary.add_column(col, justify="right" if col != "solver" else "left")
    for name, s in report.summary.items():
        solve = s["median_solve_ms"]
        summary.add_row(
            name,
            _ratio(s["geomean_ratio_to_best"]),
            _ratio(s["geomean_ratio_fragmented"]),
            str(s["placed"]),
            str(s["infeasible"]),
            str(s["skipped"]),
            str(s["confinement_broken"]),
            "" if solve is None else f"{solve:.2f}",
            "" if s.get("mean_mfu") is None else f"{100 * s['mean_mfu']:.1f}%",
        )
    console.print(summary)
    if report.greedy_vs:
        head = Table(
            title="greedy vs each solver on the fragmented states (geometric mean of greedy's "
            "comm_seconds / the solver's, instances both placed)",
            title_justify="left",
        )
        for col in ("solver", "greedy / solver", "instances"):
            head.add_column(col, justify="right" if col != "solver" else "left")
        for name, v in report.greedy_vs.items():
            head.add_row(name, _ratio(v["greedy_over_solver"]), str(v["instances"]))
        console.print(head)


def write_png(report: SuiteReport, path: Path) -> Path:
    """A bar chart of each solver's geometric-mean ratio to the best (all placed instances and
    fragmented ones). Needs matplotlib (``pip install gpuplace[plot]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise click.ClickException("--png needs matplotlib: pip install 'gpuplace[plot]'") from None
    names = list(report.summary)
    allv = [report.summary[n]["geomean_ratio_to_best"] or 0.0 for n in names]
    frag = [report.summary[n]["geomean_ratio_fragmented"] or 0.0 for n in names]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(names)), 4.0))
    ax.bar([i - 0.2 for i in x], allv, width=0.4, label="all instances placed")
    ax.bar([i + 0.2 for i in x], frag, width=0.4, label="fragmented (50 %, 85 %)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(x), names, rotation=20, ha="right")
    ax.set_ylabel("comm time / best (geometric mean)")
    ax.set_title("gpuplace solver comparison (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@click.command("bench")
@click.option("--quick", is_flag=True, help="A small slice of the suite (smaller clusters).")
@click.option(
    "--solvers",
    "solver_list",
    default=None,
    help="Comma-separated solvers (default: every registered one).",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the fragmented states and the traffic job.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for compare.csv and compare.json (and compare.png).",
)
@click.option("--png", is_flag=True, help="Also write compare.png (needs gpuplace[plot]).")
@click.option(
    "--contention",
    is_flag=True,
    help="Instead: a new job on loaded clusters with 2:1 leaf uplinks, every solver priced "
    "with its neighbours (writes contention.csv/json).",
)
@format_option
def bench(
    quick: bool,
    solver_list: str | None,
    seed: int,
    out_dir: str | None,
    png: bool,
    contention: bool,
    fmt: str,
) -> None:
    """Compare the registered solvers on a fixed, seeded suite of clusters and jobs (with
    --format json, progress goes to stderr and the report is one JSON object)."""
    if contention:
        run_contention_bench(quick, solver_list, out_dir, fmt)
        return
    if png and out_dir is None:
        raise click.UsageError("--png writes into the --out directory; give --out DIR")
    # Wide enough for one column per solver even when the output goes to a file.
    width = max(shutil.get_terminal_size((200, 50)).columns, 200)
    console = Console(highlight=False, width=width, stderr=fmt == "json")
    names = [s.strip() for s in solver_list.split(",") if s.strip()] if solver_list else None
    report = run_suite(
        quick_suite() if quick else suite(),
        solver_names=names,
        seed=seed,
        progress=lambda line: console.print(f"[dim]{line}[/dim]"),
    )
    paths: list[Path] = []
    if out_dir is not None:
        paths = report.write(Path(out_dir))
        if png:
            paths.append(write_png(report, Path(out_dir) / "compare.png"))
    if fmt == "json":
        emit({**report.to_json(), "files": [str(p) for p in paths]})
        return
    print_report(report, console)
    if paths:
        console.print("wrote " + ", ".join(str(p) for p in paths))
