"""``gpuplace simulate``: replay a workload on a cluster under one or more placement policies
(:mod:`gpuplace.sim.engine`), print a summary table per policy, and write per-job and per-time-bin
CSV and JSON and, with ``--png`` (the ``plot`` extra), plots."""

from __future__ import annotations

import csv
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuplace._util.documents import write_atomically
from gpuplace.cli.common import cluster_params, emit, format_option, load_cluster, param_option
from gpuplace.errors import InvalidJob, InvalidTopology
from gpuplace.model.presets import PRESETS
from gpuplace.model.topology import Topology
from gpuplace.sim import metrics
from gpuplace.sim.clusters import CLUSTERS
from gpuplace.sim.engine import POLICIES, RESPONSES, SimConfig, SimResult, simulate
from gpuplace.sim.failures import load_failures
from gpuplace.sim.sweep import Task, run_on_ray
from gpuplace.sim.traces import LLM_MOE_SHARE, Workload, llm_mix, trace, with_estimates

__all__ = ["print_summaries", "simulate_cmd", "write_outputs", "write_pngs", "write_report"]


def _cluster(
    spec: str, nodes: int | None, racks: int | None, params: tuple[str, ...] = ()
) -> Topology:
    """A preset, a topology file, or one of the real clusters of :mod:`gpuplace.sim.clusters`;
    ``params``: the ``-p KEY=VALUE`` items."""

    if spec in CLUSTERS and not Path(spec).exists():
        if nodes is not None or racks is not None or params:
            raise InvalidTopology(
                f"--nodes, --racks and -p apply to presets and topology files, not to the "
                f"{spec} cluster"
            )
        return CLUSTERS[spec]()
    return load_cluster(spec, nodes, racks, params)


def _what_if_cluster(spec: str, nodes: int | None, racks: int | None, like_gpus: int) -> Topology:
    """The ``--vs`` cluster: a preset takes the size options that apply to it; when none does,
    it is sized to about ``like_gpus`` GPUs (so the two clusters compare at equal size)."""

    preset = PRESETS.get(spec)
    if preset is None:
        return _cluster(spec, None, None, ())
    given = {
        k: v
        for k, v in {"nodes": nodes, "racks": racks}.items()
        if v is not None and k in preset.params
    }
    if not given and preset.params:
        key, default = next(iter(preset.params.items()))
        per_unit = Topology.preset(spec).num_gpus / default
        given = {key: max(1, round(like_gpus / per_unit))}
    return Topology.preset(spec, **given)


def _workload(
    spec: str, cluster_gpus: int, jobs: int, seed: int, min_duration: float, moe_share: float
) -> Workload:
    if spec == "llm-mix":
        return llm_mix(jobs, cluster_gpus=cluster_gpus, seed=seed, moe_share=moe_share)
    kwargs = {"min_duration_s": min_duration} if spec == "philly" else {}
    return trace(spec, **kwargs)


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * value:.2f} %"
    if kind == "h":
        return f"{value / 3600:,.2f} h"
    if kind == "gpuh":
        return f"{value:,.1f}"
    if kind == "s":
        return f"{value:.2f} s"
    if kind == "x":
        return f"{value:.3f}"
    if isinstance(value, int) or (kind == "n" and float(value).is_integer()):
        return f"{int(value):,}"
    return f"{value:,.1f}" if kind == "n" else f"{value:,.3f}"


_ROWS = (
    ("jobs", "jobs", "n"),
    ("jobs_finished", "finished", "n"),
    ("makespan_s", "makespan", "h"),
    ("utilization", "utilization", "pct"),
    ("goodput", "goodput", "pct"),
    ("utilization_steady", "utilization, steady window", "pct"),
    ("goodput_steady", "goodput, steady window", "pct"),
    ("mfu", "cluster MFU", "pct"),
    ("ettr", "ETTR", "x"),
    ("contention_slowdown_mean", "contention slowdown mean", "x"),
    ("contention_slowdown_p95", "contention slowdown p95", "x"),
    ("degraded_slowdown_mean", "degraded-hardware slowdown mean", "x"),
    ("jct_mean_s", "JCT mean", "h"),
    ("jct_p50_s", "JCT p50", "h"),
    ("jct_p95_s", "JCT p95", "h"),
    ("jct_p99_s", "JCT p99", "h"),
    ("queue_mean_s", "queueing mean", "h"),
    ("queue_p50_s", "queueing p50", "h"),
    ("queue_p95_s", "queueing p95", "h"),
    ("largest_tp8_mean", "largest tp-8 job (mean GPUs)", "n"),
    ("fgd_unallocated_mean", "FGD unallocated (mean GPUs)", "n"),
    ("gpu_hours_lost", "GPU-hours lost", "gpuh"),
    ("jobs_interrupted", "jobs interrupted", "n"),
    ("failure_horizon_s", "failures drawn up to", "h"),
    ("elapsed_s", "simulation wall time", "s"),
)


def _cell(summary: dict[str, Any], key: str, kind: str) -> str:
    """A metric, with its 95 % confidence interval over seeds as ``± half-width`` when the
    summary is a mean over seeds (:func:`aggregate`)."""
    text = _fmt(summary[key], kind)
    interval = summary.get("ci95", {}).get(key)
    if interval is None or summary[key] is None:
        return text
    half = (interval[1] - interval[0]) / 2
    return text if half == 0 else f"{text} ± {_fmt(half, kind)}"


def print_summaries(summaries: dict[str, dict[str, Any]], console: Console) -> None:
    """One column per policy (and cluster), one row per metric."""
    first = next(iter(summaries.values()))
    table = Table(title=f"{first['workload']} on {first['cluster']}", title_justify="left")
    table.add_column("metric", style="bold")
    for label in summaries:
        table.add_column(label, justify="right")
    for key, name, kind in _ROWS:
        table.add_row(name, *(_cell(s, key, kind) for s in summaries.values()))
    causes = sorted({c for s in summaries.values() for c in s["gpu_hours_lost_by_cause"]})
    for cause in causes:
        table.add_row(
            f"  lost to {cause}",
            *(
                _fmt(s["gpu_hours_lost_by_cause"].get(cause, 0.0), "gpuh")
                for s in summaries.values()
            ),
        )
    # Traffic that leaves the host, per level (the union of the runs' levels, in order).
    levels = list(
        dict.fromkeys(lv for s in summaries.values() for lv in list(s["fabric_bytes_by_level"])[1:])
    )
    for level in levels:
        table.add_row(
            f"bytes via {level}",
            *(
                f"{s['fabric_bytes_by_level'].get(level, 0.0) / 1e15:,.2f} PB"
                for s in summaries.values()
            ),
        )
    console.print(table)
    sizes = Table(
        title="by job size (GPUs): JCT mean / p99 and mean queueing, hours", title_justify="left"
    )
    sizes.add_column("size", style="bold")
    for label in summaries:
        sizes.add_column(label, justify="right")
    classes = list(dict.fromkeys(c for s in summaries.values() for c in s["by_size"]))
    for size in classes:
        cells = []
        for s in summaries.values():
            row = s["by_size"].get(size)
            if row is None:
                cells.append("-")
                continue
            jct, queue = row["jct_s"], row["queue_s"]
            cells.append(
                f"{jct['mean'] / 3600:,.2f} / {jct['p99'] / 3600:,.2f} ({queue['mean'] / 3600:,.2f})"
            )
        sizes.add_row(size, *cells)
    console.print(sizes)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["name"])
    writer.writeheader()
    writer.writerows(rows)
    write_atomically(path, buffer.getvalue())


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def write_outputs(
    out: Path, results: dict[str, SimResult], summaries: dict[str, dict[str, Any]]
) -> None:
    """``summary.json``, and per run ``jobs-LABEL.csv/.json`` and ``bins-LABEL.csv/.json``."""
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "summary.json", json.dumps(summaries, indent=2) + "\n")
    for label, result in results.items():
        jobs, bins = metrics.job_rows(result), metrics.time_bins(result)
        _write_csv(out / f"jobs-{_safe(label)}.csv", jobs)
        _write_csv(out / f"bins-{_safe(label)}.csv", bins)
        write_atomically(out / f"jobs-{_safe(label)}.json", json.dumps(jobs) + "\n")
        write_atomically(out / f"bins-{_safe(label)}.json", json.dumps(bins) + "\n")


def write_pngs(
    out: Path, results: dict[str, SimResult], summaries: dict[str, dict[str, Any]]
) -> list[Path]:
    """``timeline.png`` (utilization and queue length over time per run), ``jct_cdf.png`` and
    ``goodput.png``. Needs matplotlib (the ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidJob("--png needs matplotlib: pip install 'gpuplace[plot]'") from None
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    written = []
    fig, (ax_u, ax_q) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for label, result in results.items():
        rows = metrics.time_bins(result)
        t = [r["t_start_s"] / 86_400 for r in rows]
        ax_u.plot(t, [100 * r["utilization"] for r in rows], label=label)
        ax_q.plot(t, [r["queued_jobs"] for r in rows], label=label)
    ax_u.set_ylabel("utilization (%)")
    ax_q.set_ylabel("queued jobs")
    ax_q.set_xlabel("time (days)")
    ax_u.legend(fontsize="small")
    fig.tight_layout()
    written.append(out / "timeline.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, result in results.items():
        jct = np.sort([r.jct_s for r in result.records if r.jct_s is not None])
        if jct.size:
            ax.plot(jct / 3600, np.arange(1, jct.size + 1) / jct.size, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.legend(fontsize="small")
    fig.tight_layout()
    written.append(out / "jct_cdf.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = list(summaries)
    ax.bar(labels, [100 * summaries[k]["goodput"] for k in labels], label="goodput")
    ax.plot(
        labels,
        [100 * summaries[k]["utilization"] for k in labels],
        "o",
        color="black",
        label="utilization",
    )
    ax.set_ylabel("% of GPU-time")
    ax.legend(fontsize="small")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    written.append(out / "goodput.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def write_report(
    out: Path,
    summaries: dict[str, dict[str, Any]],
    runs: dict[str, dict[str, Any]],
    plots: list[Path],
) -> list[Path]:
    """``report.html``, the page an operator reads (one column per policy: the tables of the
    terminal with 95 % confidence intervals over seeds, GPU-hours lost and interruptions by
    cause, fabric bytes per level, the plots embedded), and ``report.json`` with the same
    summaries (``ci95`` per metric when there are seeds) and every run's own summary."""
    import base64
    import html

    first = next(iter(summaries.values()))
    labels = list(summaries)

    def table(
        title: str, rows: list[tuple[str, list[str]]], columns: list[str] | None = None
    ) -> str:
        head = "".join(f"<th>{html.escape(label)}</th>" for label in columns or labels)
        body = "".join(
            f"<tr><th>{html.escape(name)}</th>"
            + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells)
            + "</tr>"
            for name, cells in rows
        )
        return f"<h2>{html.escape(title)}</h2><table><tr><th></th>{head}</tr>{body}</table>"

    def keyed(key: str, kind: str) -> list[tuple[str, list[str]]]:
        names = list(dict.fromkeys(k for s in summaries.values() for k in s[key]))
        rows = [(n, [_fmt(s[key].get(n, 0), kind) for s in summaries.values()]) for n in names]
        return rows or [("none", ["-" for _ in labels])]

    seeds = first.get("seeds")
    sections = [
        table(
            "Summary"
            + (f" (mean ± 95 % confidence interval over {len(seeds)} seeds)" if seeds else ""),
            [
                (name, [_cell(s, key, kind) for s in summaries.values()])
                for key, name, kind in _ROWS
            ],
        ),
        table("GPU-hours lost by cause", keyed("gpu_hours_lost_by_cause", "gpuh")),
        table("Interruptions by cause", keyed("interruptions_by_cause", "n")),
        table(
            "Bytes per fabric level (PB)",
            [
                (
                    level,
                    [
                        f"{s['fabric_bytes_by_level'].get(level, 0.0) / 1e15:,.3f}"
                        for s in summaries.values()
                    ],
                )
                for level in dict.fromkeys(
                    lv for s in summaries.values() for lv in s["fabric_bytes_by_level"]
                )
            ],
        ),
        table(
            "By job size (GPUs): JCT mean / p95 and mean queueing (h)",
            [
                (
                    size,
                    [
                        "-"
                        if size not in s["by_size"]
                        else f"{s['by_size'][size]['jct_s']['mean'] / 3600:,.2f} / "
                        f"{s['by_size'][size]['jct_s']['p95'] / 3600:,.2f} "
                        f"({s['by_size'][size]['queue_s']['mean'] / 3600:,.2f})"
                        for s in summaries.values()
                    ],
                )
                for size in dict.fromkeys(c for s in summaries.values() for c in s["by_size"])
            ],
        ),
    ]
    paired = paired_differences(runs)
    if paired:
        sections.insert(1, _paired_table(paired, table))
    window = first["steady_window_s"]
    notes = [
        f"Workload {first['workload']} ({round(first['jobs']):,} jobs) on {first['cluster']} "
        f"({first['gpus']:,} GPUs).",
        f"Steady window: the middle 80 % of the arrivals, {window[0] / 3600:,.1f} h to "
        f"{window[1] / 3600:,.1f} h; the whole-run figures include ramp-up and drain.",
        "Failures: "
        + (
            "none drawn."
            if first["failure_horizon_s"] is None
            else f"{first['failures']}, drawn up to {first['failure_horizon_s'] / 3600:,.1f} h"
            + ("" if first["failures_cover_run"] else " (before the run ended)")
            + f", response {first['response']}."
        ),
    ]
    images = (
        "".join(
            f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
            f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(p.stem)}'
            "</figcaption></figure>"
            for p in plots
        )
        or "<p>No plots: they need matplotlib (pip install 'gpuplace[plot]').</p>"
    )
    page = (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f"<title>gpuplace simulate: {html.escape(first['workload'])}</title><style>"
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
        "table{border-collapse:collapse;margin-bottom:1.5em}"
        "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}"
        "th:first-child{text-align:left}img{max-width:100%}</style></head><body>"
        f"<h1>{html.escape(first['workload'])} on {html.escape(first['cluster'])}</h1>"
        + "".join(f"<p>{html.escape(n)}</p>" for n in notes)
        + "".join(sections)
        + "<h2>Plots</h2>"
        + images
        + "</body></html>\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "report.html", page)
    document = {"policies": summaries, "paired_differences": paired, "runs": runs}
    write_atomically(out / "report.json", json.dumps(document, indent=2) + "\n")
    return [out / "report.html", out / "report.json"]


def _solvers(policy: str, compare: str | None) -> list[str]:
    names = [s.strip() for s in (compare or policy).split(",") if s.strip()]
    if not names:
        raise click.BadParameter("expected one or more solver names", param_hint="--compare")
    return list(dict.fromkeys(names))


@click.command("simulate")
@click.option(
    "--cluster",
    "-c",
    required=True,
    help="A preset, a topology file, or lingjun / pai (real clusters).",
)
@click.option("--nodes", type=int, default=None, help="Preset size in hosts.")
@click.option("--racks", type=int, default=None, help="Preset size in racks (gb200-nvl72).")
@param_option
@click.option(
    "--trace",
    "trace_spec",
    required=True,
    help="philly, openb, llm-mix (synthetic, --jobs of them) or a workload file (CSV/YAML).",
)
@click.option("--jobs", type=int, default=2000, show_default=True, help="Jobs of the llm-mix.")
@click.option(
    "--moe-share",
    type=click.FloatRange(0.0, 1.0),
    default=LLM_MOE_SHARE,
    show_default=True,
    help="llm-mix: share of the jobs that train a mixture of experts (ep, all-to-all).",
)
@click.option("--limit", type=int, default=None, help="Replay only the first N jobs.")
@click.option(
    "--min-duration",
    type=float,
    default=0.0,
    show_default=True,
    help="Philly: drop jobs shorter (s).",
)
@click.option(
    "--policy",
    default="greedy",
    show_default=True,
    help="Placement solver (see `gpuplace solvers`).",
)
@click.option(
    "--compare", default=None, help="Comma-separated solvers to compare (overrides --policy)."
)
@click.option(
    "--queue", type=click.Choice(POLICIES), default="fifo", show_default=True, help="Queue policy."
)
@click.option(
    "--estimate-factor",
    type=float,
    default=1.0,
    show_default=True,
    help="Backfill runtime estimate = factor x runtime, for jobs without one.",
)
@click.option(
    "--failures", default="none", show_default=True, help="llama3, none or a failures YAML file."
)
@click.option(
    "--response",
    type=click.Choice(RESPONSES),
    default="requeue",
    show_default=True,
    help="What a failed job does.",
)
@click.option(
    "--evacuate/--no-evacuate",
    default=False,
    show_default=True,
    help="Repair jobs off degraded links.",
)
@click.option(
    "--spares-per-leaf",
    type=int,
    default=0,
    show_default=True,
    help="GPUs reserved per leaf for repairs.",
)
@click.option(
    "--max-moves",
    type=int,
    default=0,
    show_default=True,
    help="Repair may move this many more ranks.",
)
@click.option(
    "--checkpoint-interval",
    type=float,
    default=1800.0,
    show_default=True,
    help="Seconds between checkpoints.",
)
@click.option(
    "--restart-cost",
    type=float,
    default=300.0,
    show_default=True,
    help="Mean seconds to restart a job (lognormal, --restart-sigma).",
)
@click.option(
    "--restart-sigma",
    type=float,
    default=0.5,
    show_default=True,
    help="Spread of restart times: sigma of their log (0: always --restart-cost).",
)
@click.option(
    "--checkpoint-store",
    default="remote",
    show_default=True,
    help="Where checkpoints are written (their write time stalls the job): remote (the "
    "topology's store so named, else an assumed one above the fabric), a store of the "
    "topology, or none (checkpoints cost nothing).",
)
@click.option(
    "--health-ingest",
    type=float,
    default=None,
    help="gpuplace health ingest runs every this many seconds: degraded hardware is seen "
    "(and evacuated with --evacuate) at its next run. Without it, after --detect-hours.",
)
@click.option(
    "--detect-hours",
    type=float,
    default=4.0,
    show_default=True,
    help="Without --health-ingest: hours until degraded hardware is noticed.",
)
@click.option(
    "--time-limit",
    type=float,
    default=0.01,
    show_default=True,
    help="Seconds per placement, for solvers that search (refine, cpsat, auto).",
)
@click.option(
    "--vs", "vs_cluster", default=None, help="What-if: the same workload on this cluster too."
)
@click.option("--seed", type=int, default=0, show_default=True)
@format_option
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for CSV/JSON (and PNG) outputs.",
)
@click.option(
    "--png",
    is_flag=True,
    help="Also write plots (needs the plot extra); into --out or the current directory.",
)
@click.option(
    "--seeds", type=int, default=1, show_default=True, help="Runs with seeds SEED .. SEED+N-1."
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="Run the runs in parallel on a local Ray with N CPUs (the ray extra).",
)
@click.option(
    "--address",
    default=None,
    help="Run the runs on the Ray cluster at this address (the ray extra).",
)
def simulate_cmd(
    cluster: str,
    nodes: int | None,
    racks: int | None,
    trace_spec: str,
    jobs: int,
    moe_share: float,
    limit: int | None,
    min_duration: float,
    policy: str,
    compare: str | None,
    queue: str,
    estimate_factor: float,
    failures: str,
    response: str,
    evacuate: bool,
    spares_per_leaf: int,
    max_moves: int,
    checkpoint_interval: float,
    restart_cost: float,
    restart_sigma: float,
    checkpoint_store: str,
    health_ingest: float | None,
    detect_hours: float,
    time_limit: float | None,
    vs_cluster: str | None,
    seed: int,
    fmt: str,
    out: str | None,
    png: bool,
    seeds: int,
    workers: int | None,
    address: str | None,
) -> None:
    """Simulate a cluster over time: replay a workload under placement policies."""
    if limit is not None and limit < 1:
        raise click.BadParameter("expected a number of jobs >= 1", param_hint="--limit")
    if seeds < 1:
        raise click.BadParameter("expected a number of seeds >= 1", param_hint="--seeds")
    if workers is not None and workers < 1:
        raise click.BadParameter("expected a number of workers >= 1", param_hint="--workers")
    params = cluster_params()
    topologies = [_cluster(cluster, nodes, racks, params)]
    if vs_cluster is not None:
        topologies.append(_what_if_cluster(vs_cluster, nodes, racks, topologies[0].num_gpus))
    failure_model = load_failures(failures)
    solver_names = _solvers(policy, compare)
    tasks: list[Task] = []
    topology_of: dict[str, Topology] = {}
    for index, topology in enumerate(topologies):
        build_topology = (
            _builder(cluster, nodes, racks, params)
            if index == 0
            else _builder_vs(vs_cluster, nodes, racks, topologies[0])
        )
        for run_seed in range(seed, seed + seeds):
            build_workload = _workload_builder(
                trace_spec,
                topologies[0].num_gpus,
                jobs,
                run_seed,
                min_duration,
                moe_share,
                limit,
                estimate_factor,
            )
            for solver in solver_names:
                config = SimConfig(
                    solver=solver,
                    policy=queue,
                    failures=failure_model,
                    response=response,
                    evacuate=evacuate,
                    max_moves=max_moves,
                    spares_per_leaf=spares_per_leaf,
                    checkpoint_interval_s=checkpoint_interval,
                    restart_s=restart_cost,
                    restart_sigma=restart_sigma,
                    checkpoint_store=None if checkpoint_store == "none" else checkpoint_store,
                    health_ingest_s=health_ingest,
                    detect_s=detect_hours * 3600.0,
                    estimate_factor=estimate_factor,
                    time_limit=time_limit,
                    seed=run_seed,
                )
                config.validate()
                label = solver if len(topologies) == 1 else f"{solver}@{topology.name}"
                if seeds > 1:
                    label += f" seed={run_seed}"
                # In a what-if both clusters' jobs are measured against the first cluster.
                build_reference = _builder(cluster, nodes, racks, params) if index else None
                tasks.append(Task(label, build_topology, build_workload, config, build_reference))
                topology_of[label] = topology
    err = Console(stderr=True, highlight=False)
    results: dict[str, SimResult] = {}
    summaries: dict[str, dict[str, Any]] = {}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=fmt == "json" or not err.is_terminal,
    ) as bar:
        if workers is not None or address is not None:
            overall = bar.add_task(f"{len(tasks)} runs on Ray", total=len(tasks))
            done = run_on_ray(
                tasks,
                workers=workers,
                address=address,
                progress=lambda n: bar.update(overall, completed=n),
            )
            for label, (result, summary) in done.items():
                results[label], summaries[label] = result, summary
        else:
            for task in tasks:
                topology = topology_of[task.label]
                workload = task.build_workload()
                row = bar.add_task(f"{task.label}: {len(workload):,} jobs", total=1.0)
                results[task.label] = simulate(
                    topology,
                    workload,
                    task.config,
                    progress=functools.partial(_advance, bar, row),
                    reference=topologies[0],
                )
                summaries[task.label] = metrics.summary(results[task.label])
    shown = aggregate(summaries) if seeds > 1 else summaries
    pngs = write_pngs(Path(out or "."), results, summaries) if png else []
    report: list[Path] = []
    if out is not None:
        write_outputs(Path(out), results, summaries)
        report = write_report(
            Path(out), shown, summaries, pngs or _quiet_pngs(Path(out), results, summaries)
        )
    if fmt == "json":
        emit(summaries)
        return
    console = Console(highlight=False, soft_wrap=True)
    print_summaries(shown, console)
    if out is not None:
        console.print(f"wrote summary.json, jobs-*.csv/json and bins-*.csv/json to {out}")
    for path in pngs + report:
        console.print(f"wrote {path}")


#: Metrics whose paired differences the report gives (seeds share their workload and failures,
#: so a policy's difference from the first is measured run by run).
_PAIRED = (
    "jct_mean_s",
    "jct_p95_s",
    "queue_mean_s",
    "utilization_steady",
    "goodput_steady",
    "ettr",
)


def paired_differences(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each policy minus the first, seed by seed, for the metrics of :data:`_PAIRED`: per
    policy and metric the mean difference and its 95 % confidence interval (a paired t
    interval: the runs of one seed share the workload and failures, so it is far tighter than
    the intervals of the two means). Empty with one policy or one seed."""
    by_seed: dict[str, dict[int, dict[str, Any]]] = {}
    for label, summary in runs.items():
        by_seed.setdefault(label.split(" seed=")[0], {})[summary["seed"]] = summary
    bases = list(by_seed)
    out: dict[str, dict[str, Any]] = {}
    if len(bases) < 2:
        return out
    first = by_seed[bases[0]]
    for base in bases[1:]:
        other, rows = by_seed[base], {}
        for key in _PAIRED:
            diffs = [
                other[seed][key] - first[seed][key]
                for seed in sorted(first.keys() & other.keys())
                if other[seed][key] is not None and first[seed][key] is not None
            ]
            interval = metrics.confidence_interval(diffs)
            if interval is not None:
                rows[key] = {"mean": sum(diffs) / len(diffs), "ci95": list(interval)}
        out[f"{base} - {bases[0]}"] = rows
    return out


def _paired_table(paired: dict[str, dict[str, Any]], table: Callable[..., str]) -> str:
    kinds = {key: kind for key, _, kind in _ROWS}
    names = {key: name for key, name, _ in _ROWS}
    rows = []
    for key in _PAIRED:
        cells = []
        for diffs in paired.values():
            if key not in diffs:
                cells.append("-")
                continue
            mean, (low, high) = diffs[key]["mean"], diffs[key]["ci95"]
            half, sign = (high - low) / 2, "+" if mean >= 0 else "-"
            if kinds[key] == "pct":  # a difference of shares is in percentage points
                cells.append(f"{sign}{100 * abs(mean):.2f} ± {100 * half:.2f} points")
            else:
                cells.append(f"{sign}{_fmt(abs(mean), kinds[key])} ± {_fmt(half, kinds[key])}")
        rows.append((names[key], cells))
    return table("Paired differences, seed by seed (mean ± 95 % interval)", rows, list(paired))


def _quiet_pngs(
    out: Path, results: dict[str, SimResult], summaries: dict[str, dict[str, Any]]
) -> list[Path]:
    """The plots for the report when matplotlib is installed (none, and no error, without)."""
    try:
        return write_pngs(out, results, summaries)
    except InvalidJob:
        return []


def _advance(bar: Progress, row: TaskID, fraction: float) -> None:
    bar.update(row, completed=fraction)


def aggregate(summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Runs of several seeds -> one summary per policy (and cluster): the mean of each metric."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for label, summary in summaries.items():
        groups.setdefault(label.split(" seed=")[0], []).append(summary)
    out = {}
    for base, members in groups.items():
        merged = dict(members[0])
        merged["seeds"] = [m["seed"] for m in members]
        merged["ci95"] = {}
        for key, _, _ in _ROWS:
            values = [m[key] for m in members if m[key] is not None]
            merged[key] = sum(values) / len(values) if values else None
            interval = metrics.confidence_interval(values) if key != "elapsed_s" else None
            if interval is not None:
                merged["ci95"][key] = list(interval)
        for key in ("gpu_hours_lost_by_cause", "fabric_bytes_by_level", "interruptions_by_cause"):
            names = list(dict.fromkeys(k for m in members for k in m[key]))
            merged[key] = {
                k: sum(m[key].get(k, 0.0) for m in members) / len(members) for k in names
            }
        by_size: dict[str, Any] = {}
        for size in dict.fromkeys(c for m in members for c in m["by_size"]):
            rows = [m["by_size"][size] for m in members if size in m["by_size"]]
            by_size[size] = {
                key: {stat: sum(r[key][stat] for r in rows) / len(rows) for stat in rows[0][key]}
                for key in ("jct_s", "queue_s")
            }
        merged["by_size"] = by_size
        out[f"{base} (mean of {len(members)} seeds)"] = merged
    return out


def _builder(
    spec: str, nodes: int | None, racks: int | None, params: tuple[str, ...]
) -> Callable[[], Topology]:
    return lambda: _cluster(spec, nodes, racks, params)


def _builder_vs(
    spec: str | None, nodes: int | None, racks: int | None, like: Topology
) -> Callable[[], Topology]:
    assert spec is not None
    gpus = like.num_gpus  # the int, not the topology, travels to a Ray worker
    return lambda: _what_if_cluster(spec, nodes, racks, gpus)


def _workload_builder(
    spec: str,
    cluster_gpus: int,
    jobs: int,
    seed: int,
    min_duration: float,
    moe_share: float,
    limit: int | None,
    estimate_factor: float,
) -> Callable[[], Workload]:
    """The workload of a run; the same on both clusters of a what-if (sized for the first)."""

    def build() -> Workload:
        workload = _workload(spec, cluster_gpus, jobs, seed, min_duration, moe_share)
        if limit is not None:
            workload = workload.head(limit)
        return with_estimates(workload, estimate_factor)

    return build
