"""Cluster state: allocation, health, counters, snapshots and state files."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time

import gpuplace
import numpy as np
import pytest
from gpuplace import ClusterState, Topology
from gpuplace._util.documents import write_atomically


@pytest.fixture
def pod() -> Topology:
    return Topology.preset("h100-superpod", nodes=64)


def counts(state: ClusterState) -> list[list[int]]:
    return [state.free_counts(lv).tolist() for lv in range(len(state.topology.levels))]


def test_a_new_state_is_all_free(pod):
    state = ClusterState(pod)
    assert state.free_gpus == 512
    assert state.jobs == {}
    assert state.occupancy == 0
    assert state.free_counts("node").tolist() == [8] * 64
    assert state.free_counts("leaf").tolist() == [256, 256]
    assert state.free_counts("spine").tolist() == [512]
    state.check()  # the counters equal a recount


def test_allocate_and_release(pod):
    state = ClusterState(pod)
    state.allocate(name="a", gpus=[9, 8, 300])
    assert state.free_gpus == 509
    assert state.owner_of(8) == "a" and state.owner_of(7) is None
    assert state.jobs["a"].tolist() == [9, 8, 300]
    assert state.free_counts("node")[1] == 6
    assert state.free_counts("leaf").tolist() == [254, 255]
    assert state.occupancy == pytest.approx(3 / 512)
    assert sorted(state.release("a").tolist()) == [8, 9, 300]
    assert state.free_gpus == 512
    assert state.jobs == {}


def test_allocation_errors_change_nothing(pod):
    state = ClusterState(pod)
    state.allocate(name="a", gpus=[0, 1])
    state.fail_gpus([5])
    before = state.snapshot()
    for name, gpus in [
        ("a", [2]),  # name in use
        ("b", [1, 2]),  # GPU taken
        ("b", [5]),  # GPU failed
        ("b", [2, 2]),  # GPU twice
        ("b", [512]),  # no such GPU
        ("b", [-1]),  # no such GPU
        ("", [3]),  # no name
    ]:
        with pytest.raises(gpuplace.InvalidState):
            state.allocate(name=name, gpus=gpus)
        assert state.snapshot() == before
    with pytest.raises(gpuplace.InvalidState):
        state.allocate()
    with pytest.raises(gpuplace.InvalidState, match="zz"):
        state.release("zz")
    assert state.snapshot() == before


def test_a_placement_of_another_topology_is_refused(pod):
    other = Topology.preset("h100-superpod", nodes=64)
    placement = gpuplace.place(ClusterState(other), gpuplace.Job(name="j", tp=8))
    state = ClusterState(pod)
    with pytest.raises(gpuplace.InvalidState):
        state.allocate(placement)
    assert state.free_gpus == 512


def test_failing_gpus_reports_affected_jobs_and_keeps_them_out(pod):
    state = ClusterState(pod)
    state.allocate(name="a", gpus=[4, 5, 6])
    affected = state.fail_gpus([6, 0])
    assert {k: v.tolist() for k, v in affected.items()} == {"a": [2]}
    assert state.free_gpus == 512 - 3 - 1
    assert state.drain_gpus([1]) == {}
    assert state.health()[:8].tolist() == [1, 2, 0, 0, 0, 0, 1, 0]
    state.release("a")
    # The failed GPU stays out of service after its job leaves.
    assert state.free_gpus == 512 - 3
    assert not state.free_mask()[6]
    state.recover_gpus([0, 1, 6])
    assert state.free_gpus == 512
    state.check()  # the counters equal a recount


def test_unknown_gpus_in_health_changes_change_nothing(pod):
    state = ClusterState(pod)
    before = state.snapshot()
    with pytest.raises(gpuplace.InvalidState):
        state.fail_gpus([3, 9999])
    with pytest.raises(gpuplace.InvalidState):
        state.drain_gpus([-1])
    assert state.snapshot() == before


def test_copy_is_independent(pod):
    state = ClusterState(pod)
    state.allocate(name="a", gpus=[0])
    copy = state.copy()
    copy.allocate(name="b", gpus=[1])
    copy.release("a")
    assert list(state.jobs) == ["a"] and list(copy.jobs) == ["b"]
    assert state.free_gpus == copy.free_gpus == 511


# --------------------------------------------------------------------------- persistence
def busy_state(pod: Topology) -> ClusterState:
    state = ClusterState(pod)
    state.allocate(name="a", gpus=[0, 1, 2, 3])
    state.allocate(name="b", gpus=[100, 40])
    state.fail_gpus([200])
    state.drain_gpus([201, 202])
    return state


def test_snapshot_contents(pod):
    snap = busy_state(pod).snapshot()
    assert snap["format"] == "gpuplace.state/2"
    assert snap["topology"]["gpus"] == 512
    assert snap["topology"]["fingerprint"] == pod.fingerprint
    assert snap["health"] == {
        "components": [
            {"kind": "gpu", "condition": "failed", "gpu": 200},
            {"kind": "gpu", "condition": "drained", "gpu": 201},
            {"kind": "gpu", "condition": "drained", "gpu": 202},
        ]
    }
    assert snap["jobs"] == [{"name": "a", "gpus": [0, 1, 2, 3]}, {"name": "b", "gpus": [100, 40]}]
    json.dumps(snap)  # JSON-able


def test_save_load_round_trip(tmp_path, pod):
    state = busy_state(pod)
    path = tmp_path / "state.json"
    state.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    document = json.loads(path.read_text())
    body = json.dumps(document["state"], sort_keys=True, separators=(",", ":"))
    assert document["checksum"] == "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    loaded = ClusterState.load(pod, path)
    assert loaded.snapshot() == state.snapshot()
    assert counts(loaded) == counts(state)
    # Overwriting keeps one file.
    loaded.release("a")
    loaded.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    assert ClusterState.load(pod, path).snapshot() == loaded.snapshot()


def test_a_job_on_a_gpu_that_failed_later_survives_snapshot_and_file(tmp_path, pod):
    """Failing a GPU under a running job keeps the job (it is reported, not evicted); the
    state must still snapshot, restore, save and load."""
    state = ClusterState(pod)
    state.allocate(name="a", gpus=[0, 1])
    state.fail_gpus([1])
    restored = ClusterState.restore(pod, state.snapshot())
    assert restored.snapshot() == state.snapshot()
    assert counts(restored) == counts(state)
    path = tmp_path / "state.json"
    state.save(path)
    assert ClusterState.load(pod, path).snapshot() == state.snapshot()


@pytest.mark.parametrize(
    "damage",
    [
        "truncate",
        "flip",
        "empty",
        "not-json",
        "list",
        "no-checksum",
        "bad-checksum",
        "binary",
    ],
)
def test_a_damaged_state_file_is_refused(tmp_path, pod, damage):
    path = tmp_path / "state.json"
    busy_state(pod).save(path)
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "flip":
        path.write_text(text.replace('"b"', '"c"'))
    elif damage == "empty":
        path.write_text("")
    elif damage == "not-json":
        path.write_text("state: yes\n")
    elif damage == "list":
        path.write_text("[1, 2, 3]")
    elif damage == "no-checksum":
        document = json.loads(text)
        del document["checksum"]
        path.write_text(json.dumps(document))
    elif damage == "bad-checksum":
        document = json.loads(text)
        document["checksum"] = "sha256:" + "0" * 64
        path.write_text(json.dumps(document))
    else:
        path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(gpuplace.InvalidState) as info:
        ClusterState.load(pod, path)
    assert str(path) in str(info.value)


def test_a_missing_state_file_is_refused(tmp_path, pod):
    with pytest.raises(gpuplace.InvalidState, match="no such"):
        ClusterState.load(pod, tmp_path / "nope.json")


def test_a_state_of_another_topology_is_refused(tmp_path, pod):
    path = tmp_path / "state.json"
    busy_state(pod).save(path)
    other = Topology.preset("h100-superpod", nodes=65)
    with pytest.raises(gpuplace.InvalidState, match="topology"):
        ClusterState.load(other, path)


def signed(body: dict) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps(
        {"checksum": "sha256:" + hashlib.sha256(text.encode()).hexdigest(), "state": body}
    )


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: s["jobs"].append({"name": "c", "gpus": [0]}), "jobs[2]"),
        (lambda s: s["jobs"].append({"name": "c", "gpus": [9999]}), "jobs[2]"),
        (lambda s: s["jobs"].append({"name": "c", "gpus": [-4]}), "jobs[2].gpus[0]"),
        (lambda s: s["jobs"].append({"name": "a", "gpus": [7]}), "jobs[2]"),
        (lambda s: s["jobs"].append({"gpus": [7]}), "jobs[2].name"),
        (lambda s: s["jobs"].append("x"), "jobs[2]"),
        (lambda s: s.update(jobs={"a": [1]}), "jobs"),
        (lambda s: s["health"].update(failed=[9999]), "health.failed"),
        (lambda s: s["health"].update(failed="all"), "health.failed"),
        (lambda s: s.update(format="gpuplace.state/0"), "format"),
        (lambda s: s.update(topology=None), "topology"),
    ],
)
def test_a_well_signed_but_invalid_state_names_the_field(tmp_path, pod, edit, field):
    body = busy_state(pod).snapshot()
    edit(body)
    path = tmp_path / "state.json"
    path.write_text(signed(body))
    with pytest.raises(gpuplace.InvalidState) as info:
        ClusterState.load(pod, path)
    assert f"{field}:" in str(info.value)


def test_restore_rejects_non_mappings(pod):
    for snapshot in (None, [], "state", 3):
        with pytest.raises(gpuplace.InvalidState):
            ClusterState.restore(pod, snapshot)


def test_free_mask_matches_health_and_owners(pod):
    state = busy_state(pod)
    mask = state.free_mask()
    health = state.health()
    owners = np.array([state.owner_of(g) is not None for g in range(pod.num_gpus)])
    assert mask.tolist() == ((health == 0) & ~owners).tolist()


def test_a_write_removes_the_leftovers_of_killed_writers_only(tmp_path):
    """Temporary files of interrupted writes of the same file are removed by the next
    successful write; one a live writer holds locked, a fresh one, and those of other files
    are left."""
    target = tmp_path / "s.json"
    old = time.time() - 60
    stale = [tmp_path / f".s.json.{tag}.tmp" for tag in ("a1b2", "zz_9")]
    for leftover in stale:
        leftover.write_text("{half")
        os.utime(leftover, (old, old))
    held = tmp_path / ".s.json.live.tmp"
    held.write_text("{being written")
    os.utime(held, (old, old))
    fresh = tmp_path / ".s.json.new.tmp"
    fresh.write_text("{just created")
    other = tmp_path / ".t.json.x.tmp"
    other.write_text("{another file")
    os.utime(other, (old, old))
    with open(held) as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        write_atomically(target, '{"ok": 1}\n')
        assert target.read_text() == '{"ok": 1}\n'
        assert not any(p.exists() for p in stale)
        assert held.exists() and fresh.exists() and other.exists()
    write_atomically(target, '{"ok": 2}\n')
    assert not held.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".s.json.new.tmp",
        ".t.json.x.tmp",
        "s.json",
    ]


def test_a_state_loaded_with_another_description_of_its_topology_says_how_it_was_written(
    tmp_path,
):
    """Same name and size, different hardware (here the leaf level's routing): the error says
    so and names the preset and options the state was written with, not two equal names."""
    written = gpuplace.Topology.from_spec("h100-superpod", {"nodes": 4})
    gpuplace.ClusterState(written).save(tmp_path / "s.json")
    other = gpuplace.Topology.from_spec(
        "h100-superpod", {"nodes": 4, "levels.leaf.routing": "ecmp"}
    )
    assert other.name == written.name
    with pytest.raises(
        gpuplace.InvalidState,
        match=r"another description of topology 'h100-superpod-4' \(32 GPUs\).*"
        r"written with preset h100-superpod -p nodes=4\)",
    ):
        gpuplace.ClusterState.load(other, tmp_path / "s.json")
    assert gpuplace.ClusterState.load(written, tmp_path / "s.json").free_gpus == 32
