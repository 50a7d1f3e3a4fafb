"""``fabric_load`` and ``job_load`` (rust/py/src/fabric.rs): the load the state keeps per uplink
direction is the sum of its running jobs' flows, each job's flows are the reference's, and both
refuse a placement that is not one."""

from __future__ import annotations

import gpuplace
import numpy as np
import pytest
from gpuplace import _core
from gpuplace.errors import InvalidState
from reference import reference_load


def _ring(name: str, tp: int, dp: int) -> gpuplace.Job:
    """A data-parallel job whose dp all-reduce moves 1 GB a step."""
    return gpuplace.Job(
        name=name, tp=tp, dp=dp, communication={"dp": gpuplace.Communication("all-reduce", 1e9)}
    )


def _job_flows(state: gpuplace.ClusterState) -> float:
    return sum(
        float(_core.job_load(state.specs[name].compile(state.topology), gpus)[1].sum())
        for name, gpus in state.jobs.items()
    )


def test_the_kept_load_is_the_sum_of_the_running_jobs_flows(two_leaves) -> None:
    topo = two_leaves(lambda host: host // 2)
    state = gpuplace.ClusterState(topo)
    empty = _core.fabric_load(state._core)
    assert empty.shape == (2 * len(_core.uplinks(topo._core)[0]),) and not empty.any()
    jobs = [_ring(f"dp{k}", tp=8, dp=2) for k in range(2)]
    # Each job has one host under each leaf: its dp ring crosses the spine.
    for job, hosts in zip(jobs, (("dgx001", "dgx003"), ("dgx002", "dgx004")), strict=True):
        gpus = np.concatenate([topo.host_gpus(h) for h in hosts])
        cost = gpuplace.evaluate(topo, job, gpus)
        state.allocate(gpuplace.Placement(job, topo, gpus, cost, "manual", 0.0))
        assert float(_core.fabric_load(state._core).sum()) == pytest.approx(_job_flows(state))
    assert _core.fabric_load(state._core).sum() > 0
    restored = gpuplace.ClusterState.restore(topo, state.snapshot())
    assert np.allclose(_core.fabric_load(restored._core), _core.fabric_load(state._core))
    for job in jobs:
        state.release(job.name)
    assert not _core.fabric_load(state._core).any()
    state.check()


@pytest.mark.parametrize("gpus", [[0, 16], [0, 8, 16, 24], [3, 11, 19, 27]])
def test_a_jobs_flows_are_the_references(two_leaves, gpus: list[int]) -> None:
    topo = two_leaves(lambda host: host // 2)
    job = _ring("ring", tp=1, dp=len(gpus))
    _slots, values = _core.job_load(job.compile(topo), np.asarray(gpus, dtype=np.int64))
    assert values.sum() > 0
    assert values.sum() == pytest.approx(sum(reference_load(topo, job, gpus).values()))


@pytest.mark.parametrize("gpus", [[0], [0, 0], [0, 10**6], [-1, 0]])
def test_job_load_refuses_what_is_not_a_placement(two_leaves, gpus: list[int]) -> None:
    topo = two_leaves(lambda host: host // 2)
    spec = gpuplace.Job(name="j", tp=1, dp=2).compile(topo)
    with pytest.raises(InvalidState):
        _core.job_load(spec, np.asarray(gpus, dtype=np.int64))
