"""Hypothesis profiles and shared fixtures of the gpuplace test suite (strategies live in
``tests/strategies.py``, the cost oracle in ``tests/reference.py``).

Hypothesis profiles are chosen by ``GPUPLACE_HYPOTHESIS_PROFILE``: ``ci`` (the default: few
examples, derandomized, no deadline, so a run is fast and repeatable) or ``deep`` (many random
examples, for a long run on demand).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import gpuplace
import pytest
from hypothesis import HealthCheck, settings

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:  # `import reference` from any test module
    sys.path.insert(0, str(TESTS))


def pytest_configure(config: pytest.Config) -> None:
    # Hypothesis imports libcst to explain a failure; libcst still uses the deprecated
    # mypy_extensions.TypedDict, which filterwarnings=error would turn into an INTERNALERROR
    # that hides the real failure report.
    config.addinivalue_line(
        "filterwarnings", "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
    )


settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("GPUPLACE_HYPOTHESIS_PROFILE", "ci"))


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def superpod() -> gpuplace.Topology:
    """4 DGX H100 leaves of 32 nodes (128 nodes, 1024 GPUs)."""
    return gpuplace.Topology.preset("h100-superpod", nodes=128)


@pytest.fixture(scope="session")
def dgx() -> gpuplace.Topology:
    return gpuplace.Topology.preset("dgx-h100")


@pytest.fixture
def tp8_allreduce() -> gpuplace.Job:
    return gpuplace.Job(
        name="tp8",
        tp=8,
        communication={"tp": gpuplace.Communication("all-reduce", 1e9, 1.0)},
        confine={},
    )


@pytest.fixture(autouse=True)
def _solver_registry_restored():
    """Solvers a test registers are gone after it: the registry is global, and a test solver
    left behind would run in every later suite that places with all registered solvers (the
    bench once ran a test's solver that returned 39 GPUs for a 64-rank job)."""
    from gpuplace.placement import registry

    saved = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
