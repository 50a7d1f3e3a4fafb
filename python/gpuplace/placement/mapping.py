"""Rank mapping as a quadratic assignment problem, solved in Rust.

``map_ranks(traffic, distance)`` minimises ``sum_ij traffic[i, j] * distance[perm[i], perm[j]]``
(rank ``i`` goes to location ``perm[i]``). The core (``rust/core/src/qap``) detects a
hierarchy in the distance matrix (nodes, racks, pods) and builds a start by grouping heavily
communicating ranks into its blocks, then runs Taillard's robust tabu search with O(1) delta
updates (dense traffic) or an O(degree) local search (sparse traffic), with one independent
search per thread. The GIL is released for the whole search.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplace import _core
from gpuplace.errors import InvalidJob

__all__ = ["Mapping", "map_ranks"]


@dataclass(frozen=True)
class Mapping:
    """A rank mapping: ``perm[i]`` is the location of rank ``i``."""

    perm: np.ndarray
    #: ``sum_ij traffic[i, j] * distance[perm[i], perm[j]]``.
    cost: float
    elapsed_s: float
    #: Search iterations, summed over the parallel searches.
    iterations: int


def map_ranks(
    traffic: Any,
    distance: Any,
    *,
    time_limit: float = 1.0,
    seed: int = 0,
    initial: Any = None,
    threads: int | None = None,
    max_iterations: int | None = None,
    ranks: int | None = None,
) -> Mapping:
    """Map ranks to locations minimising the quadratic-assignment cost.

    ``traffic``: a square numpy array (float64 or int64; asymmetric allowed), a scipy.sparse
    matrix, or (src, dst, weight) rows together with ``ranks=N`` — the sparse forms are for jobs
    too large for a dense matrix. ``distance``: a square ``m x m`` array with ``m >= N``
    (extra locations stay empty). ``initial``: a starting mapping; the result is never worse.
    ``threads``: independent parallel searches (default 1). The result is deterministic for a
    seed and a thread count when ``max_iterations``, not ``time_limit`` (s), ends the search.
    """
    dist = np.ascontiguousarray(np.asarray(distance, dtype=np.float64))
    if dist.ndim != 2:
        raise InvalidJob(f"distance must be a square matrix, got shape {dist.shape}")
    kwargs: dict[str, Any] = {}
    if hasattr(traffic, "tocoo"):
        coo = traffic.tocoo()
        if coo.shape[0] != coo.shape[1]:
            raise InvalidJob(f"traffic must be a square matrix, got shape {coo.shape}")
        n = int(coo.shape[0])
        kwargs.update(
            traffic_src=coo.row.astype(np.int64),
            traffic_dst=coo.col.astype(np.int64),
            traffic_weight=coo.data.astype(np.float64),
        )
    elif ranks is not None:
        rows = np.asarray(traffic, dtype=np.float64).reshape(-1, 3)
        n = int(ranks)
        kwargs.update(
            traffic_src=rows[:, 0].astype(np.int64),
            traffic_dst=rows[:, 1].astype(np.int64),
            traffic_weight=np.ascontiguousarray(rows[:, 2]),
        )
    else:
        dense = np.ascontiguousarray(np.asarray(traffic, dtype=np.float64))
        if dense.ndim != 2 or dense.shape[0] != dense.shape[1]:
            raise InvalidJob(f"traffic must be a square matrix, got shape {dense.shape}")
        n = int(dense.shape[0])
        kwargs["traffic_dense"] = dense
    if initial is not None:
        kwargs["initial"] = np.asarray(initial, dtype=np.int64)
    if threads is not None and threads < 1:
        raise InvalidJob(f"threads must be >= 1, got {threads}")
    start = time.perf_counter()
    mapping = _core.map_ranks(
        dist,
        n,
        time_limit=float(time_limit),
        seed=int(seed),
        threads=int(threads or 1),
        max_iterations=max_iterations,
        **kwargs,
    )
    return Mapping(
        perm=mapping.perm,
        cost=float(mapping.cost),
        elapsed_s=time.perf_counter() - start,
        iterations=mapping.iterations,
    )
