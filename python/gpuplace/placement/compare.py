"""What a placement buys against a topology-blind one: the comparison line of ``gpuplace
place`` ("vs first-fit: fabric bytes -82 %, MFU 41 % -> 55 %")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuplace.errors import GpuplaceError
from gpuplace.placement.place import place

if TYPE_CHECKING:
    from gpuplace.cluster.state import ClusterState
    from gpuplace.placement.result import CostReport, Placement

__all__ = ["BASELINE", "compare_to_baseline", "comparison_line"]

#: The topology-blind placement every report compares against.
BASELINE = "first-fit"


def _summary(cost: CostReport) -> dict[str, Any]:
    return {
        "comm_seconds": cost.comm_seconds,
        "fabric_bytes": cost.fabric_bytes,
        "step_seconds": cost.step_seconds,
        "mfu": cost.mfu,
        "tokens_per_second": cost.tokens_per_second,
        "confinement_ok": cost.confinement_ok,
    }


def compare_to_baseline(state: ClusterState, placement: Placement) -> dict[str, Any]:
    """The same job placed by first-fit on the same state (before ``placement`` is allocated),
    priced by the same cost model: ``{"solver", "baseline": {...}, "placement": {...}}``, with
    ``baseline`` None (and ``error`` the reason) when first-fit cannot place it."""
    out: dict[str, Any] = {"solver": BASELINE, "placement": _summary(placement.cost)}
    try:
        base = place(state, placement.job, BASELINE)
    except GpuplaceError as exc:
        out["baseline"] = None
        out["error"] = str(exc)
        return out
    out["baseline"] = _summary(base.cost)
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def comparison_line(comparison: dict[str, Any]) -> str:
    """One line: fabric bytes change, then MFU (or comm time when the job declares no
    compute) from the baseline to the placement."""
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
    if ours["mfu"] is not None and base["mfu"] is not None:
        parts.append(f"MFU {_pct(base['mfu'])} -> {_pct(ours['mfu'])}")
        parts.append(f"step {base['step_seconds']:.3f} s -> {ours['step_seconds']:.3f} s")
    else:
        parts.append(
            f"comm {base['comm_seconds'] * 1e3:.3f} ms -> {ours['comm_seconds'] * 1e3:.3f} ms"
        )
    if not base["confinement_ok"]:
        parts.append(f"{comparison['solver']} breaks confinement")
    return f"vs {comparison['solver']}: " + ", ".join(parts)


def add_step_rows(table: Any, cost: CostReport, comparison: dict[str, Any] | None) -> None:
    """Rows of step time, MFU and tokens/s (next to the comm breakdown of ``gpuplace place``),
    then the comparison line."""
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
    if comparison is not None:
        table.add_row("comparison", comparison_line(comparison))
