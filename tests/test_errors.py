"""Bad input: every malformed topology, job or state raises the named gpuplace error, naming
the file and the field, never KeyError / TypeError / RecursionError / a panic."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import gpuplace
import pytest
import yaml
from gpuplace import ClusterState, Job, Topology
from hypothesis import given
from hypothesis import strategies as st
from strategies import topology_dicts


def pcie() -> dict[str, Any]:
    """A valid document with every feature: sublevels, NICs, two spines' worth of levels."""
    doc = Topology.preset("pcie-cluster", nodes=2).to_dict()
    doc["node_types"]["pcie-8gpu"]["bandwidth_gbps"] = [
        [0 if i == j else 32.0 for j in range(8)] for i in range(8)
    ]
    return doc


def write(tmp_path: Path, name: str, content: Any) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    elif name.endswith(".json"):
        path.write_text(json.dumps(content))
    else:
        path.write_text(yaml.safe_dump(content))
    return path


def edited(edit) -> dict[str, Any]:
    doc = pcie()
    edit(doc)
    return doc


def node_type(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["node_types"]["pcie-8gpu"]


# --------------------------------------------------------------------------- topology files
TOPOLOGY_CASES = [
    # (id, document edit, field the message must name)
    ("levels-not-a-list", lambda d: d.update(levels="node"), "levels"),
    ("no-levels", lambda d: d.pop("levels"), "levels"),
    ("empty-levels", lambda d: d.update(levels=[]), "levels"),
    ("no-nodes", lambda d: d.pop("nodes"), "nodes"),
    ("no-node-types", lambda d: d.pop("node_types"), "node_types"),
    ("no-format", lambda d: d.pop("format"), "format"),
    ("wrong-format", lambda d: d.update(format="gpuplace.topology/2"), "format"),
    ("unknown-top-field", lambda d: d.update(colour="red"), "colour"),
    ("unknown-level-field", lambda d: d["levels"][1].update(speed=3), "levels[1].speed"),
    ("unknown-node-field", lambda d: d["nodes"][0].update(rack=3), "nodes[0].rack"),
    ("unknown-type-field", lambda d: node_type(d).update(tdp=3), "node_types.pcie-8gpu.tdp"),
    ("bandwidth-string", lambda d: d["levels"][0].update(bandwidth_gbps="fast"), "levels[0]"),
    ("bandwidth-negative", lambda d: d["levels"][2].update(bandwidth_gbps=-1), "levels[2]"),
    ("bandwidth-zero", lambda d: d["levels"][2].update(bandwidth_gbps=0), "levels[2]"),
    ("bandwidth-nan", lambda d: d["levels"][0].update(bandwidth_gbps=float("nan")), "levels[0]"),
    ("bandwidth-huge-int", lambda d: d["levels"][0].update(bandwidth_gbps=10**400), "levels[0]"),
    ("latency-negative", lambda d: d["levels"][0].update(latency_us=-1), "levels[0].latency_us"),
    ("level-name-int", lambda d: d["levels"][0].update(name=7), "levels[0].name"),
    ("level-name-case", lambda d: d["levels"][0].update(name="NUMA"), "levels[0].name"),
    ("level-duplicate", lambda d: d["levels"][1].update(name="pcie-switch"), "levels[1].name"),
    ("node-level-unknown", lambda d: d.update(node_level="rack"), "node_level"),
    ("nvlink-below-node", lambda d: d.update(nvlink_domain="numa"), "nvlink_domain"),
    ("gpus-string", lambda d: node_type(d).update(gpus="8"), "node_types.pcie-8gpu.gpus"),
    ("gpus-zero", lambda d: node_type(d).update(gpus=0), "node_types.pcie-8gpu.gpus"),
    ("gpus-too-many", lambda d: node_type(d).update(gpus=10**9), "node_types.pcie-8gpu.gpus"),
    ("gpus-nan", lambda d: node_type(d).update(gpus=float("nan")), "node_types.pcie-8gpu.gpus"),
    ("types-empty", lambda d: d.update(node_types={}), "node_types"),
    ("types-list", lambda d: d.update(node_types=[1]), "node_types"),
    (
        "sublevel-short",
        lambda d: node_type(d)["sublevels"].update(numa=[0, 1]),
        "node_types.pcie-8gpu.sublevels.numa",
    ),
    (
        "sublevel-missing",
        lambda d: node_type(d)["sublevels"].pop("numa"),
        "node_types.pcie-8gpu.sublevels",
    ),
    (
        "sublevel-not-nested",
        lambda d: node_type(d)["sublevels"].update(numa=[0, 1, 0, 1, 0, 1, 0, 1]),
        "node_types.pcie-8gpu.sublevels",
    ),
    (
        "sublevel-negative",
        lambda d: node_type(d)["sublevels"].update(numa=[-1] * 8),
        "node_types.pcie-8gpu.sublevels.numa[0]",
    ),
    (
        "sublevel-above-node",
        lambda d: node_type(d)["sublevels"].update(leaf=[0] * 8),
        "node_types.pcie-8gpu.sublevels.leaf",
    ),
    (
        "matrix-asymmetric",
        lambda d: node_type(d)["bandwidth_gbps"][0].__setitem__(1, 64.0),
        "node_types.pcie-8gpu.bandwidth_gbps[",
    ),
    (
        "matrix-zero",
        lambda d: node_type(d)["bandwidth_gbps"][2].__setitem__(5, 0),
        "node_types.pcie-8gpu.bandwidth_gbps[",
    ),
    (
        "matrix-rows",
        lambda d: node_type(d)["bandwidth_gbps"].pop(),
        "node_types.pcie-8gpu.bandwidth_gbps",
    ),
    (
        "matrix-ragged",
        lambda d: node_type(d)["bandwidth_gbps"][3].pop(),
        "node_types.pcie-8gpu.bandwidth_gbps[3]",
    ),
    (
        "matrix-cell",
        lambda d: node_type(d)["bandwidth_gbps"][3].__setitem__(4, "NV18"),
        "node_types.pcie-8gpu.bandwidth_gbps[3][4]",
    ),
    (
        "matrix-string",
        lambda d: node_type(d).update(bandwidth_gbps="NV18"),
        "node_types.pcie-8gpu.bandwidth_gbps",
    ),
    (
        "link-classes-size",
        lambda d: node_type(d).update(link_classes=[["X"] * 8] * 7),
        "node_types.pcie-8gpu.link_classes",
    ),
    ("gpu-nic-range", lambda d: node_type(d).update(gpu_nic=[9] * 8), "gpu_nic"),
    ("gpu-nic-short", lambda d: node_type(d).update(gpu_nic=[0]), "gpu_nic"),
    ("nics-string", lambda d: node_type(d).update(nics="mlx5_0"), "nics"),
    ("power-string", lambda d: node_type(d).update(power_w="lots"), "power_w"),
    ("nodes-empty", lambda d: d.update(nodes=[]), "nodes"),
    ("nodes-mapping", lambda d: d.update(nodes={"a": 1}), "nodes"),
    ("node-null", lambda d: d["nodes"].append(None), "nodes[1]"),
    ("node-name-int", lambda d: d["nodes"][0].update(name=3), "nodes[0].name"),
    ("node-name-missing", lambda d: d["nodes"][0].pop("name"), "nodes[0].name"),
    ("node-type-unknown", lambda d: d["nodes"][0].update(type="dgx"), "nodes[0].type"),
    ("domains-missing", lambda d: d["nodes"][0].update(domains={}), "nodes[0].domains"),
    ("domains-list", lambda d: d["nodes"][0].update(domains=["leaf"]), "nodes[0].domains"),
    ("domain-float", lambda d: d["nodes"][0]["domains"].update(leaf=1.5), "nodes[0].domains.leaf"),
    ("domain-extra", lambda d: d["nodes"][0]["domains"].update(rack="r1"), "nodes[0].domains.rack"),
    (
        "duplicate-hosts",
        lambda d: d["nodes"].append({**d["nodes"][0], "name": "gpu002"}),
        "nodes[1].name",
    ),
    ("hostlist-1e9", lambda d: d["nodes"][0].update(name="n[1-1000000000]"), "nodes[0].name"),
    (
        "hostlist-product",
        lambda d: d["nodes"][0].update(name="r[1-100000]n[1-100000]"),
        "nodes[0].name",
    ),
    ("hostlist-unclosed", lambda d: d["nodes"][0].update(name="gpu[1-"), "nodes[0].name"),
    ("hostlist-backwards", lambda d: d["nodes"][0].update(name="gpu[9-1]"), "nodes[0].name"),
    (
        "domains-do-not-nest",
        lambda d: d["nodes"].extend(
            [
                {"name": "x1", "type": "pcie-8gpu", "domains": {"leaf": "su001", "spine": "s2"}},
                {"name": "x2", "type": "pcie-8gpu", "domains": {"leaf": "su9", "spine": "s2"}},
            ]
        ),
        "domains do not nest",
    ),
    (
        "several-top-domains",
        lambda d: d["nodes"].append(
            {"name": "x1", "type": "pcie-8gpu", "domains": {"leaf": "su9", "spine": "s2"}}
        ),
        "top level",
    ),
]


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize(
    ("edit", "field"), [c[1:] for c in TOPOLOGY_CASES], ids=[c[0] for c in TOPOLOGY_CASES]
)
def test_malformed_topology_files_name_the_file_and_field(tmp_path, suffix, edit, field):
    doc = edited(edit)
    if suffix == ".json":
        text = json.dumps(doc, allow_nan=True)
    else:
        text = yaml.safe_dump(doc)
    path = write(tmp_path, f"cluster{suffix}", text)
    with pytest.raises(gpuplace.InvalidTopology) as info:
        Topology.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert field in message, message


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        (
            "bad.yaml",
            "format: gpuplace.topology/1\nlevels:\n  - {name: node,\n  bw: [1,\n",
            "line ",
        ),
        ("tab.yaml", "format: gpuplace.topology/1\n\tlevels: []\n", "line 2"),
        ("bad.json", '{"format": "gpuplace.topology/1",\n "levels": [}', "line 2"),
        ("tag.yaml", "!!python/object/apply:os.system [echo]\n", "line 1"),
        ("empty.yaml", "", "expected a mapping"),
        ("list.yaml", "- 1\n- 2\n", "expected a mapping"),
        ("binary.yaml", b"\xff\xfe\x00\x01", "line 1: expected UTF-8"),
        ("deep.json", "[" * 100_000 + "]" * 100_000, ""),
        ("deep.yaml", "[" * 20_000 + "]" * 20_000, ""),
        ("bigint.yaml", None, "bandwidth_gbps"),
    ],
)
def test_unreadable_topology_files(tmp_path, name, text, where):
    if text is None:
        text = (
            "format: gpuplace.topology/1\n"
            f"levels: [{{name: node, bandwidth_gbps: {'9' * 400}}}]\n"
            "node_types: {t: {gpus: 1}}\n"
            "nodes: [{name: a, type: t}]\n"
        )
    path = write(tmp_path, name, text)
    with pytest.raises(gpuplace.InvalidTopology) as info:
        Topology.load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert where in str(info.value)


def test_missing_topology_file_and_directory(tmp_path):
    with pytest.raises(gpuplace.InvalidTopology, match="no such file"):
        Topology.load(tmp_path / "nope.yaml")
    with pytest.raises(gpuplace.InvalidTopology):
        Topology.load(tmp_path)


def test_not_a_networkx_topology_graph():
    nx = pytest.importorskip("networkx")
    with pytest.raises(gpuplace.InvalidTopology):
        Topology.from_networkx(nx.path_graph(4))


# --------------------------------------------------------------------------- job files
JOB_CASES = [
    ("not-a-mapping", [1, 2], ""),
    ("no-name", {"parallelism": {"tp": 2}}, "name"),
    ("tp-string", {"name": "j", "parallelism": {"tp": "8"}}, "parallelism.tp"),
    ("tp-zero", {"name": "j", "parallelism": {"tp": 0}}, "parallelism.tp"),
    ("tp-fraction", {"name": "j", "parallelism": {"tp": 2.5}}, "parallelism.tp"),
    ("unknown-dimension", {"name": "j", "parallelism": {"zp": 2}}, "parallelism.zp"),
    ("unknown-field", {"name": "j", "priority": 1}, "priority"),
    ("rank-order-short", {"name": "j", "rank_order": ["tp"]}, "rank_order"),
    ("model-string", {"name": "j", "model": "llama-7b"}, "model"),
    ("model-missing-field", {"name": "j", "model": {"layers": 2}}, "model.parameters"),
    (
        "model-huge-int",
        {
            "name": "j",
            "model": {"parameters": 10**400, "layers": 2, "hidden_size": 8, "sequence_length": 8},
        },
        "model.parameters",
    ),
    ("comm-kind", {"name": "j", "communication": {"tp": {"kind": "bcast", "bytes": 1}}}, "kind"),
    (
        "comm-p2p-not-pp",
        {"name": "j", "communication": {"tp": {"kind": "p2p", "bytes": 1}}},
        "communication.tp.kind",
    ),
    ("comm-bytes", {"name": "j", "communication": {"tp": {"bytes": -1}}}, "communication.tp.bytes"),
    ("comm-dimension", {"name": "j", "communication": {"xp": {"bytes": 1}}}, "communication.xp"),
    ("confine-dimension", {"name": "j", "constraints": {"confine": {"xp": "node"}}}, "confine.xp"),
    ("confine-level-int", {"name": "j", "constraints": {"confine": {"tp": 1}}}, "confine.tp"),
    ("max-span-int", {"name": "j", "constraints": {"max_span": 2}}, "constraints.max_span"),
    (
        "traffic-and-degrees",
        {"name": "j", "parallelism": {"tp": 2}, "traffic": {"matrix": [[0]]}},
        "traffic",
    ),
    ("traffic-ragged", {"name": "j", "traffic": {"matrix": [[0, 1], [1]]}}, "traffic.matrix[1]"),
    (
        "traffic-edge-rank",
        {"name": "j", "traffic": {"ranks": 2, "edges": [[0, 5, 1.0]]}},
        "traffic.edges[0]",
    ),
    (
        "traffic-edge-huge",
        {"name": "j", "traffic": {"ranks": 2, "edges": [[0, 1, 10**400]]}},
        "traffic.edges[0][2]",
    ),
]


@pytest.mark.parametrize(
    ("doc", "field"), [c[1:] for c in JOB_CASES], ids=[c[0] for c in JOB_CASES]
)
def test_malformed_job_files_name_the_file_and_field(tmp_path, doc, field):
    path = write(tmp_path, "job.yaml", yaml.safe_dump(doc))
    with pytest.raises(gpuplace.InvalidJob) as info:
        Job.load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bad.yaml", "name: j\nparallelism: {tp: 2\n"),
        ("bad.json", '{"name": '),
        ("deep.json", "[" * 100_000 + "]" * 100_000),
        ("deep.yaml", "[" * 20_000 + "]" * 20_000),
        ("empty.yaml", ""),
    ],
)
def test_unreadable_job_files(tmp_path, name, text):
    path = write(tmp_path, name, text)
    with pytest.raises(gpuplace.InvalidJob) as info:
        Job.load(path)
    assert str(info.value).startswith(f"{path}: ")
    with pytest.raises(gpuplace.InvalidJob, match="no such file"):
        Job.load(tmp_path / "missing.yaml")


def test_absurd_job_sizes_are_refused_with_a_named_error():
    """A job far larger than any cluster must be Infeasible (or InvalidJob), not an
    OverflowError. (Sizes whose arrays would not fit in memory are tested in a subprocess by
    the CLI tests, because the core aborts the process on them.)"""
    state = ClusterState(Topology.preset("dgx-h100"))
    for document in (
        {"name": "j", "parallelism": {"tp": 10**30}},
        {"name": "j", "traffic": {"ranks": 10**30, "edges": [[0, 1, 1.0]]}},
        {"name": "j", "parallelism": {"tp": 64, "dp": 64}},  # legal, larger than the cluster
    ):
        with pytest.raises((gpuplace.Infeasible, gpuplace.InvalidJob)):
            gpuplace.place(state, Job.from_dict(document))


def test_placements_with_bad_gpu_ids_raise_named_errors():
    topo = Topology.preset("dgx-h100")
    job = Job(name="j", tp=2)
    for gpus in ([0], [0, 0], [0, 8], [-1, 0]):
        with pytest.raises(gpuplace.GpuplaceError):
            gpuplace.evaluate(topo, job, gpus)


def test_a_deeply_nested_state_file_is_refused(tmp_path):
    topo = Topology.preset("dgx-h100")
    path = write(tmp_path, "state.json", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(gpuplace.InvalidState):
        ClusterState.load(topo, path)


# --------------------------------------------------------------------------- fuzzing
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from([10**400, "1e999", "n[1-3]", "", "node", -1, 0, 65, "nvlink_domain"]),
    st.lists(st.integers(-1, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(0, 3), max_size=2),
)

nested = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def locations(value: Any, out: list) -> list:
    """Every (container, key) of a nested document."""
    if isinstance(value, dict):
        for key in value:
            out.append((value, key))
            locations(value[key], out)
    elif isinstance(value, list):
        for index in range(len(value)):
            out.append((value, index))
            locations(value[index], out)
    return out


@st.composite
def mutated(draw, documents):
    """A valid document with one to three places deleted or replaced by junk."""
    doc = copy.deepcopy(draw(documents))
    for _ in range(draw(st.integers(1, 3))):
        places = locations(doc, [])
        if not places:
            break
        container, key = draw(st.sampled_from(places))
        if isinstance(container, dict) and draw(st.booleans()):
            del container[key]
        else:
            container[key] = draw(junk)
    return doc


def allowed_topology(document: Any) -> None:
    try:
        topology = Topology.from_dict(document, source="fuzz.yaml")
    except gpuplace.InvalidTopology as exc:
        assert str(exc).startswith("fuzz.yaml: ")
        return
    Topology.from_dict(topology.to_dict())


@given(nested)
def test_fuzz_topology_from_random_data(document):
    allowed_topology(document)
    allowed_topology({"format": "gpuplace.topology/1", "levels": document, "nodes": document})


@given(mutated(topology_dicts()))
def test_fuzz_topology_from_mutated_documents(document):
    allowed_topology(document)


def job_documents() -> st.SearchStrategy[dict[str, Any]]:
    small = st.integers(1, 3)
    return st.fixed_dictionaries(
        {"name": st.just("j")},
        optional={
            "parallelism": st.fixed_dictionaries(
                {}, optional={d: small for d in ("tp", "dp", "pp")}
            ),
            "rank_order": st.permutations(["tp", "cp", "ep", "dp", "pp"]),
            "model": st.just(
                {"parameters": 7e9, "layers": 4, "hidden_size": 64, "sequence_length": 32}
            ),
            "communication": st.just({"dp": {"kind": "all-gather", "bytes": 10.0, "count": 2}}),
            "constraints": st.just({"confine": {"tp": "node"}, "max_span": "leaf"}),
        },
    )


def traffic_documents() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.just({"name": "t", "traffic": {"matrix": [[0, 1.0], [2.0, 0]]}}),
        st.just({"name": "t", "traffic": {"ranks": 3, "edges": [[0, 1, 5.0], [2, 0, 1.0]]}}),
    )


CLUSTER = Topology.preset("h100-superpod", nodes=4)


def allowed_job(document: Any) -> None:
    try:
        job = Job.from_dict(document, source="job.yaml")
    except gpuplace.InvalidJob as exc:
        assert str(exc).startswith("job.yaml: ")
        return
    Job.from_dict(job.to_dict())
    # Only sizes that cannot exhaust memory go on to the core (see the CLI tests).
    if job.gpus <= 10_000:
        try:
            gpuplace.place(ClusterState(CLUSTER), job)
        except (gpuplace.InvalidJob, gpuplace.Infeasible):
            pass


@given(nested)
def test_fuzz_job_from_random_data(document):
    allowed_job(document)
    allowed_job({"name": "j", "parallelism": document, "traffic": document})


@given(mutated(job_documents() | traffic_documents()))
def test_fuzz_job_from_mutated_documents(document):
    allowed_job(document)
