"""Shared GPUs: requests and nodes, the openb readers, the shared cluster's bookkeeping, the FGD
paper's policies and gpuplace's, the plan prices, and the FGD experiment (issue 23)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import gpuplace
import numpy as np
import pytest
from gpuplace._util.documents import Checker
from gpuplace.cli.schemas import SCHEMAS
from gpuplace.cluster import share
from gpuplace.cluster.share import SharedCluster
from gpuplace.errors import Infeasible, InvalidJob, InvalidState, InvalidTopology
from gpuplace.io.openb import read_openb_nodes, read_openb_pods
from gpuplace.model.mig import MODELS
from gpuplace.model.share import MILLI, SharedNode, SharedRequest, typical_mix
from gpuplace.placement.share import (
    POLICIES,
    ShareScheduler,
    fragmentation,
    node_prices,
    pod_mix,
    replay,
)
from gpuplace.sim import fgd
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator


@pytest.fixture(scope="module")
def openb() -> list[SharedNode]:
    return fgd.openb_nodes()


@pytest.fixture(scope="module")
def default_pods() -> list[SharedRequest]:
    return fgd.openb_workload("default")


def small_cluster() -> SharedCluster:
    return SharedCluster(
        [
            SharedNode("g0", 96_000, 393_216, 8, "G2"),
            SharedNode("g1", 96_000, 393_216, 8, "G2"),
            SharedNode("t0", 104_000, 524_288, 2, "T4"),
            SharedNode("c0", 32_000, 65_536),
        ]
    )


# ------------------------------------------------------------------ requests and readers
def test_packaged_openb_data_is_the_papers(openb, default_pods):
    assert len(openb) == 1213
    assert sum(n.gpus for n in openb) == 6212
    assert {n.model for n in openb} == {"A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"}
    assert len(fgd.openb_nodes(all_nodes=True)) == 1523
    assert len(default_pods) == 8152
    shares = [r for r in default_pods if r.shared]
    assert len(shares) == 3078
    assert sum(1 for r in default_pods if r.gpus == 0) == 1088
    spec = fgd.openb_workload("gpuspec33")
    assert sum(1 for r in spec if r.models) == 2388
    assert all(r.shared for r in fgd.openb_workload("gpushare100") if r.gpus)
    assert len(fgd.openb_workload("multigpu50")) == 9061


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("n1,abc,1024,2,T4", "n1.csv:3: cpu_milli: expected an integer, got 'abc'"),
        ("n1,1000,1024,2,", "n1.csv:3: node n1 has 2 GPUs but no model"),
        ("n0,1000,1024,2,T4", "n1.csv:3: node n0 is listed twice"),
        ("n1,-5,1024,2,T4", "n1.csv:3: cpu_milli: expected 0 or more"),
    ],
)
def test_node_list_errors_name_the_line(row, needle, tmp_path):
    path = tmp_path / "n1.csv"
    path.write_text(f"sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1024,2,T4\n{row}\n")
    with pytest.raises(InvalidTopology, match=needle):
        read_openb_nodes(path)


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("p1,1000,1024,2,500,", "p.csv:3: 2 GPUs of 500 milli-GPUs each"),
        ("p1,1000,1024,1,1500,", "p.csv:3: .*gpu_milli: expected an integer <= 1000"),
        ("p1,1000,x,1,500,", "p.csv:3: memory_mib: expected an integer"),
        ("p0,1000,1024,1,500,", "p.csv:3: pod p0 is listed twice"),
    ],
)
def test_pod_list_errors_name_the_line(row, needle, tmp_path):
    path = tmp_path / "p.csv"
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"
    path.write_text(f"{header}\np0,1000,1024,1,500,T4|G2\n{row}\n")
    with pytest.raises(InvalidJob, match=needle):
        read_openb_pods(path)


def test_pod_list_reads_models_and_sorts_by_name():
    text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nb,1,2,1,500,T4|G2\na,3,4,0,0,\n"
    pods = read_openb_pods(io.StringIO(text))
    assert [p.name for p in pods] == ["a", "b"]
    assert pods[1] == SharedRequest("b", 1, 2, 1, 500, ("T4", "G2"))


def test_request_rules_and_documents():
    c = Checker(InvalidJob, "r.yaml")
    r = SharedRequest.from_dict({"name": "x", "cpu": 4, "memory_gib": 8, "gpu": 0.25}, c, "r")
    assert (r.cpu_milli, r.memory_mib, r.gpus, r.gpu_milli, r.shared) == (4000, 8192, 1, 250, True)
    whole = SharedRequest.from_dict({"name": "y", "gpu": 2, "models": ["T4"]}, c, "r")
    assert (whole.gpus, whole.gpu_milli, whole.kind) == (2, MILLI, "2 GPU")
    assert SharedRequest.from_dict(whole.to_dict(), c, "r") == whole
    for bad, needle in [
        ({"name": "x", "gpu": 1.5}, "r.gpu: expected a share below 1 or whole GPUs"),
        ({"name": "x", "gpus": 2, "gpu_milli": 300}, "a share is of one GPU"),
        ({"name": "x", "cpu": 1, "cpu_milli": 1}, "give cpu_milli or cpu, not both"),
        ({"name": "x", "gpu_milli": 300}, "without a GPU"),
        ({"name": "x", "colour": 1}, r"r\.colour: unknown field"),
    ]:
        with pytest.raises(InvalidJob, match=needle):
            SharedRequest.from_dict(bad, c, "r")


def test_typical_mix_covers_95_percent_most_frequent_first(default_pods):
    mix = typical_mix(default_pods)
    counts = [w for _, w in mix]
    assert counts == sorted(counts, reverse=True)
    assert sum(counts) >= 0.95 * len(default_pods)
    assert sum(counts[:-1]) < 0.95 * len(default_pods)
    # The most frequent shape in openb's default workload: a share of 810 milli-GPUs.
    assert mix[0][0].gpu_milli == 810
    with pytest.raises(InvalidJob):
        typical_mix([])


# ------------------------------------------------------------------ the cluster
def test_allocation_is_checked_and_all_or_nothing():
    c = small_cluster()
    share = SharedRequest("a", 4000, 1024, 1, 300)
    c.allocate(share, "t0", [1])
    assert c.gpu_left("t0").tolist() == [1000, 700]
    assert c.used_gpu_milli == 300
    before = (c.cpu_left().tolist(), c.gpu_left("t0").tolist())
    for request, node, gpus, needle in [
        (SharedRequest("b", 0, 0, 1, 800), "t0", [1], "has 700 milli-GPUs free"),
        (SharedRequest("c", 0, 0, 2, MILLI), "t0", [0, 0], "named twice"),
        (SharedRequest("d", 200_000, 0, 0, 0), "g0", [], "milli-CPU free"),
        (SharedRequest("e", 0, 0, 1, 500, ("T4",)), "g0", [0], "not one the pod accepts"),
        (SharedRequest("f", 0, 0, 1, 500, ("A100",)), "g0", [0], "accepts GPU models A100"),
        (SharedRequest("a", 0, 0, 0, 0), "c0", [], "already placed"),
        (SharedRequest("g", 0, 0, 1, 500), "nope", [0], "unknown node"),
    ]:
        with pytest.raises(InvalidState, match=needle):
            c.allocate(request, node, gpus)
    assert (c.cpu_left().tolist(), c.gpu_left("t0").tolist()) == before
    c.release("a")
    assert c.used_gpu_milli == 0 and c.gpu_left("t0").tolist() == [1000, 1000]
    with pytest.raises(InvalidState, match="no request named 'a'"):
        c.release("a")


def test_cluster_document_round_trip_and_refusals():
    c = small_cluster()
    c.allocate(SharedRequest("a", 4000, 1024, 1, 300, ("T4",)), "t0", [1])
    c.allocate(SharedRequest("b", 8000, 2048, 8, MILLI), "g1", list(range(8)))
    doc = json.loads(json.dumps(c.to_dict()))
    back = SharedCluster.from_dict(doc, Checker(InvalidState, "s.json"), "share")
    assert back.to_dict() == c.to_dict()
    assert back.used_gpu_milli == c.used_gpu_milli
    doc["placements"][1]["node"] = "t0"
    with pytest.raises(
        InvalidState,
        match=r"s\.json: share\.placements\[1\]: GPU 1 of node t0 has 700 milli-GPUs free",
    ):
        SharedCluster.from_dict(doc, Checker(InvalidState, "s.json"), "share")


requests_st = st.lists(
    st.one_of(
        st.builds(
            lambda cpu, milli: SharedRequest("x", cpu, 1024, 1, milli),
            st.integers(0, 40_000),
            st.integers(1, 1000),
        ),
        st.builds(
            lambda cpu, n: SharedRequest("x", cpu, 1024, n, MILLI),
            st.integers(0, 40_000),
            st.sampled_from([1, 2, 4, 8]),
        ),
        st.builds(lambda cpu: SharedRequest("x", cpu, 4096), st.integers(0, 60_000)),
    ),
    min_size=1,
    max_size=60,
)


@given(requests_st, st.sampled_from(POLICIES), st.integers(0, 2**32), st.randoms())
def test_policies_never_overcommit_and_release_restores(requests, policy, seed, rnd):
    c = small_cluster()
    named = [SharedRequest(f"r{i}", *r.shape) for i, r in enumerate(requests)]
    s = ShareScheduler(c, policy, workload=named, seed=seed)
    placed = []
    for r in named:
        slot = s.choose(r)
        if slot is None:
            # Nothing fits: the explanation names the request.
            with pytest.raises(Infeasible, match=f"request '{r.name}'"):
                s.place(r)
            continue
        p = c.allocate(r, slot.node, slot.gpus, slot.starts)
        placed.append(p)
        node = c.nodes[c.node_index(p.node)]
        assert not r.gpus or node.model is not None
    cpu, mem = c.cpu_left(), c.memory_left()
    for i, node in enumerate(c.nodes):
        used = [p.request for p in placed if p.node == node.name]
        assert cpu[i] == node.cpu_milli - sum(r.cpu_milli for r in used) >= 0
        assert mem[i] == node.memory_mib - sum(r.memory_mib for r in used) >= 0
        left = c.gpu_left(i)
        assert (left >= 0).all() and (left <= MILLI).all()
    assert c.used_gpu_milli == sum(p.request.total_gpu_milli for p in placed)
    rnd.shuffle(placed)
    for p in placed:
        c.release(p.request.name)
    assert c.used_gpu_milli == 0
    assert c.cpu_left().tolist() == [n.cpu_milli for n in c.nodes]


def test_fgd_fills_a_used_gpu_and_packing_prefers_shared_gpus():
    c = small_cluster()
    c.allocate(SharedRequest("a", 1000, 0, 1, 500), "t0", [1])
    # Half the workload wants whole GPUs: splitting an idle GPU strands half of it for them.
    workload = [SharedRequest(f"w{i}", 1000, 0, 1, 500 if i % 2 else MILLI) for i in range(4)]
    share = workload[1]
    for policy in ("fgd", "packing", "gpuplace", "bestfit"):
        slot = ShareScheduler(c, policy, workload=workload, seed=1).choose(share)
        assert slot is not None and (slot.node, slot.gpus) == (2, (1,)), policy


def test_a_request_for_a_missing_model_is_refused_with_its_reason():
    c = small_cluster()
    s = ShareScheduler(c, "bestfit")
    with pytest.raises(Infeasible, match="accepts GPU models A100; the cluster has G2, T4"):
        s.place(SharedRequest("x", 0, 0, 1, 500, ("A100",)))
    with pytest.raises(Infeasible, match=r"fits no node of 4: .*short of CPU"):
        s.place(SharedRequest("y", 500_000, 0, 1, 500))
    with pytest.raises(InvalidJob, match="weighs fragmentation over a workload"):
        ShareScheduler(c, "fgd")


def test_plan_prices_make_a_scarce_model_dear(openb):
    cluster = SharedCluster(openb)
    flat = node_prices(cluster, fgd.openb_workload("default"))
    assert flat is not None and np.allclose(flat[:, 0], flat[:, 0].max())
    scarce = node_prices(cluster, fgd.openb_workload("gpuspec33"))
    assert scarce is not None
    model = np.array([n.model for n in openb])
    # T4-only pods outnumber what the T4 nodes hold: their GPUs are the bottleneck.
    assert scarce[model == "T4", 0].min() > scarce[model == "G2", 0].max()
    assert node_prices(cluster, [SharedRequest("c", 1000, 0)]) is None


# ------------------------------------------------------------------ the experiment
def test_arrival_order_shuffles_then_inflates(default_pods, openb):
    capacity = sum(n.gpus for n in openb) * MILLI
    order = fgd.arrival_order(default_pods, capacity, 42)
    assert sorted(order[: len(default_pods)].tolist()) == list(range(len(default_pods)))
    total = sum(default_pods[i].total_gpu_milli for i in order)
    assert 1.3 * capacity - 8 * MILLI <= total <= 1.3 * capacity + 8 * MILLI
    assert fgd.arrival_order(default_pods, capacity, 42).tolist() == order.tolist()
    # A workload above 1.3x loses pods until within.
    multi = fgd.openb_workload("multigpu50")
    down = fgd.arrival_order(multi, capacity, 42)
    assert len(down) < len(multi)
    assert sum(multi[i].total_gpu_milli for i in down) <= 1.3 * capacity


def test_allocation_curve_discretises_as_the_authors():
    arrived = np.array([0, 500, 1000, 1500, 3000])
    used = np.array([0, 500, 1000, 1000, 1000])
    curve = fgd.allocation_curve(arrived, used, 1000)
    assert curve[0] == 0 and curve[50] == 50 and curve[100] == 100
    # 150 % arrived rounds past the top; 101-130 have no arrival within one point but 101.
    assert curve[101] == 100 and np.isnan(curve[120])


def test_fgd_and_bestfit_reproduce_the_paper_on_one_seed():
    figure = fgd.run("default", ("bestfit", "fgd"), (42,))
    ours = figure.unallocated(100)
    paper = {p: float(np.median(100 - c[:, 100])) for p, c in fgd.paper_curves("default").items()}
    assert paper["fgd"] == pytest.approx(4.77, abs=0.01)
    for policy in ("bestfit", "fgd"):
        assert abs(ours[policy] - paper[policy]) < 1.0, (policy, ours[policy])


def test_replay_matches_one_decision_at_a_time(default_pods, openb):
    cluster = SharedCluster(openb)
    order = fgd.arrival_order(default_pods, cluster.total_gpu_milli, 7)[:1500]
    (record,) = replay(cluster, default_pods, [(order, "gpuplace", 7)])
    s = ShareScheduler(cluster, "gpuplace", workload=default_pods, seed=7)
    placed = []
    for i in order:
        slot = s.choose(default_pods[int(i)])
        placed.append(slot is not None)
        if slot is not None:
            request = SharedRequest(f"p{len(placed)}", *default_pods[int(i)].shape)
            cluster.allocate(request, slot.node, slot.gpus, slot.starts)
    assert record.placed.tolist() == placed
    assert int(record.used_gpu_milli[-1]) == cluster.used_gpu_milli


def test_pod_mix_skips_requests_for_models_the_cluster_lacks():
    c = small_cluster()
    mix = pod_mix(
        c,
        [
            (SharedRequest("a", 0, 0, 1, 300, ("A100",)), 1.0),
            (SharedRequest("b", 0, 0, 1, 300), 1.0),
        ],
    )
    assert mix.fragmentation(c._core).shape == (4,)
    assert fragmentation(c, [SharedRequest("b", 0, 0, 1, 300)]).tolist() == [0.0] * 4
    with pytest.raises(InvalidJob, match="no request that can run"):
        pod_mix(c, [(SharedRequest("a", 0, 0, 1, 300, ("A100",)), 1.0)])


def validate(document: object, schema: str) -> None:
    Draft202012Validator(SCHEMAS[schema]).validate(document)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplace.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_cli_fgd_reports_against_the_paper(tmp_path):
    png = tmp_path / "fig.png"
    r = run_cli(
        "fgd",
        "--seeds",
        "1",
        "--policy",
        "fgd",
        "--policy",
        "gpuplace",
        "--format",
        "json",
        "--plot",
        str(png),
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    validate(out, "fgd")
    (doc,) = out["figures"]
    assert doc["workload"] == "default" and doc["gpus"] == 6212
    assert doc["unallocated_percent"]["fgd"]["paper"] == pytest.approx(4.77, abs=0.01)
    assert (
        doc["unallocated_percent"]["gpuplace"]["median"]
        < doc["unallocated_percent"]["fgd"]["median"]
    )
    assert png.read_bytes()[:4] == b"\x89PNG"
    r = run_cli("fgd", "--workload", "nope")
    assert r.returncode == 2 and "unknown workload 'nope'" in r.stderr


# ------------------------------------------------------------------ MIG as a sharing mode
def mig_cluster() -> SharedCluster:
    nodes = [SharedNode(f"a{i}", 128_000, 1_048_576, 8, "A100-80GB") for i in range(2)]
    nodes.append(SharedNode("t0", 104_000, 524_288, 2, "T4"))
    return SharedCluster(nodes, mig_rules={"A100-80GB": MODELS["A100-80GB"]})


def test_mig_gpus_hold_instances_under_the_start_rules():
    c = mig_cluster()
    c.set_mode("a0", 0, "mig")
    assert c.gpu_modes("a0")[:2] == ["mig", "fractional"]
    assert c.reconfigurations == 1
    # 460 milli-GPUs need 4 of 7 compute slices: a 4g instance, at slice 0 only.
    share = SharedRequest("s", 1000, 1024, 1, 460, isolation="mig")
    with pytest.raises(InvalidState, match="cannot start at memory slice 4"):
        c.allocate(share, "a0", [0], [4])
    c.allocate(share, "a0", [0], [0])
    assert c.gpu_left("a0")[0] == 1000 - 571
    # A 3g fits beside it at slice 4; a second 4g does not.
    c.allocate(SharedRequest("t", 0, 0, 1, 400), "a0", [0], [4])
    assert c.gpu_left("a0")[0] == 0
    with pytest.raises(InvalidState):
        c.allocate(SharedRequest("u", 0, 0, 1, 100, isolation="mig"), "a0", [0], [0])
    # Isolation is kept: a MIG-only request refuses a fractional GPU, and the reverse.
    with pytest.raises(InvalidState, match="fractional; the pod asks Mig isolation"):
        c.allocate(SharedRequest("v", 0, 0, 1, 100, isolation="mig"), "a0", [1], [0])
    # A busy GPU cannot change mode; releasing leaves the mode as it is.
    with pytest.raises(InvalidState, match="only an idle GPU changes mode"):
        c.set_mode("a0", 0, "fractional")
    doc = json.loads(json.dumps(c.to_dict()))
    back = SharedCluster.from_dict(doc, Checker(InvalidState, "s.json"), "share")
    assert back.to_dict() == c.to_dict() and back.reconfigurations == 1
    assert back.gpu_left("a0").tolist() == c.gpu_left("a0").tolist()
    c.release("s")
    c.release("t")
    assert c.gpu_left("a0")[0] == 1000 and c.gpu_modes("a0")[0] == "mig"
    with pytest.raises(InvalidState, match="GPU model T4 of node t0 has no MIG rules"):
        c.set_mode("t0", 0, "mig")


@given(
    st.lists(
        st.tuples(st.integers(1, 1000), st.sampled_from(["any", "mig", "fractional"])),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from(POLICIES),
    st.booleans(),
)
def test_isolation_holds_and_reconfiguration_only_when_needed(asks, policy, reconfigure):
    c = mig_cluster()
    c.set_mode("a1", 7, "mig")
    requests = [
        SharedRequest(f"r{i}", 1000, 1024, 1, m, isolation=iso) for i, (m, iso) in enumerate(asks)
    ]
    s = ShareScheduler(c, policy, workload=requests, seed=3, reconfigure=reconfigure)
    for r in requests:
        before = c.reconfigurations
        try:
            p = s.place(r)
        except Infeasible:
            continue
        mode = c.gpu_modes(p.node)[p.gpus[0]]
        assert r.isolation in ("any", mode), (r, mode)
        if c.reconfigurations > before:
            assert reconfigure and r.isolation != "any"
    assert c.reconfigurations == 1 or reconfigure
    for name in list(c.placements):
        c.release(name)
    assert c.used_gpu_milli == 0


# ------------------------------------------------------------------ in a state file, by the CLI
def test_cli_share_keeps_requests_apart_from_training_gangs(tmp_path):
    state = str(tmp_path / "s.json")
    stream = tmp_path / "req.yaml"
    stream.write_text(
        "requests:\n"
        "  - {name: chat, cpu: 4, memory_gib: 16, gpu: 0.25, count: 3}\n"
        "  - {name: iso, cpu: 2, memory_gib: 8, gpu: 0.3, isolation: mig}\n"
        "  - {name: huge, cpu: 500, gpu: 0.5}\n"
        "  - {name: big, cpu: 8, memory_gib: 64, gpu: 2}\n"
    )
    r = run_cli(
        "share",
        "enable",
        "--state",
        state,
        "-c",
        "a100-pod",
        "--nodes",
        "4",
        "--node",
        "dgxa001",
        "--node",
        "dgxa002",
        "--cpu",
        "128",
        "--memory-gib",
        "1024",
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    validate(json.loads(r.stdout), "share-enable")
    r = run_cli("share", "place", "--state", state, "--requests", str(stream), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    validate(doc, "share-place")
    rows = {row["request"]: row for row in doc["placements"]}
    assert all(rows[f"chat-{k}"]["placed"] for k in range(3)) and rows["big"]["placed"]
    # Each refusal is alone, with its reason; the stream went on.
    assert "short of GPUs in mig mode" in rows["iso"]["reason"]
    assert "short of CPU" in rows["huge"]["reason"]
    again = tmp_path / "iso.yaml"
    again.write_text(
        "requests:\n  - {name: iso, cpu: 2, memory_gib: 8, gpu: 0.3, isolation: mig}\n"
    )
    r = run_cli(
        "share",
        "place",
        "--state",
        state,
        "--requests",
        str(again),
        "--reconfigure",
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["placements"]
    assert row["placed"] and row["reconfigured"] == 1
    r = run_cli("share", "status", "--state", state, "--format", "json")
    status = json.loads(r.stdout)
    validate(status, "share-status")
    assert status["reconfigurations"] == 1 and status["requests"] == 5
    node = next(n for n in status["nodes"] if "iso" in n["requests"])
    assert "mig" in node["modes"]
    # Training gangs never get a shared GPU: the 16 free GPUs are the two other hosts'.
    job = tmp_path / "job.yaml"
    job.write_text("name: train\nparallelism: {tp: 8, dp: 2}\n")
    r = run_cli("place", "-c", "a100-pod", "--nodes", "4", "-j", str(job), "--state", state)
    assert r.returncode == 0, r.stderr
    jobs = {j["name"]: j for j in json.loads(Path(state).read_text())["state"]["jobs"]}
    shared_gpus = set(range(16))  # dgxa001 and dgxa002
    assert not set(jobs["train"]["gpus"]) & shared_gpus
    r = run_cli(
        "place", "-c", "a100-pod", "--nodes", "4", "-j", str(job), "--state", state, "--name", "t2"
    )
    assert r.returncode == 2 and "t2" not in run_cli("status", "--state", state).stdout
    r = run_cli("share", "release", "--state", state, "chat-0", "iso", "--format", "json")
    assert r.returncode == 0, r.stderr
    validate(json.loads(r.stdout), "share-release")
    r = run_cli("share", "release", "--state", state, "chat-0")
    assert r.returncode == 2 and "no request named 'chat-0'" in r.stderr
    r = run_cli(
        "share", "enable", "--state", state, "--node", "dgxa003", "--cpu", "1", "--memory-gib", "1"
    )
    assert r.returncode == 2 and "not free" in r.stderr


def test_a_state_file_that_lies_about_its_shared_hosts_is_refused(tmp_path):
    topo = gpuplace.Topology.preset("a100-pod", nodes=4)
    state = gpuplace.ClusterState(topo)
    share.enable(state, ["dgxa001"], cpu_milli=64_000, memory_mib=2**20, mode="mig")
    assert state.shared.gpu_modes("dgxa001") == ["mig"] * 8
    state.save(tmp_path / "s.json")
    doc = json.loads((tmp_path / "s.json").read_text())["state"]
    again = gpuplace.ClusterState.restore(topo, doc)
    assert again.shared.to_dict() == state.shared.to_dict()
    doc["shared"]["nodes"][0]["name"] = "dgxa002"
    doc["shared"]["mig"] = {"dgxa002": doc["shared"]["mig"].pop("dgxa001")}
    with pytest.raises(InvalidState, match=r"shared\.nodes: must be exactly the hosts"):
        gpuplace.ClusterState.restore(topo, doc)


@given(st.text(max_size=400), st.sampled_from(["nodes", "pods"]))
def test_openb_readers_raise_only_their_error(text, which):
    header = (
        "sn,cpu_milli,memory_mib,gpu,model\n"
        if which == "nodes"
        else "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
    )
    for body in (text, header + text):
        if which == "nodes":
            try:
                read_openb_nodes(io.StringIO(body))
            except InvalidTopology:
                pass
        else:
            try:
                read_openb_pods(io.StringIO(body))
            except InvalidJob:
                pass


def test_a_pool_is_shared_and_its_gpus_are_never_lent_to_training(tmp_path):
    state = str(tmp_path / "s.json")
    policy = Path(__file__).resolve().parents[1] / "examples/policy/cluster-policy.yaml"
    r = run_cli(
        "policy", "set", "--state", state, "-c", "h100-superpod", "--nodes", "64", "-f", str(policy)
    )
    assert r.returncode == 0, r.stderr
    r = run_cli(
        "share", "enable", "--state", state, "--pool", "inference", "--cpu", "96",
        "--memory-gib", "1024", "--format", "json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    enabled = json.loads(r.stdout)
    assert len(enabled["hosts"]) == 32 and enabled["free_gpus"] == 256
    # A preemptible training job may borrow the inference pool's free GPUs: shared ones are
    # never free, so it stays off them even when its own pool is full.
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: batch\nparallelism: {tp: 8, dp: 40}\npolicy: {pool: training, priority_class: batch}\n"
    )
    r = run_cli("place", "-j", str(job), "--state", state)
    assert r.returncode == 2 and "batch" not in run_cli("status", "--state", state).stdout
    shared_hosts = set(enabled["hosts"])
    job.write_text(
        "name: batch\nparallelism: {tp: 8, dp: 4}\npolicy: {pool: training, priority_class: batch}\n"
    )
    r = run_cli("place", "-j", str(job), "--state", state)
    assert r.returncode == 0, r.stderr
    topo = gpuplace.Topology.preset("h100-superpod", nodes=64)
    jobs = {j["name"]: j for j in json.loads(Path(state).read_text())["state"]["jobs"]}
    assert not {topo.host_of(g) for g in jobs["batch"]["gpus"]} & shared_hosts
