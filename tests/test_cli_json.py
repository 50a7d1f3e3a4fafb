"""The command line as a daily tool: a job's whole life on one state file named by ``--state``
alone, ``--format json`` on every command with one schema per output (validated here against
the real output), errors as JSON objects, ``-p KEY=VALUE`` options and help text that is true.

The lifecycle runs as a user runs it (subprocesses); the per-command outputs run in-process
through ``gpuplace.cli.main`` (the same entry point, without a Python start-up per call)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import gpuplace
import pytest
import yaml
from gpuplace.cli import cli, main
from gpuplace.cli.schemas import COMMANDS, SCHEMAS
from jsonschema import Draft202012Validator
from service_harness import RULES, xid_line

CLI = [sys.executable, "-m", "gpuplace.cli"]
ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data"

#: Commands that only read the state file.
READ_ONLY = {
    "status",
    "fabric",
    "explain",
    "policy show",
    "mig status",
    "share status",
    "k8s export",
}


def validate(document: Any, schema: str) -> None:
    Draft202012Validator(SCHEMAS[schema]).validate(document)


def commands() -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            # list_commands/get_command: the lazily imported commands (serve, service) too
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, [*path, name])
        else:
            out[" ".join(path)] = command

    walk(cli, [])
    return out


def job_file(path: Path, name: str, tp: int, dp: int, pp: int = 1) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "parallelism": {"tp": tp, "pp": pp, "dp": dp},
                "model": {
                    "parameters": 7e9,
                    "layers": 32,
                    "hidden_size": 4096,
                    "sequence_length": 4096,
                },
            }
        )
    )
    return str(path)


# ------------------------------------------------------------------------- the lifecycle
def cli_run(cwd: Path, *args: str, fmt: str, ok: bool = True) -> Any:
    """Run ``gpuplace ARGS --format FMT``; the JSON document (validated against its schema
    by the caller) or the table text. An error must be one line on stderr and exit 2."""
    result = subprocess.run(
        [*CLI, *args, "--format", fmt],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    if ok:
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
    else:
        assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuplace: error: "), result.stderr
    if fmt == "json":
        lines = result.stdout.splitlines()
        assert len(lines) == 1, result.stdout[-2000:]
        return json.loads(lines[0])
    return result.stdout


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_jobs_whole_life_through_the_cli_with_state_only(tmp_path: Path, fmt: str) -> None:
    a = job_file(tmp_path / "a.yaml", "a", tp=8, dp=4)
    b = job_file(tmp_path / "b.yaml", "b", tp=8, dp=2, pp=2)
    c = job_file(tmp_path / "c.yaml", "c", tp=8, dp=2)

    def run(*args: str, schema: str | None = None, ok: bool = True) -> Any:
        out = cli_run(tmp_path, *args, fmt=fmt, ok=ok)
        if fmt == "json":
            validate(out, schema if ok else "error")
        return out

    # Only the command that creates the state names the cluster (and its options).
    first = run(
        "place", "-c", "h100-superpod", "-p", "nodes=8", "-p", "oversubscription=2", "-j", a,
        "--state", "s.json", schema="place",
    )  # fmt: skip
    second = run("place", "--state", "s.json", "-j", b, schema="place")
    status = run("status", "--state", "s.json", schema="status")
    blocked = run("explain", "--state", "s.json", "-j", c, schema="explain")
    refused = run("place", "--state", "s.json", "-j", c, ok=False)
    released = run("release", "--state", "s.json", "a", schema="lifecycle")
    fits = run("explain", "--state", "s.json", "-j", c, schema="explain")
    again = run("place", "--state", "s.json", "-j", c, schema="place")
    requeued = run("requeue", "--state", "s.json", "b", "--reason", "node swap", schema="lifecycle")
    waiting = run("status", "--state", "s.json", schema="status")
    why = run("explain", "--state", "s.json", "--queued", "b", schema="explain")
    back = run("place", "--state", "s.json", "--queued", "b", schema="place")
    fabric = run("fabric", "--state", "s.json", schema="fabric")
    cancelled = run("cancel", "--state", "s.json", "b", "c", schema="lifecycle")
    empty = run("status", "--state", "s.json", schema="status")

    if fmt == "json":
        assert first["cluster"] == "h100-superpod-8-2to1" and first["allocated"]
        assert first["state"] == "s.json" and first["free_gpus"] == 32
        assert second["free_gpus"] == 0 and len(set(first["gpus"]) & set(second["gpus"])) == 0
        assert status["free"] == 0 and [j["name"] for j in status["jobs"]] == ["a", "b"]
        assert blocked["placeable"] is False and "capacity" in blocked["binding"]
        assert refused["error"]["class"] == "Infeasible"
        assert refused["error"]["explanation"]["placeable"] is False
        assert released["jobs"] == [
            {"job": "a", "was": "running", "gpus": 32, "hosts": first["nodes"]}
        ]
        assert released["free_gpus"] == 32
        assert fits["placeable"] is True and fits["binding"] == []
        assert again["allocated"] and again["free_gpus"] == 16
        assert requeued["queue"] == ["b"] and requeued["free_gpus"] == 48
        assert waiting["queue"] == [{"job": "b", "gpus": 32, "reason": "node swap"}]
        assert why["job"] == "b" and why["placeable"] is True
        assert back["job"] == "b" and back["free_gpus"] == 16
        assert [lv["level"] for lv in fabric["levels"]] == ["node", "leaf"]
        assert fabric["levels"][0]["loaded"] > 0
        assert {j["job"]: j["was"] for j in cancelled["jobs"]} == {"b": "running", "c": "running"}
        assert empty["free"] == 64 and empty["jobs"] == [] and empty["queue"] == []
    else:
        assert "allocated in s.json: 32 of 64 GPUs free" in first
        assert "allocated in s.json: 0 of 64 GPUs free" in second
        assert "h100-superpod-8-2to1: 0 of 64 GPUs free" in status
        assert "c (16 GPUs) does not fit" in blocked and "why c is not placed" in blocked
        assert "32 of 64 GPUs free; saved s.json" in released
        assert "c (16 GPUs) fits now" in fits
        assert "allocated in s.json: 16 of 64 GPUs free" in again
        assert "queued: b" in requeued
        assert "node swap" in waiting and "queued" in waiting
        assert "b (32 GPUs) fits now" in why
        assert "uplinks by level" in fabric and "node->leaf" in fabric
        assert "cancelled" in cancelled and "64 of 64 GPUs free" in cancelled
        assert "64 of 64 GPUs free" in empty


# ------------------------------------------------------------------------- the convention
def test_every_command_takes_format_json_and_names_its_schema() -> None:
    found = commands()
    missing = [
        name
        for name, command in found.items()
        if not any(
            p.name == "fmt" and "json" in getattr(p.type, "choices", ()) for p in command.params
        )
    ]
    assert missing == []
    assert set(found) <= set(COMMANDS)
    assert set(COMMANDS.values()) <= set(SCHEMAS)
    for name, schema in SCHEMAS.items():
        Draft202012Validator.check_schema(schema)
        assert schema.get("description"), name


def test_help_of_every_command_is_true_about_the_state() -> None:
    found = commands()
    for name, command in found.items():
        ctx = click.Context(command, info_name=name)
        text = " ".join(command.get_help(ctx).split())
        if name in READ_ONLY:
            assert "changed all or nothing" not in text, name
            assert "changes nothing" in text or "not change" in text, name
        elif any(p.name == "state_path" for p in command.params) and name.split()[0] in (
            "place",
            "release",
            "cancel",
            "requeue",
            "fail",
            "drain",
            "recover",
            "degrade",
            "repair",
        ):
            assert "changed all or nothing" in text, name


def invoke(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> Any:
    """``gpuplace ARGS --format json`` in-process: the one JSON object it prints."""
    assert main([*args, "--format", "json"]) == code
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 1, captured.out[-2000:] + captured.err[-2000:]
    if code:
        assert len(captured.err.splitlines()) == 1
    return json.loads(lines[0])


@pytest.mark.parametrize(
    ("args", "kind", "needle"),
    [
        (["place", "-j", "job.yaml"], "UsageError", "give --cluster"),
        (["place", "-c", "h100-superpod", "-p", "nodes=8", "-j", "missing.yaml"], "InvalidJob", "missing.yaml"),
        (["place", "-c", "nowhere", "-j", "job.yaml"], "InvalidTopology", "unknown cluster"),
        (["place", "-c", "h100-superpod", "-p", "bogus=1", "-j", "job.yaml"], "InvalidTopology", "bogus"),
        (["place", "-c", "h100-superpod", "-p", "nodes", "-j", "job.yaml"], "InvalidTopology", "KEY=VALUE"),
        (["place", "-c", "dgx-h100", "-j", "big.yaml"], "Infeasible", "needs 64 GPUs"),
        (["status", "--state", "none.json"], "InvalidState", "none.json"),
        (["release", "--state", "none.json", "x"], "InvalidState", "none.json"),
        (["explain", "--state", "s.json"], "UsageError", "--job FILE or --queued"),
        (["status"], "UsageError", "--state"),
        (["schema", "nothing"], "UsageError", "no schema"),
        (["mig", "status", "--state", "s.json"], "InvalidState", "MIG"),
    ],
)  # fmt: skip
def test_errors_are_one_json_object_and_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    kind: str,
    needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    job_file(tmp_path / "job.yaml", "j", tp=8, dp=1)
    job_file(tmp_path / "big.yaml", "big", tp=8, dp=8)
    state = gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=2))
    state.save(tmp_path / "s.json")
    document = invoke(capsys, *args, code=2)
    validate(document, "error")
    assert document["error"]["class"] == kind and document["error"]["exit_code"] == 2
    assert needle in document["error"]["message"]
    if kind == "Infeasible":
        assert document["error"]["explanation"]["placeable"] is False


def test_json_is_asked_for_only_before_a_double_dash() -> None:
    from gpuplace.cli.common import json_requested

    assert json_requested(["status", "--format", "json"])
    assert json_requested(["status", "--format=json"])
    assert not json_requested(["status", "--format", "table"])
    assert not json_requested(["slurm", "submit", "-j", "x", "--", "--format", "json"])


# ------------------------------------------------------------------------- every command
def test_catalog_commands_json(capsys: pytest.CaptureFixture[str]) -> None:
    presets = invoke(capsys, "presets")
    validate(presets, "presets")
    superpod = next(p for p in presets["presets"] if p["name"] == "h100-superpod")
    assert superpod["parameters"] == {"nodes": 256, "oversubscription": 1}
    assert any(o.startswith("power.LEVEL.") for o in presets["options"])
    validate(invoke(capsys, "solvers"), "solvers")
    listing = invoke(capsys, "schema")
    validate(listing, "schema-list")
    assert listing["commands"]["release"] == "lifecycle"
    schema = invoke(capsys, "schema", "mig status")
    assert schema == SCHEMAS["mig-status"]


def test_state_commands_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    job = job_file(tmp_path / "job.yaml", "llama", tp=8, dp=4)
    placed = invoke(capsys, "place", "-c", "h100-superpod", "-p", "nodes=16", "-j", job, "--state", "s.json")  # fmt: skip
    validate(placed, "place")
    host = placed["nodes"][0]
    failed = invoke(capsys, "fail", "--state", "s.json", "--node", host)
    validate(failed, "health-event")
    assert failed["affected"] == {"llama": list(range(8))} and failed["targets"] == {"host": [host]}
    repaired = invoke(capsys, "repair", "--state", "s.json", "--job", "llama")
    validate(repaired, "repair")
    assert len(repaired["moved"]) == 8
    for event in ("drain", "recover"):
        validate(invoke(capsys, event, "--state", "s.json", "--node", host), "health-event")
    degraded = invoke(capsys, "degrade", "--state", "s.json", "--nic", f"{host}:mlx5_0", "--loss", "1%")  # fmt: skip
    validate(degraded, "health-event")
    ibstat = DATA / "health" / "ibstat-h100-some-down-gpud.txt"
    ingested = invoke(capsys, "health", "ingest", "--state", "s.json", f"{host}={ibstat}", "--dry-run")  # fmt: skip
    validate(ingested, "health-ingest")
    assert ingested["applied"] is False and ingested["findings"]
    # --state alone names the cluster (the policy below would fence this job off).
    out_dir = tmp_path / "k8s"
    exported = invoke(capsys, "k8s", "export", "--state", "s.json", "-o", str(out_dir), "-j", job)
    validate(exported, "k8s-export")
    assert (out_dir / "pod-patches.yaml").exists() and exported["cluster"] == "h100-superpod-16"
    policy = {"pools": {"training": "dgx[001-008]", "serving": "dgx[009-016]"}}
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    validate(
        invoke(capsys, "policy", "set", "--state", "s.json", "-f", "policy.yaml"), "policy-set"
    )
    shown = invoke(capsys, "policy", "show", "--state", "s.json")
    validate(shown, "policy-show")
    assert set(shown["policy"]["pools"]) == {"training", "serving"}
    query = tmp_path / "query.csv"
    query.write_text(
        "index, name, driver_version, vbios_version\n"
        + "".join(f"{i}, NVIDIA H100 80GB HBM3, 550.54.15, 96.00.89.00.01\n" for i in range(8))
    )
    attributes = invoke(capsys, "policy", "attributes", "--state", "s.json", "--host", "dgx016", "--nvidia-smi-query", str(query))  # fmt: skip
    validate(attributes, "policy-attributes")


def test_mig_commands_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    enabled = invoke(capsys, "mig", "enable", "--state", "m.json", "-c", "a100-pod", "-p", "nodes=2", "--node", "dgxa001")  # fmt: skip
    validate(enabled, "mig-enable")
    assert enabled["mig_gpus"] == 8 and enabled["free_gpus"] == 8
    placed = invoke(capsys, "mig", "place", "--state", "m.json", "--requests", str(ROOT / "examples" / "mig" / "stream.yaml"))  # fmt: skip
    validate(placed, "mig-place")
    status = invoke(capsys, "mig", "status", "--state", "m.json")
    validate(status, "mig-status")
    assert len(status["gpus"]) == 8
    owner = next(r["request"] for r in placed["placements"] if r["placed"])
    validate(invoke(capsys, "mig", "release", "--state", "m.json", owner), "mig-release")
    # The MIG GPUs are held under the name "mig"; release refuses it.
    refused = invoke(capsys, "release", "--state", "m.json", "mig", code=2)
    assert "mig release" in refused["error"]["message"]


def test_topology_commands_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    smi = DATA / "topologies" / "nvidia-smi-topo-hgx-h100-8gpu-8nic-rail.txt"
    imported = invoke(capsys, "topo", "import", "--nvidia-smi", str(smi))
    validate(imported, "topo-import")
    assert imported["topology"]["format"] == "gpuplace.topology/1"
    written = invoke(capsys, "topo", "import", "--nvidia-smi", str(smi), "-o", "node.yaml")
    validate(written, "topo-import")
    assert written["topology"] is None and Path("node.yaml").exists()
    shown = invoke(capsys, "topo", "show", "h100-superpod", "-p", "nodes=64", "-p", "oversubscription=2")  # fmt: skip
    validate(shown, "topo-show")
    assert shown["name"] == "h100-superpod-64-2to1" and shown["gpus"] == 512
    exported = invoke(capsys, "topo", "export", "h100-superpod", "-p", "nodes=64", "--slurm", "tree")  # fmt: skip
    validate(exported, "topo-export")
    assert "SwitchName=su002" in exported["text"]


def test_calibrate_prints_fitted_values_and_whole_sample_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    run = (
        DATA
        / "nccl-tests"
        / ("all_reduce_perf-h100-sxm-2nodes-8gpn-ib-ndr-ring-tuned-nccl-tests-issue309-gj-aion.txt")
    )
    args = ["calibrate", "-c", "h100-superpod", "-p", "nodes=2", "--nccl-tests", str(run)]
    document = invoke(capsys, *args, "-o", "cal.json")
    validate(document, "calibrate")
    fitted = gpuplace.Topology.load("cal.json")
    by_name = {p["parameter"]: p for p in document["parameters"]}
    leaf = by_name["levels.leaf.latency_us"]
    assert leaf["before"] == 2.5 and leaf["changed"]
    assert leaf["after"] == pytest.approx(fitted.levels[1].latency_us)
    assert {p["parameter"] for p in document["parameters"]} >= {
        f"levels.{lv}.{key}" for lv in ("node", "leaf") for key in ("bandwidth_gbps", "latency_us")
    }
    assert document["rms_log_error"]["after"] <= document["rms_log_error"]["before"]
    assert all(s["sample"].startswith(run.name) for s in document["samples"])
    # The table: every fitted value next to the old one, every sample name whole.
    assert main([*args, "-o", "cal.yaml"]) == 0
    table = capsys.readouterr().out
    assert "fitted values" in table and "levels.leaf.latency_us" in table
    assert f"{leaf['after']:.4g}" in table and "2.5" in table
    for sample in document["samples"]:
        assert sample["sample"] in table


def test_calibrate_fits_the_routing_of_a_shared_scaling_series(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """OCI GB200 all-reduce and all-to-all on 2 to 48 nodes (tests/data/nccl-tests/scaling), on
    three NVL72 racks described as RoCE with ECMP: the fit finds them balanced and says why."""
    monkeypatch.chdir(tmp_path)
    scaling = DATA / "nccl-tests" / "scaling"
    runs = [
        "all_reduce_perf-gb200-2nodes-4gpn-ib-ociquickstart.txt",
        "all_reduce_perf-gb200-32nodes-4gpn-iborroce-ociquickstart.txt",
        "all_reduce_perf-gb200-48nodes-4gpn-iborroce-ociquickstart.txt",
        "alltoall_perf-gb200-2nodes-4gpn-ib-ociquickstart.txt",
        "alltoall_perf-gb200-16nodes-4gpn-iborroce-ociquickstart.txt",
        "alltoall_perf-gb200-32nodes-4gpn-iborroce-ociquickstart.txt",
        "alltoall_perf-gb200-48nodes-4gpn-iborroce-ociquickstart.txt",
    ]
    args = ["calibrate", "-c", "gb200-nvl72", "--racks", "3"]
    args += ["-p", "levels.nvlink-domain.routing=ecmp", "-p", "levels.leaf.bandwidth_gbps=100"]
    for name in runs:
        args += ["--nccl-tests", str(scaling / name)]
    for ranks in (8, 128, 192, 8, 64, 128, 192):
        args += ["--ranks", str(ranks)]
    document = invoke(capsys, *args, "-o", "cal.json")
    validate(document, "calibrate")
    by_name = {p["parameter"]: p for p in document["parameters"]}
    routing = by_name["levels.nvlink-domain.routing"]
    assert (routing["before"], routing["after"], routing["changed"]) == ("ecmp", "adaptive", True)
    assert gpuplace.Topology.load("cal.json").levels[1].routing == "adaptive"
    tried = {(t["routing"], t["qps_per_connection"]): t for t in document["routing"]}
    assert tried["adaptive", 1]["chosen"] and not tried["ecmp", 1]["chosen"]
    assert tried["adaptive", 1]["rms_log_error"] < 0.5 * tried["ecmp", 1]["rms_log_error"]
    assert [s["gpus"] for s in document["samples"]] == [
        n for n in (8, 128, 192, 8, 64, 128, 192) for _ in range(2)
    ]
    assert document["rms_log_error"]["after"] < document["rms_log_error"]["before"]
    # The table shows the routings tried; --fit-routing no keeps the declared one.
    assert main([*args, "--fit-routing", "no", "-o", "fixed.yaml"]) == 0
    table = capsys.readouterr().out
    assert "routing fitted" not in table
    assert gpuplace.Topology.load("fixed.yaml").levels[1].routing == "ecmp"
    assert main([*args, "-o", "cal.yaml"]) == 0
    table = capsys.readouterr().out
    assert "routing fitted" in table and "levels.nvlink-domain.routing" in table
    # One --ranks per file or none.
    assert main([*args[:-2], "-o", "bad.yaml"]) == 2
    assert "--ranks: expected one per --nccl-tests file (7), got 6" in capsys.readouterr().err


def test_simulate_and_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summaries = invoke(
        capsys, "simulate", "-c", "h100-superpod", "-p", "nodes=16", "--trace", "llm-mix",
        "--jobs", "20",
    )  # fmt: skip
    validate(summaries, "simulate")
    assert all(s["cluster"] == "h100-superpod-16" for s in summaries.values())
    report = invoke(capsys, "bench", "--quick", "--solvers", "greedy,first-fit")
    validate(report, "bench")
    assert set(report["solvers"]) == {"greedy", "first-fit"}


@contextlib.contextmanager
def announcing(tmp_path: Path, *args: str) -> Iterator[dict[str, Any]]:
    """Run ``gpuplace ARGS --format json`` (a server) and yield the JSON line it prints once it
    listens; the server is stopped afterwards, also when the test fails."""
    with subprocess.Popen(
        [*CLI, *args, "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
    ) as proc:
        try:
            assert proc.stdout is not None
            yield json.loads(proc.stdout.readline())
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_k8s_extender_announces_its_address_as_json(tmp_path: Path) -> None:
    args = ("k8s", "extender", "-c", "h100-superpod", "-p", "nodes=4", "--port", "0")
    with announcing(tmp_path, *args) as document:
        validate(document, "k8s-extender")
        assert document["listening"].startswith("http://127.0.0.1:")


def test_serve_and_service_commands_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpuplace serve --format json` announces where it listens as one JSON line; every
    `gpuplace service` command's JSON answer matches its schema."""
    sock = tmp_path / "gp.sock"
    job = job_file(tmp_path / "job.yaml", "train", tp=8, dp=2)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(RULES))
    args = ("serve", "--journal", "j.db", "--socket", str(sock), "-c", "h100-superpod", "-p", "nodes=4", "--rules", "rules.yaml", "--log-level", "warning")  # fmt: skip
    with announcing(tmp_path, *args) as announced:
        validate(announced, "serve")
        assert announced["listening"] == [str(sock)]
        assert announced["clusters"] == ["h100-superpod-4"]
        to = ("--service", str(sock))
        placed = invoke(capsys, "service", "place", *to, "-j", job)
        validate(placed, "service-place")
        assert placed["job"] == "train" and len(placed["gpus"]) == 16
        host = placed["nodes"][0]
        log = tmp_path / "kern.log"
        log.write_text(xid_line(host, 0))
        health = invoke(capsys, "service", "health", *to, str(log))
        validate(health, "service-health")
        assert len(health["changes"]) == 1 and set(health["repairs"]) == {"train"}
        repaired = invoke(capsys, "service", "repair", *to, "train")
        validate(repaired, "service-repair")
        assert repaired["applied"] is False
        why = invoke(capsys, "service", "explain", *to, "-j", job_file(tmp_path / "b.yaml", "b", tp=8, dp=4))  # fmt: skip
        validate(why, "service-explain")
        assert why["job"] == "b" and why["placeable"] is False
        status = invoke(capsys, "service", "status", *to)
        validate(status, "service-status")
        assert set(status["clusters"][0]["jobs"]) == {"train"}
        released = invoke(capsys, "service", "release", *to, "train")
        validate(released, "service-release")
        assert released["released_gpus"] == 16
