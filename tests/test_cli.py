"""The command line, run as a user runs it: in a subprocess, reading stdout, stderr and the
exit status."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gpuplace
import pytest
import yaml

CLI = [sys.executable, "-m", "gpuplace.cli"]


def run(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode != 0, result.stdout
    assert result.returncode > 0, f"killed by signal {-result.returncode}: {result.stderr[-500:]}"
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("gpuplace: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "job.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "llama",
                "parallelism": {"tp": 8, "pp": 2},
                "model": {
                    "parameters": 7e9,
                    "layers": 32,
                    "hidden_size": 4096,
                    "sequence_length": 4096,
                },
            }
        )
    )
    return tmp_path


def test_place_on_a_preset_prints_one_json_object(workdir):
    result = run(
        "place",
        "-c",
        "h100-superpod",
        "--nodes",
        "8",
        "-j",
        "job.yaml",
        "--format",
        "json",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    document = json.loads(lines[0])
    assert {"job", "gpus", "nodes", "cost", "solver", "elapsed_s"} <= set(document)
    assert document["job"] == "llama"
    assert len(document["gpus"]) == 16 and len(set(document["gpus"])) == 16
    assert document["nodes"] == ["dgx001", "dgx002"]
    assert document["solver"] == "greedy"
    assert document["cost"]["confinement_ok"] is True
    assert document["cost"]["comm_seconds"] > 0
    assert document["elapsed_s"] >= 0
    # The same numbers as the library gives.
    topo = gpuplace.Topology.preset("h100-superpod", nodes=8)
    job = gpuplace.Job.load(workdir / "job.yaml")
    report = gpuplace.evaluate(topo, job, document["gpus"])
    assert document["cost"]["comm_seconds"] == pytest.approx(report.comm_seconds, rel=1e-12)


@pytest.mark.parametrize(
    ("cluster", "extra"),
    [
        ("dgx-h100", []),
        ("gb200-nvl72", ["--racks", "2"]),
        ("pcie-cluster", ["--nodes", "2"]),
        ("a100-pod", ["--nodes", "4"]),
    ],
)
def test_place_table_on_presets(workdir, cluster, extra):
    (workdir / "small.yaml").write_text("name: small\nparallelism: {tp: 4, dp: 2}\n")
    result = run("place", "-c", cluster, *extra, "-j", "small.yaml", "-s", "first-fit", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "small" in result.stdout and "first-fit" in result.stdout


def test_place_on_a_topology_file(workdir):
    gpuplace.Topology.preset("pcie-cluster", nodes=2).save(workdir / "cluster.json")
    (workdir / "small.yaml").write_text("name: small\nparallelism: {tp: 2}\n")
    result = run("place", "-c", "cluster.json", "-j", "small.yaml", "--format", "json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["cost"]["span_level"] == "pcie-switch"


def test_presets_and_solvers_commands(workdir):
    presets = run("presets", cwd=workdir)
    assert presets.returncode == 0
    for name in ("dgx-h100", "h100-superpod", "gb200-nvl72", "a100-pod", "pcie-cluster"):
        assert name in presets.stdout
    solvers = run("solvers", cwd=workdir)
    assert solvers.returncode == 0
    for name in ("greedy", "first-fit", "random"):
        assert name in solvers.stdout


def test_the_console_script(workdir):
    script = shutil.which("gpuplace")
    if script is None:
        pytest.skip("the gpuplace console script is not on PATH")
    result = subprocess.run(
        [script, "place", "-c", "dgx-h100", "-j", "job.yaml", "--format", "json"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert_one_line_error(result, "needs 16 GPUs")


# --------------------------------------------------------------------------- error paths
ERRORS = [
    # (id, files to write, arguments, words the one line must contain)
    ("unknown-preset", {}, ["place", "-c", "h200-superpod", "-j", "job.yaml"], ["h200-superpod"]),
    ("missing-job-file", {}, ["place", "-c", "dgx-h100", "-j", "nope.yaml"], ["nope.yaml"]),
    ("missing-cluster-file", {}, ["place", "-c", "nope.yaml", "-j", "job.yaml"], ["nope.yaml"]),
    (
        "bad-yaml-job",
        {"bad.yaml": "name: j\nparallelism: {tp: 2\n"},
        ["place", "-c", "dgx-h100", "-j", "bad.yaml"],
        ["bad.yaml", "line"],
    ),
    (
        "bad-yaml-topology",
        {"cluster.yaml": "format: gpuplace.topology/1\nlevels: [\n"},
        ["place", "-c", "cluster.yaml", "-j", "job.yaml"],
        ["cluster.yaml", "line"],
    ),
    (
        "invalid-topology-field",
        {
            "cluster.yaml": "format: gpuplace.topology/1\nlevels: [{name: node, bandwidth_gbps: x}]\n"
        },
        ["place", "-c", "cluster.yaml", "-j", "job.yaml"],
        ["cluster.yaml", "levels[0].bandwidth_gbps"],
    ),
    (
        "multi-line-yaml-error",
        {"cluster.yaml": "format: gpuplace.topology/1\nname: 'a\n\nb\n"},
        ["place", "-c", "cluster.yaml", "-j", "job.yaml"],
        ["cluster.yaml"],
    ),
    ("infeasible", {}, ["place", "-c", "dgx-h100", "-j", "job.yaml"], ["needs 16 GPUs"]),
    (
        "infeasible-tp",
        {"tp16.yaml": "name: j\nparallelism: {tp: 16}\n"},
        ["place", "-c", "h100-superpod", "--nodes", "4", "-j", "tp16.yaml"],
        ["tp group (16 GPUs) must stay inside one node", "largest node has 8"],
    ),
    (
        "unknown-solver",
        {},
        ["place", "-c", "h100-superpod", "--nodes", "4", "-j", "job.yaml", "-s", "magic"],
        ["magic"],
    ),
    (
        "corrupted-state",
        {"state.json": '{"checksum": "sha256:00", "state": {"jobs": []}'},
        ["place", "-c", "h100-superpod", "--nodes", "4", "-j", "job.yaml", "--state", "state.json"],
        ["state.json"],
    ),
    (
        "tampered-state",
        {"state.json": '{"checksum": "sha256:00", "state": {"jobs": []}}'},
        ["place", "-c", "h100-superpod", "--nodes", "4", "-j", "job.yaml", "--state", "state.json"],
        ["state.json", "checksum"],
    ),
    (
        "bad-preset-size",
        {},
        ["place", "-c", "h100-superpod", "--nodes", "0", "-j", "job.yaml"],
        ["nodes"],
    ),
    (
        "preset-size-not-a-number",
        {},
        ["place", "-c", "h100-superpod", "--nodes", "many", "-j", "job.yaml"],
        ["many"],
    ),
    (
        "nodes-with-a-file",
        {"cluster.json": None},
        ["place", "-c", "cluster.json", "--nodes", "3", "-j", "job.yaml"],
        ["--nodes"],
    ),
    ("unknown-command", {}, ["plaice"], ["plaice"]),
    ("missing-option", {}, ["place", "-c", "dgx-h100"], ["--job"]),
    (
        "time-limit-zero",
        {},
        ["place", "-c", "h100-superpod", "--nodes", "4", "-j", "job.yaml", "--time-limit", "0"],
        ["time_limit"],
    ),
    (
        "deeply-nested-job",
        {"deep.json": "[" * 100_000 + "]" * 100_000},
        ["place", "-c", "dgx-h100", "-j", "deep.json"],
        ["deep.json"],
    ),
    (
        "huge-number-in-job",
        {"big.yaml": "name: j\ntraffic: {ranks: 2, edges: [[0, 1, " + "9" * 400 + "]]}\n"},
        ["place", "-c", "dgx-h100", "-j", "big.yaml"],
        ["big.yaml"],
    ),
    (
        "absurd-job-size",
        {
            "huge.yaml": "name: j\nparallelism: {tp: 1000000, dp: 1000000, pp: 1000000}\n"
            "constraints: {confine: {}}\n"
        },
        ["place", "-c", "dgx-h100", "-j", "huge.yaml"],
        ["GPUs"],
    ),
    (
        "job-file-is-a-directory",
        {"adir/x": "x"},
        ["place", "-c", "dgx-h100", "-j", "adir"],
        ["adir"],
    ),
]


@pytest.mark.parametrize(
    ("files", "args", "needles"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_every_error_is_one_line_on_stderr(workdir, files, args, needles):
    for name, text in files.items():
        path = workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            gpuplace.Topology.preset("dgx-h100").save(path)
        else:
            path.write_text(text)
    result = run(*args, cwd=workdir)
    assert_one_line_error(result, *needles)
    assert result.returncode == 2


# --------------------------------------------------------------------------- state files
def test_state_allocates_and_a_second_placement_lands_elsewhere(workdir):
    base = [
        "place",
        "-c",
        "h100-superpod",
        "--nodes",
        "8",
        "-j",
        "job.yaml",
        "--state",
        "state.json",
        "--format",
        "json",
    ]
    first = run(*base, cwd=workdir)
    assert first.returncode == 0, first.stderr
    state_path = workdir / "state.json"
    assert state_path.exists()
    second = run(*base, "--name", "llama-2", cwd=workdir)
    assert second.returncode == 0, second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["job"] == "llama" and b["job"] == "llama-2"
    assert set(a["gpus"]).isdisjoint(b["gpus"])
    assert b["cost"]["confinement_ok"]

    topo = gpuplace.Topology.preset("h100-superpod", nodes=8)
    state = gpuplace.ClusterState.load(topo, state_path)
    assert {k: v.tolist() for k, v in state.jobs.items()} == {
        "llama": a["gpus"],
        "llama-2": b["gpus"],
    }
    assert state.free_gpus == 64 - 32

    # The same name again is refused and the state file is not touched.
    before = state_path.read_bytes()
    again = run(*base, "--name", "llama-2", cwd=workdir)
    assert_one_line_error(again, "llama-2")
    assert state_path.read_bytes() == before
    # An infeasible placement leaves the file as it was, too.
    (workdir / "big.yaml").write_text("name: big\nparallelism: {tp: 8, dp: 8}\n")
    big = run(
        "place",
        "-c",
        "h100-superpod",
        "--nodes",
        "8",
        "-j",
        "big.yaml",
        "--state",
        "state.json",
        cwd=workdir,
    )
    assert_one_line_error(big, "needs 64 GPUs")
    assert state_path.read_bytes() == before

    # No temporary file is ever left behind (the empty lock file beside the state stays).
    assert sorted(p.name for p in workdir.iterdir()) == [
        "big.yaml",
        "job.yaml",
        "state.json",
        "state.json.lock",
    ]


def test_concurrent_placements_into_one_state_file_all_land(workdir):
    """The state file is locked across read, place and write: no update is lost. Each writer
    pauses before its rename (a test hook) so that, without the lock, they would all read the
    same old state and only the last write would survive."""
    names = [f"job{i}" for i in range(4)]
    env = {**os.environ, "GPUPLACE_TEST_PAUSE_BEFORE_RENAME_S": "0.3"}
    procs = [
        subprocess.Popen(
            [
                *CLI,
                "place",
                "-c",
                "h100-superpod",
                "--nodes",
                "8",
                "-j",
                "job.yaml",
                "--state",
                "state.json",
                "--name",
                name,
            ],
            cwd=workdir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    topo = gpuplace.Topology.preset("h100-superpod", nodes=8)
    state = gpuplace.ClusterState.load(topo, workdir / "state.json")
    assert sorted(state.jobs) == names
    assert state.free_gpus == topo.num_gpus - 4 * 16


def test_state_of_another_cluster_is_refused(workdir):
    base = ["place", "-j", "job.yaml", "--state", "state.json"]
    assert run(*base, "-c", "h100-superpod", "--nodes", "8", cwd=workdir).returncode == 0
    before = (workdir / "state.json").read_bytes()
    other = run(*base, "-c", "h100-superpod", "--nodes", "9", cwd=workdir)
    assert_one_line_error(other, "state.json")
    assert (workdir / "state.json").read_bytes() == before


def test_state_in_a_missing_directory_fails_cleanly(workdir):
    result = run(
        "place",
        "-c",
        "h100-superpod",
        "--nodes",
        "8",
        "-j",
        "job.yaml",
        "--state",
        "no/dir/state.json",
        cwd=workdir,
    )
    assert_one_line_error(result)
    assert not (workdir / "no").exists()


def test_emit_writes_the_scheduler_formats_of_the_placement(workdir):
    result = run(
        "place", "-c", "h100-superpod", "--nodes", "64", "-j", "job.yaml", "--format", "json",
        "--emit", "hostlist=hosts.txt", "--emit", "cuda=cuda.txt", "--emit", "rankfile=ranks",
        "--emit", "k8s=affinity.json",
        cwd=workdir,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    placement = json.loads(result.stdout)
    assert (workdir / "hosts.txt").read_text().strip() == placement["hostlist"]
    cuda = (workdir / "cuda.txt").read_text().splitlines()
    assert [line.split()[0] for line in cuda] == placement["nodes"]
    rankfile = (workdir / "ranks").read_text().splitlines()
    assert len(rankfile) == len(placement["gpus"])
    affinity = json.loads((workdir / "affinity.json").read_text())
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    hosts = terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
    assert sorted(hosts) == sorted(placement["nodes"])


def test_emit_with_an_unknown_format_is_one_line_and_writes_nothing(workdir):
    result = run(
        "place", "-c", "dgx-h100", "-j", "job.yaml", "--state", "s.json", "--emit", "bogus=x",
        cwd=workdir,
    )  # fmt: skip
    assert_one_line_error(result, "--emit", "bogus")
    assert not (workdir / "x").exists() and not (workdir / "s.json").exists()
