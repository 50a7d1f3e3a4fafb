"""Atheris fuzz target: every reader on arbitrary bytes raises nothing but InvalidTopology.

Run a bounded session (the corpus seeds are the real samples; libFuzzer writes new inputs into
the FIRST corpus directory, so name a scratch directory first, never tests/data):

    mkdir -p /tmp/fuzz-corpus
    python tests/fuzz/fuzz_readers.py -runs=20000 /tmp/fuzz-corpus tests/data/topologies

Under pytest the module is skipped cleanly when atheris is not installed; with atheris it runs
a short bounded session in a subprocess.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readers():
    from gpuplace.io import (
        read_ec2_topology,
        read_ibnetdiscover,
        read_k8s_nodes,
        read_nvidia_smi_topo,
        read_rocm_smi_topo,
        read_slurm_topology,
    )

    return [
        read_nvidia_smi_topo,
        read_rocm_smi_topo,
        read_ibnetdiscover,
        read_slurm_topology,
        read_k8s_nodes,
        read_ec2_topology,
    ]


def test_one_input(data: bytes) -> None:
    from gpuplace.errors import InvalidTopology

    if not data:
        return
    readers = _readers()
    reader = readers[data[0] % len(readers)]
    try:
        reader(io.BytesIO(data[1:]))
    except InvalidTopology as exc:
        # The safety net in the readers turns surprises into InvalidTopology; report those as
        # findings so that they get a proper check.
        if "unexpected parse failure" in str(exc):
            raise AssertionError(str(exc)) from exc


def _importable_without_extension() -> None:
    """Same trick as tests/io/conftest.py: use this tree's pure-Python readers even when
    another gpuplace is installed or the package's ``__init__`` cannot load its extension."""
    import types

    ours = (ROOT / "python" / "gpuplace").resolve()
    try:
        import gpuplace
        import gpuplace.errors

        if any(Path(p).resolve() == ours for p in getattr(gpuplace, "__path__", [])):
            return
    except ImportError:
        pass
    for name in [m for m in sys.modules if m == "gpuplace" or m.startswith("gpuplace.")]:
        if name == "gpuplace" or getattr(sys.modules[name], "__file__", None):
            del sys.modules[name]
    package = types.ModuleType("gpuplace")
    package.__path__ = [str(ours)]
    sys.modules["gpuplace"] = package


def main(argv: list[str]) -> None:
    import atheris

    sys.path.insert(0, str(ROOT / "python"))
    _importable_without_extension()
    with atheris.instrument_imports():
        _readers()
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
else:
    import pytest

    pytest.importorskip("atheris")

    def test_bounded_atheris_session(tmp_path):
        env = dict(os.environ)  # the installed gpuplace is the one under test
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "-runs=2000",
                "-max_len=4096",
                str(tmp_path),  # new inputs go to the first directory: a scratch one
                str(ROOT / "tests" / "data" / "topologies"),
            ],
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
