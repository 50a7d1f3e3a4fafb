"""Storage and data locality: stores in the topology, jobs' dataset and checkpoint traffic
priced over the path, and placement moving next to the data when that pays."""

from __future__ import annotations

import json

import gpuplace
import pytest
from gpuplace.cli import main
from gpuplace.cluster.storage import io_seconds
from gpuplace.model.job import TransformerModel
from gpuplace.model.storage import DataAccess


def _cluster() -> gpuplace.Topology:
    """8 hosts of 8 GPUs, 2 per leaf; a storage node on leaf l3, local NVMe, a remote store."""
    return gpuplace.Topology.from_dict(
        {
            "format": "gpuplace.topology/1",
            "name": "stored",
            "levels": [
                {"name": "node", "bandwidth_gbps": 450, "latency_us": 1},
                {"name": "leaf", "bandwidth_gbps": 50, "latency_us": 2},
                {"name": "spine", "bandwidth_gbps": 25, "latency_us": 3},
            ],
            "node_types": {"box": {"gpus": 8}},
            "nodes": [
                {"name": f"n{h}", "type": "box", "domains": {"leaf": f"l{h // 2}", "spine": "s"}}
                for h in range(8)
            ],
            "stores": {
                "lake": {"attach": "leaf:l3", "read_gbps": 2000, "write_gbps": 1000},
                "nvme": {"attach": "local", "read_gbps": 25, "write_gbps": 12},
                "s3": {"attach": "remote", "read_gbps": 100, "write_gbps": 100},
            },
        }
    )


def _reader(store: str = "lake", name: str = "reader") -> gpuplace.Job:
    return gpuplace.Job(
        name=name,
        tp=8,
        data=DataAccess(
            store=store,
            input_bytes_per_step=40e9,
            checkpoint_store="s3",
            checkpoint_bytes=800e9,
            checkpoint_interval_steps=100,
        ),
    )


def test_stores_and_data_round_trip() -> None:
    t = _cluster()
    assert gpuplace.Topology.from_dict(t.to_dict()).stores == t.stores
    job = _reader()
    assert gpuplace.Job.from_dict(job.to_dict()).data == job.data


def test_io_is_priced_over_the_path_to_the_store() -> None:
    t = _cluster()
    state = gpuplace.ClusterState(t)
    near, far = t.host_gpus("n6"), t.host_gpus("n0")
    lake_only = gpuplace.Job(
        name="j", tp=8, data=DataAccess(store="lake", input_bytes_per_step=40e9)
    )
    # Near: 8 GPUs x 50 GB/s to the leaf; far: 8 x 25 GB/s across the spine.
    assert io_seconds(state, lake_only, near) == pytest.approx(40e9 / 400e9)
    assert io_seconds(state, lake_only, far) == pytest.approx(40e9 / 200e9)
    nvme = gpuplace.Job(name="j", tp=8, data=DataAccess(store="nvme", input_bytes_per_step=40e9))
    assert io_seconds(state, nvme, far) == pytest.approx(40e9 / 25e9)
    # Checkpoints: 800 GB every 100 steps to a 100 GB/s remote store.
    report = gpuplace.evaluate(t, _reader(), near)
    assert report.io_seconds == pytest.approx(40e9 / 400e9 + 8e9 / 100e9)


def test_unknown_store_is_refused_naming_it() -> None:
    t = _cluster()
    with pytest.raises(gpuplace.InvalidJob, match="unknown store 'tape'"):
        gpuplace.evaluate(t, _reader("tape"), t.host_gpus("n0"))


def test_placement_moves_next_to_its_data_when_that_pays() -> None:
    t = _cluster()
    state = gpuplace.ClusterState(t)
    state.allocate(name="other", gpus=t.host_gpus("n0"))  # l0 is now the tightest fit
    blind = gpuplace.place(state, gpuplace.Job(name="blind", tp=8))
    assert blind.nodes == ["n1"]
    placed = gpuplace.place(state, _reader())
    assert placed.nodes[0] in ("n6", "n7")
    assert placed.cost.io_seconds < gpuplace.evaluate(t, _reader(), blind.gpus).io_seconds


def test_cli_job_moves_next_to_its_data(tmp_path, capsys) -> None:
    topo = tmp_path / "stored.yaml"
    _cluster().save(topo)
    job = tmp_path / "reader.yaml"
    job.write_text(
        "name: reader\nparallelism: {tp: 8}\ndata: {store: lake, input_bytes_per_step: 40e9}\n"
    )
    filler = tmp_path / "filler.yaml"
    filler.write_text("name: filler\nparallelism: {tp: 8}\n")
    state = str(tmp_path / "state.json")
    assert main(["place", "-c", str(topo), "-j", str(filler), "--state", state]) == 0
    capsys.readouterr()
    assert (
        main(["place", "-c", str(topo), "-j", str(job), "--state", state, "--format", "json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["nodes"][0] in ("n6", "n7")
    assert out["cost"]["io_seconds"] == pytest.approx(40e9 / 400e9)


def test_a_running_job_storage_traffic_loads_the_fabric_and_survives_a_state_file() -> None:
    from gpuplace import _core

    t = _cluster()
    state = gpuplace.ClusterState(t)
    far = t.host_gpus("n0")
    job = _reader()
    state.allocate(gpuplace.Placement(job, t, far, gpuplace.evaluate(t, job, far), "x", 0))
    state.check()
    load = _core.fabric_load(state._core)
    # 8 GPUs x 25 GB/s from the storage node on l3 into n0; checkpoints out to the remote store.
    hot = {row["uplink"] for row in state.hottest_uplinks(10)}
    assert {"leaf:l0", "leaf:l3", "node:n0"} <= hot
    again = gpuplace.ClusterState.restore(t, state.snapshot())
    again.check()
    assert (_core.fabric_load(again._core) == load).all()
    state.release("reader")
    assert not state.hottest_uplinks(10)


def _h100_cluster(oversubscription: float | None = None) -> gpuplace.Topology:
    """_cluster() with H100 hosts (a known GPU peak), so that jobs with a model get a step."""
    doc = _cluster().to_dict()
    for node_type in doc["node_types"].values():
        node_type["gpu_model"] = "H100-SXM5-80GB"
    if oversubscription is not None:
        for level in doc["levels"]:
            if level["name"] == "leaf":
                level["oversubscription"] = oversubscription
    return gpuplace.Topology.from_dict(doc)


#: 8B parameters, 4 x 8k tokens per step: about a third of a second of compute on 8 H100s.
_SMALL = TransformerModel(
    parameters=8e9, layers=32, hidden_size=4096, sequence_length=8192, micro_batches=4
)


def _trainer(read_bytes: float, *, name: str = "trainer", store: str = "lake") -> gpuplace.Job:
    return gpuplace.Job(
        name=name,
        tp=8,
        model=_SMALL,
        data=DataAccess(store=store, input_bytes_per_step=read_bytes),
    )


def test_reads_hide_under_the_step_and_mfu_falls_once_they_exceed_it() -> None:
    t = _h100_cluster()
    near, far = t.host_gpus("n6"), t.host_gpus("n0")
    plain = gpuplace.evaluate(t, gpuplace.Job(name="plain", tp=8, model=_SMALL), far)
    assert plain.step_seconds is not None and plain.mfu is not None
    base, mfu = plain.step_seconds, plain.mfu
    # Reads shorter than the step are prefetched under it (a data loader's workers): the
    # step, and MFU, are those of the job without data, near or far.
    hidden = base / 2
    for gpus, rate in ((near, 400e9), (far, 200e9)):
        report = gpuplace.evaluate(t, _trainer(hidden * rate), gpus)
        assert report.io_seconds == pytest.approx(hidden)
        assert report.step_seconds == pytest.approx(base)
        assert report.mfu == pytest.approx(mfu)
        assert report.step_details["input_stall_seconds"] == pytest.approx(0.0)
    # 4 s of reads a step (800 GB at 200 GB/s): the step waits 4 s for its data and MFU
    # falls by the same factor; no longer the compute-bound MFU.
    slow = gpuplace.evaluate(t, _trainer(800e9), far)
    assert slow.io_seconds == pytest.approx(4.0)
    assert slow.step_seconds == pytest.approx(4.0)
    assert slow.input_seconds == pytest.approx(4.0)
    assert slow.step_details["input_stall_seconds"] == pytest.approx(4.0 - base)
    assert slow.mfu == pytest.approx(mfu * base / 4.0)
    assert slow.tokens_per_second == pytest.approx(plain.tokens_per_second * base / 4.0)


def test_checkpoint_writes_stall_the_step_amortized_over_the_interval() -> None:
    t = _h100_cluster()
    gpus = t.host_gpus("n0")
    plain = gpuplace.evaluate(t, gpuplace.Job(name="plain", tp=8, model=_SMALL), gpus)
    # 112 GB (8B parameters x 14 bytes) every 100 steps to the 100 GB/s remote store:
    # 1.12 s a checkpoint, 11.2 ms a step.
    job = gpuplace.Job(
        name="saver",
        tp=8,
        model=_SMALL,
        data=DataAccess(
            checkpoint_store="s3", checkpoint_bytes=112e9, checkpoint_interval_steps=100
        ),
    )
    report = gpuplace.evaluate(t, job, gpus)
    assert report.checkpoint_seconds == pytest.approx(112e9 / 100e9 / 100)
    assert report.step_seconds == pytest.approx(plain.step_seconds + 112e9 / 100e9 / 100)
    assert report.mfu < plain.mfu


def test_near_the_data_wins_when_reads_dominate() -> None:
    t = _h100_cluster()
    state = gpuplace.ClusterState(t)
    state.allocate(name="other", gpus=t.host_gpus("n0"))  # l0 is now the tightest fit
    reader = _trainer(600e9)
    placed = gpuplace.place(state, reader)
    assert placed.nodes[0] in ("n6", "n7")
    far = gpuplace.evaluate(t, reader, t.host_gpus("n1"), state=state)
    # Near: 1.5 s of reads a step (8 x 50 GB/s); far: 3 s (8 x 25 GB/s across the spine).
    assert placed.cost.step_seconds == pytest.approx(600e9 / 400e9)
    assert far.step_seconds == pytest.approx(600e9 / 200e9)
    assert placed.cost.mfu == pytest.approx(2 * far.mfu)


def test_a_jobs_own_reads_meet_an_oversubscribed_uplink_on_an_idle_fabric() -> None:
    # Two hosts of leaf l0 read from the storage node on l3; on a 4:1 leaf the job's own
    # flows share l0's uplink, with nobody else on the fabric.
    flat, over = _h100_cluster(), _h100_cluster(oversubscription=4)
    job = gpuplace.Job(
        name="wide", tp=8, dp=2, data=DataAccess(store="lake", input_bytes_per_step=160e9)
    )
    gpus = [*flat.host_gpus("n0"), *flat.host_gpus("n1")]
    t_flat = gpuplace.evaluate(flat, job, gpus).io_seconds
    t_over = gpuplace.evaluate(over, job, gpus).io_seconds
    assert t_flat == pytest.approx(80e9 / 200e9)
    assert t_over == pytest.approx(4 * t_flat)
