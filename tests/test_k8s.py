"""Kubernetes export: every object validates against the CRDs the schedulers ship (their
openAPIV3Schema, with jsonschema, plus the levels' CEL rules checked by hand), the labels
describe the topology's tree, `topo import --k8s` reads them back into the same tree, and the
pod patches put rank r where gpuplace placed it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import gpuplace
import pytest
import yaml
from gpuplace.errors import InvalidTopology
from gpuplace.integrations import k8s

jsonschema = pytest.importorskip("jsonschema")

CRDS = Path(__file__).parent / "data" / "k8s-crds"
EXAMPLES = Path(__file__).parent.parent / "examples"
CLI = [sys.executable, "-m", "gpuplace.cli"]
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> openAPIV3Schema, for every served version of every CRD."""
    out = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            out[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return out


SCHEMAS = _schemas()


def validate(obj: dict) -> None:
    schema = SCHEMAS[(obj["apiVersion"], obj["kind"])]
    jsonschema.Draft7Validator(schema).validate(obj)
    # x-kubernetes-validations are CEL, which jsonschema does not run: the level rules by hand.
    levels = obj["spec"].get("levels")
    if levels is not None:
        labels = [level["nodeLabel"] for level in levels]
        assert len(labels) == len(set(labels)), labels
        assert "kubernetes.io/hostname" not in labels[:-1], labels
        assert 1 <= len(labels) <= 16
        aliases = [level["alias"] for level in levels if "alias" in level]
        assert len(aliases) == len(set(aliases)) and not set(aliases) & set(labels)
    members = obj["spec"].get("members")
    for member in members or []:
        assert sum(k in member["selector"] for k in ("exactMatch", "regexMatch", "labelMatch")) == 1


CLUSTERS = {
    "gb200-nvl72": lambda: gpuplace.Topology.preset("gb200-nvl72", racks=4),
    "h100-superpod": lambda: gpuplace.Topology.preset("h100-superpod", nodes=64),
}


@pytest.fixture(params=sorted(CLUSTERS))
def topology(request: pytest.FixtureRequest) -> gpuplace.Topology:
    return CLUSTERS[request.param]()


def test_the_crds_are_the_three_schedulers_kinds() -> None:
    assert set(SCHEMAS) >= {
        ("kueue.x-k8s.io/v1beta2", "Topology"),
        ("topology.volcano.sh/v1alpha1", "HyperNode"),
        ("kai.scheduler/v1alpha1", "Topology"),
    }


@pytest.mark.parametrize("topograph_run", [False, True])
def test_every_object_validates_against_its_crd(
    topology: gpuplace.Topology, topograph_run: bool
) -> None:
    objs = [
        k8s.kueue_topology(topology, topograph_run=topograph_run),
        k8s.kai_topology(topology, topograph_run=topograph_run),
        *k8s.volcano_hypernodes(topology, topograph_run=topograph_run),
        *k8s.volcano_hypernodes(topology, members="regex", topograph_run=topograph_run),
    ]
    for obj in objs:
        validate(obj)
    # The schema really constrains: a Kueue level with an invalid label key is refused.
    bad = k8s.kueue_topology(topology)
    bad["spec"]["levels"][0]["nodeLabel"] = "not a label/"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad_hn = k8s.volcano_hypernodes(topology)[0]
    bad_hn["spec"]["members"][0]["type"] = "Rack"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad_hn)


def test_nvl72_racks_are_the_accelerator_level() -> None:
    topology = CLUSTERS["gb200-nvl72"]()
    labels = k8s.node_labels(topology, topograph_run=True)
    nvl = topology.nvlink_level
    for h, host in enumerate(topology.hosts):
        rack = topology.domain_of(int(topology.host_gpus(host)[0]), nvl)
        assert labels[host]["network.topology.nvidia.com/accelerator"] == rack
        assert labels[host]["accelerator.topograph.run/domain"] == rack
        leaf = topology.host_domains[h][topology.level_index("leaf") - topology.node_level - 1]
        assert labels[host]["network.topology.nvidia.com/leaf"] == leaf
        assert labels[host]["fabric.topograph.run/tier-0"] == leaf
        assert labels[host]["kubernetes.io/hostname"] == host
        for key, value in labels[host].items():
            assert _LABEL_KEY.match(key) and _LABEL_VALUE.match(value) and len(value) <= 63
    levels = [lv["nodeLabel"] for lv in k8s.kueue_topology(topology)["spec"]["levels"]]
    assert levels == [
        "network.topology.nvidia.com/leaf",
        "network.topology.nvidia.com/accelerator",
        "kubernetes.io/hostname",
    ]


def test_superpod_levels_are_top_down_with_hostname_last() -> None:
    topology = CLUSTERS["h100-superpod"]()
    levels = [lv["nodeLabel"] for lv in k8s.kai_topology(topology)["spec"]["levels"]]
    assert levels == [
        "network.topology.nvidia.com/spine",
        "network.topology.nvidia.com/leaf",
        "kubernetes.io/hostname",
    ]
    labels = k8s.node_labels(topology)
    assert "network.topology.nvidia.com/accelerator" not in labels["dgx001"]  # NVLink = the node


def test_hypernodes_form_the_topology_tree(topology: gpuplace.Topology) -> None:
    for members in ("exact", "regex"):
        hypernodes = k8s.volcano_hypernodes(topology, members=members)
        by_tier: dict[int, list[dict]] = {}
        for hn in hypernodes:
            by_tier.setdefault(hn["spec"]["tier"], []).append(hn)
        assert sorted(by_tier) == list(range(1, len(by_tier) + 1))
        # Tier 1: every host in exactly one HyperNode, grouped as the lowest labelled level.
        seen: list[str] = []
        for hn in by_tier[1]:
            hosts = []
            for m in hn["spec"]["members"]:
                assert m["type"] == "Node"
                if "exactMatch" in m["selector"]:
                    hosts.append(m["selector"]["exactMatch"]["name"])
                else:
                    pattern = re.compile(m["selector"]["regexMatch"]["pattern"])
                    hosts.extend(h for h in topology.hosts if pattern.fullmatch(h))
            seen.extend(hosts)
            lowest = topology.node_level + 1
            domains = {topology.domain_of(int(topology.host_gpus(h)[0]), lowest) for h in hosts}
            assert len(domains) == 1, (hn["metadata"]["name"], domains)
        assert sorted(seen) == sorted(topology.hosts)
        # Higher tiers hold the HyperNodes of the tier below, each exactly once.
        for tier in range(2, len(by_tier) + 1):
            below = {hn["metadata"]["name"] for hn in by_tier[tier - 1]}
            children = [
                m["selector"]["exactMatch"]["name"]
                for hn in by_tier[tier]
                for m in hn["spec"]["members"]
            ]
            assert all(
                m["type"] == "HyperNode" for hn in by_tier[tier] for m in hn["spec"]["members"]
            )
            assert sorted(children) == sorted(below)


def _partition(topology: gpuplace.Topology, level: int) -> set[frozenset[str]]:
    groups: dict[str, set[str]] = {}
    for host in topology.hosts:
        groups.setdefault(topology.domain_of(int(topology.host_gpus(host)[0]), level), set()).add(
            host
        )
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize("topograph_run", [False, True])
def test_topo_import_k8s_reads_the_labels_back(
    topology: gpuplace.Topology, topograph_run: bool, tmp_path: Path
) -> None:
    (tmp_path / "nodes.json").write_text(
        json.dumps(k8s.node_list(topology, topograph_run=topograph_run))
    )
    result = subprocess.run(
        [*CLI, "topo", "import", "--k8s", "nodes.json", "-o", "back.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    back = gpuplace.Topology.load(tmp_path / "back.yaml")
    assert back.hosts == topology.hosts
    assert back.num_gpus == topology.num_gpus
    assert back.nvlink_level - back.node_level == topology.nvlink_level - topology.node_level
    assert len(back.levels) - back.node_level == len(topology.levels) - topology.node_level
    for offset in range(1, len(topology.levels) - topology.node_level):
        assert _partition(back, back.node_level + offset) == _partition(
            topology, topology.node_level + offset
        )


@pytest.mark.parametrize("pin", ["nodeName", "affinity"])
@pytest.mark.parametrize("workload", ["job", "jobset"])
def test_pod_patches_put_each_rank_where_it_was_placed(pin: str, workload: str) -> None:
    topology = CLUSTERS["gb200-nvl72"]()
    state = gpuplace.ClusterState(topology)
    state.allocate(gpuplace.place(state, gpuplace.Job(name="other", tp=4, dp=3), solver="greedy"))
    job = gpuplace.Job.load(EXAMPLES / "moe-ep.yaml")
    placement = gpuplace.place(state, job, solver="greedy")
    patches = k8s.pod_patches(placement, workload=workload, pin=pin, container="trainer")
    assert [p["completionIndex"] for p in patches] == list(range(len(placement.gpus)))
    for rank, patch in enumerate(patches):
        gpu = int(placement.gpus[rank])
        host = topology.host_of(gpu)
        spec = patch["template"]["spec"]
        if pin == "nodeName":
            assert spec["nodeName"] == host
        else:
            term = spec["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            expr = term["nodeSelectorTerms"][0]["matchExpressions"][0]
            assert expr == {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}
        (container,) = spec["containers"]
        assert container["name"] == "trainer"
        assert container["env"] == [
            {"name": "CUDA_VISIBLE_DEVICES", "value": str(topology.local_index(gpu))}
        ]
        assert ("jobIndex" in patch) == (workload == "jobset")


def test_more_network_levels_than_topograph_keys_need_the_tier_keys() -> None:
    doc = CLUSTERS["h100-superpod"]().to_dict()
    doc["levels"] += [
        {"name": "core", "bandwidth_gbps": 50.0, "latency_us": 4.0},
        {"name": "dc", "bandwidth_gbps": 25.0, "latency_us": 9.0},
    ]
    for group in doc["nodes"]:
        group["domains"].update(core="core1", dc="dc1")
    topology = gpuplace.Topology.from_dict(doc)
    with pytest.raises(InvalidTopology, match=r"fabric\.topograph\.run/tier-N"):
        k8s.node_labels(topology)
    labels = k8s.node_labels(topology, topograph_run=True)["dgx001"]
    assert labels["fabric.topograph.run/tier-3"] == "dc1"
    validate(k8s.kueue_topology(topology, topograph_run=True))


def test_domain_names_become_label_values_without_collisions() -> None:
    doc = CLUSTERS["h100-superpod"]().to_dict()
    group = doc["nodes"][0]
    doc["nodes"] = [
        {**group, "name": "dgx[001-032]", "domains": {"leaf": "ib sw/1:a", "spine": "S" * 80}},
        {**group, "name": "dgx[033-064]", "domains": {"leaf": "ib sw/1:b", "spine": "S" * 80}},
    ]
    topology = gpuplace.Topology.from_dict(doc)
    labels = k8s.node_labels(topology)
    leafs = {labels[h]["network.topology.nvidia.com/leaf"] for h in ("dgx001", "dgx064")}
    assert len(leafs) == 2
    for value in [*leafs, labels["dgx001"]["network.topology.nvidia.com/spine"]]:
        assert _LABEL_VALUE.match(value) and len(value) <= 63, value
    for hn in k8s.volcano_hypernodes(topology):
        validate(hn)


def test_cli_export_writes_every_object_and_refuses_bad_host_names(tmp_path: Path) -> None:
    (tmp_path / "moe.yaml").write_text((EXAMPLES / "moe-ep.yaml").read_text())
    run = [*CLI, "k8s", "export", "-c", "gb200-nvl72", "--racks", "2", "-o", "out"]
    result = subprocess.run(
        [*run, "--job", "moe.yaml", "--workload", "jobset", "--volcano-members", "regex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    for name in ("kueue-topology.yaml", "kai-topology.yaml", "volcano-hypernodes.yaml"):
        docs = list(yaml.safe_load_all((out / name).read_text()))
        assert docs
        for obj in docs:
            validate(obj)
    nodes = json.loads((out / "nodes.json").read_text())
    assert len(nodes["items"]) == 36
    label_lines = (out / "label-nodes.sh").read_text().splitlines()
    assert label_lines[0].startswith("kubectl label node rack001-tray01 ")
    assert "network.topology.nvidia.com/accelerator=rack001" in label_lines[0]
    (patches,) = yaml.safe_load_all((out / "pod-patches.yaml").read_text())
    assert patches["workload"] == "jobset" and len(patches["pods"]) > 0

    doc = CLUSTERS["h100-superpod"]().to_dict()
    doc["nodes"][0]["name"] = "DGX_[001-064]"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    bad = subprocess.run(
        [*CLI, "k8s", "export", "-c", "bad.json", "-o", "bad-out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("gpuplace: error: ") and len(bad.stderr.splitlines()) == 1
    assert "'DGX_001' is not a valid Kubernetes node name" in bad.stderr
    assert not (tmp_path / "bad-out").exists()
