"""Power domains: budgets no solver exceeds, at most K synchronised jobs peaking together per
domain, staggered phases, headroom in the state and in ``status``."""

from __future__ import annotations

import json

import gpuplace
import numpy as np
import pytest
from gpuplace.cli import main
from gpuplace.model.power import BOARD_POWER_W, JobPower, gpu_power_w
from hypothesis import given, settings
from hypothesis import strategies as st

SOLVERS = ["greedy", "refine", "first-fit", "random", "slurm-tree", "kueue-bestfit", "gpuallocator"]


def _racks(
    budget_w: float = 12_000, max_synchronized: int | None = None, phases: int = 1
) -> gpuplace.Topology:
    """8 hosts of 8 x 700 W GPUs, 2 hosts per rack (= leaf), a budget per rack."""
    rack: dict = {"kind": "rack", "budget_w": budget_w}
    if max_synchronized is not None:
        rack["max_synchronized"] = max_synchronized
    doc = {
        "format": "gpuplace.topology/1",
        "name": "racks",
        "levels": [
            {"name": "node", "bandwidth_gbps": 450, "latency_us": 1},
            {"name": "leaf", "bandwidth_gbps": 50, "latency_us": 2},
            {"name": "spine", "bandwidth_gbps": 50, "latency_us": 3},
        ],
        "node_types": {"box": {"gpus": 8, "gpu_model": "H100-SXM5-80GB"}},
        "nodes": [
            {
                "name": f"n[{2 * r}-{2 * r + 1}]",
                "type": "box",
                "domains": {"leaf": f"l{r}", "spine": "s"},
            }
            for r in range(4)
        ],
        "power_domains": [
            {"name": f"rack{r}", "hosts": f"n[{2 * r}-{2 * r + 1}]", **rack} for r in range(4)
        ],
        "power_phases": phases,
    }
    return gpuplace.Topology.from_dict(doc)


def _within_budgets(state: gpuplace.ClusterState) -> None:
    for row in state.power_headroom():
        assert row["draw_w"] <= row["budget_w"] * (1 + 1e-9), row


def test_board_power_comes_from_the_model_and_the_format_round_trips() -> None:
    t = _racks(max_synchronized=2, phases=2)
    assert np.all(gpu_power_w(t) == BOARD_POWER_W["H100"])
    again = gpuplace.Topology.from_dict(t.to_dict())
    assert again.power_domains == t.power_domains and again.power_phases == 2
    job = gpuplace.Job.from_dict(
        {"name": "j", "parallelism": {"tp": 8}, "power": {"peak_w": 650, "average_w": 500}}
    )
    assert job.power == JobPower(650, 500, True)
    assert gpuplace.Job.from_dict(job.to_dict()).power == job.power


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hosts": "x[1-2]"}, r"power_domains\[0\].hosts: unknown host"),
        ({"budget_w": 0}, r"power_domains\[0\].budget_w"),
        ({"kind": "room"}, r"power_domains\[0\].kind"),
    ],
)
def test_bad_power_domains_are_refused_naming_the_field(change: dict, message: str) -> None:
    doc = _racks().to_dict()
    doc["power_domains"][0].update(change)
    with pytest.raises(gpuplace.InvalidTopology, match=message):
        gpuplace.Topology.from_dict(doc, source="racks.yaml")


def test_job_power_average_above_peak_is_refused() -> None:
    with pytest.raises(gpuplace.InvalidJob, match=r"power\.average_w"):
        gpuplace.Job.from_dict({"name": "j", "power": {"peak_w": 500, "average_w": 600}})


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([8, 16, 24]), st.booleans(), st.sampled_from([400, 550, 700])),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(SOLVERS),
    st.sampled_from([6_000, 9_000, 12_000]),
)
def test_no_solver_ever_exceeds_a_power_budget(jobs, solver, budget) -> None:
    t = _racks(budget_w=budget)
    state = gpuplace.ClusterState(t)
    for i, (gpus, synced, peak) in enumerate(jobs):
        job = gpuplace.Job(
            name=f"j{i}",
            tp=8,
            dp=gpus // 8,
            power=JobPower(peak_w=peak, average_w=peak * 0.7, synchronized=synced),
        )
        try:
            placement = gpuplace.place(state, job, solver, seed=i, time_limit=0.05)
        except gpuplace.Infeasible:
            continue
        state.allocate(placement)
        _within_budgets(state)
        state.check()


def test_a_hand_made_allocation_over_budget_is_refused_and_changes_nothing() -> None:
    t = _racks(budget_w=6_000)
    state = gpuplace.ClusterState(t)
    state.allocate(name="first", gpus=t.host_gpus("n0"))  # 8 x 700 W = 5.6 kW
    with pytest.raises(gpuplace.InvalidState, match=r"rack0.*over its budget of 6,000 W"):
        state.allocate(name="second", gpus=t.host_gpus("n1"))
    assert list(state.jobs) == ["first"]
    state.allocate(name="elsewhere", gpus=t.host_gpus("n2"))


def _sync(name: str) -> gpuplace.Job:
    return gpuplace.Job(name=name, tp=8, power=JobPower(peak_w=700, average_w=400))


def test_at_most_k_synchronised_jobs_peak_together_in_a_rack() -> None:
    t = _racks(budget_w=40_000, max_synchronized=2)
    state = gpuplace.ClusterState(t)
    racks = []
    for i in range(3):
        p = gpuplace.place(state, _sync(f"s{i}"), "first-fit")
        state.allocate(p)
        racks.append(t.domain_of(int(p.gpus[0]), "leaf"))
    assert racks[:2] == ["l0", "l0"] and racks[2] != "l0"
    rows = {r["domain"]: r for r in state.power_headroom()}
    assert set(rows["rack0"]["synchronized_jobs"]) == {"s0", "s1"}


def test_staggered_phases_admit_a_third_synchronised_job_with_its_offset() -> None:
    # 2 hosts at 700 W peak = 11.2 kW > 10 kW: two synchronised jobs may not peak together,
    # but staggered over 2 phases the rack sees 2 x 8 x 400 + 8 x 300 = 8.8 kW.
    t = _racks(budget_w=10_000, phases=2)
    one_rack = gpuplace.Topology.from_dict(
        {**t.to_dict(), "power_domains": [t.to_dict()["power_domains"][0]]}
    )
    state = gpuplace.ClusterState(one_rack)
    for h in ("n2", "n3", "n4", "n5", "n6", "n7"):
        state.drain(host=h)
    first = gpuplace.place(state, _sync("a"))
    state.allocate(first)
    second = gpuplace.place(state, _sync("b"))
    assert second.details["phase_offset"] == 0.5
    state.allocate(second)
    _within_budgets(state)
    offsets = state.power_headroom()[0]["synchronized_jobs"]
    assert offsets == {"a": 0.0, "b": 0.5}
    again = gpuplace.ClusterState.restore(one_rack, state.snapshot())
    assert again.power_headroom() == state.power_headroom()


def test_cli_refuses_a_third_synchronised_job_in_a_rack(tmp_path, capsys) -> None:
    topo_file = tmp_path / "racks.yaml"
    doc = _racks(budget_w=40_000, max_synchronized=2).to_dict()
    doc["power_domains"] = doc["power_domains"][:1]
    doc["nodes"] = doc["nodes"][:1]
    doc["levels"] = doc["levels"][:2]
    for node in doc["nodes"]:
        node["domains"] = {"leaf": "l0"}
    gpuplace.Topology.from_dict(doc).save(topo_file)
    job = tmp_path / "sync.yaml"
    job.write_text("name: sync\nparallelism: {tp: 2}\npower: {peak_w: 700, synchronized: true}\n")
    state = str(tmp_path / "state.json")
    argv = ["place", "-c", str(topo_file), "-j", str(job), "--state", state]
    assert main([*argv, "--name", "a"]) == 0
    assert main([*argv, "--name", "b"]) == 0
    capsys.readouterr()
    assert main([*argv, "--name", "c"]) == 2
    err = capsys.readouterr().err
    assert "power budgets" in err and err.startswith("gpuplace: error:")
    assert main(["status", "--state", state, "--format", "json"]) == 0
    power = json.loads(capsys.readouterr().out)["power"]
    assert power[0]["headroom_w"] == 40_000 - 4 * 700
    assert set(power[0]["synchronized_jobs"]) == {"a", "b"}


@pytest.mark.parametrize("solver", ["cpsat", "auto"])
def test_exact_solvers_stay_within_the_budget_too(solver: str) -> None:
    t = _racks(budget_w=6_000)
    state = gpuplace.ClusterState(t)
    for i in range(4):
        job = gpuplace.Job(name=f"j{i}", tp=8, dp=2, power=JobPower(peak_w=700, average_w=500))
        try:
            state.allocate(gpuplace.place(state, job, solver, time_limit=1.0))
        except gpuplace.Infeasible:
            break
        _within_budgets(state)
    # 6 kW holds eight 700 W GPUs per rack: two 16-GPU jobs over the four racks, no third.
    assert len(state.jobs) == 2


def test_a_repair_that_would_exceed_a_budget_changes_nothing() -> None:
    t = _racks(budget_w=6_000)
    state = gpuplace.ClusterState(t)
    state.allocate(name="full", gpus=t.host_gpus("n0"))  # rack0 at 5.6 kW
    gpus = t.host_gpus("n2")[:2]
    job = gpuplace.Job(name="small", tp=2)
    state.allocate(gpuplace.Placement(job, t, gpus, gpuplace.evaluate(t, job, gpus), "x", 0))
    # Everything but rack0's second host is out of service: the lost rank could only go there.
    state.drain(host=["n3", "n4", "n5", "n6", "n7"])
    state.drain(gpu=[int(g) for g in t.host_gpus("n2")[2:]])
    state.fail(gpu=int(gpus[1]))
    before = state.snapshot()
    with pytest.raises(gpuplace.Infeasible, match=r"rack0.*over its budget"):
        gpuplace.repair(state, "small")
    assert state.snapshot() == before
    _within_budgets(state)
