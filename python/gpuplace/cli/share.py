"""``gpuplace share enable | place | release | status``: shared hosts in a state file (their GPUs
fractional or MIG-partitioned, held away from training gangs) and the placement of requests for
shares of a GPU, whole GPUs, CPU and memory onto them (``gpuplace.cluster.share``,
``gpuplace.placement.share``)."""

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
from gpuplace.cluster import share
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import Infeasible, InvalidJob, InvalidState
from gpuplace.io.mig import read_nvidia_smi_mig
from gpuplace.model.share import SharedRequest
from gpuplace.placement.share import POLICIES, ShareScheduler, fragmentation
from gpuplace.policy.fence import pool_masks

__all__ = ["read_shared_requests", "share_group"]


@click.group("share")
def share_group() -> None:
    """Shared hosts: GPUs split by the milli-GPU or into MIG instances, for inference and small
    jobs, kept apart from training gangs."""


def _shared_of(state: ClusterState, path: str) -> share.SharedCluster:
    if state.shared is None:
        raise InvalidState(f"{path}: no host is shared; run `gpuplace share enable` first")
    cluster: share.SharedCluster = state.shared
    return cluster


@share_group.command("enable")
@state_options
@click.option("--node", "--host", "hosts", multiple=True, help="A host to share (repeatable).")
@click.option("--pool", default=None, help="Share every idle host of this pool (policy pools).")
@click.option(
    "--cpu",
    type=click.FloatRange(0, min_open=True),
    required=True,
    help="Cores per host for the requests.",
)
@click.option(
    "--memory-gib",
    type=click.FloatRange(0, min_open=True),
    required=True,
    help="Memory (GiB) per host for the requests.",
)
@click.option(
    "--mode",
    type=click.Choice(["fractional", "mig"]),
    default="fractional",
    show_default=True,
    help="How the hosts' GPUs are shared: by the milli-GPU (time-sliced) or as MIG instances.",
)
@click.option(
    "--listing",
    type=click.Path(dir_okay=False),
    default=None,
    help="`nvidia-smi mig -lgip` and `-lgipp` output giving the MIG rules (default: the built-in "
    "rules of the GPUs' model).",
)
@format_option
def enable_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    hosts: tuple[str, ...],
    pool: str | None,
    cpu: float,
    memory_gib: float,
    mode: str,
    listing: str | None,
    fmt: str,
) -> None:
    """Share idle hosts: their GPUs leave whole-GPU placement for shared requests."""
    rules = read_nvidia_smi_mig(listing) if listing else None
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        names = list(hosts)
        if pool is not None:
            masks = pool_masks(state)
            if pool not in masks:
                raise InvalidState(f"unknown pool {pool!r} (pools: {', '.join(masks) or 'none'})")
            topo = state.topology
            free = state.free_mask()
            names += [
                h
                for h in topo.hosts
                if masks[pool][topo.host_gpus(h)].all() and free[topo.host_gpus(h)].all()
            ]
        if not names:
            raise click.UsageError("give --node or a --pool with idle hosts")
        shared = share.enable(
            state,
            names,
            cpu_milli=round(cpu * 1000),
            memory_mib=round(memory_gib * 1024),
            mode=mode,
            mig_rules=rules,
        )
        state.save(state_path)
    if fmt == "json":
        emit(
            {
                "state": state_path,
                "hosts": [n.name for n in shared.nodes],
                "gpus": shared.num_gpus,
                "mode": mode,
                "free_gpus": state.free_gpus,
            }
        )
        return
    out.print(
        f"{len(shared)} hosts ({shared.num_gpus} GPUs) shared in {state_path}; "
        f"{state.free_gpus} GPUs left for whole-GPU placement"
    )


def read_shared_requests(path: str) -> list[SharedRequest]:
    """The requests of a stream file: ``requests:`` entries (``name``, ``cpu`` or
    ``cpu_milli``, ``memory_gib`` or ``memory_mib``, ``gpu`` (a share such as 0.25, or whole
    GPUs) or ``gpus`` and ``gpu_milli``, ``models``, ``gpu_memory_gib``, ``isolation``
    (any, mig, fractional), and ``count`` copies)."""
    c = Checker(InvalidJob, path)
    doc = c.mapping(read_document(path, InvalidJob), "")
    c.keys(doc, "", {"requests"})
    requests: list[SharedRequest] = []
    for i, raw in enumerate(c.sequence(doc.get("requests"), "requests")):
        p = f"requests[{i}]"
        entry = c.mapping(raw, p)
        name = c.string(entry.get("name"), f"{p}.name")
        count = c.integer(entry.get("count", 1), f"{p}.count", minimum=1, maximum=100_000)
        body = {k: v for k, v in entry.items() if k not in ("name", "count")}
        for k in range(count):
            requests.append(
                SharedRequest.from_dict(body, c, p, name=name if count == 1 else f"{name}-{k}")
            )
    return requests


def _gpus_text(shared: share.SharedCluster, placed: share.Placed) -> str:
    modes = shared.gpu_modes(placed.node)
    parts = []
    for g, start in zip(placed.gpus, placed.starts, strict=True):
        parts.append(f"{g} (MIG @{start})" if modes[g] == "mig" else str(g))
    return ", ".join(parts)


@share_group.command("place")
@state_options
@click.option(
    "--requests",
    "requests_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="YAML/JSON stream of requests (docs/share.md).",
)
@click.option(
    "--policy",
    type=click.Choice(POLICIES),
    default="gpuplace",
    show_default=True,
    help="How nodes and GPUs are chosen (docs/share.md).",
)
@click.option(
    "--reconfigure/--no-reconfigure",
    default=False,
    show_default=True,
    help="Switch idle GPUs between fractional and MIG mode for requests that need the other "
    "mode and fit nowhere as the GPUs are (each switch resets a GPU).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Breaks ties between nodes.")
@format_option
def place_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    requests_path: str,
    policy: str,
    reconfigure: bool,
    seed: int,
    fmt: str,
) -> None:
    """Place a stream of requests on the shared hosts, in order; a request that fits nowhere is
    refused alone, with what blocked it, and the stream goes on. FGD and gpuplace weigh
    fragmentation over the stream and what already runs."""
    requests = read_shared_requests(requests_path)
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        shared = _shared_of(state, state_path)
        workload = [p.request for p in shared] + requests
        scheduler = ShareScheduler(
            shared, policy, workload=workload, seed=seed, reconfigure=reconfigure
        )
        rows: list[dict[str, Any]] = []
        for r in requests:
            before = shared.reconfigurations
            try:
                if r.name in shared.placements:
                    raise InvalidState(f"request {r.name!r} is already placed")
                placed = scheduler.place(r)
            except (Infeasible, InvalidState) as exc:
                rows.append({"request": r.name, "placed": False, "reason": str(exc)})
                continue
            rows.append(
                {
                    "request": r.name,
                    "placed": True,
                    "node": placed.node,
                    "gpus": list(placed.gpus),
                    "starts": list(placed.starts),
                    "where": _gpus_text(shared, placed),
                    "reconfigured": shared.reconfigurations - before,
                }
            )
        state.save(state_path)
    summary = {
        "placed": sum(row["placed"] for row in rows),
        "requests": len(rows),
        "unallocated_gpu_share": round(shared.unallocated, 4),
        "reconfigurations": shared.reconfigurations,
    }
    if fmt == "json":
        emit({"placements": rows, **summary, "state": state_path})
        return
    table = Table("request", "node", "GPUs", "note", title=f"shared placement ({policy})")
    for row in rows:
        if row["placed"]:
            note = f"{row['reconfigured']} GPU reconfigured" if row["reconfigured"] else ""
            table.add_row(row["request"], row["node"], row["where"], note)
        else:
            table.add_row(row["request"], "not placed", "-", row["reason"])
    out.print(table)
    out.print(
        f"placed {summary['placed']} of {summary['requests']} requests; "
        f"{shared.unallocated * 100:.1f} % of the shared GPUs unallocated; "
        f"{shared.reconfigurations} reconfigurations in all; saved {state_path}"
    )


@share_group.command("release")
@state_options
@click.argument("names", nargs=-1, required=True)
@format_option
def release_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    names: tuple[str, ...],
    fmt: str,
) -> None:
    """Release placed requests (their GPUs keep their mode)."""
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        shared = _shared_of(state, state_path)
        missing = [n for n in names if n not in shared.placements]
        if missing:
            raise InvalidState(f"no request named {missing[0]!r} is placed")
        for n in names:
            shared.release(n)
        state.save(state_path)
    if fmt == "json":
        emit({"state": state_path, "released": list(names)})
        return
    out.print(f"released {len(names)} requests; saved {state_path}")


@share_group.command("status")
@read_state_options
@format_option
def status_cmd(
    state_path: str, cluster: str | None, nodes: int | None, racks: int | None, fmt: str
) -> None:
    """The shared hosts: each GPU's mode and free milli-GPUs, the milli-GPUs fragmented for the
    requests that run (FGD's measure), CPU and memory left, requests (reads the state; changes
    nothing)."""
    state = open_state(state_path, cluster, nodes, racks)
    shared = _shared_of(state, state_path)
    cpu, memory = shared.cpu_left(), shared.memory_left()
    per_node: dict[str, list[str]] = {n.name: [] for n in shared.nodes}
    for p in shared:
        per_node[p.node].append(p.request.name)
    running = [p.request for p in shared]
    # FGD's fragmentation under the mix of what runs: free capacity those requests could not use.
    frag = fragmentation(shared, running).tolist() if running else [0.0] * len(shared)
    if fmt == "json":
        emit(
            {
                **shared.summary(),
                "reconfigurations": shared.reconfigurations,
                "unallocated_gpu_share": round(shared.unallocated, 4),
                "nodes": [
                    {
                        "name": n.name,
                        "model": n.model,
                        "modes": shared.gpu_modes(i),
                        "gpu_left_milli": shared.gpu_left(i).tolist(),
                        "cpu_left_milli": int(cpu[i]),
                        "memory_left_mib": int(memory[i]),
                        "fragmentation_milli": round(frag[i], 1),
                        "requests": per_node[n.name],
                    }
                    for i, n in enumerate(shared.nodes)
                ],
            }
        )
        return
    table = Table(
        "host",
        "model",
        "GPUs: free milli-GPUs (m: MIG)",
        "fragmented",
        "CPU left",
        "memory left",
        "requests",
    )
    for i, n in enumerate(shared.nodes):
        modes = shared.gpu_modes(i)
        gpus = " ".join(
            f"{left}{'m' if mode == 'mig' else ''}"
            for left, mode in zip(shared.gpu_left(i).tolist(), modes, strict=True)
        )
        table.add_row(
            n.name,
            n.model or "-",
            gpus,
            f"{frag[i]:.0f}",
            f"{cpu[i] / 1000:g}/{n.cpu_milli / 1000:g}",
            f"{memory[i] / 1024:.0f}/{n.memory_mib / 1024:.0f} GiB",
            ", ".join(per_node[n.name]) or "-",
        )
    out.print(table)
    out.print(
        f"{len(shared.placements)} requests; {shared.unallocated * 100:.1f} % of "
        f"{shared.num_gpus} shared GPUs unallocated; {shared.reconfigurations} reconfigurations"
    )
