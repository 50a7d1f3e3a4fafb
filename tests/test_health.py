"""Health events by GPU, host, NIC and switch; degraded hardware in the cost model and in
greedy; state files in format /2 (and /1 still read)."""

from __future__ import annotations

import copy
import itertools
import json

import gpuplace
import pytest
from gpuplace.sim.workload import training_job
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture
def state(superpod: gpuplace.Topology) -> gpuplace.ClusterState:
    return gpuplace.ClusterState(superpod)


def test_fail_host_reports_job_and_ranks(state: gpuplace.ClusterState) -> None:
    p = gpuplace.place(state, training_job("llama", 64))
    state.allocate(p)
    host = state.topology.host_of(int(p.gpus[8]))
    hit = state.fail(host=host)
    assert list(hit) == ["llama"]
    assert hit["llama"].tolist() == list(range(8, 16))
    assert state.free_gpus == 1024 - 64
    state.check()


def test_unknown_names_change_nothing(state: gpuplace.ClusterState) -> None:
    before = state.snapshot()
    with pytest.raises(gpuplace.InvalidState, match="dgx999"):
        state.fail(host=["dgx001", "dgx999"])
    with pytest.raises(gpuplace.InvalidState, match="NIC"):
        state.degrade(nic="dgx001:mlx9", loss=0.01)
    with pytest.raises(gpuplace.InvalidState, match="switch"):
        state.fail(switch="nowhere")
    with pytest.raises(gpuplace.InvalidState, match="loss"):
        state.degrade(host="dgx001")
    assert state.snapshot() == before


def test_switch_failure_takes_out_its_gpus_and_recovers(state: gpuplace.ClusterState) -> None:
    state.fail(switch="su002")
    assert state.free_gpus == 1024 - 256
    assert state.free_counts("leaf").tolist() == [256, 0, 256, 256]
    state.fail(host="dgx040")  # inside su002: recovering the leaf leaves the host failed
    state.recover(switch="leaf:su002")
    assert state.free_gpus == 1024 - 8
    state.recover(host="dgx040")
    assert state.free_gpus == 1024
    state.check()


def test_loss_factor_by_rate_and_transport() -> None:
    from gpuplace import _core
    from gpuplace.errors import InvalidTopology

    # RoCE: go-back-N resends a path's bandwidth-delay product (400 Gb/s x 10 us / 4 KB).
    window = 50e9 * 10e-6 / 4096
    for t in ("roce", "infiniband"):
        assert _core.loss_factor(0.0, t) == 1.0
        rates = [1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.5]
        factors = [_core.loss_factor(p, t) for p in rates]
        assert all(a > b for a, b in itertools.pairwise(factors)), t
    assert _core.loss_factor(0.01) == pytest.approx(1 / (1 + 0.01 * window))
    assert _core.loss_factor(0.01) == pytest.approx(0.45, abs=0.005)
    assert _core.loss_factor(0.001) == pytest.approx(0.89, abs=0.005)
    # InfiniBand's link-level retry repairs the loss on the link: 94 % at 1 %.
    assert _core.loss_factor(0.01, "infiniband") == pytest.approx(0.94, abs=0.005)
    for p in (1e-4, 1e-3, 1e-2, 0.1):
        assert _core.loss_factor(p, "roce") < _core.loss_factor(p, "infiniband")
    assert 0 < _core.loss_factor(0.9) < 0.01
    with pytest.raises(InvalidTopology, match="transport"):
        _core.loss_factor(0.01, "ethernet")


def test_degrade_prices_loss_by_the_levels_transport() -> None:
    doc = gpuplace.Topology.preset("h100-superpod", nodes=64).to_dict()
    roce = gpuplace.ClusterState(gpuplace.Topology.from_dict(doc))
    for lv in doc["levels"][1:]:  # leaf and spine
        lv["transport"] = "infiniband"
    ib_topo = gpuplace.Topology.from_dict(doc)
    assert ib_topo.to_dict()["levels"][1]["transport"] == "infiniband"
    assert "transport" not in roce.topology.to_dict()["levels"][1]
    ib = gpuplace.ClusterState(ib_topo)
    job = gpuplace.Job(
        name="pair",
        dp=2,
        communication={"dp": gpuplace.Communication("all-reduce", 1e9)},
        confine={},
    )
    healthy = gpuplace.evaluate(roce.topology, job, [0, 8]).comm_seconds
    slow = {}
    for name, state in (("roce", roce), ("ib", ib)):
        state.degrade(nic="dgx001:mlx5_0", loss="1%")
        slow[name] = gpuplace.evaluate(state.topology, job, [0, 8], state=state).comm_seconds
        # Zero loss leaves the state as it was.
        state.recover(nic="dgx001:mlx5_0")
        state.degrade(nic="dgx001:mlx5_0", loss=0.0)
        assert gpuplace.evaluate(state.topology, job, [0, 8], state=state).comm_seconds == healthy
    assert healthy < slow["ib"] < slow["roce"]
    # A leaf switch's loss follows its level's transport.
    ib.degrade(switch="su001", loss=0.01)
    assert ib.unhealthy()[-1]["factor"] == pytest.approx(_loss(0.01, "infiniband"))
    # The command line's topology options set it on a preset too.
    opt = gpuplace.Topology.from_spec(
        "h100-superpod", {"nodes": 64, "levels.leaf.transport": "infiniband"}
    )
    assert [lv.transport for lv in opt.levels] == ["roce", "infiniband", "roce"]
    bad = copy.deepcopy(doc)
    bad["levels"][1]["transport"] = "ethernet"
    with pytest.raises(gpuplace.InvalidTopology, match=r"levels\[1\]\.transport"):
        gpuplace.Topology.from_dict(bad)


def _loss(rate: float, transport: str) -> float:
    from gpuplace.cluster.state import loss_factor

    return loss_factor(rate, transport)


def test_degraded_nic_slows_only_fabric_paths(state: gpuplace.ClusterState) -> None:
    topo = state.topology
    job = gpuplace.Job(
        name="pair",
        dp=2,
        communication={"dp": gpuplace.Communication("all-reduce", 1e9)},
        confine={},
    )
    healthy_intra = gpuplace.evaluate(topo, job, [0, 1], state=state).comm_seconds
    healthy_inter = gpuplace.evaluate(topo, job, [0, 8], state=state).comm_seconds
    state.degrade(nic="dgx001:mlx5_0", loss="1%")
    assert gpuplace.evaluate(topo, job, [0, 1], state=state).comm_seconds == healthy_intra
    slow = gpuplace.evaluate(topo, job, [0, 8], state=state).comm_seconds
    lat = 2 * topo.levels[1].latency_us * 1e-6
    assert (slow - lat) == pytest.approx((healthy_inter - lat) / _loss(0.01, "roce"))
    # Without the state the topology's healthy figures apply.
    assert gpuplace.evaluate(topo, job, [0, 8]).comm_seconds == healthy_inter


def test_greedy_avoids_degraded_leaf_when_it_pays(state: gpuplace.ClusterState) -> None:
    state.degrade(switch="su001", loss=0.01)
    job = training_job("big", 128)
    p = gpuplace.place(state, job)
    leaves = {state.topology.domain_of(int(g), "leaf") for g in p.gpus}
    assert leaves == {"su002"}
    # A job that fits in one host never crosses the leaf: the degradation costs it nothing.
    small = gpuplace.place(state, training_job("small", 8))
    assert (
        small.cost.comm_seconds
        == gpuplace.evaluate(state.topology, small.job, small.gpus).comm_seconds
    )


def test_degraded_hardware_is_used_when_nothing_else_fits(state: gpuplace.ClusterState) -> None:
    state.degrade(switch="spine01", factor=0.5)  # everything is under it
    p = gpuplace.place(state, training_job("big", 512))
    assert len(p.gpus) == 512


def test_spares_are_not_used_by_placement(state: gpuplace.ClusterState) -> None:
    reserved = state.reserve_spares(per="leaf", count=1)
    assert len(reserved) == 4 * 8
    assert state.free_gpus == 1024 - 32
    p = gpuplace.place(state, training_job("all", 1024 - 32))
    assert not set(p.gpus.tolist()) & set(reserved.tolist())
    with pytest.raises(gpuplace.Infeasible):
        gpuplace.place(state, training_job("more", 1000))
    state.release_spares()
    assert state.free_gpus == 1024


def test_state_file_round_trips_health_spares_specs_and_cluster(
    tmp_path, state: gpuplace.ClusterState
) -> None:
    state.allocate(gpuplace.place(state, training_job("llama", 64)))
    state.fail(host="dgx001", reason="PSU")
    state.drain(gpu=["dgx100:3"])
    state.degrade(nic="dgx017:mlx5_3", loss="2%")
    state.degrade(switch="leaf:su003", width=(2, 4), reason="x2 of x4")
    state.reserve_spares(hosts=["dgx128"])
    path = tmp_path / "s.json"
    state.save(path)
    again = gpuplace.ClusterState.load(state.topology, path)
    again.check()
    assert again.snapshot() == state.snapshot()
    assert again.specs["llama"] == state.specs["llama"]
    assert gpuplace.ClusterState.cluster_of(path) == {
        "preset": "h100-superpod",
        "params": {"nodes": 128},
    }
    assert json.loads(path.read_text())["state"]["format"] == "gpuplace.state/2"


def test_reads_format_1(tmp_path, state: gpuplace.ClusterState) -> None:
    import hashlib

    body = {
        "format": "gpuplace.state/1",
        "topology": {
            "name": state.topology.name,
            "gpus": 1024,
            "fingerprint": state.topology.fingerprint,
        },
        "health": {"failed": [3], "drained": [9]},
        "jobs": [{"name": "a", "gpus": [0, 1, 2, 3]}],
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    doc = {"checksum": "sha256:" + hashlib.sha256(text.encode()).hexdigest(), "state": body}
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(doc))
    s = gpuplace.ClusterState.load(state.topology, path)
    assert s.health()[[3, 9]].tolist() == [1, 2]
    assert s.jobs["a"].tolist() == [0, 1, 2, 3]
    s.check()


def test_refuses_truncated_and_corrupted_files(tmp_path, state: gpuplace.ClusterState) -> None:
    state.fail(host="dgx002")
    path = tmp_path / "s.json"
    state.save(path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(gpuplace.InvalidState, match="truncated"):
        gpuplace.ClusterState.load(state.topology, path)
    path.write_text(text.replace("dgx002", "dgx003"))
    with pytest.raises(gpuplace.InvalidState, match="checksum"):
        gpuplace.ClusterState.load(state.topology, path)


@given(data=st.data())
def test_failed_or_drained_hardware_appears_in_no_placement(
    superpod: gpuplace.Topology, data: st.DataObject
) -> None:
    state = gpuplace.ClusterState(superpod)
    hosts = data.draw(st.lists(st.sampled_from(superpod.hosts), max_size=20, unique=True))
    state.fail(host=hosts) if hosts else None
    leaf = data.draw(st.sampled_from(["su001", "su002", "su003", "su004", None]))
    if leaf:
        state.drain(switch=leaf)
    nics = data.draw(st.lists(st.integers(0, 127), max_size=5, unique=True))
    if nics:
        state.fail(nic=[f"{superpod.hosts[h]}:mlx5_{h % 8}" for h in nics])
    usable = state.health() == 0
    size = data.draw(st.sampled_from([1, 8, 16, 64, 200]))
    try:
        p = gpuplace.place(state, training_job("j", size))
    except gpuplace.Infeasible:
        return
    assert usable[p.gpus].all()
    state.check()
