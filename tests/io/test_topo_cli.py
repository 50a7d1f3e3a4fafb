"""``gpuplace topo import/show/export`` run as a user runs them: in a subprocess."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import gpuplace as gpuplace_pkg
import pytest
from gpuplace import Topology
from gpuplace.io import read_slurm_topology

DATA = Path(__file__).resolve().parents[1] / "data" / "topologies"
H100 = DATA / "nvidia-smi-topo-hgx-h100-8gpu-8nic-rail.txt"
TREE = DATA / "slurm-topology-conf-tree-manpage-example.conf"


def gpuplace(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # The child imports the same gpuplace as this process (installed, or a PYTHONPATH checkout).
    root = str(Path(gpuplace_pkg.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "gpuplace.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Path:
    """H100 host + the topology.conf(5) manpage tree, imported once for the module."""
    out = tmp_path_factory.mktemp("cli") / "cluster.yaml"
    r = gpuplace(
        "topo", "import", "--nvidia-smi", H100, "--gpu-model", "H100 80GB HBM3",
        "--slurm", TREE, "-o", out, cwd=out.parent,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {out}: cluster: 18 hosts, 144 GPUs")
    assert "gpuplace: warning: host link speed unknown" in r.stderr
    return out


def test_import_writes_a_loadable_topology(cluster):
    topo = Topology.load(cluster)
    assert topo.num_gpus == 144 and topo.level_names == ["numa", "node", "leaf", "spine"]
    assert topo.provenance["sources"] == [H100.name, TREE.name]


def test_import_to_stdout_and_options(tmp_path):
    r = gpuplace(
        "topo", "import", "--slurm", DATA / "topograph-generated-topology-block-dra-sim.conf",
        "--gpus-per-node", "4", "--name", "dra", "--bandwidth", "block=100", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    topo = Topology.from_dict(__import__("yaml").safe_load(r.stdout))
    assert topo.name == "dra" and topo.num_gpus == 96 * 4
    assert topo.levels[topo.level_index("block")].bandwidth_gbps == 100
    assert "dra: 96 hosts, 384 GPUs" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--rocm-smi", DATA / "rocm-smi-showtopo-8gpu-2xgmi-hives.txt"],
        ["--ibnetdiscover", DATA / "ibnetdiscover-rdma-core-manpage-example-sdr.txt"],
        ["--ec2", DATA / "ec2-describe-instance-topology-p4de-awesome-networking.json"],
        ["--slurm", DATA / "slurm-topology-yaml-manpage-example.yaml", "--slurm-topology",
         "topo2"],
        ["--nvidia-smi", DATA / "nvidia-smi-topo-gb200-4gpu-8nic.txt", "--gpu-model",
         "NVIDIA GB200", "--nvlink-domain-gpus", "72", "--slurm",
         DATA / "topograph-generated-topology-block-dra-sim.conf"],
    ],
)  # fmt: skip
def test_import_each_reader(tmp_path, args):
    out = tmp_path / "t.json"
    r = gpuplace("topo", "import", *args, "-o", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    Topology.load(out)


def test_import_k8s(tmp_path):
    items = [
        {
            "metadata": {"name": f"n{i}", "labels": {"fabric.topograph.run/tier-1": f"l{i // 2}"}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
        for i in range(4)
    ]
    (tmp_path / "nodes.json").write_text(json.dumps({"kind": "List", "items": items}))
    r = gpuplace("topo", "import", "--k8s", "nodes.json", "-o", "k.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert Topology.load(tmp_path / "k.yaml").num_gpus == 32


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "nothing to import"),
        (["--slurm", TREE, "--ec2", DATA / "ec2-describe-instance-topology-awscli-example.json"],
         "one fabric source"),
        (["--slurm", DATA / "nvidia-smi-topo-gb200-4gpu-8nic.txt"], "Key=Value"),
        (["--nvidia-smi", H100, "--ec2",
          DATA / "ec2-describe-instance-topology-awscli-example.json"], "has 16 GPUs"),
        (["--slurm", TREE, "--bandwidth", "leaf"], "LEVEL=NUMBER"),
        (["--slurm", "missing.conf"], "does not exist"),
    ],
)  # fmt: skip
def test_import_errors_are_one_line(tmp_path, args, message):
    r = gpuplace("topo", "import", *args, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("gpuplace: error: ") and message in lines[-1]
    assert not any("Traceback" in line for line in lines)


def test_show_table_and_json(cluster):
    r = gpuplace("topo", "show", cluster, cwd=cluster.parent)
    assert r.returncode == 0, r.stderr
    assert "18 hosts, 144 GPUs" in r.stdout and "spine" in r.stdout
    r = gpuplace("topo", "show", cluster, "--format", "json", cwd=cluster.parent)
    info = json.loads(r.stdout)
    assert info["gpus"] == 144 and info["nvlink_domain"] == "node"
    levels = {lv["name"]: lv for lv in info["levels"]}
    assert levels["leaf"]["domains"] == 3 and levels["leaf"]["gpus_per_domain"]["max"] == 48
    assert levels["node"]["bandwidth_gbps"] == pytest.approx(18 * 20.6)


def test_show_degraded_links(tmp_path):
    sdr = DATA / "ibnetdiscover-rdma-core-manpage-example-sdr.txt"
    assert (
        gpuplace("topo", "import", "--ibnetdiscover", sdr, "-o", "s.yaml", cwd=tmp_path).returncode
        == 0
    )
    r = gpuplace("topo", "show", "s.yaml", cwd=tmp_path)
    assert "degraded links (2):" in r.stdout and "1xSDR" in r.stdout
    info = json.loads(gpuplace("topo", "show", "s.yaml", "--format", "json", cwd=tmp_path).stdout)
    assert len(info["degraded_links"]) == 2


def test_show_png(cluster, tmp_path):
    if importlib.util.find_spec("matplotlib") is None:
        r = gpuplace("topo", "show", cluster, "--png", tmp_path / "t.png", cwd=tmp_path)
        assert r.returncode == 2 and "needs matplotlib" in r.stderr
        pytest.skip("matplotlib is not installed")
    for source in (cluster, "h100-superpod"):  # a preset with 128 hosts
        png = tmp_path / "tree.png"
        r = gpuplace("topo", "show", source, "--png", png, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width = int.from_bytes(data[16:20], "big")
        assert 300 < width < 8000


def test_export_tree_round_trip(cluster, tmp_path):
    r = gpuplace("topo", "export", cluster, "--slurm", "tree", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    again = read_slurm_topology(io.StringIO(r.stdout))
    original = read_slurm_topology(TREE)
    assert {n: (s.children, s.hosts) for n, s in again.switches.items()} == {
        n: (s.children, s.hosts) for n, s in original.switches.items()
    }


def test_export_block_to_file_and_errors(tmp_path):
    dra = DATA / "topograph-generated-topology-block-dra-sim.conf"
    assert gpuplace("topo", "import", "--slurm", dra, "-o", "d.yaml", cwd=tmp_path).returncode == 0
    r = gpuplace("topo", "export", "d.yaml", "--slurm", "block", "-o", "out.conf", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out.conf").read_text().endswith("BlockSizes=8,16,32\n")
    r = gpuplace("topo", "export", "d.yaml", "--slurm", "block", "--level", "spine", cwd=tmp_path)
    assert r.returncode == 2 and "not above the node level" in r.stderr
    r = gpuplace("topo", "export", "nope.yaml", "--slurm", "tree", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("gpuplace: error: nope.yaml: no such file")
