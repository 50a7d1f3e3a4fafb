"""A seeded chaos run: a few hundred random place / release / fail / degrade / recover / drain
/ repair / spare / ingest steps on 1,024 GPUs; after every step the state is recounted from
scratch and must equal its incremental counters (free GPUs and the fabric load per uplink), and
no GPU may belong to two jobs. Ingest steps feed real kernel-log and ibstatus line shapes
(tests/data/health) naming random hardware, sometimes with --repair, sometimes with a bad source
that must change nothing."""

from __future__ import annotations

from pathlib import Path

import gpuplace
import gpuplace.health
import numpy as np
import pytest
from gpuplace import _core
from gpuplace.sim.workload import training_job

STEPS = 300
HEALTH = Path(__file__).resolve().parent / "data" / "health"


def _consistent(state: gpuplace.ClusterState) -> None:
    state.check()  # free, spare and degraded counters against a recount, derived health, owners
    owners = (
        np.concatenate(list(state.jobs.values())) if state.jobs else np.zeros(0, dtype=np.int64)
    )
    assert len(owners) == len(np.unique(owners)), "a GPU belongs to two jobs"
    assert not (state.free_mask() & np.isin(np.arange(state.topology.num_gpus), owners)).any()
    # Load conservation: the per-uplink totals the state keeps equal the sum of every running
    # job's flows (check() also recounts them uplink by uplink).
    flows = sum(
        float(
            _core.job_load(
                state.specs[name].compile(state.topology), np.asarray(gpus, dtype=np.int64)
            )[1].sum()
        )
        for name, gpus in state.jobs.items()
        if name in state.specs
    )
    assert float(_core.fabric_load(state._core).sum()) == pytest.approx(flows, rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("seed", [1, 2])
def test_chaos(superpod: gpuplace.Topology, seed: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(seed)
    state = gpuplace.ClusterState(superpod)
    hosts = superpod.hosts
    leaves = superpod.domain_names[superpod.level_index("leaf")]
    counter = 0
    for _ in range(STEPS):
        action = rng.choice(
            [
                "place",
                "place",
                "place",
                "release",
                "fail",
                "degrade",
                "recover",
                "drain",
                "repair",
                "spare",
                "ingest",
            ]
        )
        target = {
            0: lambda: {"host": hosts[rng.integers(len(hosts))]},
            1: lambda: {"gpu": int(rng.integers(superpod.num_gpus))},
            2: lambda: {"nic": f"{hosts[rng.integers(len(hosts))]}:mlx5_{rng.integers(8)}"},
            3: lambda: {"switch": leaves[rng.integers(len(leaves))]},
        }[int(rng.choice(4, p=[0.4, 0.3, 0.2, 0.1]))]()
        if action == "place":
            counter += 1
            job = training_job(f"j{counter}", int(rng.choice([1, 2, 8, 16, 32, 64, 128])), pp=2)
            try:
                state.allocate(gpuplace.place(state, job))
            except gpuplace.Infeasible:
                pass
        elif action == "release" and state.jobs:
            state.release(str(rng.choice(sorted(state.jobs))))
        elif action == "fail":
            state.fail(**target)
        elif action == "drain":
            state.drain(**target)
        elif action == "degrade":
            state.degrade(loss=float(rng.choice([0.001, 0.01, 0.05])), **target)
        elif action == "recover":
            state.recover(**target)
        elif action == "repair":
            health = state.health()
            broken = [n for n, g in state.jobs.items() if (health[g] != 0).any()]
            if broken:
                name = str(rng.choice(broken))
                before = state.snapshot()
                try:
                    r = gpuplace.repair(state, name, max_moves=int(rng.integers(0, 4)))
                    assert (state.health()[r.placement.gpus] == 0).all()
                except gpuplace.Infeasible:
                    assert state.snapshot() == before
        elif action == "ingest":
            _ingest(state, rng, tmp_path)
        elif action == "spare":
            if rng.random() < 0.5:
                state.reserve_spares(per="leaf", count=1)
            else:
                state.release_spares()
        _consistent(state)


def _ingest(state: gpuplace.ClusterState, rng: np.random.Generator, tmp: Path) -> None:
    """An XID for a random GPU and a random NIC at half rate, in real line shapes."""
    topo = state.topology
    host = topo.hosts[int(rng.integers(len(topo.hosts)))]
    gpu, nic = int(rng.integers(8)), int(rng.integers(8))
    bus = [f"0000:{0x18 + 0x10 * i:02x}:00" for i in range(8)]
    xid_line = (HEALTH / "mutated" / "journal-dgx002-xid79.log").read_text().splitlines()[1]
    code = int(rng.choice([79, 48, 95, 94, 63, 74, 43]))
    bad = rng.random() < 0.15  # a PCI address no GPU has: the whole ingest must be refused
    pci = "0000:ff:00" if bad else bus[gpu]
    xid_line = (
        xid_line.replace("dgx002", host).replace("0000:ab:00", pci).replace(": 79,", f": {code},")
    )
    (tmp / "kern.log").write_text(xid_line + "\n")
    ibstatus = (HEALTH / "mutated" / "ibstatus-a100-mlx5_3-half-rate.txt").read_text()
    (tmp / "ibstatus.txt").write_text(
        ibstatus.replace("'mlx5_3'", "'mlx5_x'")
        .replace(f"'mlx5_{nic}'", "'mlx5_3'")
        .replace("'mlx5_x'", f"'mlx5_{nic}'")
    )
    sources = [tmp / "kern.log", f"{host}={tmp / 'ibstatus.txt'}"]
    rules = {"pci_bus_ids": {topo.host_types[0]: bus}}
    before = state.snapshot()
    try:
        report = gpuplace.health.ingest(
            state, sources, rules=rules, repair=bool(rng.random() < 0.5)
        )
    except (gpuplace.InvalidState, gpuplace.Infeasible):
        assert state.snapshot() == before
        return
    assert not bad or code == 43  # evidence no rule acts on is never mapped
    names = {c.name for c in report.changes}
    assert names <= {f"{host}:{gpu}", f"{host}:mlx5_{nic}"}
    health = state.health()
    for r in report.repairs:
        assert (health[r.placement.gpus] == 0).all()
