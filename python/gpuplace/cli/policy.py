"""``gpuplace policy set | show`` and ``gpuplace explain``: the cluster policy kept in a state
file (pools, priority classes, hardware attributes) and why a job is not placed."""

from __future__ import annotations

from pathlib import Path

import click
import yaml
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
from gpuplace.errors import InvalidState
from gpuplace.io.gpu_query import read_nvidia_smi_query
from gpuplace.model.job import Job
from gpuplace.model.policy import ClusterPolicy
from gpuplace.placement.explain import explain

__all__ = ["explain_cmd", "policy"]

_out = out


@click.group("policy")
def policy() -> None:
    """Pools, priority classes and hardware attributes kept in a state file."""


@policy.command("set")
@state_options
@click.option(
    "--file",
    "-f",
    "policy_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="YAML/JSON with attributes, pools and priority_classes (docs/policy.md).",
)
@format_option
def policy_set(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    policy_path: str,
    fmt: str,
) -> None:
    """Replace the state's policy with the file's (checked against the cluster first)."""
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        c = Checker(InvalidState, policy_path)
        doc = c.mapping(read_document(policy_path, InvalidState), "")
        c.keys(doc, "", set(ClusterPolicy.SECTIONS))
        new = ClusterPolicy.from_dict(doc, c)
        new.check(state.topology, c)
        state.policy = new
        state.save(state_path)
    if fmt == "json":
        emit(
            {
                "state": state_path,
                "pools": list(new.pools),
                "priority_classes": list(new.classes),
                "attribute_entries": len(new.attributes),
            }
        )
        return
    _out.print(
        f"policy of {state_path}: {len(new.pools)} pools, {len(new.classes)} priority classes, "
        f"{len(new.attributes)} attribute entries"
    )


@policy.command("attributes")
@state_options
@click.option("--host", "host", required=True, help="The host the listing was taken on.")
@click.option(
    "--nvidia-smi-query",
    "query_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Output of `nvidia-smi --query-gpu=index,name,driver_version,vbios_version "
    "--format=csv` on that host.",
)
@format_option
def policy_attributes(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    host: str,
    query_path: str,
    fmt: str,
) -> None:
    """Record a host's GPU model, driver and firmware (VBIOS) in the state's attributes."""
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        if host not in state.topology._host_index:
            raise InvalidState(f"unknown host {host!r} in cluster {state.topology.name!r}")
        entries = read_nvidia_smi_query(query_path, host=host)
        per_host = len(state.topology.host_gpus(host))
        for e in entries:
            if max(e["gpus"]) >= per_host:
                raise InvalidState(
                    f"{query_path}: GPU index {max(e['gpus'])} does not exist on {host} "
                    f"({per_host} GPUs)"
                )
        doc = state.policy.to_dict()
        doc["attributes"] = doc.get("attributes", []) + entries
        c = Checker(InvalidState, query_path)
        new = ClusterPolicy.from_dict(doc, c)
        new.check(state.topology, c)
        state.policy = new
        state.save(state_path)
    if fmt == "json":
        emit({"state": state_path, "host": host, "entries": entries})
        return
    _out.print(f"{host}: {len(entries)} attribute entries recorded in {state_path}")


@policy.command("show")
@read_state_options
@format_option
def policy_show(
    state_path: str, cluster: str | None, nodes: int | None, racks: int | None, fmt: str
) -> None:
    """Print the effective policy (the topology's, then the state's): as YAML for people, as
    JSON with --format json (reads the state; changes nothing)."""
    if not Path(state_path).exists():
        raise InvalidState(f"{state_path}: no such state file")
    state = open_state(state_path, cluster, nodes, racks)
    document = state.effective_policy().to_dict()
    if fmt == "json":
        emit({"policy": document})
        return
    click.echo(yaml.safe_dump(document, sort_keys=False).rstrip() if document else "{}")


@click.command("explain")
@read_state_options
@click.option(
    "--job", "-j", "job_path", default=None, type=click.Path(dir_okay=False), help="Job file."
)
@click.option(
    "--queued",
    default=None,
    metavar="NAME",
    help="Instead of --job: a job waiting in the state's queue.",
)
@click.option(
    "--solver",
    "-s",
    default="greedy",
    show_default=True,
    help="The solver `place` would run: its verdict is the explanation's.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--time-limit", type=float, default=None, help="Seconds, for solvers that search.")
@format_option
def explain_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    job_path: str | None,
    queued: str | None,
    solver: str,
    seed: int,
    time_limit: float | None,
    fmt: str,
) -> None:
    """Why a job is (not) placed now: runs the same admission as `place` (pools, hardware
    rules, power budgets, MIG, the solver) and lists every constraint, what it needs, what is
    available and which bind, naming the pool, rule or power domain; a job that fits also
    gets the contention it would meet (reads the state; changes nothing)."""
    if (job_path is None) == (queued is None):
        raise click.UsageError("give --job FILE or --queued NAME (one of them)")
    if not Path(state_path).exists() and cluster is None:
        raise InvalidState(f"{state_path}: no such state file")
    state = open_state(state_path, cluster, nodes, racks)
    if job_path is not None:
        job = Job.load(job_path)
    elif queued in state.queue:
        job = state.queue[queued].job
    else:
        waiting = ", ".join(repr(n) for n in state.queue) or "none"
        raise InvalidState(f"{state_path}: no job named {queued!r} is queued (queued: {waiting})")
    result = explain(state, job, solver, seed=seed, time_limit=time_limit)
    if fmt == "json":
        emit({**result.to_dict(), "solver": solver, "summary": result.summary()})
        return
    _out.print(result.summary())
    table = Table(
        "constraint",
        "rule",
        "level",
        "needed",
        "available",
        "binding",
        title=f"why {job.name} is {'placeable' if result.placeable else 'not placed'} ({solver})",
        title_justify="left",
    )
    for c in result.constraints:
        table.add_row(
            c.kind,
            c.name,
            c.level or "-",
            str(c.needed),
            str(c.available),
            "yes" if c.binding else "no",
        )
    _out.print(table)
    for c in result.constraints:
        _out.print(f"{'*' if c.binding else '-'} {c.detail}")
