"""Calibration: known parameters recovered from synthetic samples, real measurements fitted
from the API and the CLI, and the placement-table reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gpuplace
import numpy as np
import pytest
from gpuplace import Communication, Job, Topology
from gpuplace.errors import InvalidJob
from gpuplace.io import read_nccl_tests, read_placement_table

DATA = Path(__file__).resolve().parent / "data"


def allreduce(n: int, size: float) -> Job:
    return Job(
        name=f"ar{n}", dp=n, communication={"dp": Communication("all-reduce", size)}, confine={}
    )


def test_recovers_known_parameters_from_synthetic_samples() -> None:
    doc = Topology.preset("h100-superpod", nodes=4).to_dict()
    doc["levels"][1].update(bandwidth_gbps=37.0, latency_us=6.0)
    doc["node_types"]["dgx-h100"]["nvls_gbps"] = 410.0
    truth = Topology.from_dict(doc)
    samples = []
    for gpus in (
        list(range(8)),
        list(range(16)),
        [0, 8, 16, 24],
        [0, 8],
        [0, 1, 2, 3, 8, 9, 10, 11],
    ):
        for size in (1e3, 1e5, 1e7, 1e9):
            job = allreduce(len(gpus), size)
            samples.append((job, gpus, gpuplace.evaluate(truth, job, gpus).comm_seconds))
    start = Topology.preset("h100-superpod", nodes=4)
    fitted = gpuplace.calibrate(start, samples)
    leaf = fitted.levels[1]
    assert leaf.bandwidth_gbps == pytest.approx(37.0, rel=1e-3)
    assert leaf.latency_us == pytest.approx(6.0, rel=1e-3)
    assert fitted.node_types["dgx-h100"].nvls_gbps == pytest.approx(410.0, rel=1e-3)
    # The spine is never crossed by these samples: left as it was.
    assert fitted.levels[2] == start.levels[2]
    from gpuplace.calibrate import sample_errors

    assert max(abs(e) for e in sample_errors(fitted, samples)) < 1e-3
    assert max(abs(e) for e in sample_errors(start, samples)) > 0.2


def test_fits_host_count_factors_when_the_data_demand_them() -> None:
    topo = Topology.preset("h100-superpod", nodes=8)
    samples = []
    slow = {2: 1.0, 3: 1.8, 4: 0.7}
    for hosts, factor in slow.items():
        for size in (1e8, 1e9):
            gpus = [h * 8 for h in range(hosts)]
            job = allreduce(hosts, size)
            samples.append((job, gpus, factor * gpuplace.evaluate(topo, job, gpus).comm_seconds))
    fitted = gpuplace.calibrate(topo, samples)
    f = fitted.host_count_factors
    assert len(f) == 4
    assert f[2] / f[1] == pytest.approx(1.8, rel=1e-2)
    assert f[3] / f[1] == pytest.approx(0.7, rel=1e-2)
    # Round trip through the file format.
    assert Topology.from_dict(fitted.to_dict()).host_count_factors == f


def test_bad_samples_are_invalid_jobs() -> None:
    topo = Topology.preset("dgx-h100")
    with pytest.raises(InvalidJob, match="no samples"):
        gpuplace.calibrate(topo, [])
    with pytest.raises(InvalidJob, match=r"samples\[0\].*seconds"):
        gpuplace.calibrate(topo, [(allreduce(2, 1e6), [0, 1], 0.0)])
    with pytest.raises(InvalidJob, match=r"samples\[0\]"):
        gpuplace.calibrate(topo, [("not a sample",)])


def test_calibrating_on_a_real_run_lowers_its_error() -> None:
    topo = Topology.preset("h100-superpod", nodes=2)
    run = read_nccl_tests(
        DATA
        / "nccl-tests"
        / "all_reduce_perf-h100-sxm-2nodes-8gpn-ib-ndr-ring-tuned-nccl-tests-issue309-gj-aion.txt"
    )
    samples = run.samples(topo)
    from gpuplace.calibrate import sample_errors

    before = np.sqrt(np.mean(np.log1p(sample_errors(topo, samples)) ** 2))
    after = np.sqrt(
        np.mean(np.log1p(sample_errors(gpuplace.calibrate(topo, samples), samples)) ** 2)
    )
    assert after < 0.5 * before


def test_placement_table_reader_on_the_pollux_tables(tmp_path: Path) -> None:
    job = Job(name="bert", communication={"dp": Communication("all-reduce", 4.4e8)})
    samples = read_placement_table(DATA / "pollux" / "bert_placements.csv", job)
    by_name = {j.name: (j, g, s) for j, g, s in samples}
    j, g, s = by_name["bert-22"]
    assert j.dp == 4 and g.tolist() == [0, 1, 4, 5]
    rows = [
        ln.split(",")
        for ln in (DATA / "pollux" / "bert_placements.csv").read_text().splitlines()[1:]
        if ln.startswith("22,")
    ]
    assert s == pytest.approx(np.mean([float(r[3]) for r in rows]))
    assert "bert-1" not in by_name  # one GPU: no gradient sync to price
    for bad, match in (
        ("placement,local_bsz,step_time,sync_time\n2x,1,1,1\n", r"bad\.csv:2: placement"),
        ("placement,local_bsz,step_time,sync_time\n22,1,1,-1\n", r"bad\.csv:2: sync_time"),
        ("placement,local_bsz,step_time,sync_time\n52,1,1,1\n", r"bad\.csv:2: placement 52"),
        ("a,b\n", r"bad\.csv:1: expected the header"),
    ):
        (tmp_path / "bad.csv").write_text(bad)
        with pytest.raises(InvalidJob, match=match):
            read_placement_table(tmp_path / "bad.csv", job)


def test_cli_calibrate_prints_errors_and_writes_a_loadable_topology(tmp_path: Path) -> None:
    run = (
        DATA
        / "nccl-tests"
        / "all_reduce_perf-h100-sxm-2nodes-8gpn-ib-ndr-ring-tuned-nccl-tests-issue309-gj-aion.txt"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuplace.cli",
            "calibrate",
            "-c",
            "h100-superpod",
            "--nodes",
            "2",
            "--nccl-tests",
            str(run),
            "-o",
            "cal.yaml",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "error before" in out.stdout and "error after" in out.stdout
    fitted = Topology.load(tmp_path / "cal.yaml")
    assert fitted.num_gpus == 16
    bad = subprocess.run(
        [sys.executable, "-m", "gpuplace.cli", "calibrate", "-c", "h100-superpod", "-o", "x.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("gpuplace: error: ")
    assert "Traceback" not in bad.stderr


def test_mutated_placement_tables_raise_only_gpuplace_errors(tmp_path: Path) -> None:
    import random

    job = Job(name="ncf", communication={"dp": Communication("all-reduce", 1.6e7)})
    text = (DATA / "pollux" / "ncf_placements.csv").read_text()
    rng = random.Random(5)
    for k in range(60):
        lines = text.splitlines(keepends=True)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(lines))
            cells = lines[i].rstrip("\n").split(",")
            cells[rng.randrange(len(cells))] = rng.choice(
                ["", "x", "nan", "-1", "0", "99", "1e999", "1,2"]
            )
            lines[i] = ",".join(cells) + "\n"
        path = tmp_path / f"{k}.csv"
        path.write_text("".join(lines))
        try:
            read_placement_table(path, job)
        except gpuplace.GpuplaceError:
            pass


def test_recovers_a_per_algorithm_efficiency() -> None:
    doc = Topology.preset("h100-superpod", nodes=8).to_dict()
    doc["algorithm_efficiency"] = {"tree": 0.8}
    truth = Topology.from_dict(doc)
    samples = []
    for gpus in (list(range(16)), [h * 8 for h in range(8)], [0, 1, 8, 9, 16, 17, 24, 25]):
        for size in (1e5, 1e6, 1e7, 1e8, 1e9, 4e9):
            job = allreduce(len(gpus), size)
            samples.append((job, gpus, gpuplace.evaluate(truth, job, gpus).comm_seconds))
    used = {
        a for j, g, _ in samples for a in gpuplace.evaluate(truth, j, g).class_algorithms.values()
    }
    assert {"ring", "tree"} <= used
    fitted = gpuplace.calibrate(Topology.preset("h100-superpod", nodes=8), samples)
    assert fitted.algorithm_efficiency["tree"] == pytest.approx(0.8, rel=1e-2)
    assert Topology.from_dict(fitted.to_dict()).algorithm_efficiency == fitted.algorithm_efficiency


def _two_leaves(routing: str = "adaptive", qps: int = 1, spine_gbps: float = 50.0) -> Topology:
    """Two leaves of four 8-GPU hosts under one spine; the leaves' uplinks routed as given."""
    return Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "two-leaves",
            "levels": [
                {"name": "node", "bandwidth_gbps": 450, "latency_us": 1},
                {
                    "name": "leaf",
                    "bandwidth_gbps": 50,
                    "latency_us": 2,
                    "routing": routing,
                    "qps_per_connection": qps,
                },
                {"name": "spine", "bandwidth_gbps": spine_gbps, "latency_us": 3},
            ],
            "node_types": {"box": {"gpus": 8}},
            "nodes": [
                {"name": f"n{h}", "type": "box", "domains": {"leaf": f"l{h // 4}", "spine": "s"}}
                for h in range(8)
            ],
        }
    )


def _leaf_crossing_series(truth: Topology) -> list[tuple[Job, list[int], float]]:
    """tp 8 x dp 2k on 2k hosts alternating between the leaves (n0, n4, n1, n5, ...): every
    dp ring hop crosses the spine, 8k flows up each leaf's 32 links, k = 1..4."""
    samples = []
    for k in (1, 2, 3, 4):
        hosts = [h for i in range(k) for h in (i, 4 + i)]
        gpus = [8 * h + g for h in hosts for g in range(8)]
        for size in (1e7, 1e8, 1e9):
            job = Job(
                name=f"dp{2 * k}",
                tp=8,
                dp=2 * k,
                communication={"dp": Communication("all-reduce", size)},
            )
            samples.append((job, gpus, gpuplace.evaluate(truth, job, gpus).comm_seconds))
    return samples


def test_recovers_a_hashed_routing_from_several_node_counts() -> None:
    from gpuplace.calibrate import calibration, fitted_parameters

    truth = _two_leaves("ecmp", 2, spine_gbps=40.0)
    samples = _leaf_crossing_series(truth)
    # The spine starts as fast as the leaf (50 GB/s): a path takes the smaller figure, so
    # only lowering it moves a prediction (probed both ways, central differences).
    start = _two_leaves(spine_gbps=50.0)
    result = calibration(start, samples, host_count_factors=False)
    leaf = result.topology.levels[1]
    assert (leaf.routing, leaf.qps_per_connection) == ("ecmp", 2)
    assert result.topology.levels[2].bandwidth_gbps == pytest.approx(40.0, rel=1e-3)
    assert result.rms_after < 1e-3 < 0.05 < result.rms_before
    # Every candidate tried on the leaf (the only level the samples cross with uplinks), each
    # with its own refit: the balanced fabric cannot produce the falling share as the flows
    # grow, however slow its spine.
    tried = {(t.routing, t.qps_per_connection): t for t in result.routing}
    assert set(tried) == {("adaptive", 1), ("ecmp", 1), ("ecmp", 2), ("ecmp", 4), ("ecmp", 8)}
    assert {t.level for t in result.routing} == {"leaf"}
    assert [k for k, t in tried.items() if t.chosen] == [("ecmp", 2)]
    assert tried["adaptive", 1].rms_log_error > 10 * tried["ecmp", 2].rms_log_error
    rows = {p["parameter"]: p for p in fitted_parameters(start, result.topology)}
    assert rows["levels.leaf.routing"] == {
        "parameter": "levels.leaf.routing",
        "before": "adaptive",
        "after": "ecmp",
        "changed": True,
    }
    assert rows["levels.leaf.qps_per_connection"]["after"] == 2
    # Host levels and the top level have no routing to fit.
    assert "levels.node.routing" not in rows and "levels.spine.routing" not in rows
    # routing=False: the declared routing stays, and the fit is worse.
    fixed = calibration(start, samples, routing=False, host_count_factors=False)
    assert fixed.topology.levels[1].routing == "adaptive" and fixed.routing == []
    assert fixed.rms_after > 10 * result.rms_after
    # Samples inside one leaf do not depend on its routing: nothing is tried.
    inside = [s for s in samples if s[0].name == "dp2"]
    inside = [(j, list(range(16)), s) for j, _, s in inside]
    assert calibration(start, inside, host_count_factors=False).routing == []
    with pytest.raises(InvalidJob, match="routing"):
        calibration(start, samples, routing="maybe")  # type: ignore[arg-type]


SCALING = DATA / "nccl-tests" / "scaling"


OCI_GB200 = (
    ("all_reduce_perf-gb200-2nodes-4gpn-ib-ociquickstart.txt", 1, 2),
    ("all_reduce_perf-gb200-32nodes-4gpn-iborroce-ociquickstart.txt", 2, 16),
    ("all_reduce_perf-gb200-48nodes-4gpn-iborroce-ociquickstart.txt", 3, 16),
    ("alltoall_perf-gb200-2nodes-4gpn-ib-ociquickstart.txt", 1, 2),
    ("alltoall_perf-gb200-16nodes-4gpn-iborroce-ociquickstart.txt", 1, 16),
    ("alltoall_perf-gb200-32nodes-4gpn-iborroce-ociquickstart.txt", 2, 16),
    ("alltoall_perf-gb200-48nodes-4gpn-iborroce-ociquickstart.txt", 3, 16),
)


def test_calibrating_the_shared_oci_gb200_series_rules_out_ecmp_with_few_queue_pairs() -> None:
    """OCI GB200 all-reduce on 2, 32, 48 nodes and all-to-all on 2, 16, 32, 48 (one to three
    NVL72 racks; the source leaves InfiniBand or RoCE open). Described as RoCE (8 x 400G per
    tray) with ECMP and one queue pair, the fit finds the racks' uplinks balanced (adaptive,
    or ECMP spread over 4+ queue pairs, which prices the same here) and the fabric near
    InfiniBand's 4 x 400G per tray; all-reduce alone cannot tell them apart."""
    from gpuplace.calibrate import calibration

    def described(routing: str) -> Topology:
        doc = Topology.preset("gb200-nvl72", racks=3).to_dict()
        for lv in doc["levels"][2:]:
            lv["bandwidth_gbps"] = 100.0
        doc["levels"][1]["routing"] = routing
        return Topology.from_dict(doc)

    roce = described("ecmp")
    samples = {}
    for name, racks, per_rack in OCI_GB200:
        gpus = [r * 72 + t * 4 + g for r in range(racks) for t in range(per_rack) for g in range(4)]
        run = read_nccl_tests(SCALING / name, ranks=len(gpus))
        samples[name] = run.samples(roce, gpus, min_bytes=1 << 20)
    both = [s for rows in samples.values() for s in rows]
    result = calibration(roce, both, host_count_factors=False)
    tried = {(t.routing, t.qps_per_connection): t.rms_log_error for t in result.routing}
    assert {t.level for t in result.routing} == {"nvlink-domain"}
    assert result.topology.levels[1].routing == "adaptive"
    assert tried["adaptive", 1] < 0.5 * tried["ecmp", 1]
    assert tried["adaptive", 1] < 0.6 * tried["ecmp", 2]
    assert tried["ecmp", 4] == pytest.approx(tried["adaptive", 1], rel=0.02)
    assert result.rms_after < 0.06 < 0.2 < result.rms_before
    assert 45.0 < result.topology.levels[2].bandwidth_gbps < 70.0
    # All-reduce alone: the routings fit within 10 % of each other, so the declared one stays,
    # whichever it is (kept only on evidence).
    allreduce = [s for name, rows in samples.items() if "all_reduce" in name for s in rows]
    for routing in ("ecmp", "adaptive"):
        kept = calibration(described(routing), allreduce, host_count_factors=False)
        assert kept.topology.levels[1].routing == routing
        errors = [t.rms_log_error for t in kept.routing]
        assert max(errors) < 1.1 / 0.9 * min(errors)
