"""The peers in the simulator behave as their schedulers do: Slurm shares nodes unless a job
asks for --exclusive, a Kubernetes pod never spans hosts, and EASY backfill costs the same order
of solver calls as FIFO."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from gpuplace import Topology
from gpuplace.errors import InvalidJob
from gpuplace.sim import engine, metrics
from gpuplace.sim.clusters import pai
from gpuplace.sim.engine import SimConfig, simulate
from gpuplace.sim.traces import SimJob, Workload, load_workload, openb, philly


@pytest.mark.parametrize("solver", ["first-fit", "random"])
def test_a_pod_never_spans_hosts(solver: str) -> None:
    workload = openb().head(3000)
    result = simulate(pai(), workload, SimConfig(solver=solver, check=True))
    started = [r for r in result.records if r.first_start is not None]
    assert len(started) == len(workload)
    assert {r.hosts for r in started} == {1}
    assert any(r.job.gpus > 1 for r in started)


def test_slurm_shares_nodes_for_sub_node_jobs() -> None:
    # Philly is mostly 1-GPU jobs: as Slurm's cons_tres runs them (nodes shared), they queue
    # about as long as under greedy; given whole nodes each (--exclusive) they queue far longer.
    topology = Topology.preset("h100-superpod", nodes=48)
    workload = philly().head(2000)
    jct = {
        solver: metrics.summary(simulate(topology, workload, SimConfig(solver=solver)))[
            "jct_mean_s"
        ]
        for solver in ("greedy", "slurm-tree", "slurm-tree-exclusive")
    }
    assert jct["slurm-tree"] < 1.25 * jct["greedy"]
    assert jct["slurm-tree-exclusive"] > 1.5 * jct["slurm-tree"]


def test_exclusive_comes_from_the_workload(tmp_path: Path) -> None:
    topology = Topology.preset("h100-superpod", nodes=1)
    path = tmp_path / "w.csv"
    path.write_text(
        "name,submit_s,gpus,duration_s,exclusive\na,0,1,100,true\nb,0,1,100,false\nc,0,1,100,\n"
    )
    workload = load_workload(path)
    assert [j.exclusive for j in workload.jobs] == [True, False, False]
    starts = {
        r.job.name: r.first_start
        for r in simulate(
            topology, workload, SimConfig(solver="slurm-tree", checkpoint_store=None)
        ).records
    }
    # a holds the whole node; b and c share it after a ends.
    assert starts == {"a": 0.0, "b": 100.0, "c": 100.0}
    path.write_text("name,submit_s,gpus,duration_s,exclusive\na,0,1,100,maybe\n")
    with pytest.raises(InvalidJob, match=r"line 2: exclusive: expected true or false"):
        load_workload(path)


def test_easy_backfill_asks_the_solver_the_same_order_of_times_as_fifo(monkeypatch) -> None:
    # Whole-node Slurm on 1-GPU jobs keeps a long queue that cannot start: a backfill pass
    # per event that asked the solver for every queued job did not finish. A shape that failed
    # to place is not tried again until something is freed, and passes run every bf_interval.
    calls: collections.Counter[str] = collections.Counter()
    real = engine.place
    policy = ""

    def counting(*args, **kwargs):
        calls[policy] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "place", counting)
    topology = Topology.preset("h100-superpod", nodes=48)
    workload = philly().head(2000)
    finished = {}
    for policy in ("fifo", "easy"):
        result = simulate(
            topology, workload, SimConfig(solver="slurm-tree-exclusive", policy=policy)
        )
        finished[policy] = metrics.summary(result)["jobs_finished"]
    assert finished == {"fifo": 2000, "easy": 2000}
    assert calls["easy"] < 4 * calls["fifo"]


def test_a_job_on_one_host_reports_one_host() -> None:
    topology = Topology.preset("h100-superpod", nodes=4)
    jobs = (SimJob("a", 0, 8, 10, tp=8), SimJob("b", 0, 16, 10, tp=8))
    hosts = {r.job.name: r.hosts for r in simulate(topology, Workload("w", jobs)).records}
    assert hosts == {"a": 1, "b": 2}
