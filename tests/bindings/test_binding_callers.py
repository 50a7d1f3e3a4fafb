"""Every binding of the native module has a caller: the package (or a benchmark) calls it, or
it is one of the few test-only bindings, which the package never calls and whose tests live in
this folder (tokenizers keeps the tests that mirror its bindings in ``tests/bindings/``). A
binding that nothing calls is dead and is removed rather than kept."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import gpuplace
import pytest
from gpuplace import _core

PACKAGE = Path(gpuplace.__file__).parent
BENCHES = Path(__file__).resolve().parents[2] / "benches"
HERE = Path(__file__).resolve().parent

#: Bindings only tests call: the load the state keeps per uplink and one job's flows
#: (test_fabric_binding), the policy fence (test_policy_binding), NCCL's ring hops
#: (test_nccl_binding).
TEST_ONLY = {"fabric_load", "job_load", "fence_mask", "ring_hops"}


def _names_used(paths: list[Path]) -> set[str]:
    used: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.alias):
                used.add(node.name)
    return used


def _bindings() -> list[str]:
    """The native module's functions, and the methods and attributes of its classes (enum
    members aside), as ``name`` or ``Class.name``."""
    out = []
    for name, obj in vars(_core).items():
        if name.startswith("_") or name == "MIN_FACTOR":
            continue
        if inspect.isclass(obj):
            out += [
                f"{name}.{attr}"
                for attr, value in vars(obj).items()
                if not attr.startswith("_") and not isinstance(value, obj)  # enum members
            ]
        else:
            out.append(name)
    return sorted(out)


def test_every_binding_is_called_by_the_package_or_is_a_listed_test_only_one() -> None:
    if not BENCHES.is_dir():
        pytest.skip("not run from a source tree")
    used = _names_used([p for p in PACKAGE.rglob("*.py")] + sorted(BENCHES.rglob("*.py")))
    uncalled = [b for b in _bindings() if b.rpartition(".")[2] not in used]
    assert sorted(uncalled) == sorted(TEST_ONLY)


def test_the_package_never_calls_a_test_only_binding_and_each_is_tested_here() -> None:
    package = _names_used(list(PACKAGE.rglob("*.py")))
    assert not TEST_ONLY & package
    here = _names_used([p for p in HERE.glob("test_*_binding.py")])
    assert TEST_ONLY <= here
    assert TEST_ONLY <= set(vars(_core))
