"""Routing in the topology format and hash collisions in the cost model, through the public API:
a job crossing an ECMP-hashed spine runs at the pace of its fullest link, adaptive routing gives
the fair share, queue pairs spread the flows, and topologies that declare nothing keep their
results."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import gpuplace
import numpy as np
import pytest
from gpuplace.cli import main
from gpuplace.cluster.fabric import collisions
from hypothesis import given, settings
from hypothesis import strategies as st


def _doc(routing: str | None = None, qps: int | None = None, hosts: int = 8) -> dict[str, Any]:
    """Hosts of 8 GPUs, 2 per leaf, one spine; the leaves' uplinks routed as given."""
    leaf: dict[str, Any] = {"name": "leaf", "bandwidth_gbps": 50, "latency_us": 2}
    if routing is not None:
        leaf["routing"] = routing
    if qps is not None:
        leaf["qps_per_connection"] = qps
    return {
        "format": "gpuplace.topology/1",
        "name": "small",
        "levels": [
            {"name": "node", "bandwidth_gbps": 450, "latency_us": 1},
            leaf,
            {"name": "spine", "bandwidth_gbps": 50, "latency_us": 3},
        ],
        "node_types": {"box": {"gpus": 8}},
        "nodes": [
            {"name": f"n{h}", "type": "box", "domains": {"leaf": f"l{h // 2}", "spine": "s"}}
            for h in range(hosts)
        ],
    }


def _topology(routing: str | None = None, qps: int | None = None) -> gpuplace.Topology:
    return gpuplace.Topology.from_dict(_doc(routing, qps))


#: 8 tp groups of 8 on two hosts under different leaves: the 8 dp rings (of 2) cross the spine.
JOB = gpuplace.Job(
    name="dp", tp=8, dp=2, communication={"dp": gpuplace.Communication("all-reduce", 1 << 30)}
)


def _gpus(topology: gpuplace.Topology) -> np.ndarray:
    return np.concatenate([topology.host_gpus("n0"), topology.host_gpus("n2")])


def test_default_routing_keeps_every_result() -> None:
    plain = _topology()
    adaptive = _topology("adaptive")
    assert plain.fingerprint == adaptive.fingerprint
    assert "routing" not in json.dumps(plain.to_dict())
    for gpus in (_gpus(plain), np.arange(16)):
        assert (
            gpuplace.evaluate(plain, JOB, gpus).comm_seconds
            == gpuplace.evaluate(adaptive, JOB, gpus).comm_seconds
        )


def test_a_job_crossing_an_ecmp_spine_is_slower_than_on_adaptive() -> None:
    adaptive, ecmp = _topology("adaptive"), _topology("ecmp")
    gpus = _gpus(adaptive)
    fair = gpuplace.evaluate(adaptive, JOB, gpus).class_seconds["dp all-reduce"]
    hashed = gpuplace.evaluate(ecmp, JOB, gpus).class_seconds["dp all-reduce"]
    # 8 flows hashed onto a leaf's 16 links (non-blocking: one per GPU under it): the fullest
    # carries about 2.06 of them (balls into bins), so the dp rings run about 2.06x slower.
    assert 2.0 < hashed / fair < 2.4
    # Inside one host the fabric is not crossed: no difference.
    inside = np.arange(16)
    assert gpuplace.evaluate(ecmp, JOB, inside).comm_seconds == pytest.approx(
        gpuplace.evaluate(adaptive, JOB, inside).comm_seconds
    )
    # More queue pairs per connection: more, smaller flows, less imbalance (32 quarter-flows
    # on 16 links: the fullest about 4.5 quarters, 1.1x).
    qps = gpuplace.evaluate(_topology("ecmp", 4), JOB, gpus).class_seconds["dp all-reduce"]
    assert 1.0 < qps / fair < 1.3
    # Static routing by destination: queue pairs do not help.
    fixed = gpuplace.evaluate(_topology("static", 4), JOB, gpus).class_seconds["dp all-reduce"]
    assert fixed == pytest.approx(hashed)


def test_a_job_alone_is_priced_with_its_own_hashed_flows() -> None:
    """Nobody else on the fabric: the job's own flows still collide on a hashed level, in the
    price alone (evaluate, contention's alone seconds, place's report), and only there."""
    from gpuplace.cluster.fabric import contention

    prices = {}
    for routing, qps in (("adaptive", 1), ("ecmp", 1), ("ecmp", 4), ("static", 4)):
        topology = _topology(routing, qps)
        state = gpuplace.ClusterState(topology)
        gpus = _gpus(topology)
        alone = gpuplace.evaluate(topology, JOB, gpus).comm_seconds
        # The same figure through every door: in an empty state, as contention's alone price
        # and as the contended one (no neighbour adds anything).
        assert gpuplace.evaluate(topology, JOB, gpus, state=state).comm_seconds == alone
        report = contention(state, JOB, gpus)
        assert report.alone_seconds == report.contended_seconds == alone
        prices[routing, qps] = alone
    assert prices["ecmp", 1] > 1.8 * prices["adaptive", 1]
    assert prices["adaptive", 1] < prices["ecmp", 4] < prices["ecmp", 1]
    # Static routing follows the destination: its queue pairs take one path.
    assert prices["static", 4] == pytest.approx(prices["ecmp", 1])
    # Inside one leaf (hosts n0 and n1) no flow crosses the hashed uplinks.
    topology = _topology("ecmp")
    near = np.concatenate([topology.host_gpus("n0"), topology.host_gpus("n1")])
    assert gpuplace.evaluate(topology, JOB, near).comm_seconds == pytest.approx(
        gpuplace.evaluate(_topology(), JOB, near).comm_seconds
    )


def test_collisions_report_the_flows_per_level_and_count_the_running_jobs() -> None:
    topology = _topology("ecmp")
    state = gpuplace.ClusterState(topology)
    gpus = _gpus(topology)
    alone = collisions(state, JOB, gpus)
    node, leaf = alone.levels
    assert (node.level, node.routing, node.share) == ("node", "adaptive", 1.0)
    assert (leaf.level, leaf.routing, leaf.links) == ("leaf", "ecmp", 16)
    # Leaf 0 up and leaf 1 up, 8 connections each.
    assert leaf.flows == pytest.approx(16) and leaf.uplinks == 2
    assert 2.0 < leaf.fullest < 2.4 and leaf.share == pytest.approx(1 / leaf.fullest)
    assert 2.0 < alone.slowdown < 2.4
    # A running job on the two other hosts of the same leaves: 16 flows on each uplink's 16
    # links, the fullest about 3.1.
    other = np.concatenate([topology.host_gpus("n1"), topology.host_gpus("n3")])
    neighbour = dataclasses.replace(JOB, name="a")
    state.allocate(
        gpuplace.Placement(
            neighbour, topology, other, gpuplace.evaluate(topology, neighbour, other), "x", 0
        )
    )
    crowded = collisions(state, JOB, gpus)
    # gpuplace fabric names each uplink level's routing.
    assert [lv["routing"] for lv in state.uplinks_by_level()] == ["adaptive", "ecmp"]
    assert 3.0 < crowded.levels[1].fullest < 3.2
    assert crowded.seconds > alone.seconds
    # The cost model prices the same: evaluate in the state agrees with the report.
    assert gpuplace.evaluate(topology, JOB, gpus, state=state).comm_seconds == pytest.approx(
        crowded.seconds
    )


def test_placement_steers_clear_of_the_running_jobs_hashed_uplinks() -> None:
    """Two free hosts under leaves whose spine uplinks already carry a running job's 8 flows,
    two under idle leaves: on a balancing fabric every pair costs the same (the uplinks are far
    from full), on an ECMP fabric the loaded pair collides with the running job's flows. greedy
    and refine see it through the cost model; first-fit and slurm-tree take the lowest hosts."""
    chosen = {}
    for routing in ("adaptive", "ecmp"):
        topology = _topology(routing)
        state = gpuplace.ClusterState(topology)
        for job, hosts in (
            (dataclasses.replace(JOB, name="a"), ("n0", "n2")),  # leaves l0 and l1
            (gpuplace.Job(name="b", tp=8, dp=1), ("n5",)),
            (gpuplace.Job(name="c", tp=8, dp=1), ("n7",)),
        ):
            gpus = np.concatenate([topology.host_gpus(h) for h in hosts])
            cost = gpuplace.evaluate(topology, job, gpus)
            state.allocate(gpuplace.Placement(job, topology, gpus, cost, "x", 0))
        # Free: n1 (l0), n3 (l1), n4 (l2), n6 (l3).
        for solver in ("greedy", "refine", "first-fit", "slurm-tree"):
            placement = gpuplace.place(state, JOB, solver=solver)
            hosts = sorted({topology.host_of(g) for g in placement.gpus})
            chosen[routing, solver] = (hosts, placement.cost.comm_seconds)
    costs = {chosen["adaptive", s][1] for s in ("greedy", "refine", "first-fit", "slurm-tree")}
    assert max(costs) == pytest.approx(min(costs))
    for solver in ("greedy", "refine"):
        assert chosen["ecmp", solver][0] == ["n4", "n6"]
    for peer in ("first-fit", "slurm-tree"):
        assert chosen["ecmp", peer][0] == ["n1", "n3"]
        # 16 flows on each loaded uplink's 16 links against 8 on an idle one's: the fullest
        # link carries 3.08 against 2.06 flows (balls into bins).
        ratio = chosen["ecmp", peer][1] / chosen["ecmp", "greedy"][1]
        assert ratio == pytest.approx(3.078 / 2.063, rel=0.02)


def test_routing_errors_name_the_field() -> None:
    doc = _doc("ecmp")
    doc["levels"][2]["routing"] = "ecmp"
    with pytest.raises(gpuplace.InvalidTopology, match=r"levels\[2\]\.routing.*top level"):
        gpuplace.Topology.from_dict(doc)
    with pytest.raises(gpuplace.InvalidTopology, match=r"levels\[1\]\.routing.*expected one of"):
        gpuplace.Topology.from_dict(_doc("hashed"))
    with pytest.raises(gpuplace.InvalidTopology, match=r"qps_per_connection.*1\.\.1024"):
        gpuplace.Topology.from_dict(_doc("ecmp", 0))
    # Hashing at the NVLink domain's uplinks (its NICs into a hashed tier the file does not
    # spell out) is accepted; below the NVLink domain there are no uplinks.
    doc = _doc()
    doc["levels"][0]["routing"] = "static"
    assert gpuplace.Topology.from_dict(doc).levels[0].routing == "static"
    doc = _doc()
    doc["levels"].insert(
        0, {"name": "numa", "bandwidth_gbps": 450, "latency_us": 1, "routing": "ecmp"}
    )
    doc["node_level"] = "node"
    doc["node_types"]["box"]["sublevels"] = {"numa": [0, 0, 0, 0, 1, 1, 1, 1]}
    with pytest.raises(gpuplace.InvalidTopology, match="inside the NVLink domain"):
        gpuplace.Topology.from_dict(doc)


def test_routing_round_trips_through_files_networkx_and_options(tmp_path: Any) -> None:
    topology = _topology("ecmp", 4)
    again = gpuplace.Topology.from_dict(topology.to_dict())
    assert again.fingerprint == topology.fingerprint != _topology().fingerprint
    assert again.levels[1].routing == "ecmp" and again.levels[1].qps_per_connection == 4
    path = tmp_path / "t.yaml"
    topology.save(path)
    assert gpuplace.Topology.load(path).fingerprint == topology.fingerprint
    pytest.importorskip("networkx")
    back = gpuplace.Topology.from_networkx(topology.to_networkx())
    assert back.levels[1].routing == "ecmp" and back.levels[1].qps_per_connection == 4
    sharp = _doc()
    sharp["levels"][1]["routing"] = "sharp"
    assert gpuplace.Topology.from_dict(sharp).levels[1].sharp


def test_place_shows_the_flows_per_level_and_compares_with_slurm_tree(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.json").write_text(json.dumps(_doc("ecmp")))
    (tmp_path / "job.yaml").write_text(
        "name: dp\nparallelism: {tp: 8, dp: 4}\n"
        "communication:\n  dp: {kind: all-reduce, bytes: 1073741824}\n"
    )
    args = ["place", "-c", str(tmp_path / "t.json"), "-j", str(tmp_path / "job.yaml")]
    assert main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["solver"] for c in doc["comparisons"]] == ["first-fit", "slurm-tree"]
    assert doc["comparison"]["solver"] == "first-fit"
    levels = {lv["level"]: lv for lv in doc["fabric"]["levels"]}
    assert levels["leaf"]["routing"] == "ecmp"
    assert doc["fabric"]["slowdown"] >= 1.0
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "flows up from leaf" in text and "collision slowdown" in text
    assert "vs slurm-tree" in text and "vs first-fit" in text


_TOPOLOGIES = {
    key: _topology(*key)
    for key in [(None, None), ("ecmp", None), ("ecmp", 4), ("static", 4), ("static", None)]
}


@settings(max_examples=40, deadline=None)
@given(
    st.permutations(range(64)),
    st.sampled_from([(8, 2), (4, 4), (2, 8), (8, 4), (1, 16)]),
    st.sampled_from(["all-reduce", "all-to-all", "all-gather"]),
)
def test_hashing_never_speeds_a_placement_up(
    order: list[int], shape: tuple[int, int], kind: str
) -> None:
    """Any placement, any shape: ECMP or static routing costs at least the fair share, static
    routing ignores queue pairs, and adaptive routing is what declaring nothing gives."""
    tp, dp = shape
    job = gpuplace.Job(
        name="j",
        tp=tp,
        dp=dp,
        communication={"dp": gpuplace.Communication(kind, 1 << 28)},
        confine={},
    )
    gpus = np.array(order[: tp * dp])
    price = {
        key: gpuplace.evaluate(topology, job, gpus).comm_seconds
        for key, topology in _TOPOLOGIES.items()
    }
    fair = price[None, None]
    for key in (("ecmp", None), ("ecmp", 4), ("static", 4)):
        assert price[key] >= fair * (1 - 1e-12)
    assert price["static", 4] == pytest.approx(price["static", None])
    assert price["static", None] == pytest.approx(price["ecmp", None])


def test_rails_split_a_hashed_uplink_unless_the_leaf_is_top_of_rack(tmp_path: Any) -> None:
    """Hosts that list a NIC per GPU declare 8 rails: on rail-aligned leaves (the default) each
    dp ring keeps to its rail's links and the 8 rings do not collide; top-of-rack leaves
    (``rail_aligned: false``) hash them over the whole uplink, as hosts without NICs listed."""
    doc = _doc("ecmp")
    doc["node_types"]["box"]["nics"] = [f"mlx5_{i}" for i in range(8)]
    railed = gpuplace.Topology.from_dict(doc)
    doc["levels"][1]["rail_aligned"] = False
    tor = gpuplace.Topology.from_dict(doc)
    plain = _topology("ecmp")
    adaptive = gpuplace.evaluate(_topology(), JOB, _gpus(plain)).comm_seconds
    assert gpuplace.evaluate(railed, JOB, _gpus(railed)).comm_seconds == pytest.approx(adaptive)
    hashed = gpuplace.evaluate(plain, JOB, _gpus(plain)).comm_seconds
    assert hashed > 1.8 * adaptive
    assert gpuplace.evaluate(tor, JOB, _gpus(tor)).comm_seconds == pytest.approx(hashed)
    report = collisions(gpuplace.ClusterState(railed), JOB, _gpus(railed))
    assert report.levels[1].fullest == pytest.approx(1.0) and report.slowdown == 1.0
    # The field round-trips (written only when false) through files, networkx and options.
    assert tor.to_dict()["levels"][1]["rail_aligned"] is False
    assert "rail_aligned" not in railed.to_dict()["levels"][1]
    assert tor.fingerprint != railed.fingerprint
    path = tmp_path / "t.yaml"
    tor.save(path)
    assert gpuplace.Topology.load(path).fingerprint == tor.fingerprint
    from gpuplace.model.options import apply_options

    set_doc = apply_options(railed.to_dict(), {"levels.leaf.rail_aligned": False})
    assert gpuplace.Topology.from_dict(set_doc).fingerprint == tor.fingerprint
    pytest.importorskip("networkx")
    assert not gpuplace.Topology.from_networkx(tor.to_networkx()).levels[1].rail_aligned
    doc["levels"][1]["rail_aligned"] = "no"
    with pytest.raises(gpuplace.InvalidTopology, match=r"levels\[1\]\.rail_aligned"):
        gpuplace.Topology.from_dict(doc)
