"""The simulator's jobs load the fabric: neighbours on oversubscribed uplinks slow each other,
running jobs are re-priced when a neighbour arrives or leaves, and the slowdown is reported."""

from __future__ import annotations

import math

import pytest
from gpuplace import Topology
from gpuplace.sim import metrics
from gpuplace.sim.engine import SimConfig, simulate
from gpuplace.sim.failures import Cause, FailureModel
from gpuplace.sim.traces import SimJob, Workload, llm_mix


def _fabric(ratio: int) -> Topology:
    # Two 32-node leaves; ``ratio``:1 leaf uplinks.
    return Topology.preset("h100-superpod", nodes=64, oversubscription=ratio)


def _job(name: str, work_s: float = 3600.0, submit_s: float = 0.0) -> SimJob:
    # Half the cluster each, tp 8: placed at random, its tensor-parallel groups span hosts
    # and leaves, so its traffic crosses the leaf uplinks.
    return SimJob(name, submit_s, 256, work_s, tp=8, model="llama3-8b")


def _jct(topology: Topology, jobs: tuple[SimJob, ...]) -> dict[str, float]:
    result = simulate(topology, Workload("w", jobs), SimConfig(solver="random", check=True))
    out = {}
    for record in result.records:
        assert record.jct_s is not None
        out[record.job.name] = record.jct_s
    return out


def test_two_jobs_sharing_oversubscribed_uplinks_are_slowed_versus_alone() -> None:
    topology = _fabric(4)
    a, b = _job("a"), _job("b")
    alone = _jct(topology, (a,))["a"]
    pair = simulate(topology, Workload("pair", (a, b)), SimConfig(solver="random", check=True))
    by_name = {r.job.name: r for r in pair.records}
    # The first job is placed on the same GPUs in both runs; only its neighbour differs.
    assert by_name["a"].jct_s is not None and by_name["a"].jct_s > 1.3 * alone
    for record in pair.records:
        assert record.contention_slowdown is not None and record.contention_slowdown > 1.3
        assert record.degraded_slowdown == pytest.approx(1.0)
    rows = {row["name"]: row for row in metrics.job_rows(pair)}
    assert rows["a"]["contention_slowdown"] == by_name["a"].contention_slowdown
    summary = metrics.summary(pair)["contention_slowdown"]
    assert summary["mean"] > 1.3 and summary["p95"] >= summary["mean"]
    assert summary["share_slowed"] == 1.0
    # Alone, nobody slows it.
    solo = simulate(topology, Workload("solo", (a,)), SimConfig(solver="random"))
    assert solo.records[0].contention_slowdown == pytest.approx(1.0)


def test_on_a_non_blocking_fabric_the_same_pair_is_not_slowed() -> None:
    topology = _fabric(1)
    a, b = _job("a"), _job("b")
    assert _jct(topology, (a, b))["a"] == pytest.approx(_jct(topology, (a,))["a"])


def test_a_running_job_speeds_up_when_its_neighbour_leaves() -> None:
    topology = _fabric(4)
    alone = _jct(topology, (_job("a"),))["a"]
    both_long = _jct(topology, (_job("a"), _job("b")))["a"]
    # b ends after a sixth of the time: a is re-priced then and finishes sooner.
    short_b = _jct(topology, (_job("a"), _job("b", work_s=600.0)))["a"]
    assert alone < short_b < both_long
    # ... and slowed when a neighbour arrives while it runs.
    late_b = _jct(topology, (_job("a"), _job("b", submit_s=alone / 2)))["a"]
    assert alone < late_b < both_long


def test_policies_differ_on_an_oversubscribed_fabric() -> None:
    # The comparison is no longer a tie by construction: the placements' neighbours load the
    # uplinks, so a policy that scatters ranks is slowed by contention and one that packs is not.
    topology = _fabric(4)
    workload = llm_mix(40, cluster_gpus=topology.num_gpus, seed=1)
    out = {}
    for solver in ("greedy", "random"):
        out[solver] = metrics.summary(simulate(topology, workload, SimConfig(solver=solver)))
    assert out["random"]["contention_slowdown"]["mean"] > 1.05
    assert (
        out["greedy"]["contention_slowdown"]["mean"] < out["random"]["contention_slowdown"]["mean"]
    )
    assert not math.isclose(out["greedy"]["jct_mean_s"], out["random"]["jct_mean_s"], rel_tol=0.01)
    # The same workload on a non-blocking fabric: random is not slowed by neighbours there.
    flat = metrics.summary(simulate(_fabric(1), workload, SimConfig(solver="random")))
    assert flat["contention_slowdown"]["mean"] == pytest.approx(1.0)
    assert flat["jct_mean_s"] < out["random"]["jct_mean_s"]


def test_degraded_links_under_a_job_show_as_its_degraded_slowdown() -> None:
    # Every NIC loses 1 % of its packets about once in the job's runtime: the pipeline's
    # point-to-point traffic over them is slower, the step longer.
    topology = Topology.preset("h100-superpod", nodes=8)
    lossy = FailureModel(
        "lossy", (Cause("link-loss", "nic", rate=1 / 36_000, repair_s=12 * 3600, loss=0.01),)
    )
    job = SimJob("a", 0.0, 64, 36_000.0, tp=8, pp=4, model="llama3-8b")
    result = simulate(topology, Workload("w", (job,)), SimConfig(failures=lossy, check=True))
    record = result.records[0]
    assert record.jct_s is not None and record.jct_s > job.work_s
    assert record.degraded_slowdown is not None and record.degraded_slowdown > 1.001
    assert record.contention_slowdown == pytest.approx(1.0)
    healthy = simulate(topology, Workload("w", (job,)), SimConfig()).records[0]
    assert healthy.degraded_slowdown == pytest.approx(1.0)
