"""The policy layer: hardware attributes and rules, pools, borrowing, priority classes,
preemption and the explanation of Infeasible."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import gpuplace
import numpy as np
import pytest
from gpuplace._util.documents import Checker
from gpuplace.errors import Infeasible, InvalidJob, InvalidState, InvalidTopology
from gpuplace.model.policy import ClusterPolicy, version_key
from gpuplace.model.policy import Comparison as Condition
from gpuplace.policy.fence import allowed_gpus
from hypothesis import given
from hypothesis import strategies as st

HOSTS = [f"h{i:02d}" for i in range(1, 9)]
FIRMWARE = ["96.00.74.00.01", "96.00.99.00.01", "96.00.9", "97.01.00"]


def cluster_dict(firmware: list[str] | None = None, pools: Any = None) -> dict[str, Any]:
    """8 hosts of 4 GPUs under two leaves (la: h01-h04, lb: h05-h08) and one spine."""
    doc: dict[str, Any] = {
        "format": "gpuplace.topology/1",
        "name": "small",
        "levels": [
            {"name": "node", "bandwidth_gbps": 450, "latency_us": 1},
            {"name": "leaf", "bandwidth_gbps": 50, "latency_us": 3},
            {"name": "spine", "bandwidth_gbps": 25, "latency_us": 5},
        ],
        "node_types": {"hgx": {"gpus": 4, "gpu_model": "H100-SXM5-80GB"}},
        "nodes": [
            {"name": "h[01-04]", "type": "hgx", "domains": {"leaf": "la", "spine": "s"}},
            {"name": "h[05-08]", "type": "hgx", "domains": {"leaf": "lb", "spine": "s"}},
        ],
        "attributes": [{"driver": "550.54.15"}],
    }
    if firmware is not None:
        doc["attributes"] += [
            {"hosts": h, "firmware": fw} for h, fw in zip(HOSTS, firmware, strict=True)
        ]
    if pools is not None:
        doc["pools"] = pools
    return doc


def job(name: str = "j", tp: int = 4, dp: int = 2, **policy: Any) -> gpuplace.Job:
    return gpuplace.Job.from_dict(
        {
            "name": name,
            "parallelism": {"tp": tp, "dp": dp},
            **({"policy": policy} if policy else {}),
        }
    )


def hosts_of(topology: gpuplace.Topology, gpus: Any) -> set[str]:
    return {topology.host_of(int(g)) for g in gpus}


# ------------------------------------------------------------------ conditions and rules
@pytest.mark.parametrize(
    ("condition", "value", "holds"),
    [
        ("<96.00.99", "96.00.74.00.01", True),
        ("<96.00.99", "96.00.99.00.01", False),
        ("<96.00.99", "96.00.9", True),  # 9 < 99 numerically, not as text
        (">=550", "550.54.15", True),
        (">=550", "535.129.03", False),
        ("==550.54.15", "550.54.15", True),
        ("!=A1", "A1", False),
        ("H100*", "H100-SXM5-80GB", True),
        ("h100*", "H100-SXM5-80GB", True),
        ("A100*", "H100-SXM5-80GB", False),
        (">A1", "A2", True),
    ],
)
def test_conditions_compare_versions_part_by_part(condition, value, holds):
    assert Condition.parse(condition).holds(value) is holds


def test_version_key_orders_numbers_numerically():
    assert version_key("96.00.100") > version_key("96.00.99") > version_key("96.0.9")
    assert version_key("550") < version_key("550.54.15")


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"avoid": {"firmware": "<"}}, "policy.avoid.firmware"),
        ({"require": {"colour": "red"}}, "policy.require.colour"),
        ({"require": {}}, "policy.require"),
        ({"pool": 3}, "policy.pool"),
        ({"avoid": [{"driver": ">=1"}, "x"]}, "policy.avoid[1]"),
        ({"priority": 1}, "policy.priority"),
    ],
)
def test_bad_job_policy_names_the_field(policy, field):
    with pytest.raises(InvalidJob, match=re.escape(f"job.yaml: {field}: ")):
        gpuplace.Job.from_dict(
            {"name": "j", "parallelism": {"tp": 2}, "policy": policy}, source="job.yaml"
        )


def test_job_policy_round_trips_through_the_job_file_form():
    j = job(
        pool="p",
        priority_class="batch",
        require={"driver": ">=550,<560", "model": "H100*"},
        avoid=[{"firmware": "<96.00.99", "labels.rack": "r01"}, {"stepping": "A0"}],
    )
    again = gpuplace.Job.from_dict(j.to_dict())
    assert again.policy == j.policy
    assert [str(r) for r in j.policy.avoid] == [
        "avoid firmware <96.00.99, labels.rack r01",
        "avoid stepping A0",
    ]


# ------------------------------------------------------------------ the topology file
def test_topology_file_keeps_attributes_and_pools_out_of_the_fingerprint(tmp_path: Path):
    plain = gpuplace.Topology.from_dict(cluster_dict())
    doc = cluster_dict(FIRMWARE * 2, pools={"train": "la", "serve": {"domains": "lb"}})
    topo = gpuplace.Topology.from_dict(doc)
    assert topo.fingerprint == plain.fingerprint  # a firmware upgrade keeps state files valid
    path = tmp_path / "c.yaml"
    topo.save(path)
    again = gpuplace.Topology.load(path)
    assert again.policy == topo.policy
    assert set(again.policy.pools) == {"train", "serve"}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"pools": {"a": "nowhere"}}, "pools.a.domains: unknown domain 'nowhere'"),
        ({"pools": {"a": "la", "b": "h[04-05]"}}, "pools.b: overlaps pool 'a'"),
        ({"pools": {"a": {"domains": "la", "lend_to": ["zz"]}}}, "pools.a.lend_to: unknown pool"),
        ({"attributes": [{"hosts": "h99", "driver": "1"}]}, "attributes[0].hosts: unknown host"),
        ({"attributes": [{"hosts": "h01"}]}, "attributes[0]: expected at least one attribute"),
        ({"priority_classes": {"x": {"priority": "high"}}}, "priority_classes.x.priority"),
    ],
)
def test_bad_policy_in_a_topology_file_names_the_field(change, needle):
    doc = {**cluster_dict(), **change}
    with pytest.raises(InvalidTopology) as err:
        gpuplace.Topology.from_dict(doc, source="c.yaml")
    assert str(err.value).startswith("c.yaml: ")
    assert needle in str(err.value)


# ------------------------------------------------------------------ rules hold for every solver
@st.composite
def policy_cases(draw: Any) -> tuple[gpuplace.Topology, gpuplace.ClusterState, gpuplace.Job]:
    firmware = draw(st.lists(st.sampled_from(FIRMWARE), min_size=8, max_size=8))
    pools = draw(st.sampled_from([None, {"a": "la", "b": "lb"}, {"a": "h[01-06]"}, {"a": "s"}]))
    topo = gpuplace.Topology.from_dict(cluster_dict(firmware, pools))
    state = gpuplace.ClusterState(topo)
    busy = draw(st.lists(st.integers(0, 31), unique=True, max_size=12))
    if busy:
        state.allocate(name="other", gpus=busy)
    policy: dict[str, Any] = {}
    if pools is not None:
        policy["pool"] = draw(st.sampled_from(sorted(pools)))
    if draw(st.booleans()):
        policy["avoid"] = {"firmware": draw(st.sampled_from(["<96.00.99", ">=97", "96.00.9"]))}
    if draw(st.booleans()):
        policy["require"] = {"driver": draw(st.sampled_from([">=550", ">=560"]))}
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.integers(1, 4))
    return topo, state, job(tp=tp, dp=dp, **policy)


@given(policy_cases())
def test_pool_and_exclusion_rules_hold_for_every_solver(case):
    _topo, state, j = case
    allowed = allowed_gpus(state, j)
    free_before = state.free_mask().copy()
    # Every solver gpuplace registers (other test modules add test-only ones that do not
    # check capacity).
    for solver in [s for s in gpuplace.solvers() if not s.startswith("test-")]:
        try:
            p = gpuplace.place(state, j, solver, time_limit=0.5)
        except Infeasible as exc:
            assert exc.explanation is not None, solver
            assert not exc.explanation.placeable or solver not in ("greedy", "refine"), solver
            continue
        gpus = np.asarray(p.gpus)
        assert len(set(gpus.tolist())) == j.gpus, solver
        assert allowed[gpus].all(), (solver, gpus[~allowed[gpus]])
        assert free_before[gpus].all(), solver
    np.testing.assert_array_equal(state.free_mask(), free_before)  # place changes nothing
    state.check()


def test_an_exclusion_steers_a_job_off_matching_hosts():
    topo = gpuplace.Topology.from_dict(cluster_dict(FIRMWARE[:1] * 2 + FIRMWARE[1:2] * 6))
    state = gpuplace.ClusterState(topo)
    plain = gpuplace.place(state, job(tp=4, dp=2))
    assert hosts_of(topo, plain.gpus) == {"h01", "h02"}
    steered = gpuplace.place(state, job(tp=4, dp=2, avoid={"firmware": "<96.00.99"}))
    assert not hosts_of(topo, steered.gpus) & {"h01", "h02"}
    assert steered.details["policy"]["rules"] == ["avoid firmware <96.00.99"]


def test_infeasible_names_the_rule_that_blocked_placement():
    topo = gpuplace.Topology.from_dict(cluster_dict(FIRMWARE[:1] * 6 + FIRMWARE[1:2] * 2))
    state = gpuplace.ClusterState(topo)
    with pytest.raises(Infeasible) as err:
        gpuplace.place(state, job(tp=4, dp=4, avoid={"firmware": "<96.00.99"}))
    assert "blocked by avoid firmware <96.00.99" in str(err.value)
    binding = err.value.explanation.binding
    assert [c.name for c in binding if c.kind == "exclusion"] == ["avoid firmware <96.00.99"]
    with pytest.raises(Infeasible) as err:
        gpuplace.place(state, job(require={"driver": ">=560"}))
    assert "require driver >=560: excludes 32 of the 32 free GPUs" in str(err.value)


def test_repair_honours_exclusions():
    topo = gpuplace.Topology.from_dict(cluster_dict(FIRMWARE[:1] * 4 + FIRMWARE[1:2] * 4))
    state = gpuplace.ClusterState(topo)
    rule = {"avoid": {"firmware": "<96.00.99"}}
    p = gpuplace.place(state, job(tp=1, dp=8, **rule))
    state.allocate(p)
    state.allocate(name="filler", gpus=list(range(28, 32)))
    state.fail(host=topo.host_of(int(p.gpus[0])))
    result = gpuplace.repair(state, "j")
    assert not hosts_of(topo, result.placement.gpus) & {"h01", "h02", "h03", "h04"}
    assert not np.asarray(state.fenced_view(None)._core.free_mask()).all()
    assert not gpuplace._core.fence_mask(state._core).any()  # the fence was lifted
    state.check()


def test_refine_stays_inside_the_pool():
    topo = gpuplace.Topology.from_dict(cluster_dict(pools={"a": "lb"}))
    state = gpuplace.ClusterState(topo)
    j = job(tp=1, dp=6, pool="a")
    p = gpuplace.place(state, j)
    better = gpuplace.refine(state, p, time_limit=0.2)
    assert hosts_of(topo, better.gpus) <= {"h05", "h06", "h07", "h08"}


# ------------------------------------------------------------------ pools and borrowing
POOLS = {"train": "la", "serve": {"domains": "lb", "lend_to": ["train"]}}
CLASSES = {
    "production": {"priority": 100, "preemptible": False},
    "serving": {"priority": 50},
    "batch": {"priority": 10, "preemptible": True},
}


def pooled_state() -> gpuplace.ClusterState:
    doc = cluster_dict(pools=POOLS)
    doc["priority_classes"] = CLASSES
    return gpuplace.ClusterState(gpuplace.Topology.from_dict(doc))


def test_a_pool_refuses_a_job_that_does_not_fit_inside_it():
    state = pooled_state()
    with pytest.raises(Infeasible) as err:
        gpuplace.place(state, job(tp=4, dp=5, pool="train", priority_class="production"))
    assert "blocked by pool train" in str(err.value)
    with pytest.raises(InvalidJob, match="unknown pool 'nope'"):
        gpuplace.place(state, job(pool="nope"))
    with pytest.raises(Infeasible):  # no pool: only GPUs outside every pool, and there are none
        gpuplace.place(state, job(tp=1, dp=1))


def test_only_preemptible_jobs_borrow_and_only_where_lent():
    state = pooled_state()
    batch = job("b", tp=4, dp=6, pool="train", priority_class="batch")
    p = gpuplace.place(state, batch)
    assert p.details["policy"]["borrowed_gpus"] == 8
    assert p.details["policy"]["borrowed_from"] == ["serve"]
    with pytest.raises(Infeasible):
        gpuplace.place(
            state,
            dataclasses.replace(
                batch, policy=dataclasses.replace(batch.policy, priority_class="production")
            ),
        )
    # serve lends to train, not the other way round
    with pytest.raises(Infeasible):
        gpuplace.place(state, job("s", tp=4, dp=6, pool="serve", priority_class="batch"))


def test_state_file_keeps_the_policy_and_each_jobs_class(tmp_path: Path):
    topo = gpuplace.Topology.from_dict(cluster_dict())
    state = gpuplace.ClusterState(topo)
    c = Checker(InvalidState, None)
    state.policy = ClusterPolicy.from_dict({"pools": POOLS, "priority_classes": CLASSES}, c)
    state.allocate(gpuplace.place(state, job("b", pool="train", priority_class="batch")))
    state.save(tmp_path / "s.json")
    again = gpuplace.ClusterState.load(topo, tmp_path / "s.json")
    assert again.policy == state.policy
    assert again.specs["b"].policy.priority_class == "batch"


def test_a_state_file_with_a_bad_pool_is_refused(tmp_path: Path):
    topo = gpuplace.Topology.from_dict(cluster_dict())
    snap = gpuplace.ClusterState(topo).snapshot()
    snap["policy"] = {"pools": {"x": "h[01-03]", "y": "h03"}}
    with pytest.raises(InvalidState, match=r"policy\.pools\.y: overlaps pool 'x'"):
        gpuplace.ClusterState.restore(topo, snap)


# ------------------------------------------------------------------ preemption
@st.composite
def crowded_states(draw: Any) -> tuple[gpuplace.ClusterState, gpuplace.Job]:
    state = pooled_state()
    chunks = [[g, g + 1] for g in range(0, 16, 2)]  # pool train: h01-h04, in halves
    if draw(st.booleans()):  # whole hosts
        chunks = [chunks[i] + chunks[i + 1] for i in range(0, 8, 2)]
    draw(st.randoms()).shuffle(chunks)
    for k in range(8):  # fill the pool
        take = draw(st.sampled_from([1, 2]))
        if len(chunks) < take:
            break
        gpus = [g for chunk in chunks[:take] for g in chunk]
        chunks = chunks[take:]
        klass = draw(st.sampled_from(["production", "serving", "batch", "batch", None]))
        spec = job(
            f"r{k}",
            tp=1,
            dp=len(gpus),
            pool="train",
            **({"priority_class": klass} if klass else {}),
        )
        state.allocate(name=spec.name, gpus=gpus)
        state.specs[spec.name] = spec
    klass = draw(st.sampled_from(["production", "serving", "batch"]))
    return state, job(
        "new",
        tp=4,
        dp=draw(st.integers(1, 3)),
        pool="train",
        priority_class=klass,
    )


@given(crowded_states())
def test_preemption_never_touches_a_non_preemptible_job(case):
    state, new = case
    classes = {n: (s.policy.priority_class if s.policy else None) for n, s in state.specs.items()}
    before = {n: g.copy() for n, g in state.jobs.items()}
    try:
        p = gpuplace.place(state, new, preempt=True)
    except Infeasible:
        return
    assert {n: g.tolist() for n, g in state.jobs.items()} == {
        n: g.tolist() for n, g in before.items()
    }  # only proposed
    victims = p.details.get("preemption", {}).get("victims", [])
    mine = CLASSES[new.policy.priority_class]["priority"]
    for v in victims:
        assert classes[v["job"]] == "batch"
        assert CLASSES["batch"]["priority"] < mine
    gone = gpuplace.apply_preemption(state, p)
    assert sorted(gone) == sorted(v["job"] for v in victims)
    np.testing.assert_array_equal(state.job_gpus("new"), p.gpus)
    state.check()


def test_apply_preemption_is_all_or_nothing():
    state = pooled_state()
    low = job("low", tp=4, dp=4, pool="train", priority_class="batch")
    state.allocate(gpuplace.place(state, low))
    urgent = job("urgent", tp=4, dp=2, pool="train", priority_class="production")
    p = gpuplace.place(state, urgent, preempt=True)
    assert p.details["preemption"]["victims"][0]["job"] == "low"
    assert p.details["preemption"]["cost"]["gpus"] == 16
    state.fail(gpu=int(p.gpus[0]))
    with pytest.raises(InvalidState, match="no longer available"):
        gpuplace.apply_preemption(state, p)
    assert "low" in state.jobs and "urgent" not in state.jobs
    state.check()


# ------------------------------------------------------------------ the command line
def test_cli_pool_preemption_exclusion_explain_and_status(tmp_path: Path):
    """The demos of the issue on the built-in 64-node h100-superpod."""
    import json
    import subprocess
    import sys

    examples = Path(__file__).resolve().parents[1] / "examples" / "policy"
    state = str(tmp_path / "s.json")
    cluster = ["-c", "h100-superpod", "--nodes", "64"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuplace.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def place(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return run(
            "place",
            *cluster,
            "-j",
            str(examples / f"{name}.yaml"),
            "--state",
            state,
            "--format",
            "json",
            *extra,
        )

    r = run(
        "policy", "set", "--state", state, *cluster, "-f", str(examples / "cluster-policy.yaml")
    )
    assert r.returncode == 0, r.stderr
    r = place("train-gang")
    assert r.returncode == 0, r.stderr
    gang = json.loads(r.stdout)
    assert not set(gang["nodes"]) & {f"dgx{i:03d}" for i in range(1, 9)}  # the exclusion
    r = place("serve")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "blocked by pool inference" in r.stderr
    assert place("batch-sweep").returncode == 0
    r = place("urgent")
    assert r.returncode == 2 and "blocked by pool training" in r.stderr
    r = run("explain", "--state", state, "-j", str(examples / "urgent.yaml"), "--format", "json")
    account = json.loads(r.stdout)
    assert not account["placeable"] and "pool" in account["binding"]
    r = place("urgent", "--preempt")
    assert r.returncode == 0, r.stderr
    victims = json.loads(r.stdout)["details"]["preemption"]["victims"]
    assert [v["job"] for v in victims] == ["batch-sweep"]
    r = run("status", "--state", state, "--format", "json")
    pools = {p["pool"]: p for p in json.loads(r.stdout)["pools"]}
    assert pools["training"]["used"] == 256 and pools["inference"]["free"] == 256
    jobs = {j["name"]: j for j in json.loads(r.stdout)["jobs"]}
    assert set(jobs) == {"train-gang", "urgent"}
    assert jobs["urgent"]["priority_class"] == "production"
    assert jobs["train-gang"]["pool"] == "training"
    r = run("status", "--state", state)
    assert r.returncode == 0, r.stderr
    assert "pools" in r.stdout and "training" in r.stdout


# ------------------------------------------------------------------ attributes from nvidia-smi
QUERY = (
    "index, name, driver_version, vbios_version, memory.total [MiB]\n"
    "0, NVIDIA H100 80GB HBM3, 550.54.15, 96.00.74.00.01, 81559 MiB\n"
    "1, NVIDIA H100 80GB HBM3, 550.54.15, 96.00.99.00.01, 81559 MiB\n"
    "2, NVIDIA H100 80GB HBM3, [N/A], 96.00.74.00.01, 81559 MiB\n"
)


def test_nvidia_smi_query_gives_per_gpu_attributes_that_steer_placement():
    import io

    from gpuplace.io import read_nvidia_smi_query

    entries = read_nvidia_smi_query(io.StringIO(QUERY), host="h01")
    assert entries == [
        {
            "hosts": "h01",
            "gpus": [0],
            "model": "NVIDIA H100 80GB HBM3",
            "driver": "550.54.15",
            "firmware": "96.00.74.00.01",
        },
        {
            "hosts": "h01",
            "gpus": [1],
            "model": "NVIDIA H100 80GB HBM3",
            "driver": "550.54.15",
            "firmware": "96.00.99.00.01",
        },
        {
            "hosts": "h01",
            "gpus": [2],
            "model": "NVIDIA H100 80GB HBM3",
            "firmware": "96.00.74.00.01",
        },
    ]
    doc = cluster_dict()
    doc["attributes"] = entries
    state = gpuplace.ClusterState(gpuplace.Topology.from_dict(doc))
    p = gpuplace.place(state, job(tp=2, dp=1, avoid={"firmware": "<96.00.99"}))
    assert 0 not in p.gpus and 2 not in p.gpus
    p = gpuplace.place(state, job(tp=1, dp=2, require={"model": "*H100*", "driver": ">=550"}))
    assert sorted(p.gpus.tolist()) == [0, 1]  # only GPUs 0 and 1 have both


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0, NVIDIA H100, 550\n", "no CSV header"),
        ("index, name\n0, a, b\n", "q.csv:2: expected 2 fields"),
        ("index, name\n0, a\n0, b\n", "q.csv:3: GPU index 0 is listed twice"),
        ("index, name\nx, a\n", "index: expected a GPU index"),
        ("index, name\n", "no GPU rows"),
    ],
)
def test_nvidia_smi_query_refuses_bad_input(text, needle, tmp_path):
    from gpuplace.io import read_nvidia_smi_query

    path = tmp_path / "q.csv"
    path.write_text(text)
    with pytest.raises(InvalidTopology, match=re.escape(needle)):
        read_nvidia_smi_query(path, host="h01")


# ------------------------------------------------------------------ malformed state sections
_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 40),
    st.floats(allow_nan=True),
    st.sampled_from(["h01", "la", "h[01-99]", "1g.10gb", "3g.40gb", "*", ">=1", "", "s", "x:y"]),
)
_VALUE = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "pools",
                    "domains",
                    "lend_to",
                    "priority_classes",
                    "priority",
                    "preemptible",
                    "attributes",
                    "hosts",
                    "gpus",
                    "firmware",
                    "labels",
                    "model",
                    "0",
                    "3",
                    "profile",
                    "start",
                    "owner",
                    "distribution",
                    "a",
                    "b",
                ]
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)


@given(st.sampled_from(["policy", "mig"]), _VALUE)
def test_garbage_policy_or_mig_sections_are_refused_cleanly(section, value):
    from gpuplace.cluster import mig

    doc = cluster_dict()
    doc["node_types"]["hgx"]["gpu_model"] = "A100-SXM4-80GB"
    topo = gpuplace.Topology.from_dict(doc)
    base = gpuplace.ClusterState(topo)
    if section == "mig":
        mig.enable(base, [0, 1, 2, 3])
        snap = base.snapshot()
        snap["mig"]["gpus"]["0"] = value  # the instances of one MIG GPU
    else:
        snap = base.snapshot()
        snap["policy"] = value
    try:
        state = gpuplace.ClusterState.restore(topo, snap)
    except InvalidState:
        return
    state.check()
    if state.mig is not None:
        state.mig.check()


def test_explain_counts_borrowing_as_place_does():
    state = pooled_state()
    state.allocate(name="full", gpus=list(range(16)))  # pool train is full
    batch = job("b", tp=4, dp=2, pool="train", priority_class="batch")
    account = gpuplace.explain(state, batch)
    assert account.placeable
    assert account.summary() == "b (8 GPUs) fits now in pool train (borrowing from serve)"
    assert gpuplace.place(state, batch).details["policy"]["borrowed_gpus"] == 8
    strict = gpuplace.explain(state, batch, borrow=False)
    assert not strict.placeable and [c.kind for c in strict.binding][:1] == ["pool"]


@given(policy_cases(), st.integers(0, 7), st.integers(0, 2))
def test_repair_keeps_every_rule_for_the_moved_ranks(case, victim, max_moves):
    _topo, state, j = case
    try:
        placement = gpuplace.place(state, j)
    except Infeasible:
        return
    state.allocate(placement)
    allowed = allowed_gpus(state, j)
    host = _topo.host_of(int(placement.gpus[victim % j.gpus]))
    state.fail(host=host)
    before = state.snapshot()
    try:
        result = gpuplace.repair(state, j.name, max_moves=max_moves)
    except Infeasible:
        assert state.snapshot() == before  # all or nothing
        return
    for m in result.moved:
        assert allowed[m.new_gpu], (m, str(j.policy))
    assert not gpuplace._core.fence_mask(state._core).any()
    state.check()


def test_cli_bad_policy_file_is_one_line_naming_the_field(tmp_path: Path):
    import subprocess
    import sys

    bad = tmp_path / "policy.yaml"
    bad.write_text("pools:\n  training: su999\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuplace.cli",
            "policy",
            "set",
            "--state",
            str(tmp_path / "s.json"),
            "-c",
            "h100-superpod",
            "--nodes",
            "64",
            "-f",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "policy.yaml: pools.training.domains: unknown domain 'su999'" in r.stderr
    assert not (tmp_path / "s.json").exists()  # nothing written
