"""The nccl-tests reader on every real run in tests/data/nccl-tests and on mutated copies."""

from __future__ import annotations

import random
import re
from pathlib import Path

import gpuplace
import pytest
from gpuplace.errors import InvalidTopology
from gpuplace.io import read_nccl_tests

DATA = Path(__file__).resolve().parent.parent / "data" / "nccl-tests"
FILES = sorted(DATA.glob("*.txt"))


def readme_table() -> dict[str, dict[str, str]]:
    """The README's table: file -> column -> cell."""
    lines = [ln for ln in (DATA / "README.md").read_text().splitlines() if ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for ln in lines[1:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out[cells[0]] = dict(zip(header, cells, strict=False))
    return out


TABLE = readme_table()


def test_every_shared_file_is_listed() -> None:
    assert len(FILES) == 16
    assert {f.name for f in FILES} == set(TABLE)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name[:40])
def test_reads_every_real_run(path: Path) -> None:
    run = read_nccl_tests(path)
    row = TABLE[path.name]
    assert run.collective == row["collective"]
    assert len(run.rows) >= 2
    # The max-size out-of-place bus bandwidth, as the README states it.
    expected = float(re.match(r"[\d.]+", row["max-size busbw (GB/s, oop)"]).group())
    assert run.largest().busbw_gbps == pytest.approx(expected)
    # Rank count: the README's nodes x GPUs per node (approximate only where the rank lines
    # are elided and the bus-bandwidth factor is rounded).
    n = int(row["nodes"].split()[0]) * int(row["GPUs/node"])
    if run.kind != "p2p":
        got = run.num_ranks()
        assert got is not None
        assert abs(got - n) <= (0.05 * n if run.elided else 0)
    for r in run.rows:
        assert r.size_bytes >= 0 and r.time_us >= 0 and r.busbw_gbps >= 0
    if run.ranks:
        hosts = run.hosts
        assert len(hosts) >= 1
        if not run.elided and len(run.ranks) == n:
            assert len(hosts) == int(row["nodes"].split()[0])


def test_samples_map_ranks_to_hosts_and_devices() -> None:
    run = read_nccl_tests(
        DATA / "all_reduce_perf-h100-sxm-8nodes-8gpn-ib-ndr-nccl-tests-issue309-gj-aion.txt"
    )
    topo = gpuplace.Topology.preset("h100-superpod", nodes=8)
    samples = run.samples(topo, min_bytes=1 << 30)
    assert [s[0].gpus for s in samples] == [64] * len(samples)
    job, gpus, seconds = samples[-1]
    assert sorted(gpus.tolist()) == list(range(64))
    assert seconds == pytest.approx(52733e-6)
    assert job.communication["dp"].bytes == 8589934592


def test_sendrecv_is_every_rank_sending_to_the_next() -> None:
    """sendrecv_perf -g 8 is one process driving 8 ranks, each sending to the next at once: a
    job of 8 pipeline stages, not one pair. The file lists no ranks, so it needs ranks=."""
    path = DATA / "sendrecv_perf-a100-nvlink-1node-8gpu-li-plus-playground.txt"
    one = gpuplace.Topology.preset("a100-pod", nodes=1)
    with pytest.raises(InvalidTopology, match="how many ranks"):
        read_nccl_tests(path).samples(one)
    run = read_nccl_tests(path, ranks=8)
    samples = run.samples(one)
    assert [s[0].pp for s in samples] == [8] * 4
    job, gpus, seconds = samples[-1]
    assert gpus.tolist() == list(range(8))
    assert seconds == pytest.approx(5503.4e-6)
    assert job.communication["pp"].kind == "p2p"
    # In one NVLink domain every pair has the same path: 8 ranks cost what one pair costs.
    pair_job, pair_gpus, _ = read_nccl_tests(path, ranks=2).samples(one)[-1]
    eight = gpuplace.evaluate(one, job, gpus).comm_seconds
    assert eight == pytest.approx(gpuplace.evaluate(one, pair_job, pair_gpus).comm_seconds)
    # Over two hosts the pair that crosses the fabric sets the pace.
    two = gpuplace.Topology.preset("a100-pod", nodes=2)
    big = run.largest()
    sixteen = gpuplace.evaluate(two, run.job(big, 16), run.gpus_on(two, 16)).comm_seconds
    assert sixteen > 2 * eight


def test_explicit_ranks_and_collective() -> None:
    path = DATA / "all_reduce_perf-a100-sxm-80gb-16nodes-8gpn-ib-coreweave-nccl-tests.txt"
    assert read_nccl_tests(path, ranks=128).num_ranks() == 128
    with pytest.raises(InvalidTopology, match="ranks"):
        read_nccl_tests(path, ranks=1)
    with pytest.raises(InvalidTopology, match="collective"):
        read_nccl_tests(path, collective="broadcast")


def test_errors_name_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "all_reduce_perf-bad.txt"
    bad.write_text(
        "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
        "  1024 256 float sum -1 12.0 0.09 0.17 0 12.1 x 0.17 0\n"
    )
    with pytest.raises(InvalidTopology, match=r"all_reduce_perf-bad\.txt:2: in-place algbw"):
        read_nccl_tests(bad)
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n")
    with pytest.raises(InvalidTopology, match="no nccl-tests table rows"):
        read_nccl_tests(empty)


def _mutate(text: str, rng: random.Random) -> str:
    lines = text.splitlines(keepends=True)
    for _ in range(rng.randint(1, 4)):
        if not lines:
            break
        i = rng.randrange(len(lines))
        op = rng.randrange(6)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
        elif op == 2:
            tokens = lines[i].split()
            if tokens:
                tokens[rng.randrange(len(tokens))] = rng.choice(
                    ["nan", "-1", "inf", "1e999", "x", "", "99999999999999999999", "N/A", "#"]
                )
            lines[i] = " ".join(tokens) + "\n"
        elif op == 3:
            lines.insert(i, lines[i])
        elif op == 4:
            lines[i] = lines[i].replace("device", "dev", 1).replace("Rank", "Rank 9999999999", 1)
        else:
            lines[i] = "".join(rng.sample(lines[i], len(lines[i])))
    return "".join(lines)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name[:40])
def test_mutated_copies_raise_only_gpuplace_errors(path: Path, tmp_path: Path) -> None:
    rng = random.Random(path.name)
    text = path.read_text()
    topo = gpuplace.Topology.preset("h100-superpod", nodes=16)
    for k in range(40):
        copy = tmp_path / f"{k}-{path.name}"
        copy.write_text(_mutate(text, rng))
        try:
            run = read_nccl_tests(copy)
            run.samples(topo)
        except gpuplace.GpuplaceError:
            pass
