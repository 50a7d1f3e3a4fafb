"""What a placement buys against a topology-blind one and against the scheduler people run: the
comparison lines of ``gpuplace place`` ("vs first-fit: fabric bytes -82 %, MFU 41 % -> 55 %";
"vs slurm-tree: ...")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuplace.errors import GpuplaceError
from gpuplace.placement.place import place

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.placement.result import CostReport, Placement

__all__ = ["BASELINE", "PEERS", "compare_to_baseline", "compare_to_peers", "comparison_line"]

#: The topology-blind placement every report compares against.
BASELINE = "first-fit"
#: What ``gpuplace place`` compares against: the topology-blind baseline and Slurm's
#: topology/tree plugin (``placement/solvers/baselines.py``), what most clusters run.
PEERS = (BASELINE, "slurm-tree")


def _summary(cost: CostReport) -> dict[str, Any]:
    names = list(cost.bytes_by_level)
    above_leaf = names.index(cost.nvlink_level) + 2
    return {
        "comm_seconds": cost.comm_seconds,
        "fabric_bytes": cost.fabric_bytes,
        # Bytes over the levels above the first fabric tier (the spine and up), where the
        # fabric hashes and where placement differs most.
        "spine_bytes": (cost.bytes_above(names[above_leaf]) if above_leaf < len(names) else 0.0),
        "step_seconds": cost.step_seconds,
        "mfu": cost.mfu,
        "tokens_per_second": cost.tokens_per_second,
        "confinement_ok": cost.confinement_ok,
    }


def compare_to_baseline(
    state: ClusterState, placement: Placement, solver: str = BASELINE
) -> dict[str, Any]:
    """The same job placed by ``solver`` (first-fit by default) on the same state (before
    ``placement`` is allocated), priced by the same cost model: ``{"solver", "baseline":
    {...}, "placement": {...}}``, with ``baseline`` None (and ``error`` the reason) when that
    solver cannot place it."""
    out: dict[str, Any] = {"solver": solver, "placement": _summary(placement.cost)}
    try:
        base = place(state, placement.job, solver)
    except GpuplaceError as exc:
        out["baseline"] = None
        out["error"] = str(exc)
        return out
    out["baseline"] = _summary(base.cost)
    return out


def compare_to_peers(state: ClusterState, placement: Placement) -> list[dict[str, Any]]:
    """:func:`compare_to_baseline` against each of :data:`PEERS` other than the placement's
    own solver."""
    return [
        compare_to_baseline(state, placement, peer) for peer in PEERS if peer != placement.solver
    ]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def comparison_line(comparison: dict[str, Any]) -> str:
    """One line: fabric bytes change, comm time, then MFU and step time when the job declares
    its compute, from the baseline to the placement."""
    base, ours = comparison["baseline"], comparison["placement"]
    if base is None:
        return f"{comparison['solver']} cannot place it: {comparison.get('error', '')}"
    parts = []
    if base["fabric_bytes"] > 0:
        change = ours["fabric_bytes"] / base["fabric_bytes"] - 1
        parts.append(f"fabric bytes {100 * change:+.0f} %")
    elif ours["fabric_bytes"] > 0:
        parts.append("fabric bytes up from 0")
    else:
        parts.append("fabric bytes 0 in both")
    if base.get("spine_bytes", 0) > 0:
        change = ours["spine_bytes"] / base["spine_bytes"] - 1
        parts.append(f"spine bytes {100 * change:+.0f} %")
    parts.append(f"comm {base['comm_seconds'] * 1e3:.3f} ms -> {ours['comm_seconds'] * 1e3:.3f} ms")
    if ours["mfu"] is not None and base["mfu"] is not None:
        parts.append(f"MFU {_pct(base['mfu'])} -> {_pct(ours['mfu'])}")
        parts.append(f"step {base['step_seconds']:.3f} s -> {ours['step_seconds']:.3f} s")
    if not base["confinement_ok"]:
        parts.append(f"{comparison['solver']} breaks confinement")
    return f"vs {comparison['solver']}: " + ", ".join(parts)


def add_step_rows(
    table: Any,
    cost: CostReport,
    comparison: dict[str, Any] | list[dict[str, Any]] | None,
) -> None:
    """Rows of step time, MFU and tokens/s (next to the comm breakdown of ``gpuplace place``),
    then one comparison line per peer."""
    if cost.step_seconds is not None:
        d = cost.step_details
        table.add_row(
            "step time",
            f"{cost.step_seconds:.3f} s = compute {cost.compute_seconds or 0:.3f} s"
            f" + bubble {d.get('bubble_seconds', 0.0):.3f} s"
            f" + exposed comm {cost.exposed_comm_seconds or 0:.3f} s",
        )
        table.add_row(
            "MFU",
            f"{100 * (cost.mfu or 0):.1f} % of {d.get('peak_tflops', 0):g} TFLOPS"
            f" ({d.get('gpu_model', '?')})",
        )
        if cost.tokens_per_second:
            table.add_row("tokens/s", f"{cost.tokens_per_second:,.0f}")
    elif "unavailable" in cost.step_details:
        table.add_row("step time", f"n/a ({cost.step_details['unavailable']})")
    else:
        table.add_row("step time", "n/a (the job declares no model or step.flops_per_step)")
    comparisons = [comparison] if isinstance(comparison, dict) else comparison or []
    for i, one in enumerate(comparisons):
        table.add_row("comparison" if i == 0 else "", comparison_line(one))
