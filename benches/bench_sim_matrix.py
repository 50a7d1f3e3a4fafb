"""The simulator's results over seeds: policies on the LLM mix and on Philly, on a non-blocking
and a 4:1 fabric, with adaptive and ECMP routing, and with failures at Llama 3's rates under
requeue, repair and evacuation. Each configuration is one `gpuplace simulate --seeds N --out DIR`
run, as a user would type it; the table comes from its report.json (means with 95 % confidence
intervals over the seeds, and each policy's paired difference from greedy).

    python benches/bench_sim_matrix.py --seeds 5 --out bench-out/matrix
    python benches/bench_sim_matrix.py --quick          # two seeds, smaller workloads

No target: the figures are what the model gives (docs/simulate.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

POLICIES = "greedy,slurm-tree,kueue-bestfit"


def configurations(quick: bool) -> list[tuple[str, list[str]]]:
    llm = ["--trace", "llm-mix", "--jobs", "300" if quick else "1000"]
    cluster = ["-c", "h100-superpod", "--nodes", "64" if quick else "256"]
    four = ["-p", "oversubscription=4"]
    ecmp = ["-p", "levels.leaf.routing=ecmp", "-p", "levels.spine.routing=ecmp"]
    llama3 = ["--failures", "llama3", "--compare", "greedy,slurm-tree"]
    philly = ["--trace", "philly", "--limit", "5000" if quick else "20000"]
    philly_cluster = ["-c", "h100-superpod", "--nodes", "128" if quick else "512"]
    return [
        ("llm-mix, 1:1, adaptive", [*cluster, *llm, "--compare", POLICIES]),
        ("llm-mix, 4:1, adaptive", [*cluster, *four, *llm, "--compare", POLICIES]),
        ("llm-mix, 4:1, ECMP", [*cluster, *four, *ecmp, *llm, "--compare", POLICIES]),
        ("llm-mix, 4:1, ECMP, llama3 failures, requeue", [*cluster, *four, *ecmp, *llm, *llama3]),
        (
            "llm-mix, 4:1, ECMP, llama3 failures, repair",
            [*cluster, *four, *ecmp, *llm, *llama3, "--response", "repair"],
        ),
        (
            "llm-mix, 4:1, ECMP, llama3 failures, repair + evacuate",
            [*cluster, *four, *ecmp, *llm, *llama3, "--response", "repair", "--evacuate"],
        ),
        ("philly, 4:1, ECMP", [*philly_cluster, *four, *ecmp, *philly, "--compare", POLICIES]),
        (
            "philly, 4:1, ECMP, llama3 failures, requeue",
            [*philly_cluster, *four, *ecmp, *philly, *llama3],
        ),
    ]


ROWS = (
    ("jct_mean_s", "JCT mean (h)", 1 / 3600),
    ("jct_p95_s", "JCT p95 (h)", 1 / 3600),
    ("queue_mean_s", "queue mean (h)", 1 / 3600),
    ("utilization_steady", "util. steady (%)", 100),
    ("goodput_steady", "goodput steady (%)", 100),
    ("ettr", "ETTR", 1),
    ("contention_slowdown_mean", "contention slowdown", 1),
    ("gpu_hours_lost", "GPU-h lost", 1),
)


def cell(summary: dict[str, Any], key: str, scale: float) -> str:
    value = summary.get(key)
    if value is None:
        return "-"
    interval = summary.get("ci95", {}).get(key)
    text = f"{value * scale:,.3f}" if scale == 1 else f"{value * scale:,.2f}"
    if interval is not None and interval[1] > interval[0]:
        text += f" ± {(interval[1] - interval[0]) / 2 * scale:,.2f}"
    return text


def paired(report: dict[str, Any], key: str, scale: float) -> list[str]:
    out = []
    for name, diffs in report["paired_differences"].items():
        if key in diffs:
            mean, (low, high) = diffs[key]["mean"], diffs[key]["ci95"]
            out.append(f"{name}: {mean * scale:+,.2f} ± {(high - low) / 2 * scale:,.2f}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench-out/matrix"))
    parser.add_argument("--only", default=None, help="run configurations whose name has this")
    args = parser.parse_args()
    seeds = 2 if args.quick else args.seeds
    lines = [f"seeds {seeds}; mean ± 95 % confidence half-width over the seeds", ""]
    for name, argv in configurations(args.quick):
        if args.only and args.only not in name:
            continue
        out = args.out / name.replace(", ", "_").replace(" ", "-").replace(":", "to")
        start = time.perf_counter()
        command = ["gpuplace", "simulate", *argv, "--seeds", str(seeds), "--out", str(out)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        report = json.loads((out / "report.json").read_text())
        policies = report["policies"]
        lines.append(f"## {name}  ({wall:.0f} s)")
        lines.append("`" + " ".join(command[:-2]) + "`")
        lines.append("")
        lines.append("| metric | " + " | ".join(p.split(" (mean")[0] for p in policies) + " |")
        lines.append("|---|" + "---|" * len(policies))
        for key, label, scale in ROWS:
            lines.append(
                f"| {label} | " + " | ".join(cell(s, key, scale) for s in policies.values()) + " |"
            )
        for key, label, scale in ROWS[:5]:
            diffs = paired(report, key, scale)
            if diffs:
                lines.append(f"\npaired, {label}: " + "; ".join(diffs))
        lines.append("")
        print("\n".join(lines[-(len(ROWS) + 12) :]), flush=True)
    (args.out / "matrix.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'matrix.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
