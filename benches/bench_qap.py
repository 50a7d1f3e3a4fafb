"""Rank-mapping quality of map_ranks: QAPLIB and a hierarchical 512-rank job, against peers.

    nice python benches/bench_qap.py --out benches/results/bench_qap.txt   # ~20 minutes
    python benches/bench_qap.py --quick                                    # smoke run, ~1 minute

Part A, QAPLIB (the public quadratic-assignment benchmark) against its published best-known
values: every instance with n <= 30 at 10 ms, 0.1 s and 1 s, 36 <= n <= 50 and n = 100 at 1 s,
median over seeds. Measured side by side in the same run:
``scipy.optimize.quadratic_assignment`` with ``method="faq"`` from random starts and
``method="2opt"`` from random starts, each restarted while its time budget lasts (a restart that
begins inside the budget runs to its end, so a peer's time can exceed the budget: its time
column says by how much). The instances are read from ``--qaplib DIR`` (default
``../shared/qaplib`` next to the repository: the ``.dat`` files and ``bkv.csv``); without it,
part A is skipped.

Part B, the hierarchical case: a tp 8, pp 4, dp 16 job (Megatron rank order) on 16 racks of 4
nodes of 8 GPUs (distances 1, 10, 100), under random relabellings of its ranks; the optimum
5,376,000 is known. Peers on the same instances: scipy FAQ, Scotch's ``scotch_gmap`` on a
``tleaf`` target, and KaHIP's ``kaffpa`` partitioning level by level (16 racks, then 4 nodes
per rack; the GPUs of a node are equidistant, so that fixes the cost).

Everything runs single-threaded (BLAS too). The peers are optional and never installed by this
script; a missing one is reported as "skipped (not installed)":

* scipy: a dev dependency of gpuplace (``pip install -e '.[dev]'``).
* Scotch: ``apt-get install scotch`` (Debian/Ubuntu; provides ``scotch_gmap``).
* KaHIP: ``pip install kahip`` (Python bindings of ``kaffpa``).

Timing is never asserted anywhere; this script only measures and prints.
"""

from __future__ import annotations

import os

# One thread for scipy's BLAS as well: the comparison is single-threaded on both sides, and the
# machine is shared. Set before numpy is imported, which reads it once.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import csv  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import gpuplace  # noqa: E402
import numpy as np  # noqa: E402
from gpuplace.io.qaplib import read_qaplib  # noqa: E402
from gpuplace.sim.instances import (  # noqa: E402
    HIERARCHICAL_OPTIMUM,
    hierarchical_distance,
    megatron_traffic,
)

try:
    from scipy.optimize import quadratic_assignment
except ImportError:  # pragma: no cover - scipy is a dev dependency
    quadratic_assignment = None

try:
    import kahip
except ImportError:
    kahip = None

REPO = Path(__file__).resolve().parents[1]
DEFAULT_QAPLIB = REPO.parent / "shared" / "qaplib"

# Targets of issue 6 (mean gap to the best-known value, per size group and time limit).
GAP_TARGETS = {
    ("n <= 30", 0.01): 0.5,
    ("n <= 30", 0.1): 0.15,
    ("n <= 30", 1.0): 0.05,
    ("36 <= n <= 50", 1.0): 0.45,
    ("n = 100", 1.0): 1.0,
}
HIT_TARGET = ("n <= 30", 1.0, 95.0)
QUICK_INSTANCES = ("nug12", "chr20a", "tai30a", "nug30", "sko42", "tai50a")


# --------------------------------------------------------------------------- output
class Report:
    """Prints lines and keeps them for ``--out``."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def table(self, title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
        self()
        self(title)
        self("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
        self("  ".join("-" * w for w in widths))
        for row in rows:
            self("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def qap_cost(traffic: np.ndarray, distance: np.ndarray, perm: np.ndarray) -> float:
    return float(np.sum(traffic * distance[np.ix_(perm, perm)]))


# --------------------------------------------------------------------------- solvers
@dataclass(frozen=True)
class Result:
    cost: float
    seconds: float
    perm: np.ndarray | None = None


def gpuplace_run(a: np.ndarray, b: np.ndarray, budget: float, seed: int) -> Result:
    mapping = gpuplace.map_ranks(a, b, time_limit=budget, seed=seed, threads=1)
    return Result(mapping.cost, mapping.elapsed_s, mapping.perm)


def scipy_restarts(
    a: np.ndarray, b: np.ndarray, method: str, budgets: Sequence[float], seed: int
) -> dict[float, Result]:
    """Best of random restarts of scipy's ``method`` within each budget.

    One trajectory serves every budget: restarts are independent draws from one seeded stream,
    so the best of the restarts *begun* before a budget runs out is exactly what a separate run
    with that budget would return, and its time is when the last of them ended.
    """
    rng = np.random.default_rng(seed)
    options = {"P0": "randomized", "rng": rng} if method == "faq" else {"rng": rng}
    results: dict[float, Result] = {}
    best = Result(np.inf, 0.0)
    pending = sorted(budgets)
    start = time.perf_counter()
    while pending:
        began = time.perf_counter() - start
        while pending and began >= pending[0]:
            results[pending.pop(0)] = best
        if not pending:
            break
        res = quadratic_assignment(a, b, method=method, options=options)
        ended = time.perf_counter() - start
        # Recompute rather than trust ``fun``: one cost formula for every solver.
        cost = qap_cost(a, b, res.col_ind)
        if cost < best.cost:
            best = Result(cost, ended, res.col_ind)
        else:
            best = Result(best.cost, ended, best.perm)
    return results


# --------------------------------------------------------------------------- part A: QAPLIB
@dataclass(frozen=True)
class Instance:
    name: str
    n: int
    best_known: int
    optimal: bool


def read_catalogue(qaplib: Path) -> list[Instance]:
    with open(qaplib / "bkv.csv", newline="", encoding="utf-8") as fh:
        return [
            Instance(
                row["name"], int(row["n"]), int(row["best_known_value"]), row["optimal"] == "yes"
            )
            for row in csv.DictReader(fh)
        ]


def size_group(n: int) -> str | None:
    if n <= 30:
        return "n <= 30"
    if 36 <= n <= 50:
        return "36 <= n <= 50"
    if n == 100:
        return "n = 100"
    return None


@dataclass
class Outcome:
    """Median over seeds of one solver on one instance at one time limit."""

    cost: float
    seconds: float
    hits: int
    runs: int


def median_outcome(results: Sequence[Result], best_known: int) -> Outcome | None:
    if not results:  # the method was not run on this instance
        return None
    return Outcome(
        cost=statistics.median(r.cost for r in results),
        seconds=statistics.median(r.seconds for r in results),
        hits=sum(r.cost <= best_known for r in results),
        runs=len(results),
    )


def gap_percent(cost: float, best_known: int) -> float:
    if best_known == 0:  # esc16f: all-zero flows, every mapping costs 0
        return 0.0 if cost == 0 else float("inf")
    return 100.0 * (cost - best_known) / best_known


def bench_qaplib(report: Report, qaplib: Path, seeds: Sequence[int], quick: bool) -> None:
    if not (qaplib / "bkv.csv").is_file():
        report(f"Part A skipped: no QAPLIB instances at {qaplib} (give --qaplib DIR)")
        return
    if quadratic_assignment is None:
        report("scipy: skipped (not installed); only gpuplace is measured")
    catalogue = [i for i in read_catalogue(qaplib) if size_group(i.n) is not None]
    if quick:
        catalogue = [i for i in catalogue if i.name in QUICK_INSTANCES]
    methods = ["gpuplace"] + (["scipy-faq", "scipy-2opt"] if quadratic_assignment else [])
    # (group, limit) -> per instance: (instance, {method: Outcome})
    rows: dict[tuple[str, float], list[tuple[Instance, dict[str, Outcome | None]]]] = {}
    records: list[str] = []
    twoopt_at_100: list[str] = []
    for inst in catalogue:
        a, b = read_qaplib(qaplib / f"{inst.name}.dat")
        group = size_group(inst.n)
        assert group is not None
        limits = [0.1] if quick else ([0.01, 0.1, 1.0] if inst.n <= 30 else [1.0])
        per_method: dict[str, dict[float, list[Result]]] = {
            m: {lim: [] for lim in limits} for m in methods
        }
        for seed in seeds:
            for lim in limits:
                per_method["gpuplace"][lim].append(gpuplace_run(a, b, lim, seed))
            if quadratic_assignment is None:
                continue
            for res_lim, res in scipy_restarts(a, b, "faq", limits, seed).items():
                per_method["scipy-faq"][res_lim].append(res)
            # One 2-opt descent at n = 100 takes ~30 s in scipy (a Python loop over swaps,
            # each re-evaluating the whole objective): it runs once, on the first n = 100
            # instance, to show that; elsewhere at n = 100 it is reported as not run.
            if inst.n <= 50 or (seed == seeds[0] and not twoopt_at_100):
                for res_lim, res in scipy_restarts(a, b, "2opt", limits, seed).items():
                    per_method["scipy-2opt"][res_lim].append(res)
        if inst.n == 100 and per_method.get("scipy-2opt", {}).get(1.0):
            twoopt_at_100.append(inst.name)
        for lim in limits:
            outcome = {m: median_outcome(per_method[m][lim], inst.best_known) for m in methods}
            rows.setdefault((group, lim), []).append((inst, outcome))
            ran = {m: o for m, o in outcome.items() if o is not None}
            below = [m for m, o in ran.items() if o.cost < inst.best_known]
            flag = f"  BELOW BEST KNOWN ({', '.join(below)}): check it" if below else ""
            records.append(
                f"{inst.name:>9} n={inst.n:<3} bkv={inst.best_known:<10} limit={lim:<5} "
                + "  ".join(
                    f"{m} {gap_percent(o.cost, inst.best_known):7.3f} % {fmt_time(o.seconds):>9}"
                    for m, o in ran.items()
                )
                + flag
            )
            print(records[-1], flush=True)

    header = ["instance", "n", "best known", "limit"]
    for m in methods:
        header += [f"{m} gap %", f"{m} time"]
    for (group, lim), entries in rows.items():
        table_rows = []
        for inst, outcome in entries:
            row = [inst.name, str(inst.n), str(inst.best_known), f"{lim:g} s"]
            for m in methods:
                o = outcome[m]
                if o is None:
                    row += ["not run", ""]
                    continue
                row += [f"{gap_percent(o.cost, inst.best_known):.3f}", fmt_time(o.seconds)]
            table_rows.append(row)
        report.table(
            f"QAPLIB {group}, limit {lim:g} s: gap to the best-known value (median of "
            f"{len(seeds)} seeds; scipy-2opt at n = 100: one run on the first instance)",
            header,
            table_rows,
        )

    summary = []
    verdicts = []
    for (group, lim), entries in rows.items():
        row = [group, str(len(entries)), f"{lim:g} s"]
        mean_gap: dict[str, float] = {}
        for m in methods:
            ran = [(i, o[m]) for i, o in entries if o[m] is not None]
            mean_gap[m] = statistics.fmean(gap_percent(o.cost, i.best_known) for i, o in ran)
            hits = sum(o.hits for _, o in ran)
            runs = sum(o.runs for _, o in ran)
            partial = f" ({len(ran)} inst.)" if len(ran) < len(entries) else ""
            row += [
                f"{mean_gap[m]:.3f}{partial}",
                f"{100.0 * hits / runs:.0f} %",
                fmt_time(statistics.fmean(o.seconds for _, o in ran)),
            ]
        worse = [
            i.name
            for i, o in entries
            if any(
                o[m] is not None and o["gpuplace"].cost > o[m].cost
                for m in methods
                if m != "gpuplace"
            )
        ]
        row.append(", ".join(worse) if worse else "none")
        summary.append(row)
        target = GAP_TARGETS.get((group, lim))
        if target is not None and not quick:
            met = "met" if mean_gap["gpuplace"] <= target else "MISSED"
            verdicts.append(
                f"{group} at {lim:g} s: mean gap {mean_gap['gpuplace']:.3f} % "
                f"(target <= {target} %): {met}"
            )
        if (group, lim) == HIT_TARGET[:2] and not quick:
            hits = sum(o["gpuplace"].hits for _, o in entries)
            runs = sum(o["gpuplace"].runs for _, o in entries)
            rate = 100.0 * hits / runs
            met = "met" if rate >= HIT_TARGET[2] else "MISSED"
            verdicts.append(
                f"{group} at {lim:g} s: best-known hit rate {rate:.1f} % of {runs} runs "
                f"(target >= {HIT_TARGET[2]:.0f} %): {met}"
            )
        if not quick:
            verdicts.append(
                f"{group} at {lim:g} s: gpuplace worse than a scipy method on "
                f"{len(worse)} of {len(entries)} instances (target: none)"
            )
    header = ["group", "instances", "limit"]
    for m in methods:
        header += [f"{m} mean gap %", f"{m} hit", f"{m} mean time"]
    header.append("gpuplace worse than scipy on")
    report.table(
        "QAPLIB summary: mean over instances of the median gap; hit = share of all runs "
        "(instance x seed) at or below the best-known value",
        header,
        summary,
    )
    if verdicts:
        report()
        for v in verdicts:
            report(v)


# --------------------------------------------------------------------------- part B: hierarchy
TP, DP, PP = 8, 16, 4
GPUS_PER_NODE, NODES_PER_RACK, RACKS = 8, 4, 16
DISTANCES = (1, 10, 100)  # inside a node, inside a rack, across racks
# The whole call, construction included, stays under the 50 ms target with ~5 ms to spare for
# the Python side (copying the 2 MiB matrices in).
GPUPLACE_LIMIT = 0.04
FAQ_BUDGET = 1.0


@dataclass(frozen=True)
class PeerResult:
    perm: np.ndarray | None
    seconds: float
    note: str = ""


def scotch_map(traffic: np.ndarray, workdir: Path) -> PeerResult:
    """``scotch_gmap`` (default strategy) of the traffic graph onto a tleaf target.

    The time includes writing the graph and the process start: Scotch is used here as a
    command, as a scheduler would call it.
    """
    start = time.perf_counter()
    weights = traffic + traffic.T  # Scotch graphs are undirected: each arc carries both ways
    if not np.array_equal(weights, np.round(weights)):
        raise ValueError("Scotch needs integer edge weights")
    graph, target, mapping = workdir / "job.grf", workdir / "cluster.tgt", workdir / "job.map"
    with open(graph, "w", encoding="ascii") as fh:
        neighbours = [np.flatnonzero(row) for row in weights]
        arcs = sum(len(nb) for nb in neighbours)
        # Header: version 0, vertices and arcs, base 0, flags "010" = edge weights only.
        fh.write(f"0\n{len(weights)} {arcs}\n0 010\n")
        for i, nb in enumerate(neighbours):
            fh.write(f"{len(nb)}" + "".join(f" {int(weights[i, j])} {j}" for j in nb) + "\n")
    near, mid, far = DISTANCES
    # tleaf levels from the top: racks joined at cost 100, nodes at 10, GPUs at 1.
    target.write_text(f"tleaf 3 {RACKS} {far} {NODES_PER_RACK} {mid} {GPUS_PER_NODE} {near}\n")
    subprocess.run(
        ["scotch_gmap", str(graph), str(target), str(mapping)], check=True, capture_output=True
    )
    tokens = mapping.read_text().split()
    pairs = np.asarray(tokens[1:], dtype=np.int64).reshape(int(tokens[0]), 2)
    perm = np.empty(len(traffic), dtype=np.int64)
    perm[pairs[:, 0]] = pairs[:, 1]
    seconds = time.perf_counter() - start
    shared = len(perm) - len(np.unique(perm))
    return PeerResult(perm, seconds, f"{shared} ranks share a GPU" if shared else "")


def kahip_map(traffic: np.ndarray, seed: int) -> PeerResult:
    """KaHIP ``kaffpa`` (eco mode, perfect balance) level by level: 16 rack blocks, then 4
    node blocks in each; the 8 ranks of a node take its GPUs in any order (equidistant)."""
    start = time.perf_counter()
    weights = (traffic + traffic.T).astype(np.int64)

    def split(ranks: np.ndarray, parts: int) -> list[np.ndarray]:
        sub = weights[np.ix_(ranks, ranks)]
        xadj, adjncy, adjcwgt = [0], [], []
        for row in sub:
            nb = np.flatnonzero(row)
            adjncy += nb.tolist()
            adjcwgt += row[nb].tolist()
            xadj.append(len(adjncy))
        vwgt = [1] * len(ranks)
        _, blocks = kahip.kaffpa(vwgt, xadj, adjcwgt, adjncy, parts, 0.0, True, seed, kahip.ECO)
        blocks = np.asarray(blocks)
        return [ranks[blocks == k] for k in range(parts)]

    perm = np.full(len(traffic), -1, dtype=np.int64)
    unbalanced = 0
    per_rack = GPUS_PER_NODE * NODES_PER_RACK
    for rack, rack_ranks in enumerate(split(np.arange(len(traffic)), RACKS)):
        unbalanced += len(rack_ranks) != per_rack
        for node, node_ranks in enumerate(split(rack_ranks, NODES_PER_RACK)):
            unbalanced += len(node_ranks) != GPUS_PER_NODE
            perm[node_ranks] = rack * per_rack + node * GPUS_PER_NODE + np.arange(len(node_ranks))
    seconds = time.perf_counter() - start
    if unbalanced:  # a block not of the exact size has no one-to-one mapping: report, not fix
        return PeerResult(None, seconds, f"{unbalanced} blocks of the wrong size")
    return PeerResult(perm, seconds)


def bench_hierarchy(report: Report, relabellings: int) -> None:
    traffic, distance = megatron_traffic(), hierarchical_distance()
    identity_cost = qap_cost(traffic, distance, np.arange(len(traffic)))
    report()
    report(
        f"Hierarchical job: tp {TP} x pp {PP} x dp {DP} = {len(traffic)} ranks on {RACKS} racks "
        f"x {NODES_PER_RACK} nodes x {GPUS_PER_NODE} GPUs; optimum {HIERARCHICAL_OPTIMUM:,}, "
        f"Megatron order as given {identity_cost:,.0f}; {relabellings} random relabellings"
    )
    peers: dict[str, Callable[[np.ndarray, int], PeerResult] | str] = {}
    if quadratic_assignment is not None:

        def faq(shuffled: np.ndarray, seed: int) -> PeerResult:
            # The default barycenter start is a fixed point here (every rank looks alike), so
            # FAQ starts from random doubly stochastic matrices, restarted for FAQ_BUDGET.
            res = scipy_restarts(shuffled, distance, "faq", [FAQ_BUDGET], seed)[FAQ_BUDGET]
            return PeerResult(res.perm, res.seconds)

        peers[f"scipy FAQ ({FAQ_BUDGET:g} s restarts)"] = faq
    else:
        peers["scipy FAQ"] = "skipped (not installed)"
    workdir = Path(tempfile.mkdtemp(prefix="bench_qap_"))
    if shutil.which("scotch_gmap"):
        peers["Scotch gmap"] = lambda shuffled, seed: scotch_map(shuffled, workdir)
    else:
        peers["Scotch gmap"] = "skipped (not installed)"
    peers["KaHIP kaffpa"] = kahip_map if kahip is not None else "skipped (not installed)"

    columns = [f"gpuplace ({GPUPLACE_LIMIT * 1e3:g} ms limit)", "gpuplace construction", *peers]
    ratios: dict[str, list[float]] = {c: [] for c in columns}
    times: dict[str, list[float]] = {c: [] for c in columns}
    notes: dict[str, set[str]] = {c: set() for c in columns}
    rows = []
    try:
        for k in range(relabellings):
            relabel = np.random.default_rng(1000 + k).permutation(len(traffic))
            shuffled = traffic[np.ix_(relabel, relabel)]
            row = [str(k)]
            runs: dict[str, tuple[float | None, float, str]] = {}
            mapping = gpuplace.map_ranks(
                shuffled, distance, time_limit=GPUPLACE_LIMIT, seed=0, threads=1
            )
            runs[columns[0]] = (mapping.cost, mapping.elapsed_s, "")
            # The hierarchy-aware start alone (no search iteration): how much the search adds.
            built = gpuplace.map_ranks(
                shuffled, distance, time_limit=GPUPLACE_LIMIT, seed=0, max_iterations=0
            )
            runs[columns[1]] = (built.cost, built.elapsed_s, "")
            for name, peer in peers.items():
                if isinstance(peer, str):
                    runs[name] = (None, float("nan"), peer)
                    continue
                result = peer(shuffled, k)
                cost = None
                if result.perm is not None and len(np.unique(result.perm)) == len(result.perm):
                    cost = qap_cost(shuffled, distance, result.perm)
                runs[name] = (cost, result.seconds, "" if cost is not None else result.note)
            for c in columns:
                cost, seconds, note = runs[c]
                if cost is None:
                    row += [note or "no mapping", ""]
                    notes[c].add(note)
                    continue
                ratios[c].append(cost / HIERARCHICAL_OPTIMUM)
                times[c].append(seconds)
                row += [f"{cost / HIERARCHICAL_OPTIMUM:.4f}", fmt_time(seconds)]
            rows.append(row)
            print("  ".join(row), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    header = ["relabelling"]
    for c in columns:
        header += [f"{c} cost/opt", f"{c} time"]
    report.table("Hierarchical job: cost / optimum and wall time per relabelling", header, rows)

    summary = []
    for c in columns:
        if not ratios[c]:
            summary.append([c, "-", "-", "-", "-", "; ".join(sorted(notes[c]))])
            continue
        optimal = sum(r <= 1.0 + 1e-12 for r in ratios[c])
        summary.append(
            [
                c,
                f"{statistics.median(ratios[c]):.4f}",
                f"{max(ratios[c]):.4f}",
                f"{optimal}/{len(ratios[c])}",
                fmt_time(statistics.median(times[c])),
                "; ".join(sorted(n for n in notes[c] if n)),
            ]
        )
    report.table(
        "Hierarchical job summary (target: gpuplace at the optimum in under 50 ms)",
        ["solver", "median cost/opt", "worst cost/opt", "at optimum", "median time", "note"],
        summary,
    )


# --------------------------------------------------------------------------- main
def peer_versions() -> str:
    parts = []
    if quadratic_assignment is not None:
        import scipy

        parts.append(f"scipy {scipy.__version__}")
    if kahip is not None:
        parts.append(f"kahip {kahip.__version__}")
    if shutil.which("scotch_gmap"):
        done = subprocess.run(["scotch_gmap", "-V"], capture_output=True, text=True)
        # It prints its banner on stderr: "gmap/gpart, version 7.0.3 (...)".
        banner = [ln for ln in (done.stdout + done.stderr).splitlines() if "version" in ln]
        parts.append(f"scotch {banner[0].split('version')[1].split()[0]}" if banner else "scotch")
    return ", ".join(parts) or "no peers"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a handful of instances at 0.1 s")
    ap.add_argument("--qaplib", type=Path, default=DEFAULT_QAPLIB, help="QAPLIB directory")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per instance (median)")
    ap.add_argument("--relabellings", type=int, default=10, help="hierarchical job relabellings")
    ap.add_argument("--out", type=Path, default=None, help="also write the output to this file")
    args = ap.parse_args()
    report = Report()
    seeds = list(range(1 if args.quick else args.seeds))
    started = time.perf_counter()
    report(
        f"gpuplace {gpuplace.__version__}, numpy {np.__version__}, {peer_versions()}, "
        f"python {sys.version.split()[0]}; single-threaded; "
        f"{'quick' if args.quick else 'full'} run, seeds {seeds}"
    )
    bench_qaplib(report, args.qaplib, seeds, args.quick)
    bench_hierarchy(report, 3 if args.quick else args.relabellings)
    report()
    report(f"total wall time {time.perf_counter() - started:.0f} s")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(report.lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
