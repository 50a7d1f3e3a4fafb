"""Heterogeneous clusters: each job runs at the peak of the GPUs it got, and MFU never
exceeds 100 %."""

from __future__ import annotations

import numpy as np
import pytest
from gpuplace import Topology
from gpuplace.errors import InvalidState
from gpuplace.sim import engine, metrics
from gpuplace.sim.clusters import pai
from gpuplace.sim.engine import (
    SimConfig,
    SimResult,
    cluster_peak_flops,
    reference_gpus,
    simulate,
)
from gpuplace.sim.speed import Speed
from gpuplace.sim.traces import openb


@pytest.fixture(scope="module")
def pai_run() -> tuple[Topology, SimResult]:
    topology = pai()
    # Placed at random, the jobs land on every GPU type.
    # Checkpoints free to write, so that a job's speed is its GPU's peak alone.
    config = SimConfig(solver="random", check=True, checkpoint_store=None)
    result = simulate(topology, openb().head(1500), config)
    return topology, result


def test_jobs_run_at_the_peak_of_the_gpus_they_got(pai_run) -> None:
    topology, result = pai_run
    # Work is the runtime on the cluster's most common peak (P100 and the P100-class MISC
    # machines: 3,836 of 6,742 GPUs); a one-GPU job computes only, so its speed is the ratio
    # of its GPU's peak to that one.
    typical = reference_gpus(topology)
    assert typical is not None and int(typical.sum()) == 1596 + 2240
    ratios = {1.0, 65 / 21.2, 125 / 21.2}
    seen = set()
    for record in result.records:
        if record.job.gpus != 1 or record.finish is None or record.restarts:
            continue
        assert record.first_start is not None
        speed = record.job.work_s / (record.finish - record.first_start)
        match = min(ratios, key=lambda r: abs(r - speed))
        assert speed == pytest.approx(match, rel=1e-6)
        seen.add(match)
    assert len(seen) >= 2  # more than one GPU type, each at its own speed


def test_mfu_never_exceeds_100_percent_on_a_heterogeneous_cluster(pai_run) -> None:
    topology, result = pai_run
    rows = metrics.job_rows(result)
    mfu = np.array([row["mfu"] for row in rows if row["mfu"] is not None])
    assert mfu.size > 1000 and mfu.max() <= 1.0
    summary = metrics.summary(result)
    assert 0 < summary["mfu"] <= 1.0
    # The cluster's peak counts each GPU at its own type's peak (T4 65, P100 and MISC 21.2,
    # V100 125 TFLOPS), not the first type's.
    expected = (994 * 65 + (1596 + 2240) * 21.2 + (1080 + 832) * 125) / 6742 * 1e12
    assert cluster_peak_flops(topology) == pytest.approx(expected)


def test_a_speed_above_the_gpus_peak_is_an_error(monkeypatch) -> None:
    real = engine.job_speed

    def too_fast(report, profile) -> Speed:
        speed = real(report, profile)
        return Speed(speed.speed * 2, speed.step_seconds / 2, 1.2)

    monkeypatch.setattr(engine, "job_speed", too_fast)
    with pytest.raises(InvalidState, match=r"MFU 120\.0% .* above 100 %"):
        simulate(pai(), openb().head(5), SimConfig())
