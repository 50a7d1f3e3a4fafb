"""``gpuplace slurm``: read a live Slurm cluster, and submit jobs on gpuplace's nodes.

``slurm sync`` writes a state (and its topology) from ``sinfo --json``, ``squeue --json`` and
``scontrol show topology``; ``slurm submit`` places a job and runs ``sbatch`` pinned to the
chosen nodes with ``SLURM_HOSTFILE`` in rank order; ``slurm pick`` prints the nodes for a
whole-node request from a state file (the ``job_submit/lua`` plugin in contrib/slurm/ asks the
live service, ``gpuplace serve``, instead).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gpuplace._util.documents import exclusive_lock, parse_json, read_text, write_atomically
from gpuplace._util.hostlist import compress
from gpuplace.cli.common import emit, format_option
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import InvalidState
from gpuplace.integrations import slurm as sl
from gpuplace.integrations import slurmctld as ctld
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
    gpus_per_node: int | None,
    slurm: ctld.Slurmctld,
) -> ClusterState:
    """The state from the given files, running the Slurm commands for those not given."""
    return sl.sync(
        sinfo if sinfo is not None else slurm.json("sinfo"),
        squeue if squeue is not None else slurm.json("squeue"),
        topology if topology is not None else _StringSource(slurm.topology()),
        name=name,
        nvidia_smi=nvidia_smi,
        host_type=host_type,
        gpus_per_node=gpus_per_node,
    )


def _view_path(state_path: str | Path) -> Path:
    out = Path(state_path)
    return out.with_name(out.stem + ".slurm.json")


class _StringSource:
    """Text that read_topology reads as ``scontrol show topology``."""

    def __init__(self, text: str):
        self.text = text

    def read(self, size: int = -1) -> str:
        return self.text if size < 0 else self.text[:size]


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
    click.option(
        "--gpus-per-node",
        type=click.IntRange(1),
        default=None,
        help="GPUs per node where Slurm has no gpu GRES (whole-node clusters).",
    ),
    click.option("--name", default="slurm", show_default=True, help="Cluster name."),
    click.option(
        "--clusters",
        "-M",
        "cluster_name",
        default=None,
        help="Slurm cluster to talk to (-M, a cluster slurmdbd knows).",
    ),
    click.option(
        "--slurm-conf",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="slurm.conf of the cluster (another cluster on this host); default: SLURM_CONF.",
    ),
    click.option(
        "--slurm-timeout",
        type=click.FloatRange(0.5),
        default=ctld.DEFAULT_TIMEOUT,
        show_default=True,
        help="Seconds before a Slurm command counts as slurmctld not answering.",
    ),
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
    help="State file to write (its topology goes beside it, as <stem>.topology.yaml, and "
    "Slurm's partitions and reservations as <stem>.slurm.json).",
)
@format_option
def sync_cmd(
    sinfo: str | None,
    squeue: str | None,
    topology_path: str | None,
    nvidia_smi: str | None,
    host_type: str | None,
    gpus_per_node: int | None,
    name: str,
    cluster_name: str | None,
    slurm_conf: str | None,
    slurm_timeout: float,
    state_path: str,
    fmt: str,
) -> None:
    """Read the live cluster (nodes, GPUs, jobs, drained and down nodes, switch tree,
    partitions and reservations) into a state file."""
    slurm = ctld.Slurmctld(conf=slurm_conf, cluster=cluster_name, timeout=slurm_timeout)
    state = _live_or_files(
        sinfo, squeue, topology_path, name, nvidia_smi, host_type, gpus_per_node, slurm
    )
    view = _read_view(slurm, sinfo)
    out = Path(state_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    topo_path = out.with_name(out.stem + ".topology.yaml")
    with exclusive_lock(state_path):
        state.topology.save(topo_path)
        state.topology.origin = {"file": str(topo_path)}
        state.save(out)
        write_atomically(_view_path(out), json.dumps(view.to_dict(), indent=1) + "\n")
    health = state.unhealthy()
    if fmt == "json":
        emit(
            {
                "state": str(out),
                "topology": str(topo_path),
                "slurm_view": str(_view_path(out)),
                "nodes": len(state.topology.hosts),
                "gpus": state.topology.num_gpus,
                "free_gpus": state.free_gpus,
                "jobs": sorted(state.jobs),
                "out_of_service": len(health),
                "gres": view.gres,
                "partitions": [p.name for p in view.partitions],
                "reservations": [r.name for r in view.reservations],
            }
        )
        return
    click.echo(
        f"wrote {out} and {topo_path}: {len(state.topology.hosts)} nodes, "
        f"{state.free_gpus} of {state.topology.num_gpus} GPUs free, {len(state.jobs)} jobs, "
        f"{len(health)} nodes out of service" + ("" if view.gres else " (no gpu GRES: whole nodes)")
    )


def _read_view(slurm: ctld.Slurmctld, sinfo: str | None) -> ctld.SlurmView:
    """Slurm's nodes, partitions and reservations: live, or the nodes of a saved ``sinfo``
    (no partitions or reservations are known then)."""
    if sinfo is None:
        return ctld.SlurmView.read(slurm)
    nodes = sl.read_sinfo(sinfo)
    return ctld.SlurmView(nodes, [], [], gres=any(n.gpus for n in nodes))


def _load_state(state_path: str) -> ClusterState:
    cluster = ClusterState.cluster_of(state_path)
    if not cluster or "file" not in cluster:
        raise InvalidState(f"{state_path}: not a state written by `gpuplace slurm sync`")
    return ClusterState.load(Topology.load(cluster["file"]), state_path)


def _load_view(state_path: str) -> ctld.SlurmView | None:
    path = _view_path(state_path)
    if not path.exists():
        return None
    doc = parse_json(read_text(path, InvalidState), path, InvalidState)
    return ctld.SlurmView.from_dict(doc, str(path))


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
@format_option
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
def submit_cmd(
    job_path: str,
    state_path: str | None,
    sinfo: str | None,
    squeue: str | None,
    topology_path: str | None,
    nvidia_smi: str | None,
    host_type: str | None,
    gpus_per_node: int | None,
    name: str,
    cluster_name: str | None,
    slurm_conf: str | None,
    slurm_timeout: float,
    partition: str | None,
    solver: str,
    directory: str,
    dry_run: bool,
    fmt: str,
    sbatch_args: tuple[str, ...],
) -> None:
    """Place a job and submit it with sbatch on exactly gpuplace's nodes:
    `gpuplace slurm submit --job job.yaml -- [SBATCH_ARGS...] script.sh`.

    The partition, -C constraint, reservation, QOS and time limit among the sbatch arguments
    are honoured when placing. Ranks land in gpuplace's order when the script runs `srun`
    (SLURM_HOSTFILE and --distribution=arbitrary are set). Where ranks do not fill their
    nodes, GPUPLACE_PER_RANK_CUDA=1 is set and each rank takes its CUDA_VISIBLE_DEVICES from
    the rank table named by GPUPLACE_RANKS (`rank host device` per line). The hostfile and
    rank table get a unique name inside --dir for every submission."""
    slurm = ctld.Slurmctld(conf=slurm_conf, cluster=cluster_name, timeout=slurm_timeout)
    if state_path is not None:
        state = _load_state(state_path)
        view = _load_view(state_path)
    else:
        state = _live_or_files(
            sinfo, squeue, topology_path, name, nvidia_smi, host_type, gpus_per_node, slurm
        )
        view = None
    if view is None:
        view = _read_view(slurm, sinfo)
    job = Job.load(job_path)
    asked = ctld.request_from_sbatch_args(sbatch_args)
    if partition:
        asked["partition"] = partition
    request = ctld.SlurmRequest.from_dict(asked)
    placed = ctld.place_slurm_job(state, job, request, view, solver=solver)
    sub = sl.submission(
        placed.placement,
        sbatch_args,
        directory=directory,
        partition=partition,
        gres=view.gres,
        clusters=cluster_name,
    )
    document = {
        "job": job.name,
        "nodes": sub.nodes,
        "hostlist": compress(sub.nodes),
        "gpus": len(placed.placement.gpus),
        "argv": sub.argv,
        "env": sub.env,
        "files": sub.files,
    }
    if dry_run:
        if fmt == "json":
            emit({**document, "dry_run": True, "job_id": None})
        else:
            click.echo(sub.render(), nl=False)
        return
    job_id = sl.submit(sub, explain=slurm.why_not_now)
    if fmt == "json":
        emit({**document, "dry_run": False, "job_id": job_id})
        return
    click.echo(
        f"submitted batch job {job_id} on {compress(sub.nodes)} (ranks in gpuplace order; "
        f"hostfile {sub.env['SLURM_HOSTFILE']})"
    )


@slurm.command("pick")
@click.option("--state", "state_path", required=True, type=_file, help="From `slurm sync`.")
@click.option("--nodes", "-N", "node_count", type=click.IntRange(1), help="Whole nodes wanted.")
@click.option("--job", "-j", "job_path", type=_file, help="Or a job file.")
@click.option("--solver", "-s", default="greedy", show_default=True)
@format_option
def pick_cmd(
    state_path: str, node_count: int | None, job_path: str | None, solver: str, fmt: str
) -> None:
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
    if fmt == "json":
        emit(
            {
                "job": job.name,
                "nodes": list(placement.nodes),
                "hostlist": placement.hostlist(),
                "gpus": len(placement.gpus),
            }
        )
        return
    click.echo(",".join(placement.nodes))
