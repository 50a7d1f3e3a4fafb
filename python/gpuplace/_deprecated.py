"""Deprecated module paths of the flat layout (gpuplace 0.1), kept for one release.

``import gpuplace.state`` or ``from gpuplace.topology import Topology`` still work and give the
module at its new home, with a :class:`DeprecationWarning` naming it. The table is the
CHANGELOG's list of moves; remove it in the next release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

#: Old module (under ``gpuplace.``) -> its new home; a module split in two has both, the
#: names of the first looked up before the second's.
MOVED: dict[str, str | tuple[str, ...]] = {
    "_validate": "gpuplace._util.documents",
    "hostlist": "gpuplace._util.hostlist",
    "topology": "gpuplace.model.topology",
    "topology_schema": "gpuplace.model.schema",
    "topology_networkx": "gpuplace.model.graph",
    "presets": "gpuplace.model.presets",
    "job": "gpuplace.model.job",
    "step": ("gpuplace.model.step", "gpuplace.placement.result"),
    "io.model": "gpuplace.model.inventory",
    "power": ("gpuplace.model.power", "gpuplace.cluster.power"),
    "storage": ("gpuplace.model.storage", "gpuplace.cluster.storage", "gpuplace.placement.place"),
    "mig": ("gpuplace.cluster.mig", "gpuplace.model.mig"),
    "state": "gpuplace.cluster.state",
    "state_file": "gpuplace.cluster.state_file",
    "fabric": "gpuplace.cluster.fabric",
    "pricing": "gpuplace.cluster.pricing",
    "admission": "gpuplace.placement.within_policy",
    "explain": ("gpuplace.placement.explain", "gpuplace.placement.constraints"),
    "repair": "gpuplace.placement.repair",
    "mapping": "gpuplace.placement.mapping",
    "report": "gpuplace.placement.compare",
    "elastic": ("gpuplace.placement.elastic", "gpuplace.model.job"),
    "placers": "gpuplace.placement.solvers",
    "placers.auto": "gpuplace.placement.solvers.auto",
    "placers.baselines": "gpuplace.placement.solvers.baselines",
    "placers.cpsat": "gpuplace.placement.solvers.cpsat",
    "placers.cpsat_gpus": "gpuplace.placement.solvers.cpsat_gpus",
    "io.health": "gpuplace.health.readers",
    "slurm": "gpuplace.integrations.slurm",
    "ray": "gpuplace.integrations.ray",
    "k8s": "gpuplace.integrations.k8s",
    "extender": "gpuplace.integrations.extender",
    "commands": "gpuplace.cli",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str | tuple[str, ...]):
        self.targets = (target,) if isinstance(target, str) else target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {' and '.join(self.targets)}; the old path goes away in the "
            "next release",
            DeprecationWarning,
            stacklevel=2,
        )
        modules = [importlib.import_module(t) for t in self.targets]
        if len(modules) == 1:
            return modules[0]
        merged = ModuleType(spec.name, modules[0].__doc__)

        def lookup(name: str) -> Any:
            for module in modules:
                if hasattr(module, name):
                    return getattr(module, name)
            raise AttributeError(f"module {spec.name!r} has no attribute {name!r}")

        # A module's own __getattr__ (PEP 562) is an attribute of the module object; mypy takes
        # the assignment for overriding ModuleType's method.
        merged.__getattr__ = lookup  # type: ignore[method-assign]
        return merged

    def exec_module(self, module: ModuleType) -> None:
        # The target module is already executed; importlib registers it under the old name.
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        prefix = "gpuplace."
        if not fullname.startswith(prefix):
            return None
        new = MOVED.get(fullname[len(prefix) :])
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
