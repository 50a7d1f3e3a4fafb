"""A small slice of the solver comparison suite, as a test of correctness only: placements are
valid, confinement holds for the solvers that claim it, costs are finite. No timing is
asserted."""

from __future__ import annotations

import csv
import json
import math

import pytest
from gpuplace.cli import main
from gpuplace.sim.compare import (
    CLUSTERS,
    CONFINING_SOLVERS,
    JOBS,
    Instance,
    run_suite,
)

SLICE_CLUSTERS = {"h100-superpod-256", "gb200-nvl72-32", "pcie-cluster-32"}
SLICE_JOBS = {
    "train-8 (tp8)",
    "train-64 (tp8 pp4 dp2)",
    "moe-64 (tp2 ep8 dp4)",
    "traffic-32 (explicit matrix)",
}


@pytest.fixture(scope="module")
def report():
    instances = [
        Instance(cluster, occupancy, job)
        for cluster in CLUSTERS
        if cluster.label in SLICE_CLUSTERS
        for occupancy in (0.0, 0.85)
        for job in JOBS
        if job.label in SLICE_JOBS
    ]
    return run_suite(instances, seed=3)


def test_every_placement_is_valid_and_priced(report):
    placed = [r for r in report.results if r.status == "ok"]
    assert placed
    for r in placed:
        assert r.gpus_valid, f"{r.solver} on {r.instance}: a GPU twice or not free"
        assert r.comm_seconds is not None and math.isfinite(r.comm_seconds) and r.comm_seconds >= 0
        assert r.fabric_bytes is not None and math.isfinite(r.fabric_bytes)
        assert r.spine_bytes is not None and r.spine_bytes <= r.fabric_bytes + 1e-6
        assert r.ratio_to_best is not None
        if r.confinement_ok:
            # The best is the cheapest placement that keeps the job's rules.
            assert r.ratio_to_best >= 1 - 1e-12
        if r.solver in CONFINING_SOLVERS:
            assert r.confinement_ok, f"{r.solver} broke confinement on {r.instance}: {r.note}"
    for r in report.results:
        if r.status != "ok":
            assert r.note, "a skipped solver says why"


def test_a_solver_returning_too_few_gpus_is_refused_not_reported(report):
    """The 39-of-64 failure: a solver registered by another test (it returned the highest free
    GPU ids, all 39 of them on the 85 %-full PCIe cluster, for a 64-rank job) ran in the suite,
    which runs every registered solver. Test solvers no longer outlive their test (conftest),
    and the placement gate refuses such a placement whoever registered the solver."""
    import gpuplace
    import numpy as np

    @gpuplace.register_solver("test-highest-free", "test only: the highest free GPU ids")
    def highest(state, job, seed, time_limit):
        return gpuplace.SolveResult(gpus=np.flatnonzero(state.free_mask())[::-1][: job.gpus])

    pcie = next(c for c in CLUSTERS if c.label == "pcie-cluster-32")
    train64 = next(j for j in JOBS if j.label == "train-64 (tp8 pp4 dp2)")
    rows = run_suite(
        [Instance(pcie, 0.85, train64)], solver_names=["test-highest-free", "greedy"], seed=3
    ).results
    assert rows[0].free_gpus == 39
    assert rows[0].status == "invalid"
    assert "gives 39 GPUs for a job of 64 ranks" in rows[0].note
    assert rows[1].status == "infeasible"


def test_greedy_places_every_job_on_the_fresh_clusters(report):
    greedy = [r for r in report.results if r.solver == "greedy" and r.occupancy == 0]
    assert greedy and all(r.status == "ok" for r in greedy)


def test_summary_rows_are_geometric_means_at_least_one(report):
    for name, s in report.summary.items():
        if s["placed"] and name in CONFINING_SOLVERS:
            assert s["geomean_ratio_to_best"] >= 1 - 1e-12, name
    assert "slurm-tree" in report.greedy_vs


def test_the_best_of_an_instance_keeps_the_jobs_rules(report):
    """A placement that breaks confinement (a tp group split over hosts) may be cheaper than
    every valid one; the ratios are to the best valid placement, so that one is at 1."""
    by_instance: dict = {}
    for r in report.results:
        if r.status == "ok":
            by_instance.setdefault(r.instance, []).append(r)
    for rows in by_instance.values():
        valid = [r for r in rows if r.confinement_ok]
        if valid:
            assert min(r.ratio_to_best for r in valid) == pytest.approx(1.0)


def test_files_round_trip(report, tmp_path):
    csv_path, json_path = report.write(tmp_path)
    with csv_path.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(report.results)
    document = json.loads(json_path.read_text(encoding="utf-8"))
    assert set(document["summary"]) == set(report.solvers)


def test_cli_runs_a_quick_slice_and_rejects_unknown_solvers(tmp_path, capsys):
    assert main(["bench", "--quick", "--solvers", "greedy,slurm-tree", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "compare.csv").exists() and (tmp_path / "compare.json").exists()
    assert "summary" in capsys.readouterr().out
    assert main(["bench", "--quick", "--solvers", "greedy,nonesuch"]) == 2
    assert "unknown solver 'nonesuch'" in capsys.readouterr().err
