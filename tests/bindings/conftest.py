"""What the binding tests share: a small cluster of four DGX H100 under two leaves."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from gpuplace import Topology
from gpuplace.model.presets import hgx_node_type, topology_document


@pytest.fixture
def two_leaves() -> Callable[[Callable[[int], int]], Topology]:
    """``two_leaves(leaf_of)``: hosts dgx001..dgx004, host i under leaf ``su{leaf_of(i)}``,
    one spine above."""

    def build(leaf_of: Callable[[int], int]) -> Topology:
        nodes = [
            {
                "name": f"dgx{i + 1:03d}",
                "type": "hgx",
                "domains": {"leaf": f"su{leaf_of(i)}", "spine": "s"},
            }
            for i in range(4)
        ]
        levels = [("node", 370.8, 1.0), ("leaf", 50.0, 2.5), ("spine", 50.0, 3.0)]
        return Topology.from_dict(
            topology_document("two-leaves", levels, {"hgx": hgx_node_type("H100")}, nodes)
        )

    return build
