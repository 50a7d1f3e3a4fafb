"""The Python API across processes: the README's load -> place -> save in two processes at
once used to lose a job silently; now the second save is refused (StateConflict), and
``ClusterState.transaction`` runs concurrent changes one after the other, losing none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gpuplace
import pytest

WRITER = """
import sys, time, gpuplace
path, name, mode = sys.argv[1], sys.argv[2], sys.argv[3]
topology = gpuplace.Topology.preset("h100-superpod", nodes=16)
job = gpuplace.Job(name=name, tp=8, dp=1)
if mode == "plain":
    state = gpuplace.ClusterState.load(topology, path)
    placement = gpuplace.place(state, job)
    time.sleep(1.0)  # both processes have loaded before either saves
    state.allocate(placement)
    try:
        state.save(path)
    except gpuplace.StateConflict as exc:
        print("conflict:", exc)
        sys.exit(3)
else:
    for i in range(3):
        with gpuplace.ClusterState.transaction(path) as state:
            state.allocate(gpuplace.place(state, gpuplace.Job(name=f"{name}-{i}", tp=4, dp=1)))
"""


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    topology = gpuplace.Topology.preset("h100-superpod", nodes=16)
    path = tmp_path / "state.json"
    gpuplace.ClusterState(topology).save(path)
    return path


def _run(path: Path, name: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), name, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_plain_savers_one_is_refused_and_nothing_is_lost(state_file: Path) -> None:
    procs = [_run(state_file, name, "plain") for name in ("a", "b")]
    outcomes = [(p.communicate(timeout=120), p.returncode) for p in procs]
    outcomes = [(code, out) for out, code in outcomes]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 3], outcomes
    refused = next(out for code, out in outcomes if code == 3)
    assert "changed since this state was loaded" in refused[0]
    topology = gpuplace.Topology.preset("h100-superpod", nodes=16)
    state = gpuplace.ClusterState.load(topology, state_file)
    assert len(state.jobs) == 1  # the winner's job; the loser knows it must retry


def test_transactions_from_several_processes_lose_nothing(state_file: Path) -> None:
    procs = [_run(state_file, f"w{i}", "transaction") for i in range(4)]
    for p in procs:
        out = p.communicate(timeout=300)
        assert p.returncode == 0, out
    topology = gpuplace.Topology.preset("h100-superpod", nodes=16)
    state = gpuplace.ClusterState.load(topology, state_file)
    assert sorted(state.jobs) == sorted(f"w{i}-{k}" for i in range(4) for k in range(3))
    state.check()


def test_a_state_saved_twice_by_its_owner_is_fine_and_a_stranger_is_refused(
    state_file: Path,
) -> None:
    topology = gpuplace.Topology.preset("h100-superpod", nodes=16)
    mine = gpuplace.ClusterState.load(topology, state_file)
    mine.allocate(gpuplace.place(mine, gpuplace.Job(name="a", tp=8, dp=1)))
    mine.save(state_file)
    mine.allocate(gpuplace.place(mine, gpuplace.Job(name="b", tp=8, dp=1)))
    mine.save(state_file)  # its own last save: no conflict
    stale = mine.copy()
    mine.release("a")
    mine.save(state_file)
    with pytest.raises(gpuplace.StateConflict):
        stale.save(state_file)
    assert sorted(gpuplace.ClusterState.load(topology, state_file).jobs) == ["b"]
