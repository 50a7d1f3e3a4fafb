"""``explain`` runs the admission ``place`` runs (policy fence, power budgets in every phase
slot, MIG GPUs, the solver) and names what binds: the power domain and whether
``max_synchronized`` is the cause; staggering prefers a later phase slot inside one rack over
splitting across racks; cluster options (``-p KEY=VALUE``) build what a topology file would,
and a state file remembers them; the fabric is ranked level by level; Ray without Ray."""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import gpuplace
import numpy as np
import pytest
from gpuplace.cluster.mig import enable
from gpuplace.cluster.power import power_view
from gpuplace.errors import InvalidState, InvalidTopology, MissingExtra
from gpuplace.model.options import apply_options, parse_assignments
from hypothesis import given, settings
from hypothesis import strategies as st


def synced(name: str, tp: int, dp: int, peak: float, average: float) -> gpuplace.Job:
    return gpuplace.Job.from_dict(
        {
            "name": name,
            "parallelism": {"tp": tp, "dp": dp},
            "communication": {"dp": {"kind": "all-reduce", "bytes": 4e9}},
            "power": {"synchronized": True, "peak_w": peak, "average_w": average},
        }
    )


def agrees(state: gpuplace.ClusterState, job: gpuplace.Job, solver: str = "greedy") -> Any:
    """explain's verdict and place's, which must be the same; the explanation."""
    explanation = gpuplace.explain(state, job, solver)
    try:
        gpuplace.place(state, job, solver)
        placed = True
    except gpuplace.Infeasible:
        placed = False
    assert explanation.placeable == placed
    assert explanation.placeable == gpuplace.explain(state, job).placeable
    return explanation


# ------------------------------------------------------------------------- power
def test_explain_names_the_power_domain_whose_budget_binds() -> None:
    topology = gpuplace.Topology.from_spec(
        "h100-superpod", {"nodes": 4, "power.leaf.budget_w": 16_800}
    )
    state = gpuplace.ClusterState(topology)
    state.allocate(gpuplace.place(state, gpuplace.Job(name="job1", tp=8, dp=2)))
    job3 = gpuplace.Job(name="job3", tp=8, dp=2)
    explanation = agrees(state, job3)
    assert not explanation.placeable
    (power,) = explanation.binding
    assert power.kind == "power" and power.name == "power domain su001 (budget)"
    assert power.available == 8 and "headroom 5,600 W" in power.detail
    with pytest.raises(gpuplace.Infeasible, match="power domain su001: budget 16,800 W"):
        gpuplace.place(state, job3)


def test_explain_says_when_max_synchronized_is_the_cause() -> None:
    topology = gpuplace.Topology.from_spec(
        "h100-superpod",
        {"nodes": 4, "power.leaf.budget_w": 1e6, "power.leaf.max_synchronized": 1},
    )
    state = gpuplace.ClusterState(topology)
    state.allocate(gpuplace.place(state, synced("a", 8, 2, 700, 500)))
    explanation = agrees(state, synced("b", 8, 2, 700, 500))
    (power,) = explanation.binding
    assert power.name == "power domain su001 (max_synchronized)"
    assert "max_synchronized 1 reached" in power.detail and power.available == 0
    # An unsynchronised job is not held back by the limit: it fits.
    assert agrees(state, gpuplace.Job(name="c", tp=8, dp=2)).placeable


def test_staggering_prefers_a_later_slot_in_one_rack_over_splitting_racks() -> None:
    # Two NVL72 racks, one budget each, two phase slots. a and b peak in slot 0, one per rack;
    # in slot 0 each rack has room for 24 more GPUs of c (36 together only across both
    # racks), in slot 1 one rack holds all 36.
    topology = gpuplace.Topology.from_spec(
        "gb200-nvl72", {"racks": 2, "power.nvlink-domain.budget_w": 72_000, "power_phases": 2}
    )
    state = gpuplace.ClusterState(topology)
    racks = topology.level_index("nvlink-domain")

    def racks_of(placement: gpuplace.Placement) -> set[int]:
        return set(topology.path[placement.gpus, racks].tolist())

    for name in ("a", "b"):
        placed = gpuplace.place(state, synced(name, 4, 9, 1200, 800))
        assert placed.details["phase_slot"] == 0
        state.allocate(placed)
    c = synced("c", 4, 9, 1200, 800)
    (_, view0), _ = power_view(state, c)
    split = gpuplace.place(view0, gpuplace.Job(name="c", tp=4, dp=9))
    assert len(racks_of(split)) == 2  # what trying slot 0 first gave
    placed = gpuplace.place(state, c)
    assert placed.details["phase_slot"] == 1 and len(racks_of(placed)) == 1
    assert placed.cost.comm_seconds < gpuplace.evaluate(topology, c, split.gpus).comm_seconds
    state.allocate(placed)
    state.check()


def test_explain_when_every_phase_slot_has_a_different_domain_in_the_way() -> None:
    topology = gpuplace.Topology.from_spec(
        "h100-superpod",
        {
            "nodes": 2,
            "power.node.budget_w": 1e6,
            "power.node.max_synchronized": 1,
            "power_phases": 2,
        },
    )
    state = gpuplace.ClusterState(topology)
    state.allocate(gpuplace.place(state, synced("x", 4, 1, 700, 500)))  # dgx001, slot 0
    y = gpuplace.place(state, synced("y", 4, 1, 700, 500))
    assert y.nodes == ["dgx002"]
    state.allocate(dataclasses.replace(y, details={**y.details, "phase_slot": 1}))
    explanation = agrees(state, synced("z", 4, 2, 700, 500))
    (power,) = explanation.binding
    assert power.name == "power budgets in every phase slot"
    assert "slot 0: dgx001" in power.detail and "slot 1: dgx002" in power.detail


@settings(max_examples=25, deadline=None)
@given(
    budget=st.sampled_from([9_000.0, 12_000.0, 20_000.0, 40_000.0]),
    limit=st.sampled_from([None, 0, 1, 2]),
    phases=st.sampled_from([1, 2]),
    sizes=st.lists(st.sampled_from([8, 16, 24, 32]), min_size=1, max_size=4),
    sync=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_explain_and_place_agree_under_power_budgets(budget, limit, phases, sizes, sync) -> None:
    options: dict[str, Any] = {"nodes": 8, "power.node.budget_w": budget * 0.5,
                               "power_phases": phases}  # fmt: skip
    options["levels.leaf.oversubscription"] = 2
    if limit is not None:
        options["power.node.max_synchronized"] = limit
    topology = gpuplace.Topology.from_spec("h100-superpod", options)
    state = gpuplace.ClusterState(topology)
    for i, size in enumerate(sizes):
        job = (
            synced(f"j{i}", 8, size // 8, 700, 450)
            if sync[i]
            else gpuplace.Job(name=f"j{i}", tp=8, dp=size // 8)
        )
        explanation = agrees(state, job)
        if explanation.placeable:
            state.allocate(gpuplace.place(state, job))
        else:
            assert explanation.binding, explanation


# ------------------------------------------------------------------------- MIG and pools
def test_explain_names_the_mig_gpus_when_they_bind() -> None:
    topology = gpuplace.Topology.preset("a100-pod", nodes=2)
    state = gpuplace.ClusterState(topology)
    enable(state, [int(g) for g in topology.host_gpus("dgxa001")])
    job = gpuplace.Job(name="big", tp=8, dp=2)
    explanation = agrees(state, job)
    kinds = [c.kind for c in explanation.binding]
    assert kinds[:2] == ["capacity", "mig"] and set(kinds) == {"capacity", "mig", "confinement"}
    assert "8 GPUs are in MIG mode" in explanation.binding[1].detail
    assert "the job would fit if they left MIG mode" in explanation.binding[1].detail
    assert agrees(state, gpuplace.Job(name="small", tp=8)).placeable


def test_explain_for_a_placed_job_reports_its_contention() -> None:
    topology = gpuplace.Topology.preset("h100-superpod", nodes=64, oversubscription=4)
    state = gpuplace.ClusterState(topology)
    for i in range(2):
        job = gpuplace.Job.from_dict(
            {
                "name": f"j{i}",
                "parallelism": {"tp": 8, "dp": 20},
                "communication": {"dp": {"kind": "all-reduce", "bytes": 4e9}},
            }
        )
        state.allocate(gpuplace.place(state, job))
    job = gpuplace.Job.from_dict(
        {
            "name": "new",
            "parallelism": {"tp": 8, "dp": 12},
            "communication": {"dp": {"kind": "all-reduce", "bytes": 4e9}},
        }
    )
    explanation = agrees(state, job)
    (row,) = [c for c in explanation.constraints if c.kind == "contention"]
    assert not row.binding and "its time alone" in row.detail


# ------------------------------------------------------------------------- options
def test_cluster_options_build_what_a_file_would_and_a_state_remembers_them(tmp_path) -> None:
    options = parse_assignments(
        ["nodes=64", "oversubscription=2", "power.leaf.budget_w=4e5", "power_phases=2",
         "power.leaf.max_synchronized=1", "levels.spine.sharp=true", "uplink_gbps.su002=3200"]
    )  # fmt: skip
    assert options["power.leaf.budget_w"] == 400_000.0 and options["levels.spine.sharp"] is True
    topology = gpuplace.Topology.from_spec("h100-superpod", options)
    assert topology.name == "h100-superpod-64-2to1" and topology.power_phases == 2
    assert [d.name for d in topology.power_domains] == ["su001", "su002"]
    assert all(d.max_synchronized == 1 and len(d.hosts) == 32 for d in topology.power_domains)
    assert topology.levels[2].sharp and topology.uplink_gbps == {"su002": 3200}
    by_hand = apply_options(gpuplace.Topology.preset("h100-superpod", nodes=64,
                                                      oversubscription=2).to_dict(),
                            {k: v for k, v in options.items() if "." in k or k == "power_phases"})  # fmt: skip
    assert gpuplace.Topology.from_dict(by_hand).fingerprint == topology.fingerprint
    state = gpuplace.ClusterState(topology)
    state.save(tmp_path / "s.json")
    remembered = gpuplace.ClusterState.cluster_of(tmp_path / "s.json")
    assert gpuplace.Topology.from_origin(remembered).fingerprint == topology.fingerprint
    file = tmp_path / "cluster.yaml"
    gpuplace.Topology.preset("h100-superpod", nodes=8).save(file)
    on_file = gpuplace.Topology.from_spec(str(file), {"power.node.budget_w": 5000})
    assert len(on_file.power_domains) == 8 and on_file.origin["options"]


@pytest.mark.parametrize(
    ("cluster", "options", "message"),
    [
        ("dgx-h100", {"nodes": 2}, "does not take 'nodes'"),
        ("h100-superpod", {"levels.lef.sharp": True}, "no level 'lef' (there are: node, leaf"),
        ("h100-superpod", {"levels.leaf.speed": 1}, "unknown field 'speed'"),
        ("h100-superpod", {"power.leaf.max_synchronized": 1}, "give power.leaf.budget_w"),
        ("h100-superpod", {"power.leaf.budget_w": -1}, "budget_w: expected a number > 0"),
        ("pcie-cluster", {"power.numa.budget_w": 1}, "power domains hold whole hosts"),
        ("h100-superpod", {"node_types.dgx.power_w": 1}, "no node type 'dgx'"),
        ("h100-superpod", {"colour": "red"}, "does not take 'colour'"),
    ],
)
def test_bad_cluster_options_name_the_option(cluster, options, message) -> None:
    with pytest.raises(InvalidTopology, match=message.replace("(", r"\(").replace(")", r"\)")):
        gpuplace.Topology.from_spec(cluster, options)


def test_malformed_assignments_are_refused() -> None:
    for bad in (["nodes"], ["=3"], ["nodes="], ["nodes=1", "nodes=2"]):
        with pytest.raises(InvalidTopology):
            parse_assignments(bad)


# ------------------------------------------------------------------------- fabric
def test_saturated_nics_do_not_hide_the_leaf_uplinks() -> None:
    topology = gpuplace.Topology.preset("h100-superpod", nodes=64, oversubscription=2)
    state = gpuplace.ClusterState(topology)
    for i in range(3):
        job = gpuplace.Job.from_dict(
            {
                "name": f"j{i}",
                "parallelism": {"tp": 8, "dp": 20},
                "communication": {"dp": {"kind": "all-reduce", "bytes": 4e9}},
            }
        )
        state.allocate(gpuplace.place(state, job))
    overall = state.hottest_uplinks(5)
    assert all(u["uplink"].startswith("node:") for u in overall)
    levels = state.uplinks_by_level(3)
    assert [lv["level"] for lv in levels] == ["node", "leaf"]
    leaf = levels[1]
    assert leaf["loaded"] > 0 and leaf["hottest"][0]["uplink"].startswith("leaf:")
    assert leaf["max_utilisation"] == leaf["hottest"][0]["utilisation"]
    everything = state.hottest_uplinks(10_000)
    assert sum(lv["loaded"] for lv in levels) == len(everything)
    top_leaf = max(u["utilisation"] for u in everything if u["uplink"].startswith("leaf:"))
    assert leaf["max_utilisation"] == pytest.approx(top_leaf)


# ------------------------------------------------------------------------- Ray
def test_ray_without_ray_is_a_gpuplace_error_naming_the_extra(monkeypatch) -> None:
    import gpuplace.integrations.ray as gray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    state = gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=4))
    job = gpuplace.Job(name="train", tp=8, dp=2)
    for make in (gray.placement_group, gray.scaling_config):
        with pytest.raises(MissingExtra, match=r"pip install 'gpuplace\[ray\]'"):
            make(state, job)
    assert state.jobs == {}  # nothing recorded


def test_a_ray_placement_group_is_recorded_in_the_state(monkeypatch) -> None:
    import gpuplace.integrations.ray as gray

    made: list[dict[str, Any]] = []

    def placement_group(bundles: list, **kwargs: Any) -> str:
        if kwargs["name"] == "refused":
            raise RuntimeError("Ray refused the placement group")
        made.append({"bundles": bundles, **kwargs})
        return "pg"

    fake = types.ModuleType("ray.util.placement_group")
    fake.placement_group = placement_group  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))
    monkeypatch.setitem(sys.modules, "ray.util", types.ModuleType("ray.util"))
    monkeypatch.setitem(sys.modules, "ray.util.placement_group", fake)
    state = gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=4))
    assert gray.placement_group(state, gpuplace.Job(name="train", tp=8, dp=2)) == "pg"
    gpus = state.job_gpus("train")
    assert gpus is not None and len(gpus) == 16
    hosts = [state.topology.host_of(int(g)) for g in gpus]
    assert [s["gpuplace/host"] for s in made[0]["bundle_label_selector"]] == hosts
    # The same placement again is not allocated twice; another job is placed around it.
    placement = gpuplace.place(state, gpuplace.Job(name="other", tp=8, dp=1))
    gray.placement_group(state, placement)
    gray.placement_group(state, placement)
    assert sorted(state.jobs) == ["other", "train"]
    elsewhere = gpuplace.ClusterState(state.topology)
    elsewhere.drain(host=state.topology.host_of(int(gpus[0])))
    moved = gpuplace.place(elsewhere, gpuplace.Job(name="train", tp=8, dp=2))
    with pytest.raises(InvalidState, match="already allocated"):
        gray.placement_group(state, moved)
    # Ray refusing the group leaves the state as it was.
    before = state.free_mask().copy()
    with pytest.raises(RuntimeError):
        gray.placement_group(state, gpuplace.Job(name="refused", tp=8))
    assert np.array_equal(state.free_mask(), before) and "refused" not in state.jobs
    state.check()
