"""The FGD paper's experiment, reproduced: Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent" (USENIX ATC'23), Figure 9a (the
``default`` workload) and its workload variants (``gpuspec33``, ``gpushare100``,
``multigpu50``; Figures 11-13), with gpuplace's policy beside the paper's.

The procedure is the authors' (hkust-adsl/kubernetes-scheduler-simulator:
``experiments/run_scripts/generate_run_scripts.py``, ``scripts/generate_config_and_run.py``,
``pkg/simulator/{core,simulator}.go``, ``experiments/analysis/merge_alloc_discrete.py``):

1. The cluster is openb's 1,213 GPU nodes (6,212 GPUs of 8 models, CPU and memory); the pods
   are one workload's, sorted by name.
2. FGD's typical pods come from the workload as listed (:func:`gpuplace.model.share.typical_mix`).
3. Per seed, the pods are shuffled, then the workload is *inflated* (the authors' "tuning") to
   1.3 times the cluster's milli-GPUs: pods drawn at random from the listed workload are
   appended while the total stays within 1.3x (the check adds the drawn pod's milli-GPUs *per
   GPU*, as theirs does); a workload already above 1.3x (``multigpu50``) loses random pods
   until within.
4. Pods arrive in that order on an empty cluster; each is placed or dropped; none leaves.
5. After each arrival the run records the arrived milli-GPUs (placed or not) and the allocated
   ones. The curve at ``x`` % arrived is the mean allocated share over the arrivals whose
   arrived share rounds to ``x`` (within 1 when none does); the paper plots ``100 - curve``,
   the unallocated share, and reports medians over seeds 42-51.

The authors' runs draw from Go's generator through a Kubernetes scheduler, which cannot be
replayed here; the same procedure draws from numpy's PCG64 seeded with the same seeds, and
ties between nodes go to a node ranking drawn from the seed (as their scheduler ranks nodes by
a random name prefix). The published curves are packaged (:func:`paper_curves`) to compare.
"""

from __future__ import annotations

import gzip
import io
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from gpuplace.cluster.share import SharedCluster
from gpuplace.errors import InvalidJob
from gpuplace.io.openb import read_openb_nodes, read_openb_pods
from gpuplace.model.share import SharedNode, SharedRequest
from gpuplace.placement.share import POLICIES, replay

__all__ = [
    "INFLATION",
    "PAPER_POLICY",
    "SEEDS",
    "WORKLOADS",
    "Figure",
    "arrival_order",
    "openb_nodes",
    "openb_workload",
    "paper_curves",
    "plot",
    "run",
]

#: The openb workloads of the paper's Figures 9 and 11-13.
WORKLOADS = ("default", "gpuspec33", "gpushare100", "multigpu50")
#: The paper's seeds and inflation.
SEEDS = tuple(range(42, 52))
INFLATION = 1.3
#: gpuplace's policy labels -> the names in the authors' published results.
PAPER_POLICY = {
    "random": "Random",
    "dotprod": "DotProd",
    "clustering": "GpuClustering",
    "packing": "GpuPacking",
    "bestfit": "BestFit",
    "fgd": "FGD",
}
#: The curves run from 0 to this % of the cluster's milli-GPUs arrived.
TOP = 130


def _packaged(name: str) -> io.StringIO:
    raw = resources.files("gpuplace.sim").joinpath(f"data/{name}").read_bytes()
    stream = io.StringIO(gzip.decompress(raw).decode())
    stream.name = name.removesuffix(".gz")
    return stream


def openb_nodes(path: str | Path | None = None, *, all_nodes: bool = False) -> list[SharedNode]:
    """openb's nodes: the 1,213 GPU nodes the paper uses (``all_nodes``: with the 310 nodes
    without GPUs), or a node list file in the same format."""
    if path is not None:
        return read_openb_nodes(path)
    name = "openb_node_list_all_node.csv.gz" if all_nodes else "openb_node_list_gpu_node.csv.gz"
    return read_openb_nodes(_packaged(name))


def openb_workload(
    workload: str | Path = "default", *, isolation_for_qos: Mapping[str, str] | None = None
) -> list[SharedRequest]:
    """One of :data:`WORKLOADS` (packaged) or a pod list file in openb's format;
    ``isolation_for_qos`` as for :func:`gpuplace.io.openb.read_openb_pods`."""
    if str(workload) in WORKLOADS:
        return read_openb_pods(
            _packaged(f"openb_pod_list_{workload}.csv.gz"), isolation_for_qos=isolation_for_qos
        )
    path = Path(workload)
    if not path.exists():
        raise InvalidJob(
            f"unknown workload {str(workload)!r}: neither {', '.join(WORKLOADS)} nor an "
            "existing pod list file"
        )
    return read_openb_pods(path, isolation_for_qos=isolation_for_qos)


def arrival_order(
    requests: Sequence[SharedRequest],
    capacity_gpu_milli: int,
    seed: int,
    inflation: float = INFLATION,
) -> np.ndarray:
    """The arrival order of one seed (indexes into ``requests``): shuffled, then inflated to
    ``inflation`` times the capacity (see the module docs; ``inflation`` <= 0: no inflation)."""
    rng = np.random.default_rng(seed)
    n = len(requests)
    if not n:
        raise InvalidJob("the workload has no pods")
    order = [int(i) for i in rng.permutation(n)]
    if inflation <= 0:
        return np.asarray(order, dtype=np.int64)
    total = sum(r.total_gpu_milli for r in requests)
    target = inflation * capacity_gpu_milli
    if total < target:
        while True:
            i = int(rng.integers(n))
            if total + requests[i].gpu_milli > target:
                break
            total += requests[i].total_gpu_milli
            order.append(i)
            if len(order) > 1000 * n:  # a workload of pods without GPUs never fills the cluster
                raise InvalidJob("the workload asks for no GPU: it cannot be inflated")
    else:
        while total > target:
            i = order.pop(int(rng.integers(len(order))))
            total -= requests[i].total_gpu_milli
    return np.asarray(order, dtype=np.int64)


def allocation_curve(
    arrived_gpu_milli: np.ndarray, used_gpu_milli: np.ndarray, total_gpu_milli: int
) -> np.ndarray:
    """Allocated % of the cluster's milli-GPUs at 0..130 % arrived (NaN where no arrival is
    near), as the authors' ``merge_alloc_discrete.py`` discretises a run."""
    arrived = np.round(np.asarray(arrived_gpu_milli) / total_gpu_milli * 100)
    allocated = np.round(np.asarray(used_gpu_milli) / total_gpu_milli * 100, 2)
    keep = (arrived >= 0) & (arrived <= TOP + 1)
    bins = arrived[keep].astype(np.int64)
    sums = np.bincount(bins, weights=allocated[keep], minlength=TOP + 2)
    counts = np.bincount(bins, minlength=TOP + 2)
    out = np.full(TOP + 1, np.nan)
    for x in range(TOP + 1):
        if counts[x]:
            out[x] = sums[x] / counts[x]
        else:
            lo, hi = max(x - 1, 0), x + 2
            if counts[lo:hi].sum():
                out[x] = sums[lo:hi].sum() / counts[lo:hi].sum()
    return np.round(out, 2)


@dataclass
class Figure:
    """One workload's runs: per policy, the allocation curve of each seed (seeds x 131, %),
    and the time of every placement decision (ns)."""

    workload: str
    policies: tuple[str, ...]
    seeds: tuple[int, ...]
    curves: dict[str, np.ndarray]
    decision_ns: dict[str, np.ndarray]
    placed: dict[str, np.ndarray] = field(default_factory=dict)
    #: Per policy, the GPUs each seed's run switched between fractional and MIG mode.
    reconfigurations: dict[str, np.ndarray] = field(default_factory=dict)
    seconds: float = 0.0
    nodes: int = 0
    gpus: int = 0
    arrivals: int = 0

    def unallocated(self, at: int = 100) -> dict[str, float]:
        """Median over seeds of the unallocated % at ``at`` % arrived."""
        return {p: float(np.nanmedian(100.0 - c[:, at])) for p, c in self.curves.items()}

    def unallocated_by_seed(self, at: int = 100) -> dict[str, list[float]]:
        return {p: [float(v) for v in 100.0 - c[:, at]] for p, c in self.curves.items()}

    def to_dict(self, at: int = 100) -> dict[str, Any]:
        paper = paper_curves(self.workload) if self.workload in WORKLOADS else {}
        return {
            "workload": self.workload,
            "at_arrived_percent": at,
            "seeds": list(self.seeds),
            "nodes": self.nodes,
            "gpus": self.gpus,
            "seconds": round(self.seconds, 3),
            "unallocated_percent": {
                p: {
                    "median": round(v, 2),
                    "seeds": [round(x, 2) for x in self.unallocated_by_seed(at)[p]],
                    **(
                        {"paper": round(float(np.median(100 - paper[p][:, at])), 2)}
                        if p in paper
                        else {}
                    ),
                }
                for p, v in self.unallocated(at).items()
            },
            "decision_us": {
                p: {
                    "median": round(float(np.median(ns)) / 1e3, 2),
                    "p99": round(float(np.percentile(ns, 99)) / 1e3, 2),
                    "max": round(float(ns.max()) / 1e3, 2),
                }
                for p, ns in self.decision_ns.items()
            },
        }


def run(
    workload: str | Path = "default",
    policies: Iterable[str] = POLICIES,
    seeds: Iterable[int] = SEEDS,
    *,
    inflation: float = INFLATION,
    nodes: Sequence[SharedNode] | None = None,
    requests: Sequence[SharedRequest] | None = None,
    cluster: SharedCluster | None = None,
    reconfigure: bool = False,
) -> Figure:
    """Every policy on every seed of one workload (all runs in parallel in the core).
    ``nodes``: another cluster (default: openb's GPU nodes), or ``cluster``, one already built
    (with MIG rules and modes, say); ``requests``: the workload's pods already read;
    ``reconfigure``: let the policies switch idle GPUs between fractional and MIG mode."""
    policies = tuple(dict.fromkeys(policies))
    seeds = tuple(dict.fromkeys(int(s) for s in seeds))
    if not policies or not seeds:
        raise InvalidJob("give at least one policy and one seed")
    if cluster is None:
        cluster = SharedCluster(nodes if nodes is not None else openb_nodes())
    requests = openb_workload(workload) if requests is None else list(requests)
    orders = {s: arrival_order(requests, cluster.total_gpu_milli, s, inflation) for s in seeds}
    runs = [(orders[s], p, s) for p in policies for s in seeds]
    start = time.perf_counter()
    records = replay(cluster, requests, runs, reconfigure=reconfigure)
    seconds = time.perf_counter() - start
    curves: dict[str, list[np.ndarray]] = {p: [] for p in policies}
    decisions: dict[str, list[np.ndarray]] = {p: [] for p in policies}
    placed: dict[str, list[float]] = {p: [] for p in policies}
    switched: dict[str, list[int]] = {p: [] for p in policies}
    for (_, p, _), rec in zip(runs, records, strict=True):
        switched[p].append(int(rec.reconfigurations))
        curves[p].append(
            allocation_curve(rec.arrived_gpu_milli, rec.used_gpu_milli, cluster.total_gpu_milli)
        )
        decisions[p].append(rec.decision_ns)
        placed[p].append(float(np.mean(rec.placed)))
    return Figure(
        workload=str(workload),
        policies=policies,
        seeds=seeds,
        curves={p: np.vstack(c) for p, c in curves.items()},
        decision_ns={p: np.concatenate(d) for p, d in decisions.items()},
        placed={p: np.asarray(v) for p, v in placed.items()},
        reconfigurations={p: np.asarray(v) for p, v in switched.items()},
        seconds=seconds,
        nodes=len(cluster),
        gpus=cluster.num_gpus,
        arrivals=int(np.mean([len(o) for o in orders.values()])),
    )


def paper_curves(workload: str = "default") -> dict[str, np.ndarray]:
    """The authors' published allocation curves (seeds x 131, %) per policy label."""
    if workload not in WORKLOADS:
        raise InvalidJob(f"no published curves for workload {workload!r} ({', '.join(WORKLOADS)})")
    text = _packaged("fgd_figure9a_allocation.csv.gz").getvalue().splitlines()
    header = text[0].split(",")
    first = header.index("0")
    by_name = {v: k for k, v in PAPER_POLICY.items()}
    rows: dict[str, list[list[float]]] = {}
    for line in text[1:]:
        cells = line.split(",")
        if cells[0] != workload:
            continue
        values = [float(c) if c else np.nan for c in cells[first:]]
        rows.setdefault(by_name[cells[1]], []).append(values)
    return {p: np.array(rows[p]) for p in PAPER_POLICY if p in rows}


def plot(figures: Sequence[Figure], path: str | Path, *, paper: bool = True) -> Path:
    """The unallocated-GPU curves (median over seeds) against the arrived workload, one panel
    per workload, the paper's published medians dashed beside ours; written to ``path`` (PNG,
    PDF or SVG by suffix). Needs matplotlib (``pip install gpuplace[plot]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidJob("plotting needs matplotlib: pip install 'gpuplace[plot]'") from None
    path = Path(path)
    fig, axes = plt.subplots(
        1, len(figures), figsize=(5.2 * len(figures), 4.2), squeeze=False, sharey=False
    )
    colours = {p: plt.get_cmap("tab10")(i) for i, p in enumerate(POLICIES)}
    x = np.arange(TOP + 1)
    for ax, figure in zip(axes[0], figures, strict=True):
        published = paper_curves(figure.workload) if paper and figure.workload in WORKLOADS else {}
        for p in figure.policies:
            ours = np.nanmedian(100 - figure.curves[p], axis=0)
            ax.plot(x, ours, color=colours[p], lw=2 if p == "gpuplace" else 1.4, label=p)
            if p in published:
                theirs = np.nanmedian(100 - published[p], axis=0)
                ax.plot(x, theirs, color=colours[p], lw=1, ls="--")
        ax.set_xlim(0, TOP)
        ax.set_ylim(0, 100)
        ax.set_xlabel("arrived workload (% of GPU capacity)")
        ax.set_title(f"openb {figure.workload}")
        ax.grid(alpha=0.3)
        inset = ax.inset_axes((0.56, 0.5, 0.41, 0.46))
        for p in figure.policies:
            inset.plot(x, np.nanmedian(100 - figure.curves[p], axis=0), color=colours[p])
            if p in published:
                inset.plot(
                    x, np.nanmedian(100 - published[p], axis=0), color=colours[p], ls="--", lw=0.8
                )
        inset.set_xlim(90, TOP)
        inset.set_ylim(
            0, max(25.0, float(np.nanmax(100 - figure.curves[figure.policies[0]][:, 95:])))
        )
        inset.tick_params(labelsize=7)
        inset.grid(alpha=0.3)
    axes[0][0].set_ylabel("unallocated GPUs (% of capacity)")
    axes[0][0].legend(
        fontsize=8, loc="lower left", title="solid: gpuplace run; dashed: paper", title_fontsize=7
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
