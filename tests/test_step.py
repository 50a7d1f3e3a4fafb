"""Step time, MFU and tokens/s: the core's step model through the Python API and the CLI."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import gpuplace
import numpy as np
import pytest
import yaml
from gpuplace import ClusterState, Job, Topology
from gpuplace.errors import InvalidJob
from gpuplace.model.job import Communication, TransformerModel
from gpuplace.model.presets import PRESETS
from gpuplace.model.step import StepOptions
from gpuplace.placement.result import gpu_peak_tflops

MODEL = TransformerModel(
    parameters=70.6e9, layers=80, hidden_size=8192, sequence_length=8192, micro_batches=16
)


def test_peak_table_names_presets_and_readers() -> None:
    assert gpu_peak_tflops("H100-SXM5-80GB") == 989.0
    assert gpu_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_peak_tflops("A100-SXM4-80GB") == 312.0
    assert gpu_peak_tflops("H100-PCIe-80GB") == 756.0
    assert gpu_peak_tflops("Tesla T4") == 65.0
    assert gpu_peak_tflops("no such part") is None
    for name in PRESETS:
        topo = Topology.preset(name)
        for nt in topo.node_types.values():
            assert nt.gpu_model and gpu_peak_tflops(nt.gpu_model), (name, nt.gpu_model)


def test_step_report_matches_its_formula() -> None:
    topo = Topology.preset("h100-superpod", nodes=8)
    job = Job(name="j", tp=8, pp=2, dp=2, model=MODEL)
    p = gpuplace.place(ClusterState(topo), job)
    c = p.cost
    assert c.step_seconds is not None and c.mfu is not None and c.compute_seconds is not None
    tokens = 8192 * 16 * 2
    flops = 6 * 70.6e9 * tokens
    compute = flops / (32 * 989e12 * 0.6)
    assert c.compute_seconds == pytest.approx(compute)
    bubble = compute * (2 - 1) / 16
    dp = c.class_seconds["dp all-reduce"]
    exposed = (
        c.class_seconds["tp all-reduce"]
        + c.class_seconds["pp p2p"]
        + max(0.0, dp - 2 / 3 * compute)
    )
    assert c.exposed_comm_seconds == pytest.approx(exposed)
    assert c.step_seconds == pytest.approx(compute + bubble + exposed)
    assert c.mfu == pytest.approx(flops / (c.step_seconds * 32 * 989e12))
    assert c.tokens_per_second == pytest.approx(tokens / c.step_seconds)
    assert 0 < c.mfu < 0.6
    d = c.to_dict()
    for key in (
        "step_seconds",
        "exposed_comm_seconds",
        "compute_seconds",
        "mfu",
        "tokens_per_second",
    ):
        assert d[key] == getattr(c, key)


def test_overlap_override_and_moe_active_parameters() -> None:
    topo = Topology.preset("h100-superpod", nodes=4)
    state = ClusterState(topo)
    base = Job(name="j", tp=8, dp=4, model=MODEL)
    none = Job(name="j", tp=8, dp=4, model=MODEL, step=StepOptions(overlap={"dp": 0.0}))
    a = gpuplace.place(state, base).cost
    b = gpuplace.place(state, none).cost
    assert b.exposed_comm_seconds == pytest.approx(
        a.class_seconds["tp all-reduce"] + a.class_seconds["dp all-reduce"]
    )
    assert b.step_seconds > a.step_seconds
    moe = TransformerModel(**{**MODEL.__dict__, "active_parameters": 10e9})
    m = gpuplace.place(state, Job(name="m", tp=8, dp=4, model=moe)).cost
    assert m.compute_seconds == pytest.approx(a.compute_seconds * 10e9 / 70.6e9)


def test_no_compute_declared_gives_no_step() -> None:
    topo = Topology.preset("dgx-h100")
    job = Job(name="j", tp=8, communication={"tp": Communication("all-reduce", 1e6, 10)})
    c = gpuplace.place(ClusterState(topo), job).cost
    assert c.step_seconds is None and c.mfu is None
    given = Job(
        name="j",
        tp=8,
        communication={"tp": Communication("all-reduce", 1e6, 10)},
        step=StepOptions(flops_per_step=8 * 989e12 * 0.6),
    )
    c = gpuplace.place(ClusterState(topo), given).cost
    assert c.compute_seconds == pytest.approx(1.0)
    assert c.step_seconds == pytest.approx(1.0 + c.comm_seconds)


def test_step_section_round_trips_and_rejects_bad_values() -> None:
    doc = {
        "name": "j",
        "parallelism": {"tp": 8},
        "step": {"flops_per_step": 1e15, "efficiency": 0.5, "overlap": {"tp": 0.25}},
    }
    job = Job.from_dict(doc)
    assert job.step == StepOptions(flops_per_step=1e15, efficiency=0.5, overlap={"tp": 0.25})
    assert Job.from_dict(job.to_dict()).step == job.step
    for bad, field in (
        ({"efficiency": 1.5}, "step.efficiency"),
        ({"overlap": {"xx": 0.5}}, "step.overlap.xx"),
        ({"overlap": {"dp": 2}}, "step.overlap.dp"),
        ({"flops_per_step": -1}, "step.flops_per_step"),
        ({"unknown": 1}, "step"),
    ):
        with pytest.raises(InvalidJob, match=field.replace(".", r"\.")):
            Job.from_dict({**doc, "step": bad})


def test_unknown_gpu_model_needs_peak_tflops_for_the_step() -> None:
    doc = Topology.preset("dgx-h100").to_dict()
    doc["node_types"]["dgx-h100"]["gpu_model"] = "mystery"
    topo = Topology.from_dict(doc)
    job = Job(name="j", tp=8, model=MODEL)
    # Comm is still priced; the step says why it is missing.
    c = gpuplace.place(ClusterState(topo), job).cost
    assert c.comm_seconds > 0 and c.mfu is None and c.step_seconds is None
    assert "peak_tflops" in c.step_details["unavailable"]
    assert c.peak_tflops is None
    doc["node_types"]["dgx-h100"]["peak_tflops"] = 500
    topo = Topology.from_dict(doc)
    c = gpuplace.place(ClusterState(topo), job).cost
    assert c.step_details["peak_tflops"] == 500
    # The peak read on its own is the step details' (the core's report, and a plain copy).
    assert c.peak_tflops == 500
    assert dataclasses.replace(c).peak_tflops == 500
    bare = gpuplace.place(ClusterState(topo), Job(name="bare", tp=8)).cost
    assert bare.step_details == {} and bare.peak_tflops is None


def test_cli_place_prints_step_mfu_and_first_fit_comparison(tmp_path: Path) -> None:
    job = {
        "name": "llama",
        "parallelism": {"tp": 8, "dp": 4},
        "model": {
            "parameters": 70.6e9,
            "layers": 80,
            "hidden_size": 8192,
            "sequence_length": 8192,
            "micro_batches": 4,
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    # A state whose first free GPUs are scattered one per host: first-fit spreads the tp
    # groups across hosts, the greedy solver packs them.
    state = ClusterState(Topology.preset("h100-superpod", nodes=8))
    blocker = Job(name="blocker", traffic=None, tp=1, dp=28, confine={})
    gpus = np.array([h * 8 + g for h in range(4) for g in range(1, 8)], dtype=np.int64)
    state.allocate(
        gpuplace.Placement(
            blocker,
            state.topology,
            gpus,
            gpuplace.evaluate(state.topology, blocker, gpus),
            "manual",
            0.0,
        )
    )
    state.save(tmp_path / "state.json")
    place = [sys.executable, "-m", "gpuplace.cli", "place", "-c", "h100-superpod", "--nodes", "8"]

    def run(*args: str) -> str:
        return subprocess.run(
            [*place, "-j", "job.yaml", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    doc = json.loads(run("--state", "state.json", "--format", "json"))
    cost, cmp_ = doc["cost"], doc["comparison"]
    assert cost["mfu"] > 0 and cost["step_seconds"] > 0 and cost["tokens_per_second"] > 0
    assert cmp_["solver"] == "first-fit"
    assert cmp_["baseline"]["mfu"] < cmp_["placement"]["mfu"]
    assert cmp_["baseline"]["fabric_bytes"] > cmp_["placement"]["fabric_bytes"]
    table = run()
    assert "MFU" in table and "tokens/s" in table and "vs first-fit" in table


def test_tokens_count_every_dp_replica_and_expert_parallel_rank() -> None:
    from gpuplace.model.step import flops_and_tokens

    moe = TransformerModel(
        parameters=47e9,
        layers=32,
        hidden_size=4096,
        sequence_length=4096,
        micro_batch_size=2,
        micro_batches=8,
        active_parameters=13e9,
    )
    flops, tokens = flops_and_tokens(Job(name="m", tp=2, cp=2, ep=8, dp=4, model=moe))
    assert tokens == 2 * 4096 * 8 * 4 * 8  # cp ranks share a sequence
    assert flops == 6 * 13e9 * tokens
