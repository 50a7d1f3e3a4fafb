"""MIG: the built-in rules, the nvidia-smi reader on real listings and mutations of them, and
packing that never breaks a start rule."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gpuplace
import pytest
from gpuplace.cluster import mig
from gpuplace.errors import Infeasible, InvalidState, InvalidTopology
from gpuplace.io.mig import read_nvidia_smi_mig
from gpuplace.model.mig import MODELS
from hypothesis import given
from hypothesis import strategies as st

DATA = Path(__file__).resolve().parent / "data" / "mig"
ROOT = Path(__file__).resolve().parents[1]


def shape(model: mig.MigModel) -> dict[str, tuple[int, int, tuple[int, ...], int]]:
    """Profiles by name without the GiB figures (which vary by driver)."""
    return {n: (p.compute, p.size, p.starts, p.instances) for n, p in model.profiles.items()}


# ------------------------------------------------------------------ built-in rules
def test_built_in_rules_follow_the_guide():
    a100 = MODELS["A100-40GB"]
    assert (a100.memory_slices, a100.compute_slices) == (8, 7)
    assert shape(a100)["1g.5gb"] == (1, 1, (0, 1, 2, 3, 4, 5, 6), 7)
    assert shape(a100)["3g.20gb"] == (3, 4, (0, 4), 2)
    assert shape(a100)["4g.20gb"] == (4, 4, (0,), 1)
    assert shape(a100)["1g.5gb+me"][3] == 1
    assert set(MODELS["H200-141GB"].profiles) >= {"1g.18gb", "3g.71gb", "7g.141gb"}
    for model in MODELS.values():
        model.check()
    assert mig.model_for("H100-SXM5-80GB") is MODELS["H100-80GB"]
    assert mig.model_for("NVIDIA H100 NVL 94GB") is MODELS["H100-94GB"]
    with pytest.raises(InvalidTopology, match="read_nvidia_smi_mig"):
        mig.model_for("V100-SXM2-32GB")


# ------------------------------------------------------------------ the reader
@pytest.mark.parametrize(
    ("listing", "built_in"),
    [("h100-nvl-94gb.txt", "H100-94GB"), ("h100-80gb-hbm3.txt", "H100-80GB")],
)
def test_reader_on_real_listings_matches_the_guide(listing, built_in):
    read = read_nvidia_smi_mig(DATA / listing, model=built_in)
    assert shape(read) == shape(MODELS[built_in])
    assert (read.memory_slices, read.compute_slices) == (8, 7)
    assert read.profiles[next(iter(read.profiles))].profile_id == 19


def test_reader_on_an_early_driver_and_two_files():
    read = read_nvidia_smi_mig(
        DATA / "a100-40gb-thetagpu-lgip.txt", DATA / "a100-40gb-thetagpu-lgipp.txt"
    )
    # Drivers of that time had neither 1g.10gb nor the +me profiles on A100 40 GB.
    assert list(read.profiles) == ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    built = shape(MODELS["A100-40GB"])
    assert all(shape(read)[n] == built[n] for n in read.profiles)
    assert read.profiles["3g.20gb"].memory_gb == 19.62


@pytest.mark.parametrize(
    ("listing", "built_in", "names"),
    [
        (
            (DATA / "a100-40gb-thetagpu-lgip.txt").read_text(),
            "A100-40GB",
            ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
        ),
        (
            (DATA / "h100-nvl-94gb.txt").read_text().split("$ nvidia-smi mig -lgipp")[0],
            "H100-94GB",
            list(MODELS["H100-94GB"].profiles),
        ),
    ],
)
def test_an_lgip_listing_alone_falls_back_to_the_built_in_placements(
    listing, built_in, names, tmp_path
):
    path = tmp_path / "lgip.txt"
    path.write_text(listing)
    read = read_nvidia_smi_mig(path)
    assert read.model == built_in
    assert sorted(read.profiles) == sorted(names)
    built = shape(MODELS[built_in])
    assert all(shape(read)[n] == built[n] for n in read.profiles)
    assert "-lgip" in read.source and built_in in read.source
    read.check()
    # The GPU model named by the caller decides; an unknown one leaves nothing to fall back on.
    assert (
        read_nvidia_smi_mig(
            path, model="A100-SXM4-40GB" if "A100" in built_in else "H100-NVL-94GB"
        ).memory_slices
        == 8
    )
    with pytest.raises(InvalidTopology, match="no `nvidia-smi mig -lgipp`"):
        read_nvidia_smi_mig(path, model="A30-24GB")


def test_reader_learns_a_gpu_with_four_slices_without_code():
    a30 = read_nvidia_smi_mig(DATA / "a30-24gb-r450.txt", model="A30-24GB")
    assert (a30.memory_slices, a30.compute_slices) == (4, 4)
    assert shape(a30)["2g.12gb"] == (2, 2, (0, 2), 2)
    packing = mig.MigCluster(a30, 1)
    for i in range(2):
        packing.place(mig.Request(f"r{i}", "2g.12gb"))
    with pytest.raises(Infeasible, match="capacity"):
        packing.place(mig.Request("more", "1g.6gb"))
    packing.check()


LISTING = (DATA / "h100-nvl-94gb.txt").read_text()


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (
            lambda t: t.replace("GPU  0 Profile ID  9 Placements: {0,4}:4\n", ""),
            "ID 9) has no -lgipp",
        ),
        (lambda t: t.replace("{0,4}:4", "{0,6}:4"), "exceeds the 8 memory slices"),
        (lambda t: t.replace("{0,4}:4", "{0,x}:4"), "expected {n,n,...}:size"),
        (
            # -lgip alone, with a profile ID no built-in model has: nothing to fall back on
            lambda t: t.split("$ nvidia-smi mig -lgipp")[0].replace(
                "3g.47gb        9", "3g.47gb       29"
            ),
            "no `nvidia-smi mig -lgipp`",
        ),
        (lambda t: t.split("$ nvidia-smi mig -lgipp")[1], "no `nvidia-smi mig -lgip`"),
        (lambda t: t + "GPU  0 Profile ID 42 Placements: {0}:1\n", "profile ID 42"),
        (lambda t: t.replace("3g.47gb        9", "3g.47gb       14"), "named both"),
        (lambda t: t.replace("{0}:8", "{0}:99"), "out of range"),
    ],
)
def test_reader_refuses_broken_listings_naming_the_line(mutate, needle, tmp_path):
    path = tmp_path / "listing.txt"
    path.write_text(mutate(LISTING))
    with pytest.raises(InvalidTopology) as err:
        read_nvidia_smi_mig(path)
    assert str(err.value).startswith("listing.txt")
    assert needle in str(err.value)


@given(
    st.lists(
        st.tuples(
            st.integers(0, LISTING.count("\n")),
            st.sampled_from(["drop", "dup", "garbage", "digit", "truncate"]),
            st.text(max_size=12),
        ),
        max_size=4,
    )
)
def test_reader_mutations_give_valid_rules_or_invalid_topology(edits):
    lines = LISTING.splitlines()
    for index, kind, junk in edits:
        i = min(index, len(lines) - 1)
        if kind == "drop":
            lines.pop(i)
        elif kind == "dup":
            lines.insert(i, lines[i])
        elif kind == "garbage":
            lines[i] = lines[i][: len(lines[i]) // 2] + junk
        elif kind == "digit":
            lines[i] = lines[i].replace("4", "9", 1)
        else:
            lines = lines[:i]
        if not lines:
            lines = [""]
    try:
        rules = read_nvidia_smi_mig(__import__("io").StringIO("\n".join(lines)))
    except InvalidTopology:
        return
    rules.check()
    for p in rules.profiles.values():
        assert all(s + p.size <= rules.memory_slices for s in p.starts)


# ------------------------------------------------------------------ packing
KINDS = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me"]


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("place"), st.sampled_from(KINDS)),
            st.tuples(st.just("sized"), st.tuples(st.integers(1, 90), st.integers(1, 7))),
            st.tuples(st.just("release"), st.integers(0, 40)),
        ),
        max_size=40,
    ),
    st.sampled_from(mig.POLICIES),
    st.integers(1, 4),
    st.booleans(),
)
def test_packing_never_breaks_a_start_rule(ops, policy, gpus, configured):
    model = MODELS["A100-80GB"]
    packing = mig.MigCluster(model, gpus, distribution={"3g.40gb": 2, "1g.10gb": 1, "7g.80gb": 1})
    if configured:  # start from a configured geometry of free instances
        for g in range(gpus):
            packing.add_free_instances(g, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"])
    placed: list[str] = []
    where: dict[str, tuple[int, int]] = {}
    for i, (op, arg) in enumerate(ops):
        if op == "release":
            if placed:
                packing.release(placed.pop(arg % len(placed)))
            continue
        request = (
            mig.Request(f"r{i}", arg)
            if op == "place"
            else mig.Request(f"r{i}", None, float(arg[0]), arg[1])
        )
        free_before = packing.free_share()
        try:
            gpu, inst = packing.place(request, policy)
        except Infeasible as exc:
            assert "cannot be placed" in str(exc) or "no A100-80GB MIG profile" in str(exc)
            assert packing.free_share() == free_before
            continue
        p = model.profile(inst.profile)
        assert inst.start in p.starts
        where[request.name] = (gpu, inst.start)
        if op == "sized":
            assert p.memory_gb >= arg[0] and p.compute >= arg[1]
        placed.append(request.name)
    packing.check()  # every instance at an allowed start, no overlap, compute within 7
    for name in placed:  # a running instance never moves
        gpu, inst = packing.owners[name]
        assert (gpu, inst.start) == where[name]
    for gpu in packing.gpus.values():
        used = [0] * model.memory_slices
        for inst in gpu.instances:
            for s in range(inst.start, inst.start + model.profile(inst.profile).size):
                used[s] += 1
        assert max(used) <= 1
        assert sum(model.profile(i.profile).compute for i in gpu.instances) <= 7
        assert collections.Counter(i.profile for i in gpu.instances)["1g.10gb+me"] <= 1


def test_fgd_keeps_the_4g_slot_that_first_fit_strands():
    model = MODELS["A100-80GB"]
    for policy, start in (("fgd", 4), ("first-fit", 0), ("best-fit", 0)):
        packing = mig.MigCluster(model, 1, distribution={"3g.40gb": 1, "4g.40gb": 1})
        _, inst = packing.place(mig.Request("a", "3g.40gb"), policy)
        assert inst.start == start, policy
        if policy == "fgd":
            packing.place(mig.Request("b", "4g.40gb"), policy)  # 3g + 4g fill the GPU
            assert packing.free_share() == 0
        else:
            with pytest.raises(Infeasible, match="MIG start rule") as err:
                packing.place(mig.Request("b", "4g.40gb"), policy)
            binding = err.value.explanation.binding
            assert [c.kind for c in binding] == ["mig"]
            assert "4g.40gb: [0]" in binding[0].detail


def test_mig_geometry_lives_in_the_state_file(tmp_path):
    topo = gpuplace.Topology.preset("a100-pod", nodes=20)
    state = gpuplace.ClusterState(topo)
    packing = mig.enable(state, range(8))
    assert state.free_gpus == topo.num_gpus - 8
    packing.place(mig.Request("chat", "3g.40gb"))
    packing.place(mig.Request("embed", None, 8, 1))
    state.save(tmp_path / "s.json")
    again = gpuplace.ClusterState.load(topo, tmp_path / "s.json")
    assert again.mig.to_dict() == packing.to_dict()
    job = gpuplace.Job(name="t", tp=8, dp=2)
    placed = gpuplace.place(again, job)
    assert not set(placed.gpus.tolist()) & set(range(8))  # whole-GPU jobs stay off MIG GPUs
    doc = json.loads((tmp_path / "s.json").read_text())["state"]
    doc["mig"]["gpus"]["0"][0]["start"] = 2
    with pytest.raises(InvalidState, match=r"mig\.gpus\.0\[0\]: 3g\.40gb at slice 2 breaks"):
        gpuplace.ClusterState.restore(topo, doc)


def test_cli_mig_packs_a_request_stream(tmp_path):
    state = str(tmp_path / "s.json")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuplace.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    r = run(
        "mig", "enable", "--state", state, "-c", "a100-pod", "--nodes", "20", "--node", "dgxa001"
    )
    assert r.returncode == 0, r.stderr
    r = run(
        "mig",
        "place",
        "--state",
        state,
        "--requests",
        str(ROOT / "examples/mig/stream.yaml"),
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    assert all(p["placed"] for p in out["placements"])
    assert len(out["placements"]) == 15
    r = run("mig", "status", "--state", state)
    assert "chat-0=3g.40gb@4" in r.stdout
    r = run("mig", "release", "--state", state, "nope")
    assert r.returncode == 2 and "no MIG request named 'nope'" in r.stderr


def test_free_instances_are_reused_then_reconfigured_never_busy_ones(tmp_path):
    topo = gpuplace.Topology.preset("a100-pod", nodes=20)
    state = gpuplace.ClusterState(topo)
    balanced = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]  # needs 3g at slice 4 to coexist
    packing = mig.enable(state, [0, 1], geometry=balanced)
    assert sorted((i.profile, i.start) for i in packing.gpus[0].instances) == [
        ("1g.10gb", 2),
        ("1g.10gb", 3),
        ("2g.20gb", 0),
        ("3g.40gb", 4),
    ]
    assert packing.free_share() == 2.0  # free instances are unallocated capacity
    gpu, inst = packing.place(mig.Request("chat", "3g.40gb"))
    assert (inst.start, packing.reused, packing.created) == (4, 1, 0)
    busy = {(g, i.profile, i.start) for g, i in packing.instances() if i.owner}
    gpu, inst = packing.place(mig.Request("big", "7g.80gb"))  # only by destroying free ones
    assert gpu != 0 and packing.destroyed == 4
    assert busy <= {(g, i.profile, i.start) for g, i in packing.instances() if i.owner}
    packing.release("chat")
    assert (mig.Instance("3g.40gb", 4, None)) in packing.gpus[0].instances
    packing.check()
    state.save(tmp_path / "s.json")
    again = gpuplace.ClusterState.load(topo, tmp_path / "s.json")
    assert again.mig.to_dict() == packing.to_dict()
    with pytest.raises(InvalidState, match="cannot coexist"):
        mig.enable(state, [2], geometry=["4g.40gb", "4g.40gb"])
    assert state.job_gpus(mig.MIG_JOB).tolist() == [0, 1]  # the refused enable changed nothing


def test_existing_instances_from_nvidia_smi_lgi():
    from gpuplace.io import read_nvidia_smi_mig_instances

    a100 = read_nvidia_smi_mig_instances(DATA / "a100-40gb-lgi.txt")
    assert a100 == {0: [("3g.20gb", 4, 4), ("3g.20gb", 0, 4)]}
    packing = mig.MigCluster(MODELS["A100-40GB"], 1)
    packing.add_existing_instances(0, a100[0])
    assert packing.free_share() == 1.0 and len(packing.gpus[0].instances) == 2
    with pytest.raises(InvalidState, match=r"3g\.20gb at 2:4 breaks"):
        mig.MigCluster(MODELS["A100-40GB"], 1).add_existing_instances(0, [("3g.20gb", 2, 4)])

    h100 = read_nvidia_smi_mig_instances(DATA / "h100-80gb-lgi.txt")
    topo = gpuplace.Topology.preset("h100-superpod", nodes=32)
    state = gpuplace.ClusterState(topo)
    host = [int(g) for g in topo.host_gpus("dgx001")]
    packing = mig.enable(state, host, existing={host[0]: h100[0]})
    gpu, embed = packing.place(mig.Request("embed", "1g.10gb"))
    assert (gpu, packing.reused) == (host[0], 1)  # an existing instance, no reconfiguration
    state.allocate(name="full", gpus=[g for g in range(topo.num_gpus) if g not in host])
    for g in host[1:]:  # fill the other MIG GPUs so the 3g must reconfigure GPU 0
        packing.add_free_instances(g, ["7g.80gb"])
        packing.place(mig.Request(f"whole{g}", "7g.80gb"))
    gpu, inst = packing.place(mig.Request("chat", "3g.40gb"))
    assert gpu == host[0] and packing.destroyed == 4  # the free 1g instances in the way
    assert packing.owners["embed"] == (host[0], embed)  # the busy one stayed
    assert not (inst.start <= embed.start < inst.start + 4)
    packing.check()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nothing here\n", "no `nvidia-smi mig -lgi` rows"),
        (
            "|   0  MIG 1g.10gb   19   7   0:1 |\n|   0  MIG 1g.10gb   19   7   1:1 |\n",
            "listed twice",
        ),
        ("|   0  MIG 1g.10gb   19   7   70:1 |\n", "out of range"),
    ],
)
def test_lgi_reader_refuses_bad_listings(text, needle, tmp_path):
    from gpuplace.io import read_nvidia_smi_mig_instances

    path = tmp_path / "lgi.txt"
    path.write_text(text)
    with pytest.raises(InvalidTopology, match=needle):
        read_nvidia_smi_mig_instances(path)


def test_cli_enable_records_the_instances_a_host_has(tmp_path):
    state = str(tmp_path / "s.json")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuplace.cli",
            "mig",
            "enable",
            "--state",
            state,
            "-c",
            "h100-superpod",
            "--nodes",
            "32",
            "--node",
            "dgx002",
            "--instances",
            str(DATA / "h100-80gb-lgi.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(Path(state).read_text())["state"]["mig"]["gpus"]
    assert len(doc) == 8 and [len(v) for v in doc.values()].count(7) == 1


@pytest.mark.parametrize(
    ("listing", "model", "slices"),
    [("h100-80gb-hbm3.txt", "MIG 7g.80gb GPU", 8), ("a30-24gb-r450.txt", "MIG 4g.24gb GPU", 4)],
)
def test_rules_read_from_a_listing_live_in_the_state(listing, model, slices, tmp_path):
    state = str(tmp_path / "s.json")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuplace.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    r = run(
        "mig",
        "enable",
        "--state",
        state,
        "-c",
        "a100-pod",
        "--nodes",
        "4",
        "--gpu",
        "0",
        "--listing",
        str(DATA / listing),
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(Path(state).read_text())["state"]
    assert doc["mig"]["model"] == model
    assert doc["mig"]["rules"]["memory_slices"] == slices
    # Every later command reads the rules from the state, whole-GPU placement included.
    job = tmp_path / "job.yaml"
    job.write_text("name: train\nparallelism: {tp: 8}\n")
    place = ("place", "-c", "a100-pod", "--nodes", "4", "-j", str(job))
    for args in (("mig", "status"), ("status",), place):
        r = run(*args, "--state", state)
        assert r.returncode == 0, (args, r.stderr)
    assert "." * slices in run("mig", "status", "--state", state).stdout
    stream = tmp_path / "stream.yaml"
    stream.write_text(
        "requests:\n"
        "  - {name: huge, memory_gb: 500}\n"
        "  - {name: typo, profile: 9g.99gb}\n"
        "  - {name: small, compute: 1}\n"
    )
    r = run("mig", "place", "--state", state, "--requests", str(stream), "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = {row["request"]: row for row in json.loads(r.stdout)["placements"]}
    assert not rows["huge"]["placed"] and ">= 500 GB" in rows["huge"]["reason"]
    assert not rows["typo"]["placed"] and "no MIG profile '9g.99gb'" in rows["typo"]["reason"]
    assert rows["small"]["placed"]
    # Rules that break their own geometry are refused naming the field.
    doc = json.loads(Path(state).read_text())["state"]
    doc["mig"]["rules"]["profiles"][0]["starts"] = [slices]
    topo = gpuplace.Topology.preset("a100-pod", nodes=4)
    with pytest.raises(InvalidState, match=r"mig\.rules: .* exceeds the"):
        gpuplace.ClusterState.restore(topo, doc)
