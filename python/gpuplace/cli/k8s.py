"""``gpuplace k8s export``: the Kubernetes objects topology-aware schedulers read.

Writes into a directory: ``nodes.json`` (the hosts as ``kubectl get nodes -o json`` would show
them, with Topograph's labels; ``gpuplace topo import --k8s nodes.json`` reads it back),
``label-nodes.sh`` (``kubectl label node`` per host), ``kueue-topology.yaml``,
``volcano-hypernodes.yaml``, ``kai-topology.yaml`` and, with ``--job``, ``pod-patches.yaml``
(one pod template patch per rank of the job's placement).
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import yaml

from gpuplace._util.documents import write_atomically
from gpuplace.cli.common import emit, format_option, state_or_cluster, with_optional_cluster
from gpuplace.cli.lazy import LazyGroup
from gpuplace.integrations import k8s as objects
from gpuplace.model.job import Job
from gpuplace.placement.place import place

__all__ = ["k8s"]


@click.group("k8s", cls=LazyGroup, lazy={"extender": ("gpuplace.cli.serve", "extender_cmd")})
def k8s() -> None:
    """Kubernetes: node labels, Kueue/Volcano/KAI topology objects, pod placement patches."""


@k8s.command("export")
@with_optional_cluster
@click.option(
    "--output",
    "-o",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory to write the objects into (created if missing).",
)
@click.option(
    "--topograph-run",
    is_flag=True,
    help="Also write the newer accelerator.topograph.run/domain and "
    "fabric.topograph.run/tier-N labels (needed beyond three network levels).",
)
@click.option("--name", default=None, help="Object name of the Kueue/KAI Topology.")
@click.option(
    "--volcano-members",
    type=click.Choice(["exact", "regex"]),
    default="exact",
    show_default=True,
    help="Tier-1 HyperNode members: one exact node name each, or one regex.",
)
@click.option(
    "--job", "-j", "job_path", type=click.Path(dir_okay=False), help="Also place this job."
)
@click.option(
    "--state",
    "state_path",
    type=click.Path(exists=True, dir_okay=False),
    help="A state file: its cluster (no --cluster needed), and with --job the job is placed "
    "on it (only read: this command does not change it).",
)
@click.option("--solver", "-s", default="greedy", show_default=True)
@click.option("--workload", type=click.Choice(["job", "jobset"]), default="job", show_default=True)
@click.option(
    "--pin", type=click.Choice(["nodeName", "affinity"]), default="nodeName", show_default=True
)
@click.option("--container", default="main", show_default=True, help="Container to set env on.")
@format_option
def export(
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    out_dir: str,
    topograph_run: bool,
    name: str | None,
    volcano_members: str,
    job_path: str | None,
    state_path: str | None,
    solver: str,
    workload: str,
    pin: str,
    container: str,
    fmt: str,
) -> None:
    """Write node labels and Kueue, Volcano and KAI topology objects for a cluster; with
    --job, also one pod template patch per rank of the job's placement."""

    state = state_or_cluster(state_path, cluster, nodes, racks, new=False)
    topology = state.topology
    # Render everything before writing anything, so an error leaves the directory as it was.
    files = {
        "nodes.json": _json(objects.node_list(topology, topograph_run=topograph_run)),
        "label-nodes.sh": objects.kubectl_label_commands(topology, topograph_run=topograph_run),
        "kueue-topology.yaml": _yaml(
            [objects.kueue_topology(topology, name=name, topograph_run=topograph_run)]
        ),
        "volcano-hypernodes.yaml": _yaml(
            objects.volcano_hypernodes(
                topology, members=volcano_members, topograph_run=topograph_run
            )
        ),
        "kai-topology.yaml": _yaml(
            [objects.kai_topology(topology, name=name, topograph_run=topograph_run)]
        ),
    }
    placement = None
    if job_path is not None:
        job = Job.load(job_path)
        placement = place(state, job, solver)
        patches = objects.pod_patches(placement, workload=workload, container=container, pin=pin)
        files["pod-patches.yaml"] = _yaml(
            [{"job": job.name, "workload": workload, "pods": patches}]
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for filename, text in files.items():
        write_atomically(out / filename, text)
    if fmt == "json":
        emit(
            {
                "cluster": topology.name,
                "directory": str(out),
                "files": list(files),
                "placement": None if placement is None else placement.to_dict(),
            }
        )
        return
    click.echo(f"wrote {', '.join(files)} to {out}")


def _yaml(documents: list) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True)


def _json(document: object) -> str:
    return json.dumps(document, indent=1) + "\n"
