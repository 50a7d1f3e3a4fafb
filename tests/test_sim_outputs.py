"""What a simulation reports: files readable like the plots, progress over the whole run, the
failure horizon, steady-window figures, interruptions by cause and ETTR."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from gpuplace import Topology
from gpuplace._util.documents import write_atomically
from gpuplace.cli.simulate import write_outputs
from gpuplace.sim import metrics
from gpuplace.sim.engine import SimConfig, simulate
from gpuplace.sim.failures import Cause, FailureModel
from gpuplace.sim.traces import SimJob, Workload, llm_mix


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_csv_and_json_get_the_mode_a_plain_file_gets(tmp_path: Path, umask_022) -> None:
    topology = Topology.preset("h100-superpod", nodes=4)
    result = simulate(topology, llm_mix(10, cluster_gpus=topology.num_gpus, seed=0))
    write_outputs(tmp_path, {"greedy": result}, {"greedy": metrics.summary(result)})
    written = sorted(p for p in tmp_path.iterdir() if p.suffix in (".csv", ".json"))
    assert len(written) == 5
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    # Replacing a file keeps its mode.
    kept = tmp_path / "summary.json"
    kept.chmod(0o640)
    write_atomically(kept, "{}\n")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640


def test_progress_covers_the_drain_after_the_last_arrival() -> None:
    # One node, ten 8-GPU jobs arriving within ten seconds: the arrivals are over at once,
    # the run is the drain.
    topology = Topology.preset("h100-superpod", nodes=1)
    jobs = tuple(SimJob(f"j{i}", float(i), 8, 3600.0, tp=8) for i in range(10))
    seen: list[float] = []
    simulate(topology, Workload("w", jobs), progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 1.0
    assert any(0.5 < f < 1.0 for f in seen)  # jobs ending after the last arrival


def _flaky() -> FailureModel:
    day = 86_400.0
    return FailureModel(
        "flaky",
        (
            Cause("gpu", "gpu", 2.0 / day, 3 * 3600.0),
            Cause("software", "software", 2.0 / day, 0.0),
        ),
    )


def test_interruptions_by_cause_ettr_and_the_failure_horizon() -> None:
    topology = Topology.preset("h100-superpod", nodes=4)
    workload = llm_mix(30, cluster_gpus=topology.num_gpus, seed=2)
    free = SimConfig(failures=_flaky(), seed=1, check=True, checkpoint_store=None)
    result = simulate(topology, workload, free)
    summary = metrics.summary(result)
    jobs = workload.jobs
    horizon = jobs[-1].submit_s + 4 * max(j.work_s for j in jobs) + 30 * 86_400
    assert summary["failure_horizon_s"] == pytest.approx(horizon)
    assert summary["failures_cover_run"] == (horizon >= result.end_s)
    rows = metrics.job_rows(result)
    by_cause = summary["interruptions_by_cause"]
    assert set(by_cause) <= {"gpu", "software"} and sum(by_cause.values()) > 0
    assert sum(by_cause.values()) == sum(r.restarts for r in result.records)
    assert sum(row["interruptions"] for row in rows) == sum(by_cause.values())
    assert summary["jobs_interrupted"] == sum(1 for row in rows if row["interruptions"])
    # Events on idle hardware are failures but interrupt nobody.
    assert sum(summary["failure_events"].values()) >= sum(by_cause.values())
    for record in result.records:
        if record.finish is None:
            continue
        assert record.ettr is not None and 0 < record.ettr <= 1
        if not record.interruptions:
            assert record.ettr == pytest.approx(1.0)
        else:
            assert record.ettr < 1.0
    assert 0 < summary["ettr"] < 1
    no_failures = metrics.summary(simulate(topology, workload, SimConfig(checkpoint_store=None)))
    assert no_failures["failure_horizon_s"] is None and no_failures["ettr"] == pytest.approx(1.0)


def test_steady_window_leaves_out_the_ramp_up_and_the_drain() -> None:
    topology = Topology.preset("h100-superpod", nodes=8)
    workload = llm_mix(80, cluster_gpus=topology.num_gpus, seed=4)
    result = simulate(topology, workload)
    summary = metrics.summary(result)
    submits = sorted(j.submit_s for j in workload.jobs)
    w0, w1 = summary["steady_window_s"]
    assert submits[0] <= w0 < w1 <= submits[-1]
    assert 0 < summary["goodput_steady"] <= summary["utilization_steady"] * (1 + 1e-9) <= 1
    # The whole run's figures include the drain, when the cluster empties.
    assert summary["utilization_steady"] > summary["utilization"]


def test_confidence_interval_over_seeds() -> None:
    # Student t with 2 degrees of freedom: t(0.975) = 4.3027; sd of 1, 2, 3 is 1.
    low, high = metrics.confidence_interval([1.0, 2.0, 3.0])
    assert (low, high) == pytest.approx((2 - 4.3027 / 3**0.5, 2 + 4.3027 / 3**0.5), abs=1e-3)
    assert metrics.confidence_interval([5.0]) is None
    assert metrics.confidence_interval([4.0, 4.0, 4.0]) == pytest.approx((4.0, 4.0))


def test_report_with_seeds_gives_intervals_and_paired_differences(tmp_path: Path, capsys) -> None:
    from gpuplace.cli import main

    code = main(
        [
            "simulate", "-c", "h100-superpod", "--nodes", "8", "--trace", "llm-mix", "--jobs", "25",
            "--compare", "greedy,slurm-tree", "--seeds", "3", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "greedy (mean of 3 seeds)" in printed and " ± " in printed
    report = json.loads((tmp_path / "report.json").read_text())
    assert list(report["policies"]) == ["greedy (mean of 3 seeds)", "slurm-tree (mean of 3 seeds)"]
    assert len(report["runs"]) == 6
    for summary in report["policies"].values():
        low, high = summary["ci95"]["jct_mean_s"]
        assert low <= summary["jct_mean_s"] <= high
        assert summary["seeds"] == [0, 1, 2]
    runs = report["runs"]
    diffs = [
        runs[f"slurm-tree seed={s}"]["jct_mean_s"] - runs[f"greedy seed={s}"]["jct_mean_s"]
        for s in range(3)
    ]
    paired = report["paired_differences"]["slurm-tree - greedy"]["jct_mean_s"]
    assert paired["mean"] == pytest.approx(sum(diffs) / 3)
    assert paired["ci95"] == pytest.approx(list(metrics.confidence_interval(diffs)))
    page = (tmp_path / "report.html").read_text()
    for text in ("Paired differences", "slurm-tree (mean of 3 seeds)", "JCT p95", "Steady window"):
        assert text in page
    assert page.count("data:image/png;base64,") == 3  # matplotlib is a test dependency


def test_a_job_that_only_the_spares_keep_out_is_told_why_at_once() -> None:
    topology = Topology.preset("h100-superpod", nodes=4)  # 32 GPUs, one leaf
    workload = Workload(
        "w",
        (
            SimJob("fits", 0.0, 16, 100.0),
            SimJob("whole", 1.0, 32, 100.0),  # all 32 GPUs: 8 are held back as spares
        ),
    )
    result = simulate(topology, workload, SimConfig(spares_per_leaf=8))
    records = {r.job.name: r for r in result.records}
    assert records["fits"].finish is not None
    assert records["whole"].first_start is None
    assert records["whole"].reason == (
        "needs 32 GPUs, the cluster has 32 of which 8 are reserved as spares"
    )
    # Without spares it runs.
    assert all(r.finish is not None for r in simulate(topology, workload).records)


def test_a_job_no_pod_can_hold_is_refused_at_once_and_does_not_block_the_queue() -> None:
    """Under a pod solver (kube-scheduler binds one pod to one node) a 16-GPU job on 8-GPU
    hosts can never start; kube-scheduler moves on to the next pod, so the job is refused at
    arrival with its reason instead of blocking the FIFO queue for good."""
    topology = Topology.preset("h100-superpod", nodes=4)
    workload = Workload(
        "w",
        (
            SimJob("small", 0.0, 4, 100.0),
            SimJob("wide", 1.0, 16, 100.0),
            SimJob("later", 2.0, 8, 100.0),
        ),
    )
    for solver in ("first-fit-pod", "random-pod"):
        records = {
            r.job.name: r for r in simulate(topology, workload, SimConfig(solver=solver)).records
        }
        assert records["wide"].first_start is None
        assert records["wide"].reason == (
            "needs 16 GPUs in one pod, and a pod never spans hosts: the largest host has 8"
        )
        assert records["small"].finish is not None and records["later"].finish is not None
    # A solver that may span hosts runs it.
    assert all(r.finish is not None for r in simulate(topology, workload).records)
