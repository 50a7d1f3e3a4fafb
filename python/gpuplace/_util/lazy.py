"""A module imported on first use: OR-Tools (with pandas behind it) takes over a second to
import, which every ``gpuplace`` command and every scheduler hook that imports gpuplace would
pay although only the CP-SAT solvers use it."""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any

__all__ = ["LazyModule"]


class LazyModule:
    """Stands for the module ``name`` and imports it at the first attribute read. Modules that
    use it write ``if TYPE_CHECKING: from x import y`` / ``else: y = LazyModule("x.y")``, so
    type checkers see the real module."""

    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None
        self._lock = threading.Lock()

    def _load(self) -> ModuleType:
        module = self._module
        if module is None:
            with self._lock:
                if self._module is None:
                    self._module = importlib.import_module(self._name)
                module = self._module
        return module

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        return getattr(self._load(), attribute)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"
