"""``gpuplace calibrate``: fit a cluster's bandwidths and latencies to measured collectives.

``gpuplace calibrate --cluster h100-superpod --nodes 8 --nccl-tests run.txt ... -o cal.yaml``
reads nccl-tests outputs (and Pollux-format placement tables with ``--placements TABLE.csv
--job JOB.yaml``), fits the topology with :func:`gpuplace.calibrate`, prints each sample's
error before and after, and writes the calibrated topology.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from gpuplace.calibrate import calibrate, sample_errors
from gpuplace.cli.common import load_cluster
from gpuplace.errors import InvalidJob
from gpuplace.io import read_nccl_tests, read_placement_table
from gpuplace.model.job import Job

_out = Console(highlight=False, soft_wrap=True)


@click.command("calibrate")
@click.option("--cluster", "-c", required=True, help="A preset name or a topology file.")
@click.option("--nodes", type=int, default=None, help="Preset size in hosts.")
@click.option("--racks", type=int, default=None, help="Preset size in racks (gb200-nvl72).")
@click.option(
    "--nccl-tests",
    "nccl_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="nccl-tests output (all_reduce_perf, all_gather_perf, ...). Repeatable.",
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
    "--output", "-o", required=True, type=click.Path(dir_okay=False), help="Topology to write."
)
def calibrate_cmd(
    cluster: str,
    nodes: int | None,
    racks: int | None,
    nccl_files: tuple[str, ...],
    min_bytes: int,
    tables: tuple[str, ...],
    job_path: str | None,
    gpus_per_host: int,
    output: str,
) -> None:
    """Fit the cluster's per-level bandwidth and latency (and NVLS bandwidth, and host-count
    factors where the data demand them) to measurements; print each sample's error."""

    topology = load_cluster(cluster, nodes, racks)
    samples = []
    names = []
    for path in nccl_files:
        run = read_nccl_tests(path)
        for job, gpus, seconds in run.samples(topology, min_bytes=min_bytes):
            samples.append((job, gpus, seconds))
            names.append(
                f"{Path(path).name} {job.communication['dp' if 'dp' in job.communication else 'pp'].bytes:.3g} B"
            )
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
    fitted = calibrate(topology, samples)
    after = sample_errors(fitted, samples)
    table = Table("sample", "measured ms", "error before", "error after", title="calibration")
    for name, (_, _, seconds), b, a in zip(names, samples, before, after, strict=True):
        table.add_row(name, f"{seconds * 1e3:.3f}", f"{100 * b:+.1f} %", f"{100 * a:+.1f} %")
    _out.print(table)
    fitted.save(output)
    _out.print(f"wrote {output}")
