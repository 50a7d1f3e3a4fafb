"""A seeded chaos run: a few hundred random place / release / fail / degrade / recover / drain
/ repair / spare steps on 1,024 GPUs; after every step the state is recounted from scratch and
must equal its incremental counters (free GPUs and the fabric load per uplink), and no GPU may
belong to two jobs."""

from __future__ import annotations

import gpuplace
import numpy as np
import pytest
from gpuplace import _core
from gpuplace.sim.workload import training_job

STEPS = 300


def _consistent(state: gpuplace.ClusterState) -> None:
    recount = state._core.recount()
    for level in range(len(state.topology.levels)):
        assert np.array_equal(recount[level], state.free_counts(level))
    state.check()  # spare and degraded counters, derived health, owners
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
def test_chaos(superpod: gpuplace.Topology, seed: int) -> None:
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
        elif action == "spare":
            if rng.random() < 0.5:
                state.reserve_spares(per="leaf", count=1)
            else:
                state.release_spares()
        _consistent(state)
