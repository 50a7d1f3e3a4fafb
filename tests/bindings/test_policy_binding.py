"""``set_fence`` and ``fence_mask`` (rust/py/src/policy.rs): the per-GPU fence of the policy
layer, set all or nothing, named by the placement gate."""

from __future__ import annotations

import gpuplace
import numpy as np
import pytest
from gpuplace import _core
from gpuplace.errors import InvalidState


def test_the_fence_binding_checks_gpus_and_the_gate_names_a_fenced_gpu() -> None:
    topo = gpuplace.Topology.preset("h100-superpod", nodes=2)
    state = gpuplace.ClusterState(topo)
    for bad in ([-1], [0, topo.num_gpus]):
        with pytest.raises(InvalidState):
            _core.set_fence(state._core, np.asarray(bad, dtype=np.int64), True)
        assert not _core.fence_mask(state._core).any()  # all or nothing
    _core.set_fence(state._core, np.asarray([1], dtype=np.int64), True)
    assert _core.fence_mask(state._core).tolist() == [g == 1 for g in range(topo.num_gpus)]
    spec = gpuplace.Job(name="j", tp=1, dp=2).compile(topo)
    with pytest.raises(InvalidState, match="GPU 1, which is fenced off"):
        _core.admit(state._core, spec, np.asarray([0, 1], dtype=np.int64), "test", False)
    _core.set_fence(state._core, np.asarray([1], dtype=np.int64), False)
    assert not _core.fence_mask(state._core).any()
    state.check()


def test_a_fenced_view_lifts_its_fence_on_leaving() -> None:
    topo = gpuplace.Topology.preset("h100-superpod", nodes=2)
    state = gpuplace.ClusterState(topo)
    allowed = np.zeros(topo.num_gpus, dtype=bool)
    allowed[8:] = True
    with state.fenced(allowed):
        assert _core.fence_mask(state._core).tolist() == (~allowed).tolist()
        placement = gpuplace.place(state, gpuplace.Job(name="j", tp=8, dp=1))
        assert set(placement.gpus.tolist()) <= set(range(8, 16))
    assert not _core.fence_mask(state._core).any()
