"""Kernel-log ingest speed against ``grep -c Xid`` on the same file (issue 14: a 1 GB dump must
ingest in at most 3x grep's time, memory flat).

The file is generated here from the real line shapes of tests/data/health (journal lines of
mlx5 and systemd, dmesg -T lines with Xid 43/31/94 and ``GPU at PCI`` lines, kmsg NVLink Xid
149/145 lines, the multi-line "fallen off the bus" report), with host names and PCI addresses
varied and about one NVRM line per 500. Both commands read the file from the page cache
(one warm-up run each); the table gives medians over ``--runs`` runs, the ratio, and the peak
resident memory of a separate process that ingests the whole file (against the same
interpreter with gpuplace imported and nothing read).

    python benches/bench_ingest.py                  # 1 GiB, 5 runs (~1 minute)
    python benches/bench_ingest.py --size-mb 128    # quicker
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuplace.health.readers import read_kernel_log
from rich.console import Console
from rich.table import Table

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "health"
BLOCK_BYTES = 4 << 20


def _shapes() -> tuple[list[str], list[str]]:
    """(background lines, NVRM lines) from the real samples."""
    background = (DATA / "journal-k-mlx5-gpud-pr1209.log").read_text().splitlines()
    nvrm: list[str] = []
    for name in (
        "dmesg-T-xid-akash-support-244.log",
        "kmsg-nvlink-xid-gpud-pr1174.log",
        "journal-xid45-open-gpu-kernel-modules-1150.log",
        "dmesg-ctime-xid-gpud-pr46.log",
    ):
        for line in (DATA / name).read_text().splitlines():
            (nvrm if "NVRM" in line else background).append(line)
    nvrm.append(
        "\n".join((DATA / "dmesg-fallen-off-bus-nvsentinel-155.log").read_text().splitlines()[:3])
    )
    return background, nvrm


def _block(rng: random.Random) -> bytes:
    background, nvrm = _shapes()
    lines: list[str] = []
    size = 0
    while size < BLOCK_BYTES:
        host = f"gpu{rng.randrange(4096):04d}"
        if rng.random() < 1 / 500:
            line = rng.choice(nvrm).replace("0000:00:05", f"0000:{rng.randrange(256):02x}:00")
        else:
            line = rng.choice(background).replace("000-000-00000-1-gpu-1", host)
        lines.append(line)
        size += len(line) + 1
    return ("\n".join(lines) + "\n").encode()


def make_log(path: Path, size_bytes: int, seed: int = 14) -> None:
    block = _block(random.Random(seed))
    with open(path, "wb") as handle:
        written = 0
        while written < size_bytes:
            handle.write(block)
            written += len(block)


def _time(fn, runs: int) -> tuple[float, object]:
    fn()  # warm-up: the file is in the page cache for both commands
    times, out = [], None
    for _ in range(runs):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def _peak_rss_mb(path: Path | None) -> float:
    code = (
        "import resource, sys\n"
        "from gpuplace.health.readers import read_kernel_log\n"
        "if len(sys.argv) > 1: read_kernel_log(sys.argv[1])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    args = [sys.executable, "-c", code] + ([str(path)] if path else [])
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return int(out.strip()) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write the generated log")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args()
    grep = shutil.which("grep")
    if grep is None:
        sys.exit("grep is needed as the peer")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "kern.log"
        make_log(path, args.size_mb << 20)
        size = os.path.getsize(path)

        def run_grep() -> int:
            done = subprocess.run([grep, "-c", "Xid", str(path)], capture_output=True, text=True)
            return int(done.stdout.strip() or 0)

        def run_ingest():
            return read_kernel_log(path)

        grep_s, grep_count = _time(run_grep, args.runs)
        ours_s, result = _time(run_ingest, args.runs)
        rss_base = _peak_rss_mb(None)
        rss_read = _peak_rss_mb(path)
    table = Table(
        title=f"kernel-log ingest vs grep -c Xid ({args.runs} runs, medians)", title_justify="left"
    )
    for col in (
        "file",
        "lines",
        "grep -c Xid",
        "read_kernel_log",
        "ratio",
        "XID lines (grep)",
        "evidence (ours)",
        "unknown lines",
        "peak RSS",
    ):
        table.add_column(col)
    table.add_row(
        f"{size / 2**20:,.0f} MiB",
        f"{result.lines:,}",
        f"{grep_s:.3f} s ({size / grep_s / 2**30:.2f} GiB/s)",
        f"{ours_s:.3f} s ({size / ours_s / 2**30:.2f} GiB/s)",
        f"{ours_s / grep_s:.2f}x",
        f"{grep_count:,}",
        f"{len(result.evidence):,}",
        f"{result.unknown:,}",
        f"{rss_read:.0f} MiB ({rss_read - rss_base:+.0f} MiB over the bare interpreter)",
    )
    console = Console(width=200)
    console.print(table)
    if args.out:
        with open(args.out, "w") as handle:
            Console(file=handle, width=200).print(table)


if __name__ == "__main__":
    main()
