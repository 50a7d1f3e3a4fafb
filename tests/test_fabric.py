"""Jobs sharing the fabric: uplink capacities in the topology format, per-uplink load kept by
the state, contention in the one cost model (equal to the Python oracle), and solvers that
steer clear of hot uplinks."""

from __future__ import annotations

import json

import gpuplace
import numpy as np
import pytest
from gpuplace import _core
from gpuplace.cli import main
from gpuplace.cluster import fabric
from gpuplace.sim.workload import DEFAULT_MODEL, MOE_MODEL
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference_contended, reference_load


def _small(ratio: float = 1.0, uplinks: dict[str, float] | None = None) -> gpuplace.Topology:
    """8 hosts of 8 GPUs, 2 hosts per leaf, leaf uplinks ``ratio``:1."""
    doc = {
        "format": "gpuplace.topology/1",
        "name": "small",
        "levels": [
            {"name": "node", "bandwidth_gbps": 450, "latency_us": 1},
            {"name": "leaf", "bandwidth_gbps": 50, "latency_us": 2, "oversubscription": ratio},
            {"name": "spine", "bandwidth_gbps": 50, "latency_us": 3},
        ],
        "node_types": {"box": {"gpus": 8}},
        "nodes": [
            {"name": f"n{h}", "type": "box", "domains": {"leaf": f"l{h // 2}", "spine": "s"}}
            for h in range(8)
        ],
    }
    if uplinks:
        doc["uplink_gbps"] = uplinks
    return gpuplace.Topology.from_dict(doc)


def _moe(name: str, ep: int = 4) -> gpuplace.Job:
    return gpuplace.Job(name=name, tp=8, ep=ep, dp=1, model=MOE_MODEL)


def _host_gpus(topology: gpuplace.Topology, *hosts: int) -> np.ndarray:
    return np.concatenate([topology.host_gpus(f"n{h}") for h in hosts])


def _slots_sum(state: gpuplace.ClusterState) -> float:
    return float(_core.fabric_load(state._core).sum())


def _flows_sum(state: gpuplace.ClusterState) -> float:
    total = 0.0
    for name, gpus in state.jobs.items():
        spec = state.specs[name].compile(state.topology)
        total += float(_core.job_load(spec, np.asarray(gpus, dtype=np.int64))[1].sum())
    return total


# --------------------------------------------------------------------------- format
def test_oversubscription_and_explicit_uplinks_set_capacity_and_round_trip() -> None:
    plain = _small()
    assert fabric.uplink_capacity(plain)["leaf:l0"] == 16 * 50
    assert fabric.uplink_capacity(plain)["node:n0"] == 8 * 50
    two = _small(2.0, {"leaf:l3": 100.0})
    caps = fabric.uplink_capacity(two)
    assert caps["leaf:l0"] == 400 and caps["leaf:l3"] == 100
    again = gpuplace.Topology.from_dict(two.to_dict())
    assert fabric.uplink_capacity(again) == caps
    assert again.fingerprint == two.fingerprint != plain.fingerprint


def test_superpod_preset_takes_an_oversubscription() -> None:
    t = gpuplace.Topology.preset("h100-superpod", nodes=64, oversubscription=2)
    caps = fabric.uplink_capacity(t)
    assert caps["leaf:su001"] == 32 * 8 * 50 / 2
    assert t.origin == {"preset": "h100-superpod", "params": {"nodes": 64, "oversubscription": 2}}
    with pytest.raises(gpuplace.InvalidTopology, match="oversubscription"):
        gpuplace.Topology.preset("h100-superpod", nodes=64, oversubscription=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"levels": 2, "oversubscription": 2}, "top level"),
        ({"levels": 1, "oversubscription": 0.5}, r"oversubscription.*>= 1"),
        ({"uplink_gbps": {"l9": 10}}, "uplink_gbps.l9"),
        ({"uplink_gbps": {"l0": -1}}, "uplink_gbps.l0"),
    ],
)
def test_bad_capacities_are_refused_naming_the_field(change: dict, message: str) -> None:
    doc = _small().to_dict()
    if "levels" in change:
        doc["levels"][change["levels"]]["oversubscription"] = change["oversubscription"]
    else:
        doc["uplink_gbps"] = change["uplink_gbps"]
    with pytest.raises(gpuplace.InvalidTopology, match=message):
        gpuplace.Topology.from_dict(doc, source="bad.yaml")


# --------------------------------------------------------------------------- load
def test_load_is_conserved_through_allocate_repair_release() -> None:
    t = _small(2.0)
    state = gpuplace.ClusterState(t)
    for i, hosts in enumerate([(0, 2), (1, 3), (4, 6)]):
        job = (
            _moe(f"j{i}", ep=2)
            if i != 1
            else gpuplace.Job(name="j1", tp=8, dp=2, model=DEFAULT_MODEL)
        )
        gpus = _host_gpus(t, *hosts)
        state.allocate(gpuplace.Placement(job, t, gpus, gpuplace.evaluate(t, job, gpus), "x", 0))
        state.check()
        assert _slots_sum(state) == pytest.approx(_flows_sum(state))
        assert _slots_sum(state) > 0
    state.fail(host="n0")
    gpuplace.repair(state, "j0")
    state.check()
    assert _slots_sum(state) == pytest.approx(_flows_sum(state))
    for name in list(state.jobs):
        state.release(name)
        state.check()
        assert _slots_sum(state) == pytest.approx(_flows_sum(state), abs=1e-6)
    assert _slots_sum(state) == 0.0


def test_load_survives_a_state_file(tmp_path) -> None:
    t = _small(2.0)
    state = gpuplace.ClusterState(t)
    state.allocate(gpuplace.place(state, _moe("a", ep=2)))
    path = tmp_path / "s.json"
    state.save(path)
    again = gpuplace.ClusterState.load(t, path)
    again.check()
    assert np.allclose(_core.fabric_load(again._core), _core.fabric_load(state._core))


# --------------------------------------------------------------------------- contention
def _pair(ratio: float) -> tuple[gpuplace.ClusterState, gpuplace.Job, np.ndarray, np.ndarray]:
    t = _small(ratio)
    state = gpuplace.ClusterState(t)
    job = _moe("a", ep=2)
    a, b = _host_gpus(t, 0, 2), _host_gpus(t, 1, 3)  # both straddle leaves l0 and l1
    for name, gpus in (("a", a), ("b", b)):
        j = gpuplace.Job(**{**job.__dict__, "name": name})
        state.allocate(gpuplace.Placement(j, t, gpus, gpuplace.evaluate(t, j, gpus), "x", 0))
    return state, job, a, b


def test_contention_is_symmetric_between_two_identical_jobs() -> None:
    state, job, a, b = _pair(4.0)
    ra, rb = fabric.contention(state, job, a), fabric.contention(state, job, b)
    assert ra.slowdown == pytest.approx(rb.slowdown, rel=1e-12)
    assert ra.slowdown > 1.05
    assert ra.uplinks and ra.uplinks[0].uplink.startswith("leaf:")
    assert set(ra.uplinks[0].jobs) == {"b"}
    hurt = state.jobs_hurt()
    assert {row["job"] for row in hurt} == {"a", "b"}
    assert hurt[0]["slowdown"] == pytest.approx(hurt[1]["slowdown"])
    assert state.hottest_uplinks(1)[0]["utilisation"] > 1


def test_evaluate_with_state_reports_slowdown_and_uplinks() -> None:
    state, job, a, _ = _pair(4.0)
    report = gpuplace.evaluate(state.topology, job, a, state=state)
    alone = gpuplace.evaluate(state.topology, job, a)
    assert report.alone_seconds == pytest.approx(alone.comm_seconds)
    assert report.comm_seconds > alone.comm_seconds
    assert report.slowdown == pytest.approx(report.comm_seconds / alone.comm_seconds)
    assert report.to_dict()["hot_uplinks"][0]["jobs"] == {"b": pytest.approx(400.0)}


def test_the_placement_gate_prices_among_the_running_jobs() -> None:
    """Rust and Python solvers alike: place() reports the contended cost evaluate(state=)
    gives, with the slowdown and the uplinks responsible."""
    t = _small(4.0)
    state = gpuplace.ClusterState(t)
    b = _moe("b", ep=2)
    gpus_b = _host_gpus(t, 1, 3)
    state.allocate(gpuplace.Placement(b, t, gpus_b, gpuplace.evaluate(t, b, gpus_b), "x", 0))
    job = _moe("a", ep=2)
    wanted = _host_gpus(t, 0, 2)  # straddles leaves l0 and l1, like b

    def hosts_0_2(state, job, seed, time_limit):
        return gpuplace.SolveResult(gpus=wanted)

    gpuplace.register_solver("test-hosts-0-2", "test only: hosts n0 and n2")(hosts_0_2)
    expected = gpuplace.evaluate(t, job, wanted, state=state)
    assert expected.comm_seconds > gpuplace.evaluate(t, job, wanted).comm_seconds
    for solver in ("first-fit", "test-hosts-0-2"):
        placed = gpuplace.place(state, job, solver)
        assert placed.gpus.tolist() == wanted.tolist()
        assert placed.cost.comm_seconds == pytest.approx(expected.comm_seconds, rel=1e-12)
        assert placed.cost.slowdown == pytest.approx(expected.slowdown, rel=1e-12)
        assert [u.uplink for u in placed.cost.hot_uplinks] == [
            u.uplink for u in expected.hot_uplinks
        ]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([8, 16, 32, 64]), st.booleans()), min_size=1, max_size=6),
    st.sampled_from(["greedy", "first-fit", "random"]),
)
def test_a_job_on_a_non_blocking_fabric_is_never_slowed(jobs, solver) -> None:
    t = _small(1.0)
    state = gpuplace.ClusterState(t)
    for i, (size, moe) in enumerate(jobs):
        rest = size // 8
        job = (
            gpuplace.Job(name=f"j{i}", tp=8, ep=rest, model=MOE_MODEL)
            if moe and rest > 1
            else gpuplace.Job(name=f"j{i}", tp=8, dp=rest, model=DEFAULT_MODEL)
        )
        try:
            state.allocate(gpuplace.place(state, job, solver, seed=i))
        except gpuplace.Infeasible:
            continue
    for row in state.jobs_hurt(100):
        assert row["slowdown"] == 1.0
    for name, gpus in state.jobs.items():
        assert not fabric.contention(state, state.specs[name], gpus).uplinks


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([1.0, 2.0, 4.0]))
def test_rust_contention_equals_the_python_oracle(seed: int, ratio: float) -> None:
    rng = np.random.default_rng(seed)
    t = _small(ratio, {"leaf:l1": 150.0} if seed % 2 else None)
    state = gpuplace.ClusterState(t)
    placed = []
    for i in range(3):
        hosts = rng.choice(8, size=2, replace=False)
        free = [h for h in hosts if state.free_counts("node")[h] == 8]
        if len(free) < 2:
            continue
        kind = rng.integers(3)
        job = (
            _moe(f"j{i}", ep=2)
            if kind == 0
            else gpuplace.Job(name=f"j{i}", tp=8, dp=2, model=DEFAULT_MODEL)
            if kind == 1
            else gpuplace.Job(name=f"j{i}", tp=8, pp=2, model=DEFAULT_MODEL)
        )
        gpus = _host_gpus(t, *free)
        state.allocate(gpuplace.Placement(job, t, gpus, gpuplace.evaluate(t, job, gpus), "x", 0))
        placed.append((job, gpus))
    assert_priced_as_reference(t, state, placed)


def assert_priced_as_reference(t, state, placed) -> None:
    """Every placed job's contended price and load equal the Python oracle's."""
    for k, (job, gpus) in enumerate(placed):
        others = [p for j, p in enumerate(placed) if j != k]
        want = reference_contended(t, job, gpus, others)
        got = gpuplace.evaluate(t, job, gpus, state=state).comm_seconds
        assert got == pytest.approx(want, rel=1e-9)
        _slots, values = _core.job_load(job.compile(t), np.asarray(gpus, dtype=np.int64))
        assert values.sum() == pytest.approx(sum(reference_load(t, job, gpus).values()))


@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_packed_rings_load_and_contend_at_their_nic_shares(ratio: float) -> None:
    # tp 4 x dp 4 over two hosts under different leaves: every dp ring has two GPUs per host
    # and runs (and loads the uplinks) at two NIC shares, in NCCL's ring order.
    t = _small(ratio)
    state = gpuplace.ClusterState(t)
    placed = []
    for i, hosts in enumerate([(0, 2), (1, 3)]):
        job = gpuplace.Job(name=f"j{i}", tp=4, dp=4, model=DEFAULT_MODEL)
        gpus = _host_gpus(t, *hosts)
        state.allocate(gpuplace.Placement(job, t, gpus, gpuplace.evaluate(t, job, gpus), "x", 0))
        placed.append((job, gpus))
    assert_priced_as_reference(t, state, placed)


# --------------------------------------------------------------------------- placement
def test_a_new_job_steers_clear_of_a_hot_uplink_and_counts_its_neighbours() -> None:
    t = _small(4.0)
    state = gpuplace.ClusterState(t)
    first = _moe("first", ep=2)
    gpus = _host_gpus(t, 0, 2)  # straddles l0 and l1
    state.allocate(gpuplace.Placement(first, t, gpus, gpuplace.evaluate(t, first, gpus), "x", 0))
    # Fill l2 and l3 halfway, so no leaf holds the new 2-host job: it must straddle two.
    for h in (4, 6):
        filler = gpuplace.Job(name=f"f{h}", tp=8)
        g = _host_gpus(t, h)
        state.allocate(gpuplace.Placement(filler, t, g, gpuplace.evaluate(t, filler, g), "x", 0))
    second = _moe("second", ep=2)
    placed = gpuplace.place(state, second)
    hosts = sorted(placed.nodes)
    assert hosts == ["n5", "n7"], hosts
    assert placed.cost.slowdown == 1.0
    assert fabric.added_to_neighbours(state, second, placed.gpus) == 0.0
    crossing = _host_gpus(t, 1, 3)
    assert fabric.added_to_neighbours(state, second, crossing) > 0


def test_cli_second_job_steers_clear_and_both_slowdowns_are_printed(tmp_path, capsys) -> None:
    topo_file = tmp_path / "fabric.yaml"
    _small(4.0).save(topo_file)
    job_file = tmp_path / "moe.yaml"
    job_file.write_text(
        "name: moe\nparallelism: {tp: 8, ep: 2}\nmodel:\n  parameters: 47e9\n  layers: 32\n"
        "  hidden_size: 4096\n  sequence_length: 4096\n  micro_batch_size: 1\n"
        "  micro_batches: 8\n  moe_top_k: 2\n"
    )
    state = str(tmp_path / "state.json")
    place = ["place", "-c", str(topo_file), "--state", state, "-j", str(job_file)]
    # Host n1 in maintenance: the first job (first-fit) straddles leaves l0 and l1.
    assert main(["drain", "--state", state, "-c", str(topo_file), "--host", "n1"]) == 0
    assert main([*place, "--name", "first", "-s", "first-fit"]) == 0
    # Two more hosts in maintenance: no leaf holds the second job whole.
    assert main(["drain", "--state", state, "--host", "n4", "--host", "n6"]) == 0
    capsys.readouterr()
    assert main([*place, "--name", "second"]) == 0
    text = capsys.readouterr().out
    assert "n[5,7]" in text  # not n3, behind the first job's hot l1 uplink
    assert "slowdown (contention)" in text and "x1.000" in text
    assert "running jobs by slowdown" in text and "first" in text and "second" in text
    assert main(["status", "--state", state, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {row["job"] for row in doc["jobs_hurt"]} == {"first", "second"}
    assert all(row["slowdown"] == 1.0 for row in doc["jobs_hurt"])


def test_a_job_alone_on_an_oversubscribed_fabric_contends_with_itself() -> None:
    job = _moe("alone", ep=2)
    gpus = _host_gpus(_small(), 0, 2)  # 8 all-to-all pairs across the l0-l1 uplinks
    open_cost = gpuplace.evaluate(_small(), job, gpus)
    t = _small(4.0)
    tight = gpuplace.evaluate(t, job, gpus)
    assert tight.comm_seconds > open_cost.comm_seconds
    inside = _host_gpus(t, 0, 1)  # one leaf: no uplink crossed
    assert gpuplace.evaluate(t, job, inside).comm_seconds == pytest.approx(
        gpuplace.evaluate(_small(), job, inside).comm_seconds
    )
    state = gpuplace.ClusterState(t)
    state.allocate(gpuplace.Placement(job, t, gpus, tight, "x", 0))
    seen = fabric.contention(state, job, gpus)
    assert seen.slowdown == 1.0  # nobody else on the fabric
    assert seen.uplinks and all(not u.jobs for u in seen.uplinks)
    assert seen.uplinks[0].utilisation == pytest.approx(2.0)


def test_contention_bench_prices_every_solver_with_the_same_model(tmp_path) -> None:
    from gpuplace.sim.contention import quick_contention_suite, run_contention_suite

    suite = run_contention_suite(quick_contention_suite()[:1], runs=1)
    placed = [r for r in suite.results if r.status == "ok"]
    assert {r.solver for r in placed} == set(suite.solvers)
    for r in placed:
        assert r.comm_seconds >= r.alone_seconds > 0
        assert r.added_seconds >= 0 and r.total_seconds >= r.comm_seconds
    summary = suite.summary()
    assert summary["greedy"]["greedy_over_solver"] == 1.0
    paths = suite.write(tmp_path)
    assert all(p.exists() for p in paths)
    assert json.loads(paths[1].read_text())["summary"]["slurm-tree"]["placed"] == 1
