"""``gpuplace health ingest``: turn the evidence operators already collect (kernel logs, dcgmi,
nvidia-smi, ibstat/ibstatus, perfquery, ibdiagnet, mlxlink) into the state file's health,
all changes at once or none, under the state file's lock; ``--follow`` tails growing kernel
logs and applies new evidence as it arrives."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from gpuplace._util.documents import exclusive_lock
from gpuplace.cli.common import emit, format_option, open_state, spares_option, state_options
from gpuplace.cluster.state import ClusterState
from gpuplace.enums import Condition, SparePolicy
from gpuplace.errors import InvalidState
from gpuplace.health.judge import (
    IngestReport,
    Source,
    ingest,
    load_rules,
    parse_source,
    read_sources,
)
from gpuplace.health.readers import (
    FORMATS,
    DcgmiHealthStream,
    KernelLogScanner,
    ReadResult,
    detect_format,
    read_head,
)

__all__ = ["health"]

_out = Console(highlight=False, soft_wrap=True)


@click.group("health")
def health() -> None:
    """Hardware health from the tools' own output."""


@health.command("ingest")
@state_options
@click.argument("sources", nargs=-1, required=True)
@click.option("--host", default=None, help="Host of sources whose lines do not name one.")
@click.option(
    "--input-format",
    type=click.Choice(sorted(FORMATS)),
    default=None,
    help="Read every source as this format (default: recognised from the text).",
)
@click.option("--rules", "rules_path", default=None, help="Site rules (YAML) over the defaults.")
@click.option("--strict", is_flag=True, help="An unreadable evidence line is an error.")
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@click.option("--repair", "do_repair", is_flag=True, help="Repair the jobs hit (one transaction).")
@click.option("--max-moves", type=int, default=0, show_default=True, help="For --repair.")
@spares_option("For --repair: whether reserved spare GPUs may be used.")
@click.option(
    "--follow",
    is_flag=True,
    help="Keep tailing the kernel logs and dcgmi health logs; apply evidence as it arrives.",
)
@click.option(
    "--poll", type=float, default=1.0, show_default=True, help="--follow: seconds between reads."
)
@click.option(
    "--follow-seconds",
    type=float,
    default=None,
    help="--follow: stop after this many seconds (default: until interrupted).",
)
@format_option
def ingest_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    sources: tuple[str, ...],
    host: str | None,
    input_format: str | None,
    rules_path: str | None,
    strict: bool,
    dry_run: bool,
    do_repair: bool,
    max_moves: int,
    spares: SparePolicy,
    follow: bool,
    poll: float,
    follow_seconds: float | None,
    fmt: str,
) -> None:
    """Ingest health evidence into a state file.

    SOURCES are files, or HOST=FILE / HOST:DEVICE=FILE for output that does not name what it
    is about (dmesg of one host; perfquery or mlxlink of one HCA, e.g. dgx017:mlx5_3=mlxlink.txt).
    Prints each source's line counts (unknown lines are counted, never an error), the jobs
    hit and every change with its reason."""
    if max_moves < 0:
        raise click.BadParameter("expected an integer >= 0", param_hint="--max-moves")
    if poll <= 0:
        raise click.BadParameter("expected seconds > 0", param_hint="--poll")
    rules = load_rules(rules_path)
    options: dict[str, Any] = {
        "rules": rules,
        "host": host,
        "strict": strict,
        "dry_run": dry_run,
        "repair": do_repair,
        "max_moves": max_moves,
        "spares": spares,
    }

    def open_it() -> ClusterState:
        return open_state(state_path, cluster, nodes, racks)

    if follow:
        _follow(state_path, open_it, sources, input_format, options, poll, follow_seconds, fmt)
        return
    results = read_sources(sources, host=host, format=input_format, strict=strict)
    with exclusive_lock(state_path):
        state = open_it()
        report = ingest(state, results, **options)
        if not dry_run:
            state.save(state_path)
    _print(report, state_path, fmt, state)


def _print(report: IngestReport, state_path: str, fmt: str, state: Any) -> None:
    if fmt == "json":
        emit({**report.to_dict(), "state": state_path})
        return
    for r in report.sources:
        bad = (
            f", {r.malformed_total} malformed (first: line {r.malformed[0][0]}: {r.malformed[0][1]})"
            if r.malformed
            else ""
        )
        _out.print(
            f"{r.source}: {r.format}{' of ' + r.host if r.host else ''}, {r.lines} lines, "
            f"{len(r.evidence)} evidence, {r.unknown} unknown lines{bad}"
        )
    noted = len(report.findings)
    _out.print(
        f"{report.events} evidence, {noted} calling for a change, {len(report.changes)} changes"
    )
    if report.changes:
        table = Table(title="changes", title_justify="left")
        for col in ("kind", "name", "before", "after", "factor", "reason"):
            table.add_column(col)
        for c in report.changes:
            factor = f"{c.factor:.3g}" if c.after == Condition.Degraded.label else "-"
            table.add_row(c.kind, c.name, c.before, c.after, factor, c.reason)
        _out.print(table)
    for line in report.unchanged:
        _out.print(f"unchanged: {line}")
    for line in report.unmapped:
        _out.print(f"not in this cluster: {line}")
    topo = state.topology
    if not report.affected:
        _out.print("no running job is hit")
    for name, ranks in sorted(report.affected.items()):
        shown = ", ".join(str(int(r)) for r in ranks[:16]) + (" ..." if len(ranks) > 16 else "")
        _out.print(f"job {name}: {len(ranks)} ranks hit ({shown})")
    for rep in report.repairs:
        moves = ", ".join(
            f"rank {m.rank} {topo.host_of(m.old_gpu)}:{topo.local_index(m.old_gpu)} -> "
            f"{topo.host_of(m.new_gpu)}:{topo.local_index(m.new_gpu)}"
            for m in rep.moved[:8]
        )
        more = f" and {len(rep.moved) - 8} more" if len(rep.moved) > 8 else ""
        _out.print(
            f"repaired {rep.placement.job.name}: {len(rep.moved)} ranks moved"
            + (f" ({moves}{more})" if moves else "")
            + f"; comm per step {rep.cost_before.comm_seconds * 1e3:.3f} ms before, "
            f"{rep.cost_after.comm_seconds * 1e3:.3f} ms after"
        )
    _out.print(f"saved {state_path}" if report.applied else "dry run: nothing changed")


class _Tail:
    """A growing kernel log or ``dcgmi health -c`` log, read from where the last read stopped
    (and from the start again when the file was rotated or truncated)."""

    def __init__(self, source: Source, strict: bool, format: str):
        self.source = source
        self.path = os.fspath(source.path)
        self.strict = strict
        self.format = format
        self._open()

    def _open(self) -> None:
        try:
            self.handle = open(self.path, "rb")
        except OSError as exc:
            raise InvalidState(f"{self.path}: cannot read file: {exc.strerror or exc}") from None
        self.inode = os.fstat(self.handle.fileno()).st_ino
        name = os.path.basename(self.path)
        stream = KernelLogScanner if self.format == "kernel-log" else DcgmiHealthStream
        self.scanner = stream(name, host=self.source.host, strict=self.strict)

    def read(self) -> ReadResult | None:
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
        if st is not None and (st.st_ino != self.inode or st.st_size < self.handle.tell()):
            self.handle.close()
            self._open()
        data = self.handle.read()
        found = self.scanner.feed(data) if data else []
        if not found:
            return None
        return ReadResult(
            source=self.scanner.result.source,
            format=self.format,
            evidence=list(found),
            lines=0,
            host=self.source.host,
        )


def _follow(
    state_path: str,
    open_it: Callable[[], Any],
    specs: tuple[str, ...],
    input_format: str | None,
    options: dict[str, Any],
    poll: float,
    seconds: float | None,
    fmt: str,
) -> None:
    """Tail the kernel logs and ``dcgmi health -c`` logs among ``specs`` (other sources, such
    as bus-id tables, are read once and their evidence applied once): every ``poll`` seconds the new complete lines are
    read and their evidence applied, so an event is in the state file within about one poll
    interval of reaching the log."""
    tails: list[_Tail] = []
    static: list[ReadResult] = []
    for spec in specs:
        src = parse_source(spec, host=options["host"], format=input_format)
        fmt_of = src.format or detect_format(read_head(src.path))
        if fmt_of in ("kernel-log", "dcgmi-health"):
            tails.append(_Tail(src, options["strict"], fmt_of))
        else:
            static.extend(read_sources([src], strict=options["strict"]))
    if not tails:
        raise click.UsageError(
            "--follow needs a kernel log or a dcgmi health log among the sources"
        )
    deadline = None if seconds is None else time.monotonic() + seconds
    first = True
    try:
        while True:
            fresh = [r for r in (t.read() for t in tails) if r is not None]
            if fresh or (first and any(r.evidence for r in static)):
                batch = (static if first else [replace(r, evidence=[]) for r in static]) + fresh
                with exclusive_lock(state_path):
                    state = open_it()
                    report = ingest(state, batch, **options)
                    if not options["dry_run"]:
                        state.save(state_path)
                _print_follow(report, state_path, fmt)
            first = False
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(
                poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            )
    except KeyboardInterrupt:
        return


def _print_follow(report: IngestReport, state_path: str, fmt: str) -> None:
    if fmt == "json":
        emit({**report.to_dict(), "state": state_path})
        return
    stamp = time.strftime("%H:%M:%S")
    for c in report.changes:
        factor = f" {c.factor:.3g}" if c.after == Condition.Degraded.label else ""
        _out.print(f"{stamp} {c.kind} {c.name}: {c.before} -> {c.after}{factor} ({c.reason})")
    for name, ranks in sorted(report.affected.items()):
        _out.print(f"{stamp} job {name}: {len(ranks)} ranks hit")
    for rep in report.repairs:
        _out.print(f"{stamp} repaired {rep.placement.job.name}: {len(rep.moved)} ranks moved")
    if not report.changes:
        _out.print(f"{stamp} {report.events} new evidence, no change")
