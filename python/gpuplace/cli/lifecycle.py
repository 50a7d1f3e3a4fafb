"""``gpuplace release | cancel | requeue``: end a job or send it back to the queue.

With ``place --state`` and ``status``/``explain``, a job's whole life runs from the command
line on one state file (which remembers its cluster, so ``--state`` alone names it):

- ``release JOB...``: the jobs ended; their GPUs are free again;
- ``cancel JOB...``: stop jobs whether they run (their GPUs are freed) or wait in the queue
  (they leave it);
- ``requeue JOB...``: stop running jobs and queue them again (after a failure, to make room);
  ``place --state S --queued JOB`` places one again, ``explain --queued JOB`` says why it
  waits, ``status`` lists the queue.

Every command changes the state file all or nothing (every job named must exist) and writes it
atomically.
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from gpuplace._util.documents import exclusive_lock
from gpuplace.cli.common import emit, format_option, open_state, out, state_options
from gpuplace.cluster.mig import MIG_JOB
from gpuplace.cluster.state import ClusterState
from gpuplace.errors import InvalidState

__all__ = ["cancel_cmd", "release_cmd", "requeue_cmd"]


def _running(state: ClusterState, name: str, verb: str) -> dict[str, Any]:
    """The running job's row (before it stops); InvalidState when it does not run."""
    if name == MIG_JOB and state.mig is not None:
        raise InvalidState(
            f"{name!r} holds the GPUs in MIG mode; release MIG requests with `gpuplace mig release`"
        )
    gpus = state.job_gpus(name)
    if gpus is None:
        running = [n for n in state.jobs if n != MIG_JOB or state.mig is None]
        listing = ", ".join(repr(n) for n in running[:10]) or "none"
        queued = " (it is queued: use cancel)" if name in state.queue and verb != "cancel" else ""
        raise InvalidState(f"no job named {name!r} is running{queued}; running: {listing}")
    topo = state.topology
    hosts = sorted({topo.host_of(int(g)) for g in gpus}, key=topo.hosts.index)
    return {"job": name, "was": "running", "gpus": len(gpus), "hosts": hosts}


def _run(
    verb: str,
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    names: tuple[str, ...],
    reason: str,
    fmt: str,
) -> None:
    if len(set(names)) != len(names):
        raise click.UsageError("a job is named twice")
    rows: list[dict[str, Any]] = []
    with exclusive_lock(state_path):
        state = open_state(state_path, cluster, nodes, racks)
        # Every name is checked before anything changes, so errors name the state as it is.
        for name in names:
            if verb == "cancel" and name in state.queue and state.job_gpus(name) is None:
                job = state.queue[name].job
                rows.append({"job": name, "was": "queued", "gpus": job.gpus, "hosts": []})
            else:
                rows.append(_running(state, name, verb))
        for row in rows:
            if row["was"] == "queued":
                state.dequeue(row["job"])
            elif verb == "requeue":
                state.requeue(row["job"], reason)
            else:
                state.release(row["job"])
        state.save(state_path)
    document = {
        "action": verb,
        "jobs": rows,
        "queue": list(state.queue),
        "free_gpus": state.free_gpus,
        "total_gpus": state.topology.num_gpus,
        "state": state_path,
    }
    if fmt == "json":
        emit(document)
        return
    done = {"release": "released", "cancel": "cancelled", "requeue": "requeued"}[verb]
    table = Table("job", "was", "GPUs", "hosts", title=done, title_justify="left")
    for row in rows:
        table.add_row(row["job"], row["was"], str(row["gpus"]), _hosts(row["hosts"]))
    out.print(table)
    queue = f"; queued: {', '.join(state.queue)}" if state.queue else ""
    out.print(
        f"{state.free_gpus} of {state.topology.num_gpus} GPUs free{queue}; saved {state_path}"
    )


def _hosts(hosts: list[str]) -> str:
    if not hosts:
        return "-"
    return ", ".join(hosts[:6]) + (f" ... ({len(hosts)} hosts)" if len(hosts) > 6 else "")


@click.command("release")
@state_options
@click.argument("names", nargs=-1, required=True, metavar="JOB...")
@format_option
def release_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    names: tuple[str, ...],
    fmt: str,
) -> None:
    """The jobs ended: free their GPUs (all named jobs, or none if one is not running)."""
    _run("release", state_path, cluster, nodes, racks, names, "", fmt)


@click.command("cancel")
@state_options
@click.argument("names", nargs=-1, required=True, metavar="JOB...")
@format_option
def cancel_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    names: tuple[str, ...],
    fmt: str,
) -> None:
    """Cancel jobs: a running one's GPUs are freed, a queued one leaves the queue."""
    _run("cancel", state_path, cluster, nodes, racks, names, "", fmt)


@click.command("requeue")
@state_options
@click.argument("names", nargs=-1, required=True, metavar="JOB...")
@click.option("--reason", default="", help="Why, kept with the queued job (free text).")
@format_option
def requeue_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    names: tuple[str, ...],
    reason: str,
    fmt: str,
) -> None:
    """Stop running jobs and queue them again: their GPUs are freed and their specs wait in
    the state's queue until `gpuplace place --state FILE --queued JOB`."""
    _run("requeue", state_path, cluster, nodes, racks, names, reason, fmt)
