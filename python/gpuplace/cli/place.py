"""``gpuplace place``: place a job, optionally allocating it in a state file and writing it
out for a scheduler."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import click

from gpuplace._util.documents import exclusive_lock, write_atomically
from gpuplace.cli.common import load_cluster, out, print_placement, with_cluster
from gpuplace.cli.reports import print_fabric
from gpuplace.cluster.state import ClusterState
from gpuplace.io import writers
from gpuplace.model.job import Job
from gpuplace.placement.compare import compare_to_baseline
from gpuplace.placement.place import place
from gpuplace.placement.result import Placement
from gpuplace.placement.within_policy import apply_preemption

__all__ = ["EMITTERS", "place_cmd"]


@click.command("place")
@with_cluster
@click.option(
    "--job",
    "-j",
    "job_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Job file (YAML/JSON).",
)
@click.option("--solver", "-s", default="greedy", show_default=True, help="See `gpuplace solvers`.")
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="State file: read if present, and the placement is allocated in it (written atomically).",
)
@click.option(
    "--name",
    default=None,
    help="Job name to use instead of the file's (to place one file several times).",
)
@click.option(
    "--emit",
    "emits",
    multiple=True,
    metavar="FORMAT=PATH",
    help="Also write the placement for a scheduler: hostlist, cuda (CUDA_VISIBLE_DEVICES per "
    "host), ranks (CSV rank table), rankfile / hostfile (Open MPI), torchrun, k8s (node "
    "affinity JSON). Repeatable.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--time-limit", type=float, default=None, help="Seconds, for solvers that search.")
@click.option(
    "--preempt",
    is_flag=True,
    help="When nothing fits, preempt lower-priority preemptible jobs (with --state, applied "
    "together with the allocation, all or nothing).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
def place_cmd(
    cluster: str,
    nodes: int | None,
    racks: int | None,
    job_path: str,
    solver: str,
    state_path: str | None,
    name: str | None,
    emits: tuple[str, ...],
    seed: int,
    time_limit: float | None,
    preempt: bool,
    fmt: str,
) -> None:
    """Place a job on a cluster."""
    targets = [_emit_target(e) for e in emits]
    topology = load_cluster(cluster, nodes, racks)
    job = Job.load(job_path)
    if name is not None:
        job = dataclasses.replace(job, name=name)
    lock = exclusive_lock(state_path) if state_path is not None else contextlib.nullcontext()
    with lock:
        if state_path is not None and Path(state_path).exists():
            state = ClusterState.load(topology, state_path)
        else:
            state = ClusterState(topology)
        placement = place(state, job, solver, seed=seed, time_limit=time_limit, preempt=preempt)
        comparison = compare_to_baseline(state, placement)
        # Render every output before changing anything, so an output that cannot be written
        # for this placement (torchrun with interleaved hosts) leaves the state file as it was.
        rendered = [(path, EMITTERS[kind](placement)) for kind, path in targets]
        if state_path is not None:
            apply_preemption(state, placement)
            state.save(state_path)
    for path, text in rendered:
        write_atomically(path, text if text.endswith("\n") else text + "\n")
    if fmt == "json":
        click.echo(json.dumps({**placement.to_dict(), "comparison": comparison}))
    else:
        print_placement(placement, comparison)
        if state_path is not None:
            out.print(
                f"allocated in {state_path}: {state.free_gpus} of {topology.num_gpus} GPUs free"
            )
            print_fabric(state, out)


#: ``--emit`` formats and the writer of each.
EMITTERS: dict[str, Callable[[Placement], str]] = {
    "hostlist": writers.slurm_hostlist,
    "cuda": writers.write_cuda_visible_devices,
    "ranks": writers.write_rank_table,
    "rankfile": writers.write_openmpi_rankfile,
    "hostfile": writers.write_openmpi_hostfile,
    "torchrun": writers.write_torchrun_commands,
    "k8s": writers.write_k8s_node_affinity,
}


def _emit_target(spec: str) -> tuple[str, str]:
    kind, sep, path = spec.partition("=")
    if not sep or not path or kind not in EMITTERS:
        raise click.BadParameter(
            f"expected FORMAT=PATH with FORMAT one of {', '.join(EMITTERS)}, got {spec!r}",
            param_hint="--emit",
        )
    return kind, path
