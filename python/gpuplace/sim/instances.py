"""Synthetic instances with a known optimum, for tests and benchmarks of rank mapping."""

from __future__ import annotations

import numpy as np

__all__ = ["HIERARCHICAL_OPTIMUM", "hierarchical_distance", "megatron_traffic"]

#: Optimum of ``megatron_traffic()`` on ``hierarchical_distance()``: tp groups on nodes (56,000
#: each), pipeline chains inside racks (100 * 10 per hop), data-parallel rings across racks
#: (10 * 100 per hop), both directions counted.
HIERARCHICAL_OPTIMUM = 5_376_000


def megatron_traffic(
    tp: int = 8,
    dp: int = 16,
    pp: int = 4,
    *,
    tp_bytes: float = 1000,
    pp_bytes: float = 100,
    dp_bytes: float = 10,
) -> np.ndarray:
    """Symmetric traffic of a tp x dp x pp job in Megatron rank order r = tp + TP (dp + DP pp):
    ``tp_bytes`` between every pair of a tp group, ``pp_bytes`` between neighbouring pipeline
    stages, ``dp_bytes`` around each data-parallel ring."""
    ranks = tp * dp * pp
    traffic = np.zeros((ranks, ranks))
    t, d, p = np.meshgrid(np.arange(tp), np.arange(dp), np.arange(pp), indexing="ij")
    rank = t + tp * (d + dp * p)
    for a in range(tp):
        for b in range(tp):
            if a != b:
                traffic[rank[a], rank[b]] = tp_bytes
    src, dst = rank[:, :, :-1].ravel(), rank[:, :, 1:].ravel()
    traffic[src, dst] = traffic[dst, src] = pp_bytes
    src, dst = rank.ravel(), np.roll(rank, -1, axis=1).ravel()
    traffic[src, dst] = traffic[dst, src] = dp_bytes
    return traffic


def hierarchical_distance(
    gpus_per_node: int = 8,
    nodes_per_rack: int = 4,
    racks: int = 16,
    distances: tuple[float, float, float] = (1.0, 10.0, 100.0),
) -> np.ndarray:
    """Distance between GPUs numbered node by node: ``distances`` inside a node, inside a rack
    and across racks; 0 on the diagonal."""
    gpu = np.arange(gpus_per_node * nodes_per_rack * racks)
    node, rack = gpu // gpus_per_node, gpu // (gpus_per_node * nodes_per_rack)
    near, mid, far = distances
    same_node = node[:, None] == node[None, :]
    same_rack = rack[:, None] == rack[None, :]
    distance = np.where(same_node, near, np.where(same_rack, mid, far)).astype(np.float64)
    np.fill_diagonal(distance, 0.0)
    return distance
