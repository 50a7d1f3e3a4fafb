"""``gpuplace calibrate``: fit a cluster's bandwidths and latencies to measured collectives.

``gpuplace calibrate --cluster h100-superpod --nodes 8 --nccl-tests run.txt ... -o cal.yaml``
reads nccl-tests outputs (and Pollux-format placement tables with ``--placements TABLE.csv
--job JOB.yaml``), fits the topology with :func:`gpuplace.calibrate.calibration`, prints every
fitted value next to the old one, every routing tried on the levels the samples cross with the
error of its fit, and each sample's error before and after (``--format json``: the same as one
object), and writes the calibrated topology.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Column, Table

from gpuplace.calibrate import calibration, fitted_parameters, sample_errors
from gpuplace.cli.common import emit, format_option, load_cluster, with_cluster
from gpuplace.errors import InvalidJob
from gpuplace.io import read_nccl_tests, read_placement_table
from gpuplace.model.job import Job

_out = Console(highlight=False, soft_wrap=True)


@click.command("calibrate")
@with_cluster
@click.option(
    "--nccl-tests",
    "nccl_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="nccl-tests output (all_reduce_perf, all_gather_perf, ...). Repeatable.",
)
@click.option(
    "--ranks",
    "ranks",
    multiple=True,
    type=click.IntRange(min=2),
    help="Ranks of each --nccl-tests run, in the same order (for outputs whose header does "
    "not list them all). Repeatable: give one per --nccl-tests file or none.",
)
@click.option(
    "--min-bytes",
    type=int,
    default=1 << 20,
    show_default=True,
    help="Ignore nccl-tests rows smaller than this.",
)
@click.option(
    "--placements",
    "tables",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="A Pollux-format placement table (placement,local_bsz,step_time,sync_time). Repeatable.",
)
@click.option(
    "--job",
    "job_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="The job whose dp all-reduce the placement tables measured.",
)
@click.option(
    "--gpus-per-host",
    type=int,
    default=4,
    show_default=True,
    help="GPUs per host of the placement tables' cluster.",
)
@click.option(
    "--fit-routing",
    type=click.Choice(["auto", "yes", "no"]),
    default="auto",
    show_default=True,
    help="Fit the routing and queue pairs of the levels the samples cross: auto keeps a "
    "routing other than the cluster's only when it lowers the rms log error by 10 %.",
)
@click.option(
    "--output", "-o", required=True, type=click.Path(dir_okay=False), help="Topology to write."
)
@format_option
def calibrate_cmd(
    cluster: str,
    nodes: int | None,
    racks: int | None,
    nccl_files: tuple[str, ...],
    ranks: tuple[int, ...],
    min_bytes: int,
    tables: tuple[str, ...],
    job_path: str | None,
    gpus_per_host: int,
    fit_routing: str,
    output: str,
    fmt: str,
) -> None:
    """Fit the cluster's per-level bandwidth and latency (and NVLS bandwidth, algorithm
    efficiencies, the routing of the levels the samples cross, and host-count factors where
    the data demand them) to measurements; print every fitted value next to the old one,
    every routing tried, and each sample's error before and after."""

    topology = load_cluster(cluster, nodes, racks)
    samples = []
    names = []
    if ranks and len(ranks) != len(nccl_files):
        raise InvalidJob(
            f"--ranks: expected one per --nccl-tests file ({len(nccl_files)}), got {len(ranks)}"
        )
    for i, path in enumerate(nccl_files):
        run = read_nccl_tests(path, ranks=ranks[i] if ranks else None)
        for job, gpus, seconds in run.samples(topology, min_bytes=min_bytes):
            samples.append((job, gpus, seconds))
            dims = job.communication["dp" if "dp" in job.communication else "pp"]
            names.append(f"{Path(path).name} {dims.kind} {dims.bytes:.4g} B on {len(gpus)} GPUs")
    if tables:
        if job_path is None:
            raise InvalidJob("--placements needs --job (the job whose gradients were synced)")
        job = Job.load(job_path)
        for path in tables:
            for sample in read_placement_table(path, job, gpus_per_host=gpus_per_host):
                samples.append(sample)
                names.append(f"{Path(path).name} {sample[0].name}")
    if not samples:
        raise InvalidJob("give at least one --nccl-tests file or --placements table")
    before = sample_errors(topology, samples)
    routing: bool | str = {"yes": True, "no": False}.get(fit_routing, "auto")
    result = calibration(topology, samples, routing=routing)
    fitted = result.topology
    after = sample_errors(fitted, samples)
    fitted.save(output)
    parameters = fitted_parameters(topology, fitted)
    rows: list[dict[str, Any]] = [
        {
            "sample": name,
            "gpus": len(gpus),
            "measured_seconds": seconds,
            "error_before": b,
            "error_after": a,
        }
        for name, (_, gpus, seconds), b, a in zip(names, samples, before, after, strict=True)
    ]
    rms = {
        "before": _rms(before),
        "after": _rms(after),
    }
    if fmt == "json":
        emit(
            {
                "output": output,
                "parameters": parameters,
                "routing": [t.to_dict() for t in result.routing],
                "samples": rows,
                "rms_log_error": rms,
            }
        )
        return
    table = Table(
        "parameter", "before", "after", "change", title="fitted values", title_justify="left"
    )
    for p in parameters:
        table.add_row(
            p["parameter"],
            _value(p["before"]),
            _value(p["after"]),
            _change(p["before"], p["after"]) if p["changed"] else "unchanged",
        )
    _out.print(table)
    if result.routing:
        # Each routing's fit: the error left when every other parameter is refitted with it.
        table = Table(
            "level",
            "routing",
            "QPs",
            "rms log error",
            "kept",
            title="routing fitted (every other parameter refitted for each)",
            title_justify="left",
        )
        for t in result.routing:
            table.add_row(
                t.level,
                t.routing,
                str(t.qps_per_connection),
                f"{t.rms_log_error:.3f}",
                "yes" if t.chosen else "",
            )
        _out.print(table)
    # Sample names are file name, collective, size and GPUs: folded, never cut short.
    table = Table(
        Column("sample", overflow="fold"),
        "measured ms",
        "error before",
        "error after",
        title="residuals per sample",
        title_justify="left",
    )
    for r in rows:
        table.add_row(
            r["sample"],
            f"{r['measured_seconds'] * 1e3:.3f}",
            f"{100 * r['error_before']:+.1f} %",
            f"{100 * r['error_after']:+.1f} %",
        )
    # Wide enough for the longest sample name on one line (rich caps a print at the console's
    # width, 80 columns when the output is not a terminal).
    longest = max(len(r["sample"]) for r in rows)
    Console(highlight=False, soft_wrap=True, width=max(_out.width, longest + 50)).print(table)
    _out.print(
        f"rms log error {rms['before']:.3f} before, {rms['after']:.3f} after, over "
        f"{len(rows)} samples; wrote {output}"
    )


def _rms(errors: list[float]) -> float:
    """Root mean square of the log errors (log(predicted / measured))."""
    return math.sqrt(sum(math.log1p(e) ** 2 for e in errors) / len(errors)) if errors else 0.0


def _value(v: float | str | None) -> str:
    return "-" if v is None else v if isinstance(v, str) else f"{v:.4g}"


def _change(a: float | str | None, b: float | str | None) -> str:
    if isinstance(a, str) or isinstance(b, str):
        return "changed"
    if a is None or b is None or a == 0:
        return "set" if a is None else "removed"
    return f"{100 * (b / a - 1):+.1f} %"
