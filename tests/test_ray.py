"""gpuplace.ray against a real local Ray cluster with fake GPUs: bundles land on the nodes
gpuplace chose, in rank order (also when that order is not Ray's own). Ray advertises the
machine's address, so the cluster runs in a subprocess inside a fresh network namespace with only
loopback up; skipped, saying why, where Ray or network namespaces are unavailable."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import gpuplace
import gpuplace.integrations.ray as gray
import pytest

HERE = Path(__file__).parent


def test_label_nodes_and_selectors_follow_the_placement() -> None:
    topology = gpuplace.Topology.preset("gb200-nvl72", racks=2)
    labels = gray.label_nodes(topology)
    assert labels["rack002-tray03"] == (
        "--labels gpuplace/host=rack002-tray03,network.topology.nvidia.com/accelerator=rack002,"
        "network.topology.nvidia.com/leaf=su001"
    )
    state = gpuplace.ClusterState(topology)
    placement = gpuplace.place(state, gpuplace.Job(name="j", tp=4, dp=5), "greedy")
    bundle_list, selectors = gray.bundles(placement, cpus_per_rank=2)
    assert bundle_list == [{"GPU": 1.0, "CPU": 2}] * 20
    assert [s["gpuplace/host"] for s in selectors] == [
        topology.host_of(int(g)) for g in placement.gpus
    ]
    kwargs = gray.scaling_config_kwargs(state, placement)
    assert kwargs["num_workers"] == 20 and kwargs["label_selector"] == selectors


def _skip_reason() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray not installed (pip install 'gpuplace[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare/ip not available to make a loopback-only network namespace"
    probe = subprocess.run(
        ["unshare", "--net", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=30
    )
    if probe.returncode != 0:
        return f"cannot create a network namespace (needs root): {probe.stderr.decode().strip()}"
    return None


def test_placement_group_bundles_land_on_gpuplaces_nodes_in_order() -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    script = shlex.join([sys.executable, str(HERE / "ray_cluster_check.py")])
    result = subprocess.run(
        ["unshare", "--net", "sh", "-c", f"ip link set lo up && exec {script}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    for case in ("placed", "reversed"):
        got = results[case]
        assert got["actual"] == got["expected"], case
    assert results["reversed"]["expected"] == results["placed"]["expected"][::-1]
    assert len(set(results["placed"]["expected"])) > 1  # the job spans nodes
    assert [s["gpuplace/host"] for s in results["scaling_config"]] == results["scaling_expected"]
