"""The ``gpuplace`` command line.

Every user error prints one line, ``gpuplace: error: ...``, on stderr and exits with status 2;
no traceback reaches the user. State files are written atomically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from gpuplace._validate import exclusive_lock, write_atomically
from gpuplace.admission import apply_preemption
from gpuplace.commands.bench import bench
from gpuplace.commands.topo import topo
from gpuplace.errors import GpuplaceError, InvalidTopology
from gpuplace.io import writers
from gpuplace.job import Job
from gpuplace.placement import Placement, place, solvers
from gpuplace.presets import PRESETS
from gpuplace.state import ClusterState
from gpuplace.topology import Topology

__all__ = ["cli", "load_cluster", "main"]

_out = Console(highlight=False, soft_wrap=True)


def load_cluster(cluster: str, nodes: int | None = None, racks: int | None = None) -> Topology:
    """A preset name (with --nodes / --racks) or a topology file."""
    if cluster in PRESETS:
        return Topology.preset(cluster, nodes=nodes, racks=racks)
    path = Path(cluster)
    if not path.exists():
        raise InvalidTopology(
            f"unknown cluster {cluster!r}: neither a preset ({', '.join(PRESETS)}) nor an existing file"
        )
    if nodes is not None or racks is not None:
        raise InvalidTopology("--nodes and --racks apply to presets, not to a topology file")
    return Topology.load(path)


def _fmt_bytes(b: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def print_placement(p: Placement) -> None:
    table = Table(
        title=f"{p.job.name} on {p.topology.name}", show_header=False, title_justify="left"
    )
    table.add_column(style="bold")
    table.add_column()
    table.add_row("solver", p.solver + (" (proven optimal)" if p.optimal else ""))
    table.add_row("GPUs", str(len(p.gpus)))
    table.add_row("hosts", f"{len(p.nodes)}: {p.hostlist()}")
    table.add_row("spans", p.cost.span_level or "one GPU")
    table.add_row("comm per step", f"{p.cost.comm_seconds * 1e3:.3f} ms (no overlap assumed)")
    for name, seconds in p.cost.class_seconds.items():
        table.add_row(f"  {name}", f"{seconds * 1e3:.3f} ms")
    if p.cost.traffic_seconds:
        table.add_row("  explicit traffic", f"{p.cost.traffic_seconds * 1e3:.3f} ms")
    for level, b in p.cost.bytes_by_level.items():
        table.add_row(f"bytes via {level}", _fmt_bytes(b))
    table.add_row("confinement", "ok" if p.cost.confinement_ok else "; ".join(p.cost.violations))
    if p.bound is not None:
        table.add_row("bound / gap", f"{p.bound * 1e3:.3f} ms / {100 * (p.gap or 0):.2f} %")
    table.add_row("solve time", f"{p.elapsed_s * 1e3:.2f} ms")
    for key, value in describe_policy(p.details).items():
        table.add_row(key, value)
    _out.print(table)


def describe_policy(details: dict[str, Any]) -> dict[str, str]:
    """Rows for what the policy layer did: pool, borrowing, rules, preemption."""
    rows: dict[str, str] = {}
    info = details.get("policy", {})
    if "pool" in info:
        rows["pool"] = info["pool"] + (
            f" (borrowed {info['borrowed_gpus']} GPUs from {', '.join(info['borrowed_from'])})"
            if info.get("borrowed_gpus")
            else ""
        )
    if info.get("rules"):
        rows["hardware rules"] = "; ".join(info["rules"])
    if details.get("elastic"):
        rows["elastic"] = details["elastic"]["summary"]
    pre = details.get("preemption")
    if pre:
        victims = ", ".join(
            f"{v['job']} ({v['gpus']} GPUs, {v['priority_class']})" for v in pre["victims"]
        )
        rows["preempts"] = f"{victims}; {pre['cost']['gpus']} GPUs in total"
    return rows


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpuplace")
def cli() -> None:
    """Topology-aware placement of distributed GPU jobs."""


@cli.command("presets")
def presets_cmd() -> None:
    """List the built-in clusters."""
    table = Table("preset", "parameters", "description")
    for name, preset in PRESETS.items():
        params = ", ".join(f"--{k} (default {v})" for k, v in preset.params.items()) or "-"
        table.add_row(name, params, preset.description)
    _out.print(table)


@cli.command("solvers")
def solvers_cmd() -> None:
    """List the registered solvers."""
    table = Table("solver", "description")
    for name, description in solvers().items():
        table.add_row(name, description)
    _out.print(table)


cluster_options: list[Callable[[Any], Any]] = [
    click.option("--cluster", "-c", required=True, help="A preset name or a topology file."),
    click.option("--nodes", type=int, default=None, help="Preset size in hosts."),
    click.option("--racks", type=int, default=None, help="Preset size in racks (gb200-nvl72)."),
]


def with_cluster(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(cluster_options):
        func = option(func)
    return func


@cli.command("place")
@with_cluster
@click.option(
    "--job",
    "-j",
    "job_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Job file (YAML/JSON).",
)
@click.option("--solver", "-s", default="greedy", show_default=True, help="See `gpuplace solvers`.")
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="State file: read if present, and the placement is allocated in it (written atomically).",
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
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
def place_cmd(
    cluster: str,
    nodes: int | None,
    racks: int | None,
    job_path: str,
    solver: str,
    state_path: str | None,
    name: str | None,
    emits: tuple[str, ...],
    seed: int,
    time_limit: float | None,
    preempt: bool,
    fmt: str,
) -> None:
    """Place a job on a cluster."""
    targets = [_emit_target(e) for e in emits]
    topology = load_cluster(cluster, nodes, racks)
    job = Job.load(job_path)
    if name is not None:
        job = dataclasses.replace(job, name=name)
    lock = exclusive_lock(state_path) if state_path is not None else contextlib.nullcontext()
    with lock:
        if state_path is not None and Path(state_path).exists():
            state = ClusterState.load(topology, state_path)
        else:
            state = ClusterState(topology)
        placement = place(state, job, solver, seed=seed, time_limit=time_limit, preempt=preempt)
        # Render every output before changing anything, so an output that cannot be written
        # for this placement (torchrun with interleaved hosts) leaves the state file as it was.
        rendered = [(path, EMITTERS[kind](placement)) for kind, path in targets]
        if state_path is not None:
            apply_preemption(state, placement)
            state.save(state_path)
    for path, text in rendered:
        write_atomically(path, text if text.endswith("\n") else text + "\n")
    if fmt == "json":
        click.echo(json.dumps(placement.to_dict()))
    else:
        print_placement(placement)
        if state_path is not None:
            _out.print(
                f"allocated in {state_path}: {state.free_gpus} of {topology.num_gpus} GPUs free"
            )


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


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning every user error into one line on stderr."""
    try:
        cli.main(args=argv, prog_name="gpuplace", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("gpuplace: error: aborted", err=True)
        return 130
    except click.ClickException as exc:
        click.echo(f"gpuplace: error: {exc.format_message()}", err=True)
        return 2
    except GpuplaceError as exc:
        message = " ".join(str(exc).split("\n"))
        click.echo(f"gpuplace: error: {message}", err=True)
        return 2
    except KeyboardInterrupt:
        click.echo("gpuplace: error: interrupted", err=True)
        return 130
    except OSError as exc:
        click.echo(
            f"gpuplace: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True
        )
        return 2
    return 0


cli.add_command(bench)
cli.add_command(topo)

from gpuplace.commands import health as _health  # noqa: E402  (after cli is defined)

cli.add_command(_health.fail)
cli.add_command(_health.degrade)
cli.add_command(_health.recover)
cli.add_command(_health.drain)
cli.add_command(_health.repair_cmd)
cli.add_command(_health.status)

from gpuplace.commands import policy as _policy  # noqa: E402

cli.add_command(_policy.policy)
cli.add_command(_policy.explain_cmd)

from gpuplace.commands import mig as _mig  # noqa: E402

cli.add_command(_mig.mig_group)

if __name__ == "__main__":
    sys.exit(main())
