"""The cluster simulator: invariants (property tests), determinism, queue policies, failures,
the speed model, the trace loaders on their real files and the workload file errors."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest
from gpuplace import InvalidJob, Topology
from gpuplace.cli import main
from gpuplace.placement.result import CostReport
from gpuplace.sim import metrics
from gpuplace.sim.engine import SimConfig, simulate
from gpuplace.sim.failures import Cause, FailureModel, llama3, load_failures
from gpuplace.sim.speed import JobProfile, job_speed
from gpuplace.sim.traces import SimJob, Workload, llm_mix, load_workload, openb, philly
from hypothesis import given, settings
from hypothesis import strategies as st

SUMMARY_KEYS = [
    "jobs",
    "jobs_finished",
    "makespan_s",
    "utilization",
    "goodput",
    "mfu",
    "jct_mean_s",
    "jct_p99_s",
    "queue_mean_s",
    "gpu_hours_lost",
    "elapsed_s",
]


@pytest.fixture(scope="module")
def small() -> Topology:
    return Topology.preset("h100-superpod", nodes=8)


def _harsh(seed_rate: float = 0.02) -> FailureModel:
    """Failures far more frequent than any real cluster's, so short runs see many."""
    day = 86_400.0
    return FailureModel(
        "harsh",
        (
            Cause("gpu", "gpu", seed_rate / day * 24, 3 * 3600.0),
            Cause("host", "host", seed_rate / day * 24, 6 * 3600.0),
            Cause("network", "network", seed_rate / day * 24, 2 * 3600.0),
            Cause("software", "software", seed_rate / day * 24, 0.0),
            Cause("link", "nic", seed_rate / day * 24, 4 * 3600.0, loss=0.01),
        ),
    )


job_sizes = st.sampled_from([1, 2, 4, 8, 16, 32, 64])


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    count = draw(st.integers(1, 25))
    jobs = []
    t = 0.0
    for i in range(count):
        t += draw(st.floats(0, 4 * 3600))
        gpus = draw(job_sizes)
        tp = next(x for x in (8, 4, 2, 1) if gpus % x == 0)
        jobs.append(
            SimJob(
                f"j{i}",
                t,
                gpus,
                draw(st.floats(60, 3 * 86_400)),
                priority=draw(st.integers(0, 2)),
                tp=tp,
                model=draw(st.sampled_from(["llama2-13b", "llama3-8b", "none"])),
            )
        )
    return Workload("drawn", tuple(sorted(jobs, key=lambda j: (j.submit_s, j.name))))


@settings(max_examples=25, deadline=None)
@given(
    workload=workloads(),
    solver=st.sampled_from(["greedy", "first-fit", "slurm-tree"]),
    policy=st.sampled_from(["fifo", "priority", "easy", "slurm"]),
    response=st.sampled_from(["requeue", "repair"]),
    evacuate=st.booleans(),
    seed=st.integers(0, 3),
)
def test_invariants(small, workload, solver, policy, response, evacuate, seed):
    config = SimConfig(
        solver=solver,
        policy=policy,
        failures=_harsh(),
        response=response,
        evacuate=evacuate,
        checkpoint_interval_s=900.0,
        restart_s=120.0,
        seed=seed,
        check=True,  # no GPU held twice, none on failed hardware, after every event
    )
    result = simulate(small, workload, config)
    # Every job finishes or is reported unfinished with a reason.
    assert len(result.records) == len(workload)
    for r in result.records:
        assert (r.finish is not None) != bool(r.reason), r
        if r.finish is not None:
            assert r.kept_work_s == r.job.work_s
            assert r.first_start is not None and r.job.submit_s <= r.first_start <= r.finish
    # GPU-seconds accounted exactly: the jobs' held GPU-time is the time integral of the
    # allocated GPUs, and splits into kept productive time, losses and the rest (>= 0 up to
    # the speed of a placement better than the reference).
    held = sum(r.held_gpu_s for r in result.records)
    integral = metrics._integral(result.times, result.allocated, result.end_s)
    assert held == pytest.approx(integral, rel=1e-9, abs=1e-6)
    lost = sum(result.lost_gpu_s.values())
    assert lost == pytest.approx(sum(sum(r.lost_gpu_s.values()) for r in result.records))
    for r in result.records:
        assert r.kept_gpu_s + sum(r.lost_gpu_s.values()) <= r.held_gpu_s * (1 + 1e-9) + 1e-6
    assert np.all(result.allocated + result.unusable <= small.num_gpus + result.unusable)
    assert np.all(result.allocated <= small.num_gpus)


def test_deterministic_per_seed(small):
    workload = llm_mix(60, cluster_gpus=small.num_gpus, seed=3)
    config = SimConfig(policy="easy", failures=_harsh(0.005), response="repair", seed=7)
    a, b = simulate(small, workload, config), simulate(small, workload, config)
    sa, sb = metrics.summary(a), metrics.summary(b)
    sa.pop("elapsed_s"), sb.pop("elapsed_s"), sa.pop("jobs_per_s"), sb.pop("jobs_per_s")
    assert sa == sb
    assert metrics.job_rows(a) == metrics.job_rows(b)
    other = metrics.summary(simulate(small, workload, dataclasses.replace(config, seed=8)))
    assert (
        other["failure_events"] != sa["failure_events"] or other["jct_mean_s"] != sa["jct_mean_s"]
    )


def _job(name, submit, gpus, work, **kw):
    tp = next(x for x in (8, 4, 2, 1) if gpus % x == 0)
    return SimJob(name, submit, gpus, work, tp=tp, model="none", **kw)


def test_fifo_blocks_and_easy_backfills():
    topology = Topology.preset("h100-superpod", nodes=2)  # 16 GPUs
    jobs = (
        _job("a", 0, 8, 1000),
        _job("big", 1, 16, 1000),  # must wait for a
        _job("small", 2, 8, 500),  # fits next to a, ends before a does
    )
    workload = Workload("w", jobs)
    fifo = {r.job.name: r for r in simulate(topology, workload, SimConfig(policy="fifo")).records}
    easy = {r.job.name: r for r in simulate(topology, workload, SimConfig(policy="easy")).records}
    assert fifo["small"].first_start == pytest.approx(2000)  # after big
    # Backfilled at the next pass: one ran at t=1 when big blocked, the next is due 30 s
    # later (Slurm's bf_interval), not on small's arrival.
    assert easy["small"].first_start == pytest.approx(31)
    assert easy["big"].first_start == pytest.approx(1000)  # the reservation held
    every_event = SimConfig(policy="easy", backfill_interval_s=0)
    eager = {r.job.name: r for r in simulate(topology, workload, every_event).records}
    assert eager["small"].first_start == pytest.approx(2)
    # A backfill candidate that would delay the head is not started.
    late = Workload("w", (*jobs[:2], _job("long", 2, 8, 5000)))
    easy = {r.job.name: r for r in simulate(topology, late, SimConfig(policy="easy")).records}
    assert easy["big"].first_start == pytest.approx(1000)
    assert easy["long"].first_start == pytest.approx(2000)


def test_priority_classes_go_first():
    topology = Topology.preset("h100-superpod", nodes=1)
    jobs = (_job("a", 0, 8, 100), _job("low", 1, 8, 100), _job("high", 2, 8, 100, priority=5))
    records = {
        r.job.name: r
        for r in simulate(topology, Workload("w", jobs), SimConfig(policy="priority")).records
    }
    assert records["high"].first_start == pytest.approx(100)
    assert records["low"].first_start == pytest.approx(200)


def test_job_larger_than_cluster_is_reported_unfinished():
    topology = Topology.preset("h100-superpod", nodes=1)
    result = simulate(topology, Workload("w", (_job("huge", 0, 16, 10), _job("ok", 0, 8, 10))))
    records = {r.job.name: r for r in result.records}
    assert records["huge"].finish is None and "cluster has 8" in records["huge"].reason
    assert records["ok"].finish == pytest.approx(10)
    assert metrics.summary(result)["jobs_unfinished"] == 1


def test_placement_changes_runtime_through_the_cost_model():
    topology = Topology.preset("h100-superpod", nodes=64)
    job = SimJob("j", 0.0, 16, 3600.0, tp=8, model="llama2-13b")
    # Checkpoints free to write: the placement alone sets the speed.
    free = SimConfig(solver="greedy", checkpoint_store=None)
    greedy = simulate(topology, Workload("w", (job,)), free).records[0]
    random = simulate(
        topology, Workload("w", (job,)), dataclasses.replace(free, solver="random")
    ).records[0]
    assert greedy.finish == pytest.approx(3600.0)  # greedy on the empty cluster is the reference
    assert random.finish > greedy.finish


def test_speed_model_uses_step_time_when_the_report_has_it():
    report = CostReport(0.5, {}, 0.0, {"node": 0.0}, None, True, [], "node")
    profile = JobProfile(
        compute_seconds=1.5, model_flops_per_gpu=1e15, peak_flops=1e15, reference_step_seconds=1.0
    )
    comm_rule = job_speed(report, profile)
    assert comm_rule.step_seconds == pytest.approx(2.0) and comm_rule.speed == pytest.approx(0.5)
    assert comm_rule.mfu == pytest.approx(0.5)

    @dataclasses.dataclass(frozen=True)
    class StepReport(CostReport):
        step_seconds: float = 4.0
        mfu: float = 0.3

    stepped = job_speed(StepReport(0.5, {}, 0.0, {"node": 0.0}, None, True, [], "node"), profile)
    assert (
        stepped.step_seconds == 4.0 and stepped.speed == pytest.approx(0.25) and stepped.mfu == 0.3
    )


def test_repair_keeps_the_job_running_and_requeue_loses_its_place(small):
    workload = Workload("w", (_job("victim", 0, 32, 20_000), _job("next", 10, 32, 1000)))
    # One GPU failure under the victim (GPU 0, which greedy gives it) at 5,000 s.
    model = _fixed([(5000.0, Cause("gpu", "gpu", 0.0, 3600.0), 0)])
    spares = SimConfig(
        response="repair",
        failures=model,
        spares_per_leaf=8,
        checkpoint_interval_s=1800,
        restart_s=300,
        restart_sigma=0.0,
        checkpoint_store=None,
    )
    rec = {r.job.name: r for r in simulate(small, workload, spares).records}
    assert rec["victim"].restarts == 1
    # Lost: work since the checkpoint at 3600 s (1400 s) and the restart (300 s), on 32 GPUs.
    assert sum(rec["victim"].lost_gpu_s.values()) == pytest.approx(32 * (1400 + 300))
    assert rec["victim"].finish == pytest.approx(20_000 + 1400 + 300)
    requeue = dataclasses.replace(spares, response="requeue", spares_per_leaf=0)
    rec = {r.job.name: r for r in simulate(small, workload, requeue).records}
    assert sum(rec["victim"].lost_gpu_s.values()) == pytest.approx(32 * (1400 + 300))
    assert rec["victim"].finish == pytest.approx(20_000 + 1400 + 300)  # the cluster had room


def test_llama3_rates_match_the_report():
    model = llama3()
    hardware = {c.name: c.rate for c in model.causes}
    per_day_16k = (hardware["gpu"] + hardware["software"]) * 16_384 * 86_400 + (
        hardware["network"] + hardware["host"]
    ) * 2048 * 86_400
    assert per_day_16k * 54 == pytest.approx(419)
    assert hardware["gpu"] * 16_384 * 86_400 * 54 == pytest.approx(268)


def test_failures_file_errors(tmp_path):
    bad = tmp_path / "f.yaml"
    bad.write_text("causes:\n  - {component: gpu, per_component_per_day: -1}\n")
    with pytest.raises(InvalidJob, match=r"causes\[0\]: per_component_per_day"):
        load_failures(str(bad))
    bad.write_text("causes:\n  - {component: disk, per_component_per_day: 1}\n")
    with pytest.raises(InvalidJob, match="component: expected one of"):
        load_failures(str(bad))
    good = tmp_path / "g.yaml"
    good.write_text(
        "causes:\n  - {name: gpu, component: gpu, per_component_per_day: 0.001, repair_hours: 2}\n"
    )
    assert load_failures(str(good)).causes[0].repair_s == 7200


# ----------------------------------------------------------------------------- loaders
def test_philly_loader_on_the_real_trace():
    workload = philly()
    assert len(workload) == 82_247
    sizes = Counter(j.gpus for j in workload.jobs)
    # As the shared traces' README counts them.
    assert sizes == {
        1: 76_627,
        2: 1_818,
        4: 1_870,
        8: 1_643,
        12: 7,
        16: 199,
        24: 7,
        32: 67,
        64: 6,
        128: 3,
    }
    submits = [j.submit_s for j in workload.jobs]
    assert submits[0] == 0 and submits == sorted(submits)
    assert submits[-1] / 86_400 == pytest.approx(109, abs=1.5)  # 2017-09-04 to 2017-12-22
    assert len(philly(min_duration_s=60)) < len(workload)


def test_openb_loader_on_the_real_trace():
    workload = openb()
    # 8,152 pods: 1,088 without GPUs; of the rest, those never scheduled have no runtime.
    assert 6_000 < len(workload) < 7_064
    assert Counter(j.gpus for j in workload.jobs).keys() <= {1, 2, 4, 8}
    assert all(j.work_s >= 1 for j in workload.jobs)


def test_llm_mix():
    workload = llm_mix(500, cluster_gpus=16_384, seed=1)
    sizes = [j.gpus for j in workload.jobs]
    assert min(sizes) >= 8 and max(sizes) <= 16_384
    assert sizes.count(8) > sizes.count(1024)  # power law: small jobs are the common ones
    for j in workload.jobs:
        assert j.gpus % (j.tp * j.pp) == 0
    assert llm_mix(500, cluster_gpus=16_384, seed=1) == workload


def test_workload_files(tmp_path):
    good = tmp_path / "w.csv"
    good.write_text("name,submit_s,gpus,duration_s,priority\na,0,8,100,1\nb,5,16,50,\n")
    workload = load_workload(good)
    assert [j.name for j in workload.jobs] == ["a", "b"] and workload.jobs[0].priority == 1
    bad = tmp_path / "bad.csv"
    bad.write_text("name,submit_s,gpus,duration_s\na,0,8,100\nb,5,eight,50\n")
    with pytest.raises(InvalidJob, match=r"bad.csv line 3: gpus: expected an integer"):
        load_workload(bad)
    bad.write_text("name,submit_s,gpus,duration_s,tp\na,0,8,100,3\n")
    with pytest.raises(InvalidJob, match=r"line 2: gpus: 8 is not a multiple of tp"):
        load_workload(bad)
    bad.write_text("name,submit_s,gpus,duration_s\na,0,8,100\na,1,8,100\n")
    with pytest.raises(InvalidJob, match="'a' appears twice"):
        load_workload(bad)
    yml = tmp_path / "w.yaml"
    yml.write_text(
        "jobs:\n  - {name: a, submit_s: 0, gpus: 8, duration_s: 10}\n  - {name: b, submit_s: 0, gpus: 8}\n"
    )
    with pytest.raises(InvalidJob, match=r"jobs\[1\]: duration_s: required"):
        load_workload(yml)
    yml.write_text("jobs: [\n")
    with pytest.raises(InvalidJob, match=r"w\.yaml: line \d+, column \d+: invalid YAML"):
        load_workload(yml)


def test_philly_loader_names_a_bad_line(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66,x\nsoon,1,1,1,x\n"
    )
    with pytest.raises(InvalidJob, match=r"p\.csv line 3"):
        philly(path)


# ----------------------------------------------------------------------------- CLI
def test_cli_json_keys_and_outputs(tmp_path, capsys):
    code = main(
        [
            "simulate", "-c", "h100-superpod", "--nodes", "8", "--trace", "llm-mix", "--jobs", "40",
            "--compare", "greedy,first-fit", "--failures", "llama3", "--format", "json",
            "--out", str(tmp_path), "--png",
        ]
    )  # fmt: skip
    assert code == 0
    summaries = json.loads(capsys.readouterr().out)
    assert list(summaries) == ["greedy", "first-fit"]
    for s in summaries.values():
        assert list(s)[: len(SUMMARY_KEYS)] == SUMMARY_KEYS
        assert s["jobs"] == 40
    for name in (
        "summary.json",
        "jobs-greedy.csv",
        "bins-first-fit.json",
        "timeline.png",
        "jct_cdf.png",
        "goodput.png",
    ):
        assert (tmp_path / name).stat().st_size > 0
    rows = json.loads((tmp_path / "bins-greedy.json").read_text())
    assert len(rows) == 200 and 0 <= rows[0]["utilization"] <= 1


def test_cli_what_if_and_errors(tmp_path, capsys):
    workload = tmp_path / "w.csv"
    workload.write_text("name,submit_s,gpus,duration_s\na,0,8,100\nb,0,64,100\n")
    code = main(
        [
            "simulate",
            "-c",
            "h100-superpod",
            "--nodes",
            "16",
            "--trace",
            str(workload),
            "--vs",
            "gb200-nvl72",
            "--format",
            "json",
        ]
    )
    assert code == 0
    summaries = json.loads(capsys.readouterr().out)
    assert [k.split("@")[0] for k in summaries] == ["greedy", "greedy"]
    assert {s["cluster"] for s in summaries.values()} == {"h100-superpod-16", "gb200-nvl72-2"}
    workload.write_text("name,submit_s,gpus,duration_s\na,0,8,100\nb,0,-1,100\n")
    assert main(["simulate", "-c", "h100-superpod", "--trace", str(workload)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuplace: error: ") and "line 3: gpus" in err and err.count("\n") == 1
    assert main(["simulate", "-c", "h100-superpod", "--trace", "nope.csv"]) == 2
    assert main(["simulate", "-c", "h100-superpod", "--trace", "philly", "--policy", "nope"]) == 2
    assert "unknown solver" in capsys.readouterr().err


def test_real_clusters_from_the_shared_traces():
    from gpuplace.sim.clusters import lingjun, pai

    topology = lingjun()
    # 847 hosts, 119 (PSW, ASW) ToR switches, 3 PSWs, 1 DSW, as the traces' README counts them.
    assert [topology.domain_count(level) for level in topology.level_names] == [847, 119, 3, 1]
    assert topology.num_gpus == 8 * 847
    machines = pai()
    # 6,742 GPUs on the GPU machines (the 83 CPU-only machines are left out).
    assert machines.num_gpus == 6_742
    assert {nt.gpu_model for nt in machines.node_types.values()} >= {
        "P100",
        "T4",
        "V100",
        "V100M32",
    }
    result = simulate(topology, llm_mix(30, cluster_gpus=topology.num_gpus, seed=2))
    assert metrics.summary(result)["jobs_finished"] == 30


def test_what_if_measures_work_against_the_reference_cluster():
    h100 = Topology.preset("h100-superpod", nodes=16)
    gb200 = Topology.preset("gb200-nvl72", racks=2)
    workload = Workload("w", (SimJob("j", 0.0, 64, 3600.0, tp=8, model="llama2-13b"),))
    free = SimConfig(checkpoint_store=None)
    on_h100 = simulate(h100, workload, free).records[0]
    on_gb200 = simulate(gb200, workload, free, reference=h100).records[0]
    alone = simulate(gb200, workload, free).records[0]
    assert on_h100.finish == pytest.approx(3600.0)
    assert alone.finish == pytest.approx(3600.0)  # its own reference
    # 2.5 PFLOP/s against 989 TFLOP/s and NVLink 5: the same work, well over twice as fast.
    assert on_gb200.finish < 3600.0 / 2


def _fixed(events: list[tuple[float, Cause, int]]) -> FailureModel:
    """A failure model whose draw is exactly ``events`` (time, cause, component index)."""
    model = FailureModel("fixed", tuple({e[1] for e in events}))
    object.__setattr__(model, "draw", lambda counts, horizon, seed: events)
    return model


def test_a_degraded_link_slows_the_job_on_it_and_evacuation_moves_it(small):
    job = SimJob("j", 0.0, 16, 3600.0, tp=8, model="llama2-13b")  # dp 2 across two hosts
    workload = Workload("w", (job,))
    free = SimConfig(checkpoint_store=None, restart_sigma=0.0)
    clean = simulate(small, workload, free).records[0]
    assert clean.finish == pytest.approx(3600.0)
    # The core's step model hides the dp all-reduce under the backward pass: 1 % loss (half the
    # bandwidth) on its ring still fits, so the job keeps its speed.
    hidden = Cause("loss", "nic", 0.0, 2000.0, loss=0.01)
    kept = simulate(
        small, workload, dataclasses.replace(free, failures=_fixed([(1000.0, hidden, 0)]))
    )
    kept = kept.records[0]
    assert kept.finish == pytest.approx(clean.finish)
    # 10 % loss (a tenth of the bandwidth) makes the dp all-reduce outlast the backward pass.
    loss = Cause("loss", "nic", 0.0, 2000.0, loss=0.1)
    # NIC 0 is the first host's mlx5_0, the NIC of GPU 0, which greedy gives the job.
    degraded = dataclasses.replace(free, failures=_fixed([(1000.0, loss, 0)]))
    slowed = simulate(small, workload, degraded).records[0]
    assert slowed.finish > clean.finish + 1.0  # slower for 2,000 s, then back to full speed
    assert slowed.restarts == 0 and not slowed.lost_gpu_s
    # Without health ingest nobody notices the link within its 2,000 s (detect_s, 4 h): the
    # job is not evacuated, it runs slowly, as without --evacuate.
    unseen = simulate(small, workload, dataclasses.replace(degraded, evacuate=True)).records[0]
    assert unseen.restarts == 0 and unseen.finish == pytest.approx(slowed.finish)
    # With ingest every 600 s it is seen at 1,200 s, drained, and the job repaired off it.
    config = dataclasses.replace(degraded, evacuate=True, restart_s=300.0, health_ingest_s=600.0)
    result = simulate(small, workload, config)
    moved = result.records[0]
    assert moved.restarts == 1
    # Work since the start (no checkpoint yet at 1,200 s) and the restart are lost.
    assert moved.lost_gpu_s == {"loss": pytest.approx(16 * (1200.0 + 300.0))}
    assert moved.finish == pytest.approx(3600.0 + 1200.0 + 300.0)
    assert moved.degraded_slowdown is not None and moved.degraded_slowdown > 1.0
    # Noticed by hand sooner (detect_s = 100 s): at 1,100 s.
    config = dataclasses.replace(degraded, evacuate=True, restart_s=300.0, detect_s=100.0)
    early = simulate(small, workload, config).records[0]
    assert early.finish == pytest.approx(3600.0 + 1100.0 + 300.0)


def test_repricing_on_every_allocation_change_is_neutral_without_contention(small):
    # Once the cost model prices contention, a job's speed depends on its neighbours and the
    # simulator re-prices on every change; today that must change nothing.
    workload = llm_mix(40, cluster_gpus=small.num_gpus, seed=5)
    config = SimConfig(policy="easy", failures=_harsh(0.005), seed=2)
    plain = simulate(small, workload, config)
    repriced = simulate(small, workload, dataclasses.replace(config, reprice_on_change=True))
    assert metrics.job_rows(plain) == metrics.job_rows(repriced)
