"""``gpuplace presets``, ``gpuplace solvers`` and ``gpuplace schema``: what is built in, and
the schema of every command's JSON output."""

from __future__ import annotations

import json

import click
from rich.table import Table

from gpuplace.cli.common import emit, format_option, out
from gpuplace.cli.schemas import COMMANDS, SCHEMAS
from gpuplace.model.options import OPTION_KEYS
from gpuplace.model.presets import PRESETS
from gpuplace.placement.registry import solvers

__all__ = ["presets_cmd", "schema_cmd", "solvers_cmd"]


@click.command("presets")
@format_option
def presets_cmd(fmt: str) -> None:
    """List the built-in clusters, their parameters and the topology options every command
    that names a cluster takes as -p KEY=VALUE."""
    if fmt == "json":
        emit(
            {
                "presets": [
                    {"name": name, "description": p.description, "parameters": dict(p.params)}
                    for name, p in PRESETS.items()
                ],
                "options": list(OPTION_KEYS),
            }
        )
        return
    table = Table("preset", "parameters (-p KEY=VALUE)", "description")
    for name, preset in PRESETS.items():
        params = ", ".join(f"{k}={v}" for k, v in preset.params.items()) or "-"
        table.add_row(name, params, preset.description)
    out.print(table)
    out.print(
        "Every preset and topology file also takes these options, -p KEY=VALUE "
        "(docs/topology-format.md):"
    )
    for key in OPTION_KEYS:
        out.print(f"  {key}")


@click.command("solvers")
@format_option
def solvers_cmd(fmt: str) -> None:
    """List the registered solvers."""
    registered = solvers()
    if fmt == "json":
        emit(
            {"solvers": [{"name": name, "description": text} for name, text in registered.items()]}
        )
        return
    table = Table("solver", "description")
    for name, description in registered.items():
        table.add_row(name, description)
    out.print(table)


@click.command("schema")
@click.argument("name", required=False)
@format_option
def schema_cmd(name: str | None, fmt: str) -> None:
    """The JSON Schema of a command's --format json output; without NAME, the schema each
    command prints. NAME is a command (place, mig status) or a schema (lifecycle, error)."""
    if name is None:
        if fmt == "json":
            emit({"schemas": sorted(SCHEMAS), "commands": dict(COMMANDS)})
            return
        table = Table("command", "schema of its --format json output")
        for command, schema in sorted(COMMANDS.items()):
            table.add_row(command, schema)
        out.print(table)
        out.print("every command, on an error with --format json: error")
        return
    key = COMMANDS.get(name, name)
    if key not in SCHEMAS:
        raise click.BadParameter(
            f"no schema {name!r}; see `gpuplace schema` for the list", param_hint="NAME"
        )
    if fmt == "json":
        emit(SCHEMAS[key])
    else:
        click.echo(json.dumps(SCHEMAS[key], indent=2))
