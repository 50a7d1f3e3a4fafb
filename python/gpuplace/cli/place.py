"""``gpuplace place``: place a job, optionally allocating it in a state file and writing it
out for a scheduler."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import click

from gpuplace._util.documents import exclusive_lock, write_atomically
from gpuplace.cli.common import (
    emit,
    format_option,
    out,
    print_placement,
    state_or_cluster,
    with_optional_cluster,
)
from gpuplace.cli.reports import print_fabric
from gpuplace.cluster.fabric import collisions
from gpuplace.io import writers
from gpuplace.model.job import Job
from gpuplace.placement.compare import compare_to_baseline, compare_to_peers
from gpuplace.placement.place import place
from gpuplace.placement.result import Placement
from gpuplace.placement.within_policy import apply_preemption

__all__ = ["EMITTERS", "place_cmd"]


@click.command("place")
@with_optional_cluster
@click.option(
    "--job",
    "-j",
    "job_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Job file (YAML/JSON).",
)
@click.option(
    "--queued",
    "queued",
    default=None,
    metavar="NAME",
    help="Instead of --job: the job of that name waiting in the --state file's queue "
    "(`gpuplace requeue`); it leaves the queue when placed.",
)
@click.option("--solver", "-s", default="greedy", show_default=True, help="See `gpuplace solvers`.")
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="State file: read if present (it names its cluster, so --cluster is not needed), and "
    "the placement is allocated in it (changed all or nothing, written atomically).",
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
@format_option
def place_cmd(
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    job_path: str | None,
    queued: str | None,
    solver: str,
    state_path: str | None,
    name: str | None,
    emits: tuple[str, ...],
    seed: int,
    time_limit: float | None,
    preempt: bool,
    fmt: str,
) -> None:
    """Place a job on a cluster; with --state, allocate it there (the state file remembers its
    cluster, so `--state` alone names it)."""
    targets = [_emit_target(e) for e in emits]
    if (job_path is None) == (queued is None):
        raise click.UsageError("give --job FILE or --queued NAME (one of them)")
    if queued is not None and state_path is None:
        raise click.UsageError("--queued takes a job from the queue of a --state file")
    job = Job.load(job_path) if job_path is not None else None
    lock = exclusive_lock(state_path) if state_path is not None else contextlib.nullcontext()
    with lock:
        state = state_or_cluster(state_path, cluster, nodes, racks)
        if job is None:
            job = state.dequeue(str(queued))
        if name is not None:
            job = dataclasses.replace(job, name=name)
        placement = place(state, job, solver, seed=seed, time_limit=time_limit, preempt=preempt)
        comparison = compare_to_baseline(state, placement)
        comparisons = [comparison] + [
            c for c in compare_to_peers(state, placement) if c["solver"] != comparison["solver"]
        ]
        # The flows crossing each fabric level among the running jobs', before allocating.
        fabric = collisions(state, placement.job, placement.gpus)
        # Render every output before changing anything, so an output that cannot be written
        # for this placement (torchrun with interleaved hosts) leaves the state file as it was.
        rendered = [(path, EMITTERS[kind](placement)) for kind, path in targets]
        preempted: list[str] = []
        if state_path is not None:
            preempted = apply_preemption(state, placement)
            state.save(state_path)
    for path, text in rendered:
        write_atomically(path, text if text.endswith("\n") else text + "\n")
    topology = state.topology
    if fmt == "json":
        emit(
            {
                **placement.to_dict(),
                "cluster": topology.name,
                "comparison": comparison,
                "comparisons": comparisons,
                "fabric": fabric.to_dict(),
                "state": state_path,
                "allocated": state_path is not None,
                "preempted": preempted,
                "free_gpus": state.free_gpus if state_path is not None else None,
                "total_gpus": topology.num_gpus,
            }
        )
        return
    print_placement(placement, comparisons, fabric)
    if state_path is not None:
        gone = f"; preempted {', '.join(preempted)}" if preempted else ""
        out.print(
            f"allocated in {state_path}: {state.free_gpus} of {topology.num_gpus} GPUs free{gone}"
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
