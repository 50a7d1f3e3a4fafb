"""The CLI killed with SIGKILL while it writes the state file leaves either the old or the
new state, never a broken one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gpuplace
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # The child imports the same gpuplace as this process (installed, or an editable checkout).
    package_root = str(Path(gpuplace.__file__).resolve().parents[1])
    full = {**os.environ, "PYTHONPATH": package_root, **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "gpuplace.cli", *args],
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _run(*args: str) -> None:
    proc = _cli(*args)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()


def _wait_for_tmp(directory: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.name.endswith(".tmp") for p in directory.iterdir()):
            return
        time.sleep(0.01)
    raise AssertionError("the CLI never started writing")


@pytest.fixture(scope="module")
def topology() -> gpuplace.Topology:
    return gpuplace.Topology.preset("h100-superpod", nodes=128)


def test_kill_between_write_and_rename_keeps_old_state(
    tmp_path: Path, topology: gpuplace.Topology
) -> None:
    path = tmp_path / "s.json"
    _run("fail", "--state", str(path), "-c", "h100-superpod", "--nodes", "128", "--node", "dgx001")
    old = gpuplace.ClusterState.load(topology, path).snapshot()
    proc = _cli(
        "fail",
        "--state",
        str(path),
        "--node",
        "dgx002",
        env={"GPUPLACE_TEST_PAUSE_BEFORE_RENAME_S": "30"},
    )
    _wait_for_tmp(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert gpuplace.ClusterState.load(topology, path).snapshot() == old
    # The next command works on the old state, and removes the temporary file the killed
    # writer left (no process holds it locked; it is aged past the moment a writer may take
    # between creating its file and locking it).
    (leftover,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    os.utime(leftover, (time.time() - 60, time.time() - 60))
    _run("fail", "--state", str(path), "--node", "dgx002")
    assert gpuplace.ClusterState.load(topology, path).health().sum() == 16
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_kill_at_random_times_leaves_old_or_new(
    tmp_path: Path, topology: gpuplace.Topology
) -> None:
    path = tmp_path / "s.json"
    _run(
        "degrade",
        "--state",
        str(path),
        "-c",
        "h100-superpod",
        "--nodes",
        "128",
        "--switch",
        "su001",
        "--factor",
        "0.5",
    )
    import random

    rnd = random.Random(7)
    outcomes = {"old": 0, "new": 0}
    for i in range(8):
        before = gpuplace.ClusterState.load(topology, path).snapshot()
        proc = _cli("fail", "--state", str(path), "--node", f"dgx{i + 10:03d}")
        time.sleep(rnd.uniform(0.2, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        after = gpuplace.ClusterState.load(topology, path).snapshot()
        outcomes["old" if after == before else "new"] += 1
        failed = {c["name"] for c in after["health"]["components"] if c["condition"] == "failed"}
        assert failed <= {f"dgx{k + 10:03d}" for k in range(i + 1)}
    assert sum(outcomes.values()) == 8
