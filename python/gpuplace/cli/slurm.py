"""``gpuplace slurm``: read a live Slurm cluster, and submit jobs on gpuplace's nodes.

``slurm sync`` writes a state (and its topology) from ``sinfo --json``, ``squeue --json`` and
``scontrol show topology``; ``slurm submit`` places a job and runs ``sbatch`` pinned to the
chosen nodes with ``SLURM_HOSTFILE`` in rank order; ``slurm pick`` prints the nodes for a
whole-node request from a state file, for the ``job_submit/lua`` example in contrib/slurm/.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gpuplace._util.documents import exclusive_lock
from gpuplace._util.hostlist import compress
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import InvalidState
from gpuplace.integrations import slurm as sl
from gpuplace.model.job import Job
from gpuplace.model.topology import Topology
from gpuplace.placement.place import place

__all__ = ["slurm"]

_file = click.Path(exists=True, dir_okay=False)


@click.group("slurm")
def slurm() -> None:
    """Slurm: sync the cluster's state, submit jobs on gpuplace's nodes."""


def _live_or_files(
    sinfo: str | None,
    squeue: str | None,
    topology: str | None,
    name: str,
    nvidia_smi: str | None,
    host_type: str | None,
) -> ClusterState:
    """The state from the given files, running the Slurm commands for those not given."""
    return sl.sync(
        sinfo if sinfo is not None else sl.run_json("sinfo"),
        squeue if squeue is not None else sl.run_json("squeue"),
        topology if topology is not None else _StringSource(sl.show_topology()),
        name=name,
        nvidia_smi=nvidia_smi,
        host_type=host_type,
    )


class _StringSource:
    """Text that read_topology reads as ``scontrol show topology``."""

    def __init__(self, text: str):
        self.text = text

    def read(self) -> str:
        return self.text


_sources = [
    click.option("--sinfo", type=_file, help="`sinfo --json` saved to a file (default: run it)."),
    click.option("--squeue", type=_file, help="`squeue --json` saved to a file (default: run it)."),
    click.option(
        "--topology",
        "topology_path",
        type=_file,
        help="topology.conf (or saved `scontrol show topology`); default: run scontrol.",
    ),
    click.option("--nvidia-smi", type=_file, help="`nvidia-smi topo -m` of one host."),
    click.option(
        "--host-type", default=None, help="A preset host type instead (dgx-h100, gb200-tray, ...)."
    ),
    click.option("--name", default="slurm", show_default=True, help="Cluster name."),
]


def _with_sources(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_sources):
        func = option(func)
    return func


@slurm.command("sync")
@_with_sources
@click.option(
    "--output",
    "-o",
    "state_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="State file to write (its topology goes beside it, as <stem>.topology.yaml).",
)
def sync_cmd(
    sinfo: str | None,
    squeue: str | None,
    topology_path: str | None,
    nvidia_smi: str | None,
    host_type: str | None,
    name: str,
    state_path: str,
) -> None:
    """Read the live cluster (nodes, GPUs, jobs, drained and down nodes, switch tree) into a
    state file."""
    state = _live_or_files(sinfo, squeue, topology_path, name, nvidia_smi, host_type)
    out = Path(state_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    topo_path = out.with_name(out.stem + ".topology.yaml")
    with exclusive_lock(state_path):
        state.topology.save(topo_path)
        state.topology.origin = {"file": str(topo_path)}
        state.save(out)
    health = state.unhealthy()
    click.echo(
        f"wrote {out} and {topo_path}: {len(state.topology.hosts)} nodes, "
        f"{state.free_gpus} of {state.topology.num_gpus} GPUs free, {len(state.jobs)} jobs, "
        f"{len(health)} nodes out of service"
    )


def _load_state(state_path: str) -> ClusterState:
    cluster = ClusterState.cluster_of(state_path)
    if not cluster or "file" not in cluster:
        raise InvalidState(f"{state_path}: not a state written by `gpuplace slurm sync`")
    return ClusterState.load(Topology.load(cluster["file"]), state_path)


@slurm.command(
    "submit", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.option("--job", "-j", "job_path", required=True, type=_file, help="Job file (YAML/JSON).")
@click.option(
    "--state",
    "state_path",
    type=_file,
    help="A state from `slurm sync` (default: read the live cluster now).",
)
@_with_sources
@click.option("--partition", "-p", default=None, help="Slurm partition.")
@click.option("--solver", "-s", default="greedy", show_default=True)
@click.option(
    "--dir",
    "directory",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the hostfile and rank table go (must be visible on the nodes).",
)
@click.option("--dry-run", is_flag=True, help="Print the exact command and files; submit nothing.")
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
def submit_cmd(
    job_path: str,
    state_path: str | None,
    sinfo: str | None,
    squeue: str | None,
    topology_path: str | None,
    nvidia_smi: str | None,
    host_type: str | None,
    name: str,
    partition: str | None,
    solver: str,
    directory: str,
    dry_run: bool,
    sbatch_args: tuple[str, ...],
) -> None:
    """Place a job and submit it with sbatch on exactly gpuplace's nodes:
    `gpuplace slurm submit --job job.yaml -- [SBATCH_ARGS...] script.sh`.

    Ranks land in gpuplace's order when the script runs `srun` (SLURM_HOSTFILE and
    --distribution=arbitrary are set). Where ranks do not fill their nodes,
    GPUPLACE_PER_RANK_CUDA=1 is set and each rank takes its CUDA_VISIBLE_DEVICES from the
    rank table named by GPUPLACE_RANKS (`rank host device` per line)."""
    if state_path is not None:
        state = _load_state(state_path)
    else:
        state = _live_or_files(sinfo, squeue, topology_path, name, nvidia_smi, host_type)
    job = Job.load(job_path)
    placement = place(state, job, solver)
    sub = sl.submission(placement, sbatch_args, directory=directory, partition=partition)
    if dry_run:
        click.echo(sub.render(), nl=False)
        return
    job_id = sl.submit(sub)
    click.echo(f"submitted batch job {job_id} on {compress(sub.nodes)} (ranks in gpuplace order)")


@slurm.command("pick")
@click.option("--state", "state_path", required=True, type=_file, help="From `slurm sync`.")
@click.option("--nodes", "-N", "node_count", type=click.IntRange(1), help="Whole nodes wanted.")
@click.option("--job", "-j", "job_path", type=_file, help="Or a job file.")
@click.option("--solver", "-s", default="greedy", show_default=True)
def pick_cmd(state_path: str, node_count: int | None, job_path: str | None, solver: str) -> None:
    """Print the nodes gpuplace picks (a hostlist in rank order), for a job_submit plugin."""
    state = _load_state(state_path)
    if (node_count is None) == (job_path is None):
        raise click.UsageError("give --nodes or --job")
    if job_path is not None:
        job = Job.load(job_path)
    else:
        # One tp group per node keeps the request to whole nodes.
        gpus = {state.topology.node_types[t].gpus for t in state.topology.host_types}
        job = Job(name="slurm-pick", tp=max(gpus), dp=int(node_count or 0))
    placement = place(state, job, solver)
    click.echo(",".join(placement.nodes))
