"""``gpuplace presets`` and ``gpuplace solvers``: what is built in."""

from __future__ import annotations

import click
from rich.table import Table

from gpuplace.cli.common import out
from gpuplace.model.presets import PRESETS
from gpuplace.placement.registry import solvers

__all__ = ["presets_cmd", "solvers_cmd"]


@click.command("presets")
def presets_cmd() -> None:
    """List the built-in clusters."""
    table = Table("preset", "parameters", "description")
    for name, preset in PRESETS.items():
        params = ", ".join(f"--{k} (default {v})" for k, v in preset.params.items()) or "-"
        table.add_row(name, params, preset.description)
    out.print(table)


@click.command("solvers")
def solvers_cmd() -> None:
    """List the registered solvers."""
    table = Table("solver", "description")
    for name, description in solvers().items():
        table.add_row(name, description)
    out.print(table)
