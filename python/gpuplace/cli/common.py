"""What the CLI commands share: the console; the cluster options (``--cluster``, ``--nodes``,
``--racks``, ``-p KEY=VALUE``) and the state options (``--state``, read-only or changed),
``load_cluster`` and ``open_state``; the output convention (``--format table|json``, one JSON
object on stdout, :func:`emit`); the one place errors are reported (:func:`report_error`: one
line on stderr, exit status 2, and with ``--format json`` a JSON error object on stdout); and
the placement table.

A new command adopts the convention with ``@format_option`` and ``emit(document)``, and names
its output's schema in :mod:`gpuplace.cli.schemas` (tested in tests/test_cli_json.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from gpuplace.cli.reports import placement_rows
from gpuplace.cluster.fabric import Collisions
from gpuplace.cluster.state import ClusterState
from gpuplace.enums import SparePolicy
from gpuplace.errors import GpuplaceError, Infeasible, InvalidState, InvalidTopology
from gpuplace.model.options import parse_assignments
from gpuplace.model.presets import PRESETS
from gpuplace.model.topology import Topology
from gpuplace.placement.compare import add_step_rows
from gpuplace.placement.result import Placement

__all__ = [
    "ERROR_EXIT",
    "FORMATS",
    "cluster_params",
    "describe_policy",
    "emit",
    "error_document",
    "fmt_bytes",
    "format_option",
    "json_requested",
    "load_cluster",
    "open_state",
    "out",
    "param_option",
    "plain",
    "print_placement",
    "read_state_options",
    "report_bug",
    "report_error",
    "spares_option",
    "state_options",
    "state_or_cluster",
    "with_cluster",
    "with_optional_cluster",
]

out = Console(highlight=False, soft_wrap=True)

# ------------------------------------------------------------------------- output formats
#: ``--format`` values: ``table`` for people, ``json`` for programs.
FORMATS = ("table", "json")
#: The exit status of every user error (input, state, infeasible, usage, files).
ERROR_EXIT = 2
#: The exit status of a bug in gpuplace (an exception that is not a user error).
BUG_EXIT = 1


def format_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--format table|json`` (the function's ``fmt``): with json the command prints one JSON
    object on stdout, errors included (see :func:`report_error`); its schema is
    ``gpuplace schema NAME`` (docs/cli.md)."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="table for people; json: one JSON object on stdout, errors included "
        "(schemas: `gpuplace schema`).",
    )(func)


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays made plain Python and non-finite floats made
    None, so that it is valid JSON."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def emit(document: dict[str, Any]) -> None:
    """Print one JSON object (a command's ``--format json`` output) on one line of stdout."""
    click.echo(json.dumps(plain(document), allow_nan=False))


def json_requested(argv: Sequence[str]) -> bool:
    """Whether a command line asks for ``--format json`` (options after ``--`` belong to
    another program); read from the arguments, so that an error raised while click parses
    them is reported in JSON too."""
    args = list(argv)
    if "--" in args:
        args = args[: args.index("--")]
    for i, arg in enumerate(args):
        if arg == "--format=json" or (arg == "--format" and args[i + 1 : i + 2] == ["json"]):
            return True
    return False


def error_document(exc: BaseException) -> dict[str, Any]:
    """What a command prints for an error with ``--format json``: ``{"error": {"class",
    "message", "exit_code"}}``, and for an :class:`Infeasible` with an account, its
    ``explanation`` (the schema is ``gpuplace schema error``)."""
    kind, message, code = _classify(exc)
    error: dict[str, Any] = {"class": kind, "message": message, "exit_code": code}
    explanation = getattr(exc, "explanation", None)
    if isinstance(exc, Infeasible) and explanation is not None:
        error["explanation"] = explanation.to_dict()
    return {"error": error}


def _classify(exc: BaseException) -> tuple[str, str, int]:
    if isinstance(exc, click.exceptions.Abort):
        return "Aborted", "aborted", 130
    if isinstance(exc, KeyboardInterrupt):
        return "Interrupted", "interrupted", 130
    if isinstance(exc, click.UsageError):
        return "UsageError", exc.format_message(), ERROR_EXIT
    if isinstance(exc, click.ClickException):
        return "CommandError", exc.format_message(), ERROR_EXIT
    if isinstance(exc, GpuplaceError):
        return type(exc).__name__, " ".join(str(exc).split("\n")), ERROR_EXIT
    if isinstance(exc, OSError):
        where = exc.filename or ""
        return "OSError", f"{exc.strerror or exc}: {where}".rstrip(": "), ERROR_EXIT
    return type(exc).__name__, str(exc), ERROR_EXIT


def report_error(exc: BaseException, *, json_output: bool) -> int:
    """The one place a user error is reported: one line ``gpuplace: error: ...`` on stderr
    and, with ``--format json``, the :func:`error_document` on stdout. Returns the exit
    status (2; 130 when interrupted)."""
    document = error_document(exc)
    click.echo(f"gpuplace: error: {document['error']['message']}", err=True)
    if json_output:
        emit(document)
    return int(document["error"]["exit_code"])


def report_bug(exc: BaseException, *, json_output: bool) -> int:
    """Report an exception that is not a user error: one line asking to report it (the
    traceback is printed before it with ``--debug``), exit status 1."""
    what = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if len(what) > 300:
        what = what[:297] + "..."
    message = (
        f"internal error ({what}); this is a bug in gpuplace: please report it with the "
        "command line and the traceback that `gpuplace --debug ...` prints"
    )
    click.echo(f"gpuplace: error: {message}", err=True)
    if json_output:
        emit({"error": {"class": "InternalError", "message": message, "exit_code": BUG_EXIT}})
    return BUG_EXIT


def load_cluster(
    cluster: str,
    nodes: int | None = None,
    racks: int | None = None,
    params: tuple[str, ...] | None = None,
) -> Topology:
    """A preset name or a topology file, with ``--nodes`` / ``--racks`` and the ``-p
    KEY=VALUE`` items (``params``; default: those of the running command)."""
    options = parse_assignments(cluster_params() if params is None else params)
    for key, value in (("nodes", nodes), ("racks", racks)):
        if value is None:
            continue
        if key in options and options[key] != value:
            raise InvalidTopology(f"--{key} {value} and -p {key}={options[key]} disagree")
        if cluster not in PRESETS:
            raise InvalidTopology("--nodes and --racks apply to presets, not to a topology file")
        options[key] = value
    return Topology.from_spec(cluster, options)


def fmt_bytes(b: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def print_placement(
    p: Placement,
    comparison: dict[str, Any] | list[dict[str, Any]] | None = None,
    fabric: Collisions | None = None,
) -> None:
    """The placement as a table: comm per class (with the NCCL algorithm priced), bytes per
    level, the flows crossing each fabric level and what hash collisions cost (when given),
    step time and MFU, and the comparison lines against the peers when given."""

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
        algorithm = p.cost.class_algorithms.get(name)
        table.add_row(
            f"  {name}", f"{seconds * 1e3:.3f} ms" + (f" ({algorithm})" if algorithm else "")
        )
    if p.cost.traffic_seconds:
        table.add_row("  explicit traffic", f"{p.cost.traffic_seconds * 1e3:.3f} ms")
    for level, b in p.cost.bytes_by_level.items():
        table.add_row(f"bytes via {level}", fmt_bytes(b))
    table.add_row("confinement", "ok" if p.cost.confinement_ok else "; ".join(p.cost.violations))
    if fabric is not None:
        for label, value in collision_rows(fabric):
            table.add_row(label, value)
    for label, value in placement_rows(p):
        table.add_row(label, value)
    add_step_rows(table, p.cost, comparison)
    if p.bound is not None:
        table.add_row("bound / gap", f"{p.bound * 1e3:.3f} ms / {100 * (p.gap or 0):.2f} %")
    table.add_row("solve time", f"{p.elapsed_s * 1e3:.2f} ms")
    for key, value in describe_policy(p.details).items():
        table.add_row(key, value)
    out.print(table)


def collision_rows(fabric: Collisions) -> list[tuple[str, str]]:
    """Per fabric level its routing, the flows crossing it and the share the fullest link
    leaves them; then the slowdown over balanced routing."""
    rows = []
    for lv in fabric.levels:
        how = lv.routing + (f", {lv.qps_per_connection} QPs" if lv.qps_per_connection > 1 else "")
        if lv.flows <= 0:
            rows.append((f"flows up from {lv.level}", f"none ({how})"))
            continue
        load = "fullest link" if lv.routing in ("ecmp", "static") else "mean per link"
        rows.append(
            (
                f"flows up from {lv.level}",
                f"{lv.flows:.0f} over {lv.uplinks} uplink{'s' * (lv.uplinks != 1)} of "
                f"{lv.links} links ({how}): {load} {lv.fullest:.2f} flows, "
                f"{100 * lv.share:.0f} % of line rate",
            )
        )
    rows.append(
        (
            "collision slowdown",
            f"x{fabric.slowdown:.2f} over balanced routing "
            f"({fabric.seconds * 1e3:.3f} ms vs {fabric.balanced_seconds * 1e3:.3f} ms)",
        )
    )
    return rows


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


#: Help of ``-p``, one convention for every command that names a cluster.
PARAM_HELP = (
    "A preset parameter or topology option, KEY=VALUE (repeatable): nodes=64, racks=4, "
    "oversubscription=2, power.leaf.budget_w=400000, power_phases=2, "
    "levels.leaf.sharp=true, ... (`gpuplace presets` lists them)."
)


def _keep_params(ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> None:
    ctx.meta[_PARAMS] = tuple(value)


_PARAMS = "gpuplace.cluster_params"


def cluster_params() -> tuple[str, ...]:
    """The ``-p KEY=VALUE`` items of the running command (kept in its click context, so that
    every command that names a cluster takes them without one more argument)."""
    ctx = click.get_current_context(silent=True)
    return tuple(ctx.meta.get(_PARAMS, ())) if ctx is not None else ()


def param_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--param",
        "-p",
        "params",
        multiple=True,
        metavar="KEY=VALUE",
        expose_value=False,
        callback=_keep_params,
        help=PARAM_HELP,
    )(func)


def with_cluster(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--cluster/-c`` (required), ``--nodes``, ``--racks`` and ``-p KEY=VALUE``."""
    return _cluster_options(func, required=True)


def with_optional_cluster(func: Callable[..., Any]) -> Callable[..., Any]:
    """As :func:`with_cluster`, for commands where ``--state`` may name the cluster instead."""
    return _cluster_options(func, required=False)


def _cluster_options(func: Callable[..., Any], *, required: bool) -> Callable[..., Any]:
    options: list[Callable[[Any], Any]] = [
        click.option(
            "--cluster",
            "-c",
            required=required,
            default=None,
            help="A preset name or a topology file"
            + ("." if required else " (default: the one the --state file names)."),
        ),
        click.option("--nodes", type=int, default=None, help="Preset size in hosts (-p nodes=N)."),
        click.option(
            "--racks",
            type=int,
            default=None,
            help="Preset size in racks (-p racks=N, gb200-nvl72).",
        ),
        param_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def spares_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--spares``: the labels of the core's :class:`gpuplace.SparePolicy` (``allow`` by
    default); the command receives the member."""
    return click.option(
        "--spares",
        type=click.Choice([p.label for p in SparePolicy.members()]),
        default=SparePolicy.Allow.label,
        show_default=True,
        callback=lambda _ctx, _param, label: SparePolicy.from_label(label),
        help=help,
    )


def _state_options(func: Callable[..., Any], help_text: str) -> Callable[..., Any]:
    options: list[Callable[[Any], Any]] = [
        click.option(
            "--state",
            "state_path",
            required=True,
            type=click.Path(dir_okay=False),
            help=help_text,
        ),
        click.option(
            "--cluster",
            "-c",
            default=None,
            help="A preset name or a topology file (default: the one the state file names).",
        ),
        click.option("--nodes", type=int, default=None, help="Preset size in hosts (-p nodes=N)."),
        click.option(
            "--racks",
            type=int,
            default=None,
            help="Preset size in racks (-p racks=N, gb200-nvl72).",
        ),
        param_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def state_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--state`` (read, changed all or nothing, written atomically) and the cluster options
    for a state file that does not name its cluster yet."""
    return _state_options(func, "State file (read, changed all or nothing, written atomically).")


def read_state_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--state`` of a command that only reads it, and the cluster options."""
    return _state_options(func, "State file (only read: this command does not change it).")


def open_state(
    state_path: str, cluster: str | None, nodes: int | None, racks: int | None
) -> ClusterState:
    """The state in ``state_path`` on its cluster; a new empty state when the file does not
    exist (then ``--cluster`` is required)."""
    exists = Path(state_path).exists()
    remembered = ClusterState.cluster_of(state_path) if exists else None
    if cluster is None and (nodes is not None or racks is not None or cluster_params()):
        raise click.UsageError(
            "--nodes, --racks and -p describe a --cluster; the state file remembers its own"
        )
    if cluster is not None:
        topology = load_cluster(cluster, nodes, racks)
    elif remembered is not None:
        topology = _rebuild(remembered, state_path)
    elif exists:
        raise InvalidState(
            f"{state_path}: the state file does not name its cluster; give --cluster"
        )
    else:
        raise InvalidState(f"{state_path}: no such state file; give --cluster to start a new one")
    if not exists:
        return ClusterState(topology)
    return ClusterState.load(topology, state_path)


def _rebuild(cluster: dict[str, Any], state_path: str) -> Topology:
    if not isinstance(cluster.get("preset"), str) and not isinstance(cluster.get("file"), str):
        raise InvalidState(f"{state_path}: cluster: expected a preset or a file; give --cluster")
    try:
        return Topology.from_origin(cluster)
    except InvalidTopology as exc:
        raise InvalidState(f"{state_path}: the cluster it names cannot be built: {exc}") from None


def state_or_cluster(
    state_path: str | None,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    *,
    new: bool = True,
) -> ClusterState:
    """The state a command works on when ``--state`` is optional: the state file's (on its
    remembered cluster unless ``--cluster`` is given), a new empty state on ``--cluster``
    when the file does not exist yet (``new``) or no ``--state`` is given."""
    if state_path is not None and Path(state_path).exists():
        return open_state(state_path, cluster, nodes, racks)
    if state_path is not None and not new:
        raise InvalidState(f"{state_path}: no such state file")
    if cluster is None:
        raise click.UsageError(
            "give --cluster (a preset or a topology file), or --state naming a state file "
            "that remembers its cluster"
        )
    return ClusterState(load_cluster(cluster, nodes, racks))
