"""Jobs: rank layout, transformer byte formulas, the job file form and traffic matrices."""

from __future__ import annotations

from dataclasses import replace

import gpuplace
import numpy as np
import pytest
import yaml
from gpuplace import Communication, Job, TransformerModel
from gpuplace.model.step import StepOptions
from hypothesis import given
from hypothesis import strategies as st
from strategies import jobs, topologies


def test_megatron_rank_order_tp_fastest_pp_slowest():
    job = Job(name="j", tp=2, dp=2, pp=2)
    assert job.gpus == 8
    assert job.rank_groups("tp").tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert job.rank_groups("dp").tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert job.rank_groups("pp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert job.rank_groups("cp").tolist() == [[r] for r in range(8)]


def test_custom_rank_order():
    job = Job(name="j", tp=2, dp=2, pp=2, rank_order=("tp", "pp", "dp", "cp", "ep"))
    assert job.rank_groups("pp").tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert job.rank_groups("dp").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_the_compiled_job_is_read_from_the_core():
    """Groups, pipeline pairs, class names and coordinates come from the core's compilation
    of the declaration, and agree with the rank layout the job reports."""
    topo = gpuplace.Topology.preset("h100-superpod", nodes=4)
    job = Job(
        name="j",
        tp=2,
        dp=2,
        pp=4,
        communication={
            "tp": Communication("all-reduce", 1e6),
            "pp": Communication("p2p", 1e5, 2),
        },
    )
    spec = job.compile(topo)
    assert spec.class_names == job.class_names() == ["pp p2p", "tp all-reduce"]
    pipelines = job.rank_groups("pp")
    pairs = spec.class_groups(0)
    expected = np.stack([pipelines[:, :-1], pipelines[:, 1:]], axis=-1).reshape(-1, 2)
    assert pairs.tolist() == expected.tolist()
    assert spec.class_groups(1).tolist() == job.rank_groups("tp").tolist()
    coords = spec.coordinates()
    for i, dim in enumerate(job.rank_order):
        for group in job.rank_groups(dim):
            assert len(set(coords[group, i].tolist())) == len(group)
    assert [k.label for k in gpuplace._core.CollectiveKind.members()] == list(
        gpuplace.model.job.KINDS
    )
    with pytest.raises(gpuplace.Infeasible, match="needs 64 GPUs but the cluster has only 32"):
        Job(name="big", dp=64).compile(topo)


@given(st.data())
def test_rank_groups_partition_the_ranks(data):
    topology = data.draw(topologies)
    job = data.draw(jobs(topology))
    if job.traffic is not None:
        return
    for dim, degree in job.degrees.items():
        groups = job.rank_groups(dim)
        assert groups.shape == (job.gpus // degree, degree)
        assert sorted(groups.reshape(-1).tolist()) == list(range(job.gpus))


SMALL = TransformerModel(
    parameters=1e9,
    layers=8,
    hidden_size=1024,
    sequence_length=2048,
    micro_batch_size=2,
    micro_batches=4,
    bytes_per_element=2,
    moe_top_k=2,
)


def test_transformer_byte_formulas_for_a_small_model():
    comm = SMALL.communication(tp=2, cp=2, ep=2, dp=2, pp=2)
    # b=2, s=2048, h=1024, e=2 bytes, L=8, m=4, P=1e9.
    activation = 2 * (2048 / 2) * 1024 * 2  # b * s/cp * h * e = 4 MiB
    assert activation == 4194304
    layers_per_stage = 8 / 2
    assert comm["tp"] == Communication("all-reduce", 4194304, 4 * layers_per_stage * 4)
    assert comm["cp"] == Communication("all-gather", 2 * 2 * 2048 * 1024 * 2 / 2, 2 * 4 * 4)
    assert comm["ep"] == Communication("all-to-all", 4194304 * 2, 4 * 4 * 4)
    assert comm["pp"] == Communication("p2p", 4194304 / 2, 2 * 4)
    assert comm["dp"] == Communication("all-reduce", 1e9 * 2 / (2 * 2), 1)
    # Concrete numbers, for a reader checking by hand.
    assert comm["tp"].count == 64 and comm["cp"].bytes == 8388608
    assert comm["pp"].bytes == 2097152 and comm["dp"].bytes == 5e8


def test_transformer_grad_bytes_and_unused_dimensions():
    model = TransformerModel(
        parameters=7e9, layers=32, hidden_size=4096, sequence_length=4096, grad_bytes_per_element=4
    )
    comm = model.communication(tp=8, cp=1, ep=1, dp=4, pp=1)
    assert set(comm) == {"tp", "dp"}
    assert comm["dp"].bytes == 7e9 * 4 / 8
    assert comm["tp"] == Communication("all-reduce", 1 * 4096 * 4096 * 2, 4 * 32 * 1)


def test_explicit_communication_wins_over_the_model():
    job = Job(
        name="j",
        tp=2,
        dp=2,
        model=SMALL,
        communication={"dp": Communication("reduce-scatter", 123.0, 2)},
    )
    resolved = job.resolved_communication()
    assert resolved["dp"] == Communication("reduce-scatter", 123.0, 2)
    assert resolved["tp"] == SMALL.communication(2, 1, 1, 2, 1)["tp"]
    # Dimensions of degree 1 carry no traffic even when given.
    job = Job(name="j", tp=2, communication={"dp": Communication("all-reduce", 1.0)})
    assert job.resolved_communication() == {}
    assert job.class_names() == []


def test_job_file_round_trip(tmp_path):
    document = {
        "name": "llama",
        "parallelism": {"tp": 8, "pp": 4, "dp": 2},
        "rank_order": ["tp", "cp", "pp", "ep", "dp"],
        "model": {
            "parameters": 7e9,
            "layers": 32,
            "hidden_size": 4096,
            "sequence_length": 4096,
            "micro_batches": 8,
        },
        "communication": {"dp": {"kind": "all-reduce", "bytes": 1e9, "count": 1}},
        "constraints": {"confine": {"tp": "nvlink_domain", "pp": "leaf"}, "max_span": "spine"},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    job = Job.load(path)
    assert (job.tp, job.pp, job.dp, job.gpus) == (8, 4, 2, 64)
    assert job.rank_order == ("tp", "cp", "pp", "ep", "dp")
    assert job.model is not None and job.model.micro_batches == 8
    assert job.confine == {"tp": "nvlink_domain", "pp": "leaf"}
    assert job.max_span == "spine"
    again = Job.from_dict(job.to_dict())
    assert again.to_dict() == job.to_dict()
    assert again.resolved_communication() == job.resolved_communication()


def test_traffic_matrix_forms_agree():
    dense = np.zeros((4, 4))
    dense[0, 1] = 5e6
    dense[2, 3] = 7e6
    dense[3, 3] = 1e9  # self traffic is dropped
    a = Job.from_traffic("t", dense)
    assert a.gpus == 4 and a.confine == {}
    assert sorted(map(tuple, a.traffic.tolist())) == [(0, 1, 5e6), (2, 3, 7e6)]
    b = Job.from_traffic("t", [[0, 1, 5e6], [2, 3, 7e6]], ranks=4)
    assert b.traffic.tolist() == a.traffic.tolist()
    scipy_sparse = pytest.importorskip("scipy.sparse")
    c = Job.from_traffic("t", scipy_sparse.csr_matrix(dense))
    assert sorted(map(tuple, c.traffic.tolist())) == [(0, 1, 5e6), (2, 3, 7e6)]
    d = Job.from_dict({"name": "t", "traffic": {"matrix": dense.tolist()}})
    assert sorted(map(tuple, d.traffic.tolist())) == [(0, 1, 5e6), (2, 3, 7e6)]
    e = Job.from_dict(d.to_dict())
    assert e.traffic.tolist() == d.traffic.tolist() and e.gpus == 4


def test_traffic_job_cost_is_the_quadratic_assignment_sum():
    topo = gpuplace.Topology.preset("h100-superpod", nodes=64)
    job = Job.from_traffic("t", [[0, 1, 5e9], [1, 2, 1e9], [2, 0, 2e9]], ranks=3)
    report = gpuplace.evaluate(topo, job, [0, 1, 8])
    # 0->1 inside dgx001 (370.8 GB/s); 1->2 and 2->0 cross the leaf (50 GB/s). No latency term.
    expected = 5e9 / 370.8e9 + 1e9 / 50e9 + 2e9 / 50e9
    assert report.traffic_seconds == pytest.approx(expected, rel=1e-12)
    assert report.comm_seconds == pytest.approx(expected, rel=1e-12)
    assert report.class_seconds == {}
    assert report.bytes_by_level["node"] == pytest.approx(5e9)
    assert report.bytes_by_level["leaf"] == pytest.approx(3e9)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tp": 0},
        {"tp": -1},
        {"tp": 2.5},
        {"rank_order": ("tp", "dp")},
        {"communication": {"xx": Communication("all-reduce", 1)}},
        {"communication": {"tp": Communication("broadcast", 1)}},
        {"confine": {"zz": "node"}},
        {"tp": 2, "traffic": np.zeros((0, 3)), "traffic_ranks": 2},
        {"name": ""},
    ],
)
def test_bad_job_arguments_raise_invalid_job(kwargs):
    kwargs = {"name": "j", **kwargs}
    with pytest.raises(gpuplace.InvalidJob):
        Job(**kwargs)


def test_unknown_levels_are_reported_when_the_job_meets_a_topology():
    topo = gpuplace.Topology.preset("dgx-h100")
    job = Job(name="j", tp=2, confine={"tp": "rack"})
    with pytest.raises(gpuplace.InvalidJob, match="rack"):
        gpuplace.place(gpuplace.ClusterState(topo), job)
    with pytest.raises(gpuplace.InvalidJob, match="max_span"):
        gpuplace.evaluate(topo, Job(name="j", max_span="galaxy"), [0])


def test_jobs_of_one_shape_share_their_compiled_arrays():
    """The compiled job holds no name: jobs declaring the same layout, communication, model
    and constraints share one compiled job per topology, and any difference in what the core
    reads compiles apart, with the same outcome as compiling alone."""
    topo = gpuplace.Topology.preset("h100-superpod", nodes=4)
    other = gpuplace.Topology.preset("h100-superpod", nodes=4)
    model = gpuplace.TransformerModel(
        parameters=7e9, layers=32, hidden_size=4096, sequence_length=4096
    )
    a = Job(name="a", tp=2, dp=2, model=model)
    b = Job(name="b", tp=2, dp=2, model=model)
    assert b.compile(topo) is a.compile(topo)
    assert b.compile(other) is not a.compile(topo)
    # What the core reads differs: compiled apart, each as it compiles alone.
    for changed in (
        Job(name="c", tp=2, dp=2),
        Job(name="c", tp=2, dp=2, model=replace(model, micro_batches=2)),
        Job(name="c", tp=2, dp=2, model=model, confine={}),
        Job(name="c", dp=2, tp=2, model=model, rank_order=("dp", "tp", "cp", "ep", "pp")),
        Job(name="c", tp=2, dp=2, model=model, step=StepOptions(overlap={"tp": 0.5})),
    ):
        spec = changed.compile(topo)
        assert spec is not a.compile(topo)
        alone = changed._compile(topo)
        assert spec.class_names == alone.class_names
        assert spec.coordinates().tolist() == alone.coordinates().tolist()
        gpus = np.arange(4, dtype=np.int64)
        shared, own = (
            gpuplace._core.evaluate(topo._core, s, gpus, None, None) for s in (spec, alone)
        )
        assert (shared.comm_seconds, shared.step_seconds) == (own.comm_seconds, own.step_seconds)
    # 2.0 passes the job's checks but not the core's: not taken for 2 from the cache.
    with pytest.raises(TypeError):
        Job(name="d", tp=2.0, dp=2, model=model).compile(topo)
    # A failed compilation caches nothing and names its own job.
    with pytest.raises(gpuplace.Infeasible, match="needs 64 GPUs"):
        Job(name="big1", dp=64).compile(topo)
    with pytest.raises(gpuplace.Infeasible, match="needs 64 GPUs"):
        Job(name="big2", dp=64).compile(topo)
