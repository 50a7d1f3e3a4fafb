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
from gpuplace.cli.common import load_cluster
from gpuplace.cluster.state import ClusterState
from gpuplace.integrations import k8s as objects
from gpuplace.integrations.extender import Extender, serve
from gpuplace.model.job import Job
from gpuplace.placement.place import place

__all__ = ["k8s"]


@click.group("k8s")
def k8s() -> None:
    """Kubernetes: node labels, Kueue/Volcano/KAI topology objects, pod placement patches."""


@k8s.command("export")
@click.option("--cluster", "-c", required=True, help="A preset name or a topology file.")
@click.option("--nodes", type=int, default=None, help="Preset size in hosts.")
@click.option("--racks", type=int, default=None, help="Preset size in racks (gb200-nvl72).")
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
    help="Place the job on this state (not changed).",
)
@click.option("--solver", "-s", default="greedy", show_default=True)
@click.option("--workload", type=click.Choice(["job", "jobset"]), default="job", show_default=True)
@click.option(
    "--pin", type=click.Choice(["nodeName", "affinity"]), default="nodeName", show_default=True
)
@click.option("--container", default="main", show_default=True, help="Container to set env on.")
def export(
    cluster: str,
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
) -> None:
    """Write node labels and Kueue, Volcano and KAI topology objects for a cluster; with
    --job, also one pod template patch per rank of the job's placement."""

    topology = load_cluster(cluster, nodes, racks)
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
    if job_path is not None:
        job = Job.load(job_path)
        state = (
            ClusterState.load(topology, state_path)
            if state_path is not None
            else ClusterState(topology)
        )
        placement = place(state, job, solver)
        patches = objects.pod_patches(placement, workload=workload, container=container, pin=pin)
        files["pod-patches.yaml"] = _yaml(
            [{"job": job.name, "workload": workload, "pods": patches}]
        )
    elif state_path is not None:
        raise click.BadParameter("--state needs --job", param_hint="--state")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for filename, text in files.items():
        write_atomically(out / filename, text)
    click.echo(f"wrote {', '.join(files)} to {out}")


def _yaml(documents: list) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False, explicit_start=True)


def _json(document: object) -> str:
    return json.dumps(document, indent=1) + "\n"


@k8s.command("extender")
@click.option("--cluster", "-c", required=True, help="A preset name or a topology file.")
@click.option("--nodes", type=int, default=None, help="Preset size in hosts.")
@click.option("--racks", type=int, default=None, help="Preset size in racks (gb200-nvl72).")
@click.option(
    "--state",
    "state_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Start from this state (not written back).",
)
@click.option("--solver", "-s", default="greedy", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8888, show_default=True)
@click.option("--prefix", default="", help="URL prefix (the extender's urlPrefix path).")
def extender_cmd(
    cluster: str,
    nodes: int | None,
    racks: int | None,
    state_path: str | None,
    solver: str,
    host: str,
    port: int,
    prefix: str,
) -> None:
    """Serve kube-scheduler extender filter/prioritize verbs that send each pod of a gang
    (annotation gpuplace/job) to the node gpuplace planned for its completion index."""

    topology = load_cluster(cluster, nodes, racks)
    state = (
        ClusterState.load(topology, state_path)
        if state_path is not None
        else ClusterState(topology)
    )
    server = serve(Extender(state, solver=solver), host=host, port=port, prefix=prefix)
    address, bound = server.server_address[:2]
    click.echo(f"gpuplace extender on http://{address}:{bound}{prefix}/filter and /prioritize")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
