"""Document parsing speed (issue 25): bytes per second of CPU time of gpuplace's bounded YAML
loader (libyaml scanning and parsing, PyYAML's Python composer holding the budgets) next to
its pure-Python fallback and to PyYAML's own ``CSafeLoader`` (C composer, no budgets), and of
the bounded JSON parser with and without its duplicate-key check, all in the same run.

Inputs: a workload YAML of jobs in the flow style of tests/data and the examples (about
``--kb`` kB), the 1,024-node H100 SuperPOD preset dumped as YAML, and a sinfo-like JSON of
10,000 node objects. Medians over
``--runs`` runs of CPU time (process_time), so a shared machine's load counts little.

    python benches/bench_yaml.py            # ~1 minute
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import gpuplace
import yaml
from gpuplace._util import documents

JOBS = (
    "  - {name: a%d, submit_s: 0, gpus: 8, duration_s: 3600, tp: 8}\n"
    "  - {name: b%d, submit_s: 30, gpus: 64, duration_s: 7200, tp: 8, pp: 2, model: llama2-13b}\n"
    "  - {name: c%d, submit_s: 60.5, gpus: 16, duration_s: 10, estimate_s: 20, priority: 2}\n"
)


def median_cpu(call: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return statistics.median(times)


def yaml_load(loader: type[Any], text: str) -> Any:
    instance = loader(text)
    try:
        return instance.get_single_data()
    finally:
        instance.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", type=int, default=180)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    workload = "jobs:\n" + "".join(JOBS % (i, i, i) for i in range(args.kb * 1000 // len(JOBS)))
    topology = gpuplace.Topology.preset("h100-superpod", nodes=1024).to_dict()
    inputs = {
        "workload YAML": workload,
        "topology YAML": yaml.safe_dump(topology, sort_keys=False, default_flow_style=None),
    }
    fast = documents._LOADERS[0]
    print(f"PyYAML {yaml.__version__}, libyaml: {yaml.__with_libyaml__}; medians of {args.runs}")
    print(
        f"{'input':16s} {'bytes':>9s} {'pure':>10s} {'gpuplace':>10s} {'ratio':>6s} {'CSafe':>10s}"
    )
    for name, text in inputs.items():
        pure = median_cpu(lambda t=text: yaml_load(documents._BoundedLoader, t), args.runs)
        ours = median_cpu(lambda t=text: yaml_load(fast, t), args.runs)
        csafe = median_cpu(lambda t=text: yaml.load(t, Loader=yaml.CSafeLoader), args.runs)
        assert yaml_load(fast, text) == yaml_load(documents._BoundedLoader, text)
        kbs = [len(text) / s / 1e3 for s in (pure, ours, csafe)]
        print(
            f"{name:16s} {len(text):9d} {kbs[0]:7.0f} kB/s {kbs[1]:5.0f} kB/s {pure / ours:5.2f}x"
            f" {kbs[2]:5.0f} kB/s"
        )
    # sinfo --json of 10,000 nodes (its field names and shapes): object-heavy JSON
    nodes = [
        {
            "hostname": f"dgx{i:05d}",
            "state": ["IDLE"],
            "partitions": ["gpu"],
            "gres": "gpu:h100:8(S:0-1)",
            "gres_used": "gpu:h100:2(IDX:0-1)",
            "cpus": 224,
            "real_memory": 2_000_000,
            "features": "",
        }
        for i in range(10_000)
    ]
    text = json.dumps({"nodes": nodes}, indent=1)
    plain = median_cpu(lambda: json.loads(text, parse_int=documents._bounded_int), args.runs)
    checked = median_cpu(
        lambda: json.loads(
            text, parse_int=documents._bounded_int, object_pairs_hook=documents._unique_pairs
        ),
        args.runs,
    )
    print(
        f"sinfo-like JSON {len(text)} bytes: without the duplicate-key check "
        f"{len(text) / plain / 1e6:.1f} MB/s, with it {len(text) / checked / 1e6:.1f} MB/s "
        f"({checked / plain:.2f}x the time)"
    )


if __name__ == "__main__":
    main()
