"""The simulator's ``slurm`` queue policy (Slurm's sched/backfill as it behaves): conservative
reservations for every pending job, and backfill passes on their own clock. Its agreement with a
real Slurm is ``tests/test_slurm_replay.py``."""

from __future__ import annotations

import gpuplace
import numpy as np
import pytest
from gpuplace.errors import InvalidJob
from gpuplace.sim.engine import SimConfig, simulate
from gpuplace.sim.slurm import _end_groups, next_pass
from gpuplace.sim.traces import SimJob, Workload


def _one_node() -> gpuplace.Topology:
    return gpuplace.Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "one-node",
            "levels": [
                {"name": "node", "bandwidth_gbps": 370.8, "latency_us": 1.0},
                {"name": "leaf", "bandwidth_gbps": 50.0, "latency_us": 1.0},
            ],
            "node_level": "node",
            "node_types": {"hgx": {"gpus": 8}},
            "nodes": [{"name": "n01", "type": "hgx", "domains": {"leaf": "leaf1"}}],
        }
    )


def _job(name: str, submit: float, gpus: int, work: float, estimate: float) -> SimJob:
    return SimJob(name, submit, gpus, work, estimate_s=estimate, model="none")


def _starts(jobs: list[SimJob], policy: str, interval: float) -> dict[str, float]:
    result = simulate(
        _one_node(),
        Workload("t", tuple(jobs)),
        SimConfig(solver="slurm-tree", policy=policy, backfill_interval_s=interval, check=True),
    )
    assert all(r.finish is not None for r in result.records)
    return {r.job.name: r.first_start for r in result.records}


def test_every_pending_job_is_protected_not_only_the_head() -> None:
    # A runs on 4 of 8 GPUs until 100. B (6 GPUs) is blocked: EASY reserves 6 GPUs at 100 and
    # lets D (2 GPUs) start at once since 2 GPUs are spare then, though D then delays C (8
    # GPUs) until D ends. Slurm reserves for C too, so D waits until C is done.
    jobs = [
        _job("A", 0.0, 4, 100.0, 100.0),
        _job("B", 1.0, 6, 50.0, 50.0),
        _job("C", 2.0, 8, 50.0, 50.0),
        _job("D", 3.0, 2, 1000.0, 1000.0),
    ]
    easy = _starts(jobs, "easy", 0.0)
    slurm = _starts(jobs, "slurm", 1.0)
    assert easy["D"] == 3.0 and easy["C"] == pytest.approx(1003.0)
    assert slurm["B"] == pytest.approx(100.0) and slurm["C"] == pytest.approx(150.0)
    assert slurm["D"] == pytest.approx(200.0)


def test_backfill_runs_on_its_own_clock() -> None:
    # C could be backfilled at once when it arrives at 3.3 (it ends long before B can start).
    # EASY runs a pass then (the last was at 0.5, an interval of 2 s ago); Slurm's backfill
    # thread wakes at multiples of bf_interval, so C starts at 4.
    jobs = [
        _job("A", 0.0, 6, 100.0, 100.0),
        _job("B", 0.5, 8, 10.0, 10.0),
        _job("C", 3.3, 1, 10.0, 10.0),
    ]
    assert _starts(jobs, "easy", 2.0)["C"] == pytest.approx(3.3)
    assert _starts(jobs, "slurm", 2.0)["C"] == pytest.approx(4.0)
    assert _starts(jobs, "slurm", 0.0)["C"] == pytest.approx(3.3)


def test_end_times_are_tried_in_doubling_groups() -> None:
    ends = np.array([10.0, 20.0, 45.0, 50.0, 100.0, 400.0])
    # 10 with everything to 40 (20); then 45 with everything to 105 (100); then 400.
    assert _end_groups(ends, 0.0) == [20.0, 100.0, 400.0]
    assert next_pass(3.3, 2.0) == pytest.approx(4.0)
    assert next_pass(4.0, 2.0) == pytest.approx(4.0)


def test_unknown_policy_names_the_choices() -> None:
    with pytest.raises(InvalidJob, match="slurm"):
        SimConfig(policy="slurn").validate()
