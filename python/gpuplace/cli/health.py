"""``gpuplace fail | degrade | recover | drain | repair | status``: hardware health and repair
on a state file.

Every command but ``status`` (which only reads it) reads the state file, changes it all or
nothing and writes it back atomically.
The state file remembers its cluster (a preset and its parameters, or a topology file path
relative to the state file), so ``--cluster`` is needed only for a state file that does not
exist yet or does not name its cluster; when given, it must match the file's topology.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from gpuplace._util.documents import exclusive_lock
from gpuplace.cli.common import (
    emit,
    format_option,
    open_state,
    out,
    read_state_options,
    spares_option,
    state_options,
)
from gpuplace.cli.reports import fabric_doc, pool_status, print_fabric, print_pools, print_power
from gpuplace.cluster.state import ClusterState
from gpuplace.enums import Condition, Health, SparePolicy
from gpuplace.errors import InvalidState
from gpuplace.placement.repair import repair

__all__ = ["degrade", "drain", "fail", "recover", "repair_cmd", "status"]

_out = out


def _hardware_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--gpu", "gpus", multiple=True, help="A GPU: id or host:index (repeatable)."),
        click.option(
            "--node", "--host", "hosts", multiple=True, help="A host, e.g. dgx017 (repeatable)."
        ),
        click.option(
            "--nic",
            "nics",
            multiple=True,
            help="A NIC, host:name, e.g. dgx017:mlx5_3 (repeatable).",
        ),
        click.option(
            "--switch",
            "switches",
            multiple=True,
            help="A switch: a domain above the host, e.g. su003 or leaf:su003 (repeatable).",
        ),
        click.option("--reason", default=None, help="Free text kept with the health record."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _targets(
    gpus: tuple[str, ...], hosts: tuple[str, ...], nics: tuple[str, ...], switches: tuple[str, ...]
) -> dict[str, list[str]]:
    targets = {"gpu": list(gpus), "host": list(hosts), "nic": list(nics), "switch": list(switches)}
    targets = {k: v for k, v in targets.items() if v}
    if not targets:
        raise click.UsageError("name the hardware: --gpu, --node, --nic or --switch")
    return targets


def _report_affected(
    verb: str,
    targets: dict[str, list[str]],
    affected: dict[str, Any],
    state: ClusterState,
    path: str,
) -> None:
    what = ", ".join(f"{k} {v}" for k, vs in targets.items() for v in vs)
    _out.print(f"{verb} {what}; {state.free_gpus} of {state.topology.num_gpus} GPUs free")
    if not affected:
        _out.print("no running job is affected")
    for name, ranks in sorted(affected.items()):
        ranks = [int(r) for r in ranks]
        shown = ", ".join(map(str, ranks[:16])) + (" ..." if len(ranks) > 16 else "")
        _out.print(f"job {name}: {len(ranks)} ranks affected ({shown})")
    _out.print(f"saved {path}")


def _event_command(name: str, verb: str, method: str, doc: str) -> click.Command:
    @click.command(name, help=doc)
    @state_options
    @_hardware_options
    @format_option
    def command(
        state_path: str,
        cluster: str | None,
        nodes: int | None,
        racks: int | None,
        gpus: tuple[str, ...],
        hosts: tuple[str, ...],
        nics: tuple[str, ...],
        switches: tuple[str, ...],
        reason: str | None,
        fmt: str,
    ) -> None:
        targets = _targets(gpus, hosts, nics, switches)
        with exclusive_lock(state_path):
            state = open_state(state_path, cluster, nodes, racks)
            affected = getattr(state, method)(**targets, reason=reason)
            state.save(state_path)
        if fmt == "json":
            emit(_event_document(name, targets, affected, state, state_path))
        else:
            _report_affected(verb, targets, affected, state, state_path)

    return command


fail = _event_command("fail", "failed", "fail", "Mark hardware failed; lists the jobs hit.")
drain = _event_command(
    "drain", "drained", "drain", "Take hardware out of service (no solver will use it)."
)
recover = _event_command(
    "recover", "recovered", "recover", "Return hardware to ok (clears failed, drained, degraded)."
)


@click.command("degrade")
@state_options
@_hardware_options
@click.option(
    "--loss",
    default=None,
    help="Packet loss rate, e.g. 1% or 0.01 (priced by the links' transport: 1 % leaves 45 % on RoCE).",
)
@click.option(
    "--factor",
    type=float,
    default=None,
    help="Bandwidth factor in (0, 1], e.g. a measured goodput ratio.",
)
@click.option("--width", default=None, help="Link width trained/nominal, e.g. 2/4.")
@click.option("--speed", default=None, help="Link speed trained/nominal, e.g. 200/400.")
@format_option
def degrade(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    gpus: tuple[str, ...],
    hosts: tuple[str, ...],
    nics: tuple[str, ...],
    switches: tuple[str, ...],
    reason: str | None,
    loss: str | None,
    factor: float | None,
    width: str | None,
    speed: str | None,
    fmt: str,
) -> None:
    """Mark hardware degraded: still used, but paths through it are slower."""
    targets = _targets(gpus, hosts, nics, switches)
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        affected = state.degrade(
            loss=loss,
            factor=factor,
            width=_pair(width, "--width"),
            speed=_pair(speed, "--speed"),
            reason=reason,
            **targets,
        )
        state.save(state_path)
    if fmt == "json":
        emit(_event_document("degrade", targets, affected, state, state_path))
    else:
        _report_affected("degraded", targets, affected, state, state_path)


def _event_document(
    event: str,
    targets: dict[str, list[str]],
    affected: dict[str, Any],
    state: ClusterState,
    path: str,
) -> dict[str, Any]:
    return {
        "event": event,
        "targets": targets,
        "affected": {k: [int(r) for r in v] for k, v in affected.items()},
        "free_gpus": state.free_gpus,
        "total_gpus": state.topology.num_gpus,
        "state": path,
    }


def _pair(text: str | None, what: str) -> tuple[float, float] | None:
    if text is None:
        return None
    trained, _, nominal = text.lstrip("x").partition("/")
    try:
        return float(trained), float(nominal.lstrip("x"))
    except ValueError:
        raise click.BadParameter(
            f"expected trained/nominal, e.g. 2/4, got {text!r}", param_hint=what
        ) from None


@click.command("repair")
@state_options
@click.option("--job", "-j", "job_name", required=True, help="Name of the running job to repair.")
@click.option(
    "--max-moves",
    type=int,
    default=0,
    show_default=True,
    help="Surviving ranks that may move too when that lowers the cost (a tp group counts as "
    "its size); with nothing failed, this evacuates groups from degraded hardware.",
)
@spares_option("Whether reserved spare GPUs may be used.")
@click.option("--time-limit", type=float, default=None, help="Seconds for the improvement steps.")
@format_option
def repair_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    job_name: str,
    max_moves: int,
    spares: SparePolicy,
    time_limit: float | None,
    fmt: str,
) -> None:
    """Repair a job: keep surviving ranks, give lost ranks free healthy GPUs; with
    --max-moves, also move whole groups off degraded hardware when that lowers the cost."""
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        result = repair(state, job_name, max_moves=max_moves, spares=spares, time_limit=time_limit)
        state.save(state_path)
    if fmt == "json":
        emit({**result.to_dict(), "state": state_path})
        return
    topo = state.topology
    table = Table(title=f"repair of {job_name}", title_justify="left")
    for col in ("rank", "old GPU", "new GPU", "why"):
        table.add_column(col)
    for m in result.moved:
        table.add_row(
            str(m.rank),
            f"{topo.host_of(m.old_gpu)}:{topo.local_index(m.old_gpu)}",
            f"{topo.host_of(m.new_gpu)}:{topo.local_index(m.new_gpu)}",
            m.reason,
        )
    _out.print(table)
    _out.print(
        f"comm per step: {result.cost_before.comm_seconds * 1e3:.3f} ms before the repair, "
        f"{result.cost_after.comm_seconds * 1e3:.3f} ms after the repair; "
        f"{len(result.moved)} ranks moved in {result.elapsed_s * 1e3:.2f} ms; saved {state_path}"
    )


@click.command("status")
@read_state_options
@format_option
def status(
    state_path: str, cluster: str | None, nodes: int | None, racks: int | None, fmt: str
) -> None:
    """Jobs running and queued, free capacity per level, unhealthy hardware, the fabric's
    uplinks level by level, power and pools (reads the state; changes nothing)."""
    if not Path(state_path).exists():
        raise InvalidState(f"{state_path}: no such state file")
    state = open_state(state_path, cluster, nodes, racks)
    topo = state.topology
    health = state.health()
    jobs: list[dict[str, Any]] = []
    for name, gpus in state.jobs.items():
        bad = int((health[gpus] != int(Health.Ok)).sum())
        jobs.append(
            {
                "name": name,
                "gpus": len(gpus),
                "hosts": len({topo.host_of(int(g)) for g in gpus}),
                "ranks_on_unusable_gpus": bad,
            }
        )
    levels: list[dict[str, Any]] = []
    for i, level in enumerate(topo.levels):
        free = state.free_counts(i)
        sizes = topo.domain_sizes(i)
        levels.append(
            {
                "level": level.name,
                "domains": len(free),
                "free_gpus": int(free.sum()),
                "largest_free": int(free.max()),
                "fully_free_domains": int((free == sizes).sum()),
            }
        )
    doc = {
        "cluster": topo.name,
        "gpus": topo.num_gpus,
        "free": state.free_gpus,
        "spares": len(state.spares),
        "failed_gpus": int((health == int(Health.Failed)).sum()),
        "drained_gpus": int((health == int(Health.Drained)).sum()),
        "degraded_gpus": int(state.degraded_mask().sum()),
        "jobs": jobs,
        "levels": levels,
        "queue": [
            {"job": name, "gpus": q.job.gpus, "reason": q.reason} for name, q in state.queue.items()
        ],
        "unhealthy": state.unhealthy(),
        **fabric_doc(state),
        "power": state.power_headroom(),
    }

    pools = pool_status(state)
    if pools:
        doc["pools"] = pools
    for j in jobs:  # pool and priority class, when the job has them (gpuplace.policy)
        spec = state.specs.get(j["name"])
        if spec is not None and spec.policy is not None:
            j.update(
                {k: v for k, v in spec.policy.to_dict().items() if k in ("pool", "priority_class")}
            )
    if fmt == "json":
        emit(doc)
        return
    _out.print(
        f"{topo.name}: {doc['free']} of {doc['gpus']} GPUs free, {doc['spares']} spares, "
        f"{doc['failed_gpus']} failed, {doc['drained_gpus']} drained, "
        f"{doc['degraded_gpus']} on degraded paths"
    )
    table = Table(
        "job", "GPUs", "hosts", "ranks on unusable GPUs", title="jobs", title_justify="left"
    )
    for j in jobs:
        table.add_row(j["name"], str(j["gpus"]), str(j["hosts"]), str(j["ranks_on_unusable_gpus"]))
    _out.print(table)
    if doc["queue"]:
        table = Table("job", "GPUs", "reason", title="queued", title_justify="left")
        for q in doc["queue"]:
            table.add_row(q["job"], str(q["gpus"]), q["reason"] or "-")
        _out.print(table)
    table = Table(
        "level",
        "domains",
        "free GPUs",
        "largest free",
        "fully free domains",
        title="free capacity",
        title_justify="left",
    )
    for lv in levels:
        table.add_row(
            lv["level"],
            str(lv["domains"]),
            str(lv["free_gpus"]),
            str(lv["largest_free"]),
            str(lv["fully_free_domains"]),
        )
    _out.print(table)
    table = Table(
        "kind",
        "name",
        "condition",
        "factor",
        "reason",
        title="unhealthy hardware",
        title_justify="left",
    )
    for h in doc["unhealthy"]:
        factor = f"{h['factor']:.3g}" if h["condition"] == Condition.Degraded.label else "-"
        table.add_row(h["kind"], h["name"], h["condition"], factor, h["reason"])
    _out.print(table)
    print_fabric(state, _out)
    print_power(doc["power"], _out)
    if pools:
        print_pools(pools, _out)
