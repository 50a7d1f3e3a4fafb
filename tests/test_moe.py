"""Mixtures of experts: expert weights split over the ep ranks in the gradient all-reduce, the
``ep`` column of workload files, and MoE jobs in the synthetic LLM mix."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuplace import Job, Topology
from gpuplace.errors import InvalidJob
from gpuplace.model.job import TransformerModel
from gpuplace.sim.engine import simulate
from gpuplace.sim.traces import MODELS, job_template, llm_mix, llm_moe_layout, load_workload
from hypothesis import given
from hypothesis import strategies as st

MIXTRAL = MODELS["mixtral-8x7b"]
DEEPSEEK = MODELS["deepseek-v3"]


def test_expert_weights_follow_from_total_and_active_parameters():
    # Mixtral 8x7B: about 1.6B shared weights (attention, embeddings), the rest in 8 experts.
    assert MIXTRAL is not None and DEEPSEEK is not None
    assert MIXTRAL.expert_parameters == pytest.approx(45.07e9, rel=1e-3)
    assert MIXTRAL.parameters - MIXTRAL.expert_parameters == pytest.approx(1.63e9, rel=1e-2)
    # DeepSeek-V3: 671B, 37B active, top-8 of 256 routed experts: ~654B in experts.
    assert DEEPSEEK.expert_parameters == pytest.approx(654.5e9, rel=1e-3)
    # A dense model has none, whatever its top_k.
    assert TransformerModel(8e9, 32, 4096, 8192).expert_parameters == 0.0


@given(ep=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 4]))
def test_gradient_all_reduce_carries_a_ranks_share_of_the_experts(ep, tp, pp):
    assert MIXTRAL is not None
    comm = MIXTRAL.communication(tp=tp, cp=1, ep=ep, dp=2, pp=pp)
    expert = MIXTRAL.expert_parameters
    expected = (MIXTRAL.parameters - expert + expert / ep) * 2.0 / (tp * pp)
    assert comm["dp"].bytes == pytest.approx(expected)
    if ep > 1:
        assert comm["ep"].kind == "all-to-all"
        wider = MIXTRAL.communication(tp=tp, cp=1, ep=ep * 2, dp=2, pp=pp)
        assert wider["dp"].bytes < comm["dp"].bytes  # more ep ranks: fewer experts each
    # Without the expert count, every weight is on every rank (the dense formula).
    dense = TransformerModel(46.7e9, 32, 4096, 4096, active_parameters=12.9e9)
    assert dense.communication(tp, 1, ep, 2, pp)["dp"].bytes == pytest.approx(
        46.7e9 * 2.0 / (tp * pp)
    )


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("experts: 8", "model.experts: needs model.active_parameters"),
        ("experts: 2, active_parameters: 12.9e9", "model.experts: expected more than moe_top_k"),
        ("active_parameters: 90e9", "model.active_parameters: expected at most parameters"),
    ],
)
def test_bad_moe_fields_are_named_in_the_file(tmp_path: Path, model: str, message: str):
    path = tmp_path / "moe.yaml"
    path.write_text(
        "name: m\nparallelism: {ep: 8}\nmodel: {parameters: 46.7e9, layers: 32, "
        f"hidden_size: 4096, sequence_length: 4096, {model}}}\n"
    )
    with pytest.raises(InvalidJob, match=f"{path}: {message}"):
        Job.load(path)


def test_ep_column_of_workload_files(tmp_path: Path):
    good = tmp_path / "w.csv"
    good.write_text(
        "name,submit_s,gpus,duration_s,pp,ep,model\n"
        "a,0,64,100,4,8,mixtral-8x7b\n"
        "b,1,16,100,,,llama3-8b\n"
    )
    jobs = {j.name: j for j in load_workload(good).jobs}
    assert (jobs["a"].ep, jobs["a"].pp, jobs["b"].ep) == (8, 4, 1)
    template = job_template(jobs["a"])
    # No tp column: the largest of 8, 4, 2, 1 that pp * ep leaves room for.
    assert (template.tp, template.ep, template.pp, template.dp, template.gpus) == (2, 8, 4, 1, 64)
    bad = tmp_path / "bad.csv"
    for row, message in [
        ("a,0,48,100,4,8,mixtral-8x7b", r"line 2: gpus: 48 is not a multiple of tp \* pp \* ep"),
        ("a,0,64,100,1,8,llama3-8b", r"line 2: ep: expert parallelism needs a mixture"),
        ("a,0,512,100,1,512,deepseek-v3", r"line 2: ep: 512 is over deepseek-v3's 256 experts"),
    ]:
        bad.write_text(f"name,submit_s,gpus,duration_s,pp,ep,model\n{row}\n")
        with pytest.raises(InvalidJob, match=message):
            load_workload(bad)


@pytest.mark.parametrize("gpus", [8, 16, 32, 256, 512, 1024, 2048, 16_384])
def test_moe_layouts_fit_their_size(gpus: int):
    model, tp, pp, ep = llm_moe_layout(gpus)
    assert gpus % (tp * pp * ep) == 0 and ep > 1
    experts = MODELS[model].experts  # type: ignore[union-attr]
    assert experts is not None and ep <= experts


def test_llm_mix_trains_mixtures_of_experts_without_moving_the_rest():
    mixed = llm_mix(400, cluster_gpus=16_384, seed=1)
    dense = llm_mix(400, cluster_gpus=16_384, seed=1, moe_share=0.0)
    moe = [j for j in mixed.jobs if j.ep > 1]
    assert 0.15 * len(mixed) < len(moe) < 0.35 * len(mixed)
    assert all(j.ep == 1 for j in dense.jobs)
    # The share only changes the layouts: sizes, arrivals and durations are the same jobs.
    assert [(j.name, j.submit_s, j.gpus, j.work_s) for j in mixed.jobs] == [
        (j.name, j.submit_s, j.gpus, j.work_s) for j in dense.jobs
    ]
    for job in moe:
        template = job_template(job)
        assert template.model is not None and template.model.experts is not None
        comm = template.model.communication(template.tp, 1, template.ep, template.dp, template.pp)
        assert comm["ep"].kind == "all-to-all"
    with pytest.raises(InvalidJob, match="moe_share"):
        llm_mix(10, cluster_gpus=64, moe_share=1.5)


def test_moe_jobs_run_to_the_end_in_the_simulator():
    topology = Topology.preset("h100-superpod", nodes=8)
    workload = llm_mix(20, cluster_gpus=topology.num_gpus, seed=2, moe_share=1.0)
    result = simulate(topology, workload)
    assert all(r.job.ep > 1 for r in result.records)
    assert len(result.records) == len(workload)
    assert all(r.finish is not None and r.finish >= r.job.submit_s for r in result.records)
    # MoE all-to-all between hosts moves bytes over the fabric.
    assert sum(result.fabric_bytes.values()) > 0
