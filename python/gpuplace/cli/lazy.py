"""Commands whose modules are imported only when they run: the service's server stack
(FastAPI, uvicorn, prometheus-client) takes seconds to import on a loaded host, and every
other command (``gpuplace place`` in a scheduler's hook) should not pay for it."""

from __future__ import annotations

import importlib
from typing import Any

import click

__all__ = ["LazyGroup"]


class LazyGroup(click.Group):
    """A click group with some commands given as ``name -> (module, attribute)``."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            module, attribute = self.lazy[cmd_name]
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):  # pragma: no cover - a wiring bug
                raise TypeError(f"{module}.{attribute} is not a click command")
            return command
        return super().get_command(ctx, cmd_name)
