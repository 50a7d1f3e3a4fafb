"""``gpuplace fabric``: the fabric's load, uplink level by uplink level.

Where every host NIC of a fabric job runs at 100 % (a data-parallel ring drives each NIC at its
share), a list of the hottest uplinks overall is all NICs and hides the leaf and spine uplinks
that decide contention between jobs. This view ranks each level on its own: for the host
NICs, the leaf uplinks, the spine uplinks (and so on), how many uplink directions carry load,
how many are over capacity, and the hottest of each; then the running jobs by slowdown.
"""

from __future__ import annotations

from pathlib import Path

import click

from gpuplace.cli.common import emit, format_option, open_state, out, read_state_options
from gpuplace.cli.reports import print_jobs_hurt, print_uplink_levels
from gpuplace.errors import InvalidState

__all__ = ["fabric_cmd"]


@click.command("fabric")
@read_state_options
@click.option(
    "--top",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    help="Hottest uplinks to list per level, and jobs by slowdown.",
)
@format_option
def fabric_cmd(
    state_path: str,
    cluster: str | None,
    nodes: int | None,
    racks: int | None,
    top: int,
    fmt: str,
) -> None:
    """The fabric's load level by level (host NICs, leaf uplinks, spine uplinks, ...) with
    the hottest uplinks of each, and the running jobs by slowdown from contention (reads the
    state; changes nothing)."""
    if not Path(state_path).exists():
        raise InvalidState(f"{state_path}: no such state file")
    state = open_state(state_path, cluster, nodes, racks)
    levels = state.uplinks_by_level(top)
    hurt = state.jobs_hurt(top)
    if fmt == "json":
        emit({"cluster": state.topology.name, "levels": levels, "jobs_hurt": hurt})
        return
    if not levels:
        out.print(f"{state.topology.name}: no running job loads the fabric")
        return
    print_uplink_levels(levels, out)
    print_jobs_hurt(hurt, out)
