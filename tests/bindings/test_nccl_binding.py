"""``ring_hops`` (rust/py/src/nccl.rs): the hops of NCCL's ring that leave an NVLink domain, in
the order the cost model lays the ring out."""

from __future__ import annotations

import numpy as np
import pytest
from gpuplace import _core
from gpuplace.errors import InvalidState


def test_a_ring_over_four_hosts_leaves_each_host_once_in_rank_order(two_leaves) -> None:
    topo = two_leaves(lambda host: host % 2)
    interleaved = [0, 8, 16, 24]  # hosts alternate leaves: every hop crosses the spine
    hops = _core.ring_hops(topo._core, np.array(interleaved, dtype=np.int64))
    assert [(h[2], h[3]) for h in hops] == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert {h[4] for h in hops} == {topo.level_index("spine")}
    leaf_order = [0, 16, 8, 24]  # hosts 1, 3 (leaf su0) then 2, 4 (leaf su1)
    hops = _core.ring_hops(topo._core, np.array(leaf_order, dtype=np.int64))
    assert sorted(h[4] for h in hops) == [1, 1, 2, 2]


def test_a_ring_inside_one_nvlink_domain_has_no_hops(two_leaves) -> None:
    topo = two_leaves(lambda host: host % 2)
    assert _core.ring_hops(topo._core, np.arange(8, dtype=np.int64)) == []


def test_ring_hops_refuses_unknown_gpus(two_leaves) -> None:
    with pytest.raises(InvalidState):
        _core.ring_hops(
            two_leaves(lambda host: host % 2)._core, np.array([0, 10**6], dtype=np.int64)
        )
