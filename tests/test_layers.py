"""The package's layering, as tests: the import-linter contracts in pyproject.toml (layers, no
cycles between siblings), and what import-linter cannot see because the native module is
compiled: only the wrappers reach ``gpuplace._core``, nothing else imports the root package,
and no import hides in a function to dodge a cycle."""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import gpuplace
import pytest

PACKAGE = Path(gpuplace.__file__).parent

#: The modules that wrap the native module: they import it and touch the ``_core`` of the
#: objects that hold one (Topology, JobSpec, ClusterState). Everything else uses their API.
WRAPPERS = {
    "gpuplace",
    "gpuplace.enums",
    "gpuplace.model.topology",
    "gpuplace.model.job",
    "gpuplace.model.power",
    "gpuplace.cluster.state",
    "gpuplace.cluster.state_file",
    "gpuplace.cluster.fabric",
    "gpuplace.cluster.power",
    "gpuplace.cluster.pricing",
    "gpuplace.cluster.storage",
    "gpuplace.cluster.share",
    "gpuplace.placement.place",
    "gpuplace.placement.registry",
    "gpuplace.placement.result",
    "gpuplace.placement.repair",
    "gpuplace.placement.mapping",
    "gpuplace.placement.probe",
    "gpuplace.placement.share",
    "gpuplace.placement.solvers.cpsat",
}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, ast.parse(path.read_text(encoding="utf-8"), str(path))))
    return out


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def _imports_core(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.module == "gpuplace._core" or (
            node.module == "gpuplace" and any(a.name == "_core" for a in node.names)
        )
    if isinstance(node, ast.Import):
        return any(a.name == "gpuplace._core" for a in node.names)
    return False


def test_only_the_wrappers_import_the_native_module() -> None:
    offenders = [
        f"{name}:{node.lineno}"
        for name, tree in _modules()
        if name not in WRAPPERS
        for node in ast.walk(tree)
        if _imports_core(node)
    ]
    assert offenders == []


def test_no_private_reach_into_the_core_objects() -> None:
    """``x._core`` (a Topology's, a ClusterState's) is used only by the wrappers."""
    offenders = [
        f"{name}:{node.lineno}"
        for name, tree in _modules()
        if name not in WRAPPERS
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "_core"
    ]
    assert offenders == []


def test_nothing_imports_the_root_package_but_for_the_native_module() -> None:
    offenders = [
        f"{name}:{node.lineno}"
        for name, tree in _modules()
        if name != "gpuplace"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module == "gpuplace"
        and any(a.name != "_core" for a in node.names)
    ]
    assert offenders == []


def test_no_deferred_imports_of_gpuplace() -> None:
    """Imports inside functions hide cycles; only ``if TYPE_CHECKING:`` blocks may hold
    imports that are not at the top of a module."""
    offenders = []
    for name, tree in _modules():
        top = {id(n) for n in tree.body}
        typing_only = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Import | ast.ImportFrom)
                and id(node) not in top
                and id(node) not in typing_only
            ):
                names = (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                )
                if any(n == "gpuplace" or n.startswith("gpuplace.") for n in names):
                    offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_import_linter_contracts_are_kept() -> None:
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        pytest.skip("not run from a source tree")
    done = subprocess.run(
        ["lint-imports", "--config", str(root / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(PACKAGE.parent), "PATH": str(Path(sys.executable).parent)},
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("gpuplace.state", "gpuplace.cluster.state"),
        ("gpuplace.topology", "gpuplace.model.topology"),
        ("gpuplace.placers", "gpuplace.placement.solvers"),
        ("gpuplace.commands", "gpuplace.cli"),
        ("gpuplace.slurm", "gpuplace.integrations.slurm"),
    ],
)
def test_old_module_paths_are_deprecated_aliases(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_a_split_module_keeps_every_old_name() -> None:
    sys.modules.pop("gpuplace.power", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        power = importlib.import_module("gpuplace.power")
    from gpuplace.cluster.power import power_report
    from gpuplace.model.power import JobPower

    assert power.JobPower is JobPower
    assert power.power_report is power_report
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = power.nothing
