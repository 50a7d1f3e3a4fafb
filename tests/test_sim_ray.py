"""Simulation sweeps on Ray (the ``ray`` extra). Ray advertises the machine's address, so the
sweep runs inside a fresh network namespace with only loopback up; skipped where Ray or
namespaces are unavailable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from gpuplace.cli import main

pytest.importorskip("ray", reason="Ray is the optional extra gpuplace[ray]")


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--net", "sh", "-c", "ip link set lo up"], capture_output=True, check=False
    )
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not _namespaces_work(),
    reason="needs `unshare --net` (root) to run Ray in a network namespace with only loopback up",
)

ARGS = [
    "simulate", "-c", "h100-superpod", "--nodes", "8", "--trace", "llm-mix", "--jobs", "30",
    "--seeds", "2", "--compare", "greedy,first-fit", "--failures", "llama3", "--format", "json",
]  # fmt: skip


def test_sweep_on_ray_matches_the_local_runs(tmp_path, capsys):
    # Ray's sockets live under RAY_TMPDIR, whose path must stay short (AF_UNIX limit).
    short = tempfile.mkdtemp(prefix="gpray")
    env = dict(os.environ, HOME=str(tmp_path), RAY_TMPDIR=short, RAY_USAGE_STATS_ENABLED="0")
    command = " ".join([sys.executable, "-m", "gpuplace.cli", *ARGS, "--workers", "2"])
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", f"ip link set lo up && {command}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    shutil.rmtree(short, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    on_ray = json.loads(done.stdout)
    assert main(ARGS) == 0
    local = json.loads(capsys.readouterr().out)
    assert list(on_ray) == list(local) == [
        "greedy seed=0", "first-fit seed=0", "greedy seed=1", "first-fit seed=1",
    ]  # fmt: skip
    for label in local:
        for summary in (on_ray[label], local[label]):
            summary.pop("elapsed_s"), summary.pop("jobs_per_s")
        assert on_ray[label] == local[label]
