"""Failures as operators live them in the simulator: checkpoint writes priced from the
checkpoint's size over the path to its store, restart times drawn from a distribution,
requeued jobs that wait for capacity in their place, and degraded hardware that stays in its
jobs until it is noticed (by hand, or at the next health ingest)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gpuplace import InvalidJob, Topology
from gpuplace.sim import metrics
from gpuplace.sim.engine import (
    CHECKPOINT_BYTES_PER_PARAMETER,
    CHECKPOINT_GBPS_PER_GPU,
    SimConfig,
    _Simulator,
    simulate,
)
from gpuplace.sim.failures import Cause, FailureModel
from gpuplace.sim.traces import MODELS, SimJob, Workload


def _fixed(events: list[tuple[float, Cause, int]]) -> FailureModel:
    """A failure model whose draw is exactly ``events`` (time, cause, component index)."""
    model = FailureModel("fixed", tuple({e[1] for e in events}))
    object.__setattr__(model, "draw", lambda counts, horizon, seed: events)
    return model


def test_checkpoint_writes_stall_the_job_by_their_size_over_the_path_to_the_store() -> None:
    topology = Topology.preset("h100-superpod", nodes=64)
    gpus = topology.num_gpus
    params = {name: MODELS[name].parameters for name in ("llama2-13b", "llama3-70b")}
    store_gbps = CHECKPOINT_GBPS_PER_GPU * gpus  # 62.5 GB/s for 512 GPUs
    results = {}
    for name in params:
        job = SimJob("j", 0.0, 16, 3600.0, tp=8, model=name)
        results[name] = simulate(topology, Workload("w", (job,)))
    for name, result in results.items():
        record = result.records[0]
        # Two hosts write half the checkpoint each, at half the store's bandwidth each (the
        # store serves a job's hosts equally; a host's NICs are faster than that).
        write_s = CHECKPOINT_BYTES_PER_PARAMETER * params[name] / 2 / (store_gbps / 2 * 1e9)
        # One checkpoint per 1,800 s of work: 3,600 s of work stall twice.
        assert record.finish == pytest.approx(3600.0 + 2 * write_s, rel=1e-6), name
        assert record.checkpoint_gpu_s == pytest.approx(16 * 2 * write_s, rel=1e-6)
        # Stalled time is not progress: ETTR leaves it out.
        assert record.ettr == pytest.approx(3600.0 / (3600.0 + 2 * write_s), rel=1e-6)
        summary = metrics.summary(result)
        assert summary["checkpoint_gpu_hours"] == pytest.approx(32 * write_s / 3600, rel=1e-6)
        assert summary["checkpoint_store"] == "remote"
    # A model five times larger stalls five times longer.
    stall = {n: r.records[0].checkpoint_gpu_s for n, r in results.items()}
    assert stall["llama3-70b"] / stall["llama2-13b"] == pytest.approx(70 / 13, rel=1e-6)
    # The old model, checkpoints free to write, is one option away.
    free = simulate(
        topology,
        Workload("w", (SimJob("j", 0.0, 16, 3600.0, tp=8, model="llama2-13b"),)),
        SimConfig(checkpoint_store=None),
    ).records[0]
    assert free.finish == pytest.approx(3600.0) and free.checkpoint_gpu_s == 0.0


def test_a_store_of_the_topology_prices_the_checkpoints_and_an_unknown_one_is_refused() -> None:
    doc = Topology.preset("h100-superpod", nodes=8).to_dict()
    doc["stores"] = {"slow": {"attach": "remote", "read_gbps": 5, "write_gbps": 5}}
    topology = Topology.from_dict(doc)
    job = SimJob("j", 0.0, 8, 3600.0, tp=8, model="llama2-13b")
    record = simulate(topology, Workload("w", (job,)), SimConfig(checkpoint_store="slow"))
    write_s = CHECKPOINT_BYTES_PER_PARAMETER * MODELS["llama2-13b"].parameters / 5e9
    assert record.records[0].finish == pytest.approx(3600.0 + 2 * write_s, rel=1e-6)
    # Lost work is counted from the last *complete* checkpoint: one every 1,800 s plus its
    # write. A failure just after the first checkpoint was written keeps it.
    gpu = Cause("gpu", "gpu", 0.0, 100.0)
    t = 1800.0 + write_s + 10.0
    config = SimConfig(checkpoint_store="slow", restart_sigma=0.0, failures=_fixed([(t, gpu, 0)]))
    hit = simulate(topology, Workload("w", (job,)), config).records[0]
    assert hit.restarts == 1
    assert hit.lost_gpu_s == {"gpu": pytest.approx(8 * (10.0 + 300.0))}
    with pytest.raises(InvalidJob, match="checkpoint_store 'tape': not a store"):
        simulate(topology, Workload("w", (job,)), SimConfig(checkpoint_store="tape"))


def test_restart_times_are_lognormal_around_the_mean_and_seeded() -> None:
    topology = Topology.preset("h100-superpod", nodes=1)
    workload = Workload("w", (SimJob("j", 0.0, 8, 10.0, tp=8, model="none"),))

    def draws(seed: int, sigma: float) -> np.ndarray:
        sim = _Simulator(
            topology,
            workload,
            SimConfig(seed=seed, restart_s=300.0, restart_sigma=sigma),
            None,
        )
        return np.array([sim._restart_cost() for _ in range(4000)])

    a, b = draws(3, 0.5), draws(3, 0.5)
    assert (a == b).all()  # reproducible for a seed
    assert not (a == draws(4, 0.5)).all()
    assert a.mean() == pytest.approx(300.0, rel=0.03)
    # Lognormal: the median is exp(-sigma^2 / 2) of the mean, the log's spread is sigma.
    assert np.median(a) == pytest.approx(300.0 * np.exp(-0.125), rel=0.04)
    assert np.log(a).std() == pytest.approx(0.5, rel=0.05)
    assert (draws(3, 0.0) == 300.0).all()
    with pytest.raises(InvalidJob, match="restart_sigma"):
        SimConfig(restart_sigma=-1.0).validate()
    with pytest.raises(InvalidJob, match="health_ingest_s"):
        SimConfig(health_ingest_s=0.0).validate()


def test_a_requeued_job_waits_for_capacity_in_its_place() -> None:
    # 16 GPUs; the victim holds them all when GPU 0 fails for an hour at 5,000 s. Requeued, it
    # cannot start again until the GPU is back; the job behind it (FIFO, submitted later)
    # waits behind it, not in front.
    topology = Topology.preset("h100-superpod", nodes=2)
    victim = SimJob("victim", 0.0, 16, 20_000.0, tp=8, model="none")
    later = SimJob("later", 10.0, 8, 1000.0, tp=8, model="none")
    config = SimConfig(
        response="requeue",
        failures=_fixed([(5000.0, Cause("gpu", "gpu", 0.0, 3600.0), 0)]),
        checkpoint_interval_s=1800.0,
        restart_s=300.0,
        restart_sigma=0.0,
        checkpoint_store=None,
        check=True,
    )
    records = {
        r.job.name: r for r in simulate(topology, Workload("w", (victim, later)), config).records
    }
    v, late = records["victim"], records["later"]
    assert v.restarts == 1 and v.interruptions == {"gpu": 1}
    # Back at 8,600 s (the GPU repaired), then 300 s of restart and the 20,000 - 3,600 s of
    # work left after its last checkpoint (3,600 s).
    assert v.finish == pytest.approx(8600.0 + 300.0 + 20_000.0 - 3600.0)
    # The 8 healthy GPUs left sat idle: "later" did not jump the queue.
    assert late.first_start == pytest.approx(v.finish)
    # Lost: the work since the checkpoint and the restart; the wait is not work lost, but it
    # is not progress either (ETTR).
    assert sum(v.lost_gpu_s.values()) == pytest.approx(16 * (5000.0 - 3600.0 + 300.0))
    assert v.ettr == pytest.approx((20_000.0) / (v.finish - 0.0))


def test_cli_options_reach_the_run_and_the_example_failures_load(tmp_path, capsys) -> None:
    from pathlib import Path

    from gpuplace.cli import main
    from gpuplace.sim.failures import load_failures

    code = main(
        [
            "simulate", "-c", "h100-superpod", "--nodes", "4", "--trace", "llm-mix",
            "--jobs", "12", "--failures", "llama3", "--response", "repair", "--evacuate",
            "--health-ingest", "300", "--restart-sigma", "0", "--checkpoint-store", "none",
            "--format", "json",
        ]
    )  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out)["greedy"]
    assert summary["health_ingest_s"] == 300.0 and summary["restart_sigma"] == 0.0
    assert summary["checkpoint_store"] is None and summary["checkpoint_gpu_hours"] == 0.0
    assert summary["evacuate"] is True and summary["detect_s"] == 4 * 3600.0
    assert main(["simulate", "-c", "h100-superpod", "--nodes", "4", "--trace", "llm-mix",
                 "--jobs", "4", "--checkpoint-store", "tape", "--format", "json"]) == 2  # fmt: skip
    assert "checkpoint_store 'tape': not a store" in capsys.readouterr().out
    example = Path(__file__).parent.parent / "examples" / "failures-lossy-links.yaml"
    model = load_failures(str(example))
    lossy = {c.name: c for c in model.causes}["link-degraded"]
    assert lossy.loss == 0.1 and lossy.repair_s == 12 * 3600.0
