"""The simulator's ``slurm`` queue policy (Slurm's sched/backfill as it behaves): conservative
reservations for every pending job, and backfill passes on their own clock. Its agreement with a
real Slurm is ``tests/test_slurm_replay.py``."""

from __future__ import annotations

import gpuplace
import gpuplace.sim.engine as engine
import numpy as np
import pytest
from gpuplace.errors import Infeasible, InvalidJob
from gpuplace.placement.solvers.baselines import (
    _slurm_tree_general,
    _switch_tree,
    slurm_tree_nodes,
)
from gpuplace.sim.engine import SimConfig, simulate
from gpuplace.sim.slurm import _end_groups, _Reservations, _runs_on, next_pass
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


def test_end_times_are_tried_in_groups_aligned_to_the_clock() -> None:
    # Slurm's will-run test (select/cons_common/job_test.c, _will_run_test): the first end
    # rounded up to a 30 s mark of the Unix clock, then every end up to 30 s past the mark,
    # then up to 60, 120, ... s past it (doubled until the next end is in).
    ends = np.array([10.0, 20.0, 45.0, 50.0, 100.0, 400.0])
    # Clock at 0: the mark is 30; ends to 60 (50), to 150 (100), to 510 (400).
    assert _end_groups(ends, 0.0) == [50.0, 100.0, 400.0]
    # Clock at 15 (simulated 10 is Unix 25): the mark is simulated 15; ends to 45, to 75.
    assert _end_groups(ends, 0.0, 15.0) == [45.0, 50.0, 100.0, 400.0]
    # An end on a mark is rounded up to the next one (end + 30 - end % 30).
    assert _end_groups(np.array([30.0, 85.0, 95.0]), 0.0) == [85.0, 95.0]
    # Ends already past are not tried.
    assert _end_groups(ends, 60.0) == [100.0, 400.0]
    assert next_pass(3.3, 2.0) == pytest.approx(4.0)
    assert next_pass(4.0, 2.0) == pytest.approx(4.0)


def _clocked_starts(jobs: list[SimJob], origin: float) -> dict[str, float]:
    result = simulate(
        _one_node(),
        Workload("t", tuple(jobs)),
        SimConfig(
            solver="slurm-tree",
            policy="slurm",
            backfill_interval_s=2.0,
            clock_origin_s=origin,
            check=True,
        ),
    )
    assert all(r.finish is not None for r in result.records)
    return {r.job.name: r.first_start for r in result.records}


def test_a_short_job_backfills_before_a_reservation_at_the_end_of_its_group() -> None:
    # One node of 8 GPUs. A (4 GPUs) is expected to end at 20 and B (2 GPUs) at 55. C (6
    # GPUs) could start once A ends, but Slurm tries it after the whole group of ends up to
    # 30 s past the 30 s mark after 20: with the clock at 0 that reaches 60, so C is reserved
    # at 55 and D (2 GPUs for 30 s) fits before it, on the 2 free GPUs at the pass at 2. C
    # then waits for D. With the clock at 9 (20 is Unix 29, the mark 21, the group to 51), C
    # is reserved at 20 and D waits until C is done, as an exact backfill would have it.
    jobs = [
        _job("A", 0.0, 4, 20.0, 20.0),
        _job("B", 0.0, 2, 55.0, 55.0),
        _job("C", 1.0, 6, 10.0, 10.0),
        _job("D", 1.5, 2, 30.0, 30.0),
    ]
    grouped = _clocked_starts(jobs, 0.0)
    assert grouped["D"] == pytest.approx(2.0) and grouped["C"] == pytest.approx(32.0)
    exact = _clocked_starts(jobs, 9.0)
    assert exact["C"] == pytest.approx(20.0) and exact["D"] == pytest.approx(30.0)


def test_only_running_jobs_on_usable_nodes_set_the_groups() -> None:
    # The will-run test skips running jobs with no node in the pending job's node bitmap (the
    # nodes no reservation holds): they neither set the 30 s mark nor end a group.
    run_nodes = np.array([0, 1, 2, 2])  # job 0 on node 0, job 1 on nodes 1-2, job 2 on node 2
    run_first = np.array([0, 1, 3])
    assert _runs_on(np.array([False, True, False]), run_nodes, run_first).tolist() == [
        False,
        True,
        False,
    ]
    assert _runs_on(np.array([True, False, True]), run_nodes, run_first).tolist() == [
        True,
        True,
        True,
    ]
    ends = np.array([10.0, 70.0, 100.0])
    # All three: the mark is 30, groups to 60 and 90 and 150. Without job 0: the mark is 90.
    assert _end_groups(ends, 0.0) == [10.0, 70.0, 100.0]
    assert _end_groups(ends[1:], 0.0) == [100.0]


def test_unknown_policy_names_the_choices() -> None:
    with pytest.raises(InvalidJob, match="slurm"):
        SimConfig(policy="slurn").validate()


def test_backfill_tests_at_most_bf_max_job_test_jobs(monkeypatch) -> None:
    # A holds 4 GPUs until 100; B and C (8 GPUs each) wait for the whole node. D (1 GPU for
    # 10 s) fits before B's reservation, but it is the third job the backfill scheduler
    # would test: with bf_max_job_test=2 it is never reached and waits for B and C; with 3
    # (or the default) it starts on the next pass.
    jobs = [
        _job("A", 0.0, 4, 100.0, 100.0),
        _job("B", 1.0, 8, 50.0, 50.0),
        _job("C", 2.0, 8, 50.0, 50.0),
        _job("D", 3.0, 1, 10.0, 10.0),
    ]
    assert engine.BACKFILL_DEPTH == 500  # slurm.conf(5): bf_max_job_test, default 500
    assert _starts(jobs, "slurm", 1.0)["D"] == pytest.approx(3.0)
    monkeypatch.setattr(engine, "BACKFILL_DEPTH", 3)
    assert _starts(jobs, "slurm", 1.0)["D"] == pytest.approx(3.0)
    monkeypatch.setattr(engine, "BACKFILL_DEPTH", 2)
    starts = _starts(jobs, "slurm", 1.0)
    assert starts["B"] == pytest.approx(100.0) and starts["C"] == pytest.approx(150.0)
    assert starts["D"] == pytest.approx(200.0)


def test_a_full_cluster_ends_the_pass_without_changing_the_outcome() -> None:
    # Once a backfilled job takes the last free GPU the pass stops; the jobs behind it could
    # not have started anyway. E (1 GPU) fills the last free GPU at the first pass; F, also
    # short and of 1 GPU, has to wait for E (a later pass), not start beside it.
    jobs = [
        _job("A", 0.0, 7, 100.0, 100.0),
        _job("B", 1.0, 8, 50.0, 50.0),
        _job("E", 2.0, 1, 10.0, 10.0),
        _job("F", 2.0, 1, 10.0, 10.0),
    ]
    starts = _starts(jobs, "slurm", 1.0)
    assert starts["E"] == pytest.approx(2.0) and starts["F"] == pytest.approx(12.0)
    assert starts["B"] == pytest.approx(100.0)


def _trees() -> list[gpuplace.Topology]:
    uneven = gpuplace.Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "uneven-leaves",
            "levels": [
                {"name": "node", "bandwidth_gbps": 370.8, "latency_us": 1.0},
                {"name": "leaf", "bandwidth_gbps": 50.0, "latency_us": 1.0},
                {"name": "spine", "bandwidth_gbps": 50.0, "latency_us": 1.0},
            ],
            "node_level": "node",
            "node_types": {"hgx": {"gpus": 8}},
            "nodes": [
                {
                    "name": f"n{i:02d}",
                    "type": "hgx",
                    "domains": {"leaf": f"leaf{leaf}", "spine": "spine"},
                }
                for i, leaf in enumerate([1, 1, 1, 1, 1, 2, 2, 3, 3, 3])
            ],
        }
    )
    return [
        uneven,
        gpuplace.Topology.preset("h100-superpod", nodes=8),
        gpuplace.Topology.preset("h100-superpod", nodes=100),
        gpuplace.Topology.preset("a100-pod", nodes=140),
    ]


@pytest.mark.parametrize("topology", _trees(), ids=lambda t: t.name)
def test_one_node_choice_is_the_general_one(topology: gpuplace.Topology) -> None:
    # slurm_tree_nodes takes a shortcut for one node (most jobs of a trace): it must pick the
    # node the general algorithm (Slurm's _eval_nodes_topo) picks, on sparse and dense masks.
    tree = _switch_tree(topology)
    rng = np.random.default_rng(7)
    hosts = len(topology.hosts)
    picked = set()
    for density in (0.0, 0.02, 0.1, 0.4, 0.9, 1.0):
        for _ in range(40):
            idle = rng.random(hosts) < density
            try:
                expected = _slurm_tree_general(tree, idle, 1)
            except Infeasible:
                with pytest.raises(Infeasible):
                    slurm_tree_nodes(tree, idle, 1)
                continue
            got = slurm_tree_nodes(tree, idle, 1)
            assert got.tolist() == expected.tolist(), np.flatnonzero(idle)
            picked.add(int(got[0]))
    assert len(picked) > 3  # the masks exercise more than one leaf and node


def test_reservation_counts_are_the_overlaps() -> None:
    # The backfill map counts a node's reservations overlapping [t, t + limit) from sorted
    # cumulative sums; it must block exactly the nodes a direct pairwise check blocks,
    # including reservations that touch the window's ends and reservations of zero length.
    rng = np.random.default_rng(3)
    hosts = 6
    for trial in range(200):
        plan = _Reservations(hosts)
        starts, ends, held = [], [], []
        for _ in range(int(rng.integers(0, 12))):
            start = float(rng.integers(0, 20))
            length = float(rng.integers(0 if trial % 10 == 0 else 1, 8))
            nodes = np.flatnonzero(rng.random(hosts) < 0.4)
            plan.add(start, start + length, nodes)
            starts.append(start)
            ends.append(start + length)
            mask = np.zeros(hosts, dtype=bool)
            mask[nodes] = True
            held.append(mask)
        times = np.unique(rng.integers(0, 25, size=8).astype(float))
        limit = float(rng.choice([0.0, 1.0, 2.5, 5.0, 30.0]))
        usable = np.ones((len(times), hosts), dtype=bool)
        plan.unblocked(usable, times, limit)
        for a, t in enumerate(times):
            blocked = np.zeros(hosts, dtype=bool)
            for s, e, mask in zip(starts, ends, held, strict=True):
                if s < t + limit and e > t:
                    blocked |= mask
            assert usable[a].tolist() == (~blocked).tolist(), (trial, t, limit)
