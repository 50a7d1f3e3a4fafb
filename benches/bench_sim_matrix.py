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
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

POLICIES = "greedy,slurm-tree,kueue-bestfit"


def configurations(quick: bool) -> list[tuple[str, list[str]]]:
    """Both workloads over the whole matrix: non-blocking and 4:1, adaptive and ECMP, and on
    the 4:1 ECMP fabric failures at Llama 3's rates under requeue, repair and repair with
    evacuation. Philly runs on a cluster small enough that it queues (the first 10,000 jobs on
    640 GPUs: about 94 % utilisation over the steady window and a day of mean queue wait with
    greedy; on 4,096 GPUs it ran at 17 % and every policy tied)."""
    four = ["-p", "oversubscription=4"]
    leaf_ecmp = ["-p", "levels.leaf.routing=ecmp"]
    llama3 = ["--failures", "llama3", "--compare", "greedy,slurm-tree"]
    # ECMP on every level that routes up: leaf and spine on 256 nodes (a core above them),
    # the leaf alone on 80 or fewer (the spine is the top).
    workloads = (
        (
            "llm-mix",
            ["-c", "h100-superpod", "--nodes", "64" if quick else "256"],
            ["--trace", "llm-mix", "--jobs", "300" if quick else "1000"],
            leaf_ecmp if quick else [*leaf_ecmp, "-p", "levels.spine.routing=ecmp"],
        ),
        (
            "philly",
            ["-c", "h100-superpod", "--nodes", "48" if quick else "80"],
            ["--trace", "philly", "--limit", "3000" if quick else "10000"],
            leaf_ecmp,
        ),
    )
    out: list[tuple[str, list[str]]] = []
    for name, cluster, trace, ecmp in workloads:
        out += [
            (f"{name}, 1:1, adaptive", [*cluster, *trace, "--compare", POLICIES]),
            (f"{name}, 1:1, ECMP", [*cluster, *ecmp, *trace, "--compare", POLICIES]),
            (f"{name}, 4:1, adaptive", [*cluster, *four, *trace, "--compare", POLICIES]),
            (f"{name}, 4:1, ECMP", [*cluster, *four, *ecmp, *trace, "--compare", POLICIES]),
            (
                f"{name}, 4:1, ECMP, llama3 failures, requeue",
                [*cluster, *four, *ecmp, *trace, *llama3],
            ),
            (
                f"{name}, 4:1, ECMP, llama3 failures, repair",
                [*cluster, *four, *ecmp, *trace, *llama3, "--response", "repair"],
            ),
            (
                f"{name}, 4:1, ECMP, llama3 failures, repair + evacuate",
                [*cluster, *four, *ecmp, *trace, *llama3, "--response", "repair", "--evacuate"],
            ),
        ]
    return out


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


def _out_dir(base: Path, name: str) -> Path:
    return base / name.replace(", ", "_").replace(" ", "-").replace(":", "to")


def responses(base: Path, configs: list[tuple[str, list[str]]]) -> list[str]:
    """The failure responses against each other, paired by seed (the runs of one seed share
    the workload and the failures): repair - requeue and repair + evacuate - repair, per
    policy, for each workload."""
    from gpuplace.sim.metrics import confidence_interval

    keys = (
        ("gpu_hours_lost", "GPU-h lost", 1),
        ("jct_mean_s", "JCT mean (h)", 1 / 3600),
        ("goodput_steady", "goodput steady (%)", 100),
        ("ettr", "ETTR", 1),
    )
    out = ["## Failure responses against each other, paired by seed", ""]
    for workload in dict.fromkeys(name.split(",")[0] for name, _ in configs):
        runs = {}
        for response in ("requeue", "repair", "repair + evacuate"):
            name = f"{workload}, 4:1, ECMP, llama3 failures, {response}"
            report = _out_dir(base, name) / "report.json"
            if report.exists():
                runs[response] = json.loads(report.read_text())["runs"]
        if len(runs) < 3:
            continue
        out.append(f"{workload} (4:1, ECMP, Llama 3 failures):")
        out.append("")
        out.append("| policy | difference | " + " | ".join(k[1] for k in keys) + " |")
        out.append("|---|---|" + "---|" * len(keys))
        for policy in ("greedy", "slurm-tree"):
            for label, a, b in (
                ("repair - requeue", "repair", "requeue"),
                ("evacuate - repair", "repair + evacuate", "repair"),
            ):
                cells = []
                for key, _, scale in keys:
                    diffs = [
                        (run[key] - runs[b][run_name][key]) * scale
                        for run_name, run in runs[a].items()
                        if run_name.startswith(policy + " ") and run_name in runs[b]
                    ]
                    mean = sum(diffs) / len(diffs)
                    interval = confidence_interval(diffs)
                    half = (interval[1] - interval[0]) / 2 if interval else 0.0
                    cells.append(
                        f"{mean:+,.3f} ± {half:,.3f}"
                        if scale == 1 and key == "ettr"
                        else f"{mean:+,.2f} ± {half:,.2f}"
                    )
                out.append(f"| {policy} | {label} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench-out/matrix"))
    parser.add_argument("--only", default=None, help="run configurations whose name has this")
    parser.add_argument(
        "--resume", action="store_true", help="reuse configurations already run into --out"
    )
    args = parser.parse_args()
    seeds = 2 if args.quick else args.seeds
    lines = [f"seeds {seeds}; mean ± 95 % confidence half-width over the seeds", ""]
    for name, argv in configurations(args.quick):
        if args.only and args.only not in name:
            continue
        out = _out_dir(args.out, name)
        command = ["gpuplace", "simulate", *argv, "--seeds", str(seeds), "--out", str(out)]
        done = out / "wall.txt"
        if args.resume and done.exists() and (out / "report.json").exists():
            timing = done.read_text().strip()
        else:
            start = time.perf_counter()
            run = [sys.executable, "-m", "gpuplace", *command[1:]]
            subprocess.run(run, check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            timing = f"{wall:.0f} s wall, load {load} after"
            done.write_text(timing + "\n")
        report = json.loads((out / "report.json").read_text())
        policies = report["policies"]
        lines.append(f"## {name}  ({timing})")
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
    lines += responses(args.out, configurations(args.quick))
    (args.out / "matrix.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'matrix.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
