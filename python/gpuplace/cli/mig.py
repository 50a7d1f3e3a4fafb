"""``gpuplace mig enable | place | release | status``: MIG-mode GPUs in a state file and the
packing of inference requests onto their slices (``gpuplace.cluster.mig``)."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from gpuplace._util.documents import Checker, exclusive_lock, read_document
from gpuplace.cli.common import (
    emit,
    format_option,
    open_state,
    out,
    read_state_options,
    state_options,
)
from gpuplace.cluster import mig
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import Infeasible, InvalidJob, InvalidState
from gpuplace.io.mig import read_nvidia_smi_mig, read_nvidia_smi_mig_instances

__all__ = ["mig_group", "read_requests"]

_out = out


@click.group("mig")
def mig_group() -> None:
    """MIG-mode GPUs and the packing of inference requests onto their slices."""


def _mig_of(state: ClusterState, path: str) -> mig.MigCluster:
    if state.mig is None:
        raise InvalidState(f"{path}: no GPU is in MIG mode; run `gpuplace mig enable` first")
    return state.mig


@mig_group.command("enable")
@state_options
@click.option("--gpu", "gpus", multiple=True, help="A GPU: id or host:index (repeatable).")
@click.option("--node", "--host", "hosts", multiple=True, help="Every GPU of a host (repeatable).")
@click.option(
    "--listing",
    type=click.Path(dir_okay=False),
    default=None,
    help="`nvidia-smi mig -lgip` and `-lgipp` output (one file) giving the MIG rules; default: "
    "the built-in rules of the GPUs' model.",
)
@click.option(
    "--geometry",
    default="",
    help="Free instances to configure on each GPU, e.g. 3g.40gb,2g.20gb,1g.10gb,1g.10gb "
    "(default: none; instances are created per request).",
)
@click.option(
    "--instances",
    "instances_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="`nvidia-smi mig -lgi` output of the one --node given: its existing instances are "
    "recorded (free) on that host's GPUs.",
)
@format_option
def enable_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    gpus: tuple[str, ...],
    hosts: tuple[str, ...],
    listing: str | None,
    geometry: str,
    instances_path: str | None,
    fmt: str,
) -> None:
    """Put free GPUs in MIG mode (they leave whole-GPU placement)."""
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        ids = [state.resolve_gpu(g) for g in gpus]
        for h in hosts:
            if h not in state.topology._host_index:
                raise InvalidState(f"unknown host {h!r} in cluster {state.topology.name!r}")
            ids.extend(int(g) for g in state.topology.host_gpus(h))
        rules = read_nvidia_smi_mig(listing) if listing else None
        layout = [g.strip() for g in geometry.split(",") if g.strip()]
        existing: dict[int, list[tuple[str, int, int]]] = {}
        if instances_path is not None:
            if len(hosts) != 1 or gpus or layout:
                raise click.UsageError(
                    "--instances takes the listing of one --node, without --gpu or --geometry"
                )
            local = state.topology.host_gpus(hosts[0])
            for index, rows in read_nvidia_smi_mig_instances(instances_path).items():
                if index >= len(local):
                    raise InvalidState(
                        f"{instances_path}: GPU {index} does not exist on {hosts[0]} "
                        f"({len(local)} GPUs)"
                    )
                existing[int(local[index])] = rows
        cluster_mig = mig.enable(state, ids, model=rules, geometry=layout, existing=existing)
        state.save(state_path)
    if fmt == "json":
        emit(
            {
                "state": state_path,
                "model": cluster_mig.model.model,
                "mig_gpus": len(cluster_mig.gpus),
                "enabled": [_gpu_name(state, g) for g in sorted(set(ids))],
                "free_gpus": state.free_gpus,
            }
        )
        return
    _out.print(
        f"{len(cluster_mig.gpus)} {cluster_mig.model.model} GPUs in MIG mode in {state_path}; "
        f"{state.free_gpus} GPUs left for whole-GPU placement"
    )


def _gpu_name(state: ClusterState, gpu: int) -> str:
    return f"{state.topology.host_of(gpu)}:{state.topology.local_index(gpu)}"


def read_requests(path: str) -> tuple[list[mig.Request], dict[str, float] | None]:
    """The requests of a stream file (``requests:`` entries with ``profile`` or
    ``memory_gb``/``compute``, an optional ``count``) and its optional ``distribution``."""
    c = Checker(InvalidJob, path)
    doc = c.mapping(read_document(path, InvalidJob), "")
    c.keys(doc, "", {"requests", "distribution"})
    out: list[mig.Request] = []
    for i, raw in enumerate(c.sequence(doc.get("requests"), "requests")):
        p = f"requests[{i}]"
        entry = c.mapping(raw, p)
        c.keys(entry, p, {"name", "profile", "memory_gb", "compute", "count"})
        name = c.string(entry.get("name"), f"{p}.name")
        count = c.integer(entry.get("count", 1), f"{p}.count", minimum=1, maximum=100_000)
        if "profile" in entry:
            if "memory_gb" in entry or "compute" in entry:
                raise c.fail(p, "give a profile, or memory_gb and compute, not both")
            fields: dict[str, Any] = {"profile": c.string(entry["profile"], f"{p}.profile")}
        else:
            fields = {
                "min_memory_gb": c.number(entry.get("memory_gb", 0), f"{p}.memory_gb", minimum=0),
                "min_compute": c.integer(entry.get("compute", 1), f"{p}.compute", minimum=1),
            }
        for k in range(count):
            out.append(mig.Request(name if count == 1 else f"{name}-{k}", **fields))
    dist = None
    if "distribution" in doc:
        raw = c.mapping(doc["distribution"], "distribution")
        dist = {k: c.number(v, f"distribution.{k}", positive=True) for k, v in raw.items()}
    return out, dist


@mig_group.command("place")
@state_options
@click.option(
    "--requests",
    "requests_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="YAML/JSON stream of requests (docs/policy.md, MIG).",
)
@click.option(
    "--policy",
    type=click.Choice(mig.POLICIES),
    default="fgd",
    show_default=True,
    help="fgd (fragmentation gradient descent), best-fit or first-fit.",
)
@format_option
def place_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    requests_path: str,
    policy: str,
    fmt: str,
) -> None:
    """Place a stream of inference requests on MIG slices, in order; a request that fits
    nowhere, or that no profile of the GPUs satisfies, is refused alone with its reason and
    the stream goes on."""
    requests, dist = read_requests(requests_path)
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        packing = _mig_of(state, state_path)
        if dist is not None:
            packing.set_distribution(dist)
        rows: list[dict[str, Any]] = []
        for r in requests:
            counts = (packing.reused, packing.destroyed)
            try:
                gpu, inst = packing.place(r, policy)
            except Infeasible as exc:
                rows.append({"request": r.name, "placed": False, "reason": str(exc)})
                continue
            if packing.reused > counts[0]:
                how = "reused a free instance"
            elif packing.destroyed > counts[1]:
                how = f"reconfigured ({packing.destroyed - counts[1]} free instances destroyed)"
            else:
                how = "created in free slices"
            rows.append(
                {
                    "request": r.name,
                    "placed": True,
                    "how": how,
                    "profile": inst.profile,
                    "gpu": _gpu_name(state, gpu),
                    "slices": f"{inst.start}-{inst.start + packing.model.profile(inst.profile).size - 1}",
                }
            )
        packing.check()
        state.save(state_path)
    unallocated = packing.free_share()
    placed = sum(row["placed"] for row in rows)
    if fmt == "json":
        emit({"placements": rows, "unallocated_gpus": unallocated, "state": state_path})
        return
    table = Table(
        "request", "profile", "GPU", "memory slices", "instance", title=f"MIG placement ({policy})"
    )
    for row in rows:
        if row["placed"]:
            table.add_row(row["request"], row["profile"], row["gpu"], row["slices"], row["how"])
        else:
            table.add_row(row["request"], "-", "not placed", "-", row["reason"])
    _out.print(table)
    _out.print(
        f"placed {placed} of {len(rows)} requests; {unallocated:.2f} of {len(packing.gpus)} "
        f"MIG GPUs' compute unallocated; saved {state_path}"
    )


@mig_group.command("release")
@state_options
@click.option("--destroy", is_flag=True, help="Destroy the instances instead of keeping them free.")
@click.argument("names", nargs=-1, required=True)
@format_option
def release_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    destroy: bool,
    names: tuple[str, ...],
    fmt: str,
) -> None:
    """Release placed requests (their instances stay, free, unless --destroy)."""
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        packing = _mig_of(state, state_path)
        missing = [n for n in names if n not in packing.owners]
        if missing:
            raise InvalidState(f"no MIG request named {missing[0]!r} is placed")
        for n in names:
            packing.release(n, destroy=destroy)
        state.save(state_path)
    if fmt == "json":
        emit({"state": state_path, "released": list(names), "destroyed": destroy})
        return
    _out.print(f"released {len(names)} requests; saved {state_path}")


@mig_group.command("status")
@read_state_options
@format_option
def status_cmd(
    state_path: str, cluster: str | None, nodes: int | None, racks: int | None, fmt: str
) -> None:
    """MIG geometry per GPU: its instances, slices and free compute (reads the state; changes
    nothing)."""
    state = open_state(state_path, cluster, nodes, racks)
    packing = _mig_of(state, state_path)
    model = packing.model
    if fmt == "json":
        emit(
            {
                "model": model.model,
                "gpus": [
                    {
                        "gpu": _gpu_name(state, g),
                        "instances": [
                            {"profile": i.profile, "start": i.start, "owner": i.owner}
                            for i in gpu.instances
                        ],
                        "free_compute_slices": model.compute_slices - gpu.busy[1],
                        "compute_slices": model.compute_slices,
                    }
                    for g, gpu in packing.gpus.items()
                ],
                "unallocated_gpus": packing.free_share(),
            }
        )
        return
    table = Table("GPU", "memory slices", "instances", "free compute", title=model.model)
    for g, gpu in packing.gpus.items():
        slots = ["."] * model.memory_slices
        for k, inst in enumerate(gpu.instances):
            for s in range(inst.start, inst.start + model.profile(inst.profile).size):
                slots[s] = chr(ord("a") + k % 26)
        table.add_row(
            _gpu_name(state, g),
            "".join(slots),
            ", ".join(f"{i.owner or '(free)'}={i.profile}@{i.start}" for i in gpu.instances) or "-",
            f"{model.compute_slices - gpu.busy[1]}/{model.compute_slices}",
        )
    _out.print(table)
