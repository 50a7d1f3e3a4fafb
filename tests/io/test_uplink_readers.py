"""Readers fill per-switch uplink capacity where the source tells (one slow cable is one
switch's uplink, not a level-wide figure), and ``topo import`` selects hosts and warns about
hosts that do not look like the others."""

from __future__ import annotations

from pathlib import Path

import gpuplace
import pytest
from gpuplace.cli import main
from gpuplace.cluster import fabric
from gpuplace.io import read_ibnetdiscover, read_slurm_topology

DATA = Path(__file__).resolve().parents[1] / "data" / "topologies"
SUPERPOD = DATA / "ibnetdiscover-topograph-dgx-superpod-ndr-40sw.txt"
SLOW_LEAF = "IBLEAF-04-04"


def _slowed(tmp_path: Path) -> Path:
    """The SuperPOD dump with one leaf-to-spine cable trained at HDR instead of NDR (both
    ends of the cable say so)."""
    lines = SUPERPOD.read_text().splitlines()
    leaf = next(
        i for i, line in enumerate(lines) if line.startswith("Switch") and SLOW_LEAF in line
    )
    i = next(k for k in range(leaf + 1, len(lines)) if "IBSPINE" in lines[k])
    spine_key, spine_port = lines[i].split('"')[1], lines[i].split("[")[2].split("]")[0]
    leaf_key, leaf_port = lines[leaf].split('"')[1], lines[i].split("]")[0].strip("[")
    lines[i] = lines[i].replace("4xNDR", "4xHDR")
    block = next(
        k for k, line in enumerate(lines) if line.startswith("Switch") and spine_key in line
    )
    j = next(
        k
        for k in range(block + 1, len(lines))
        if lines[k].startswith(f"[{spine_port}]") and leaf_key in lines[k]
    )
    assert lines[j].split("[")[2].split("]")[0] == leaf_port
    lines[j] = lines[j].replace("4xNDR", "4xHDR")
    out = tmp_path / "slow.txt"
    out.write_text("\n".join(lines) + "\n")
    return out


def test_one_slow_cable_lowers_one_switch_uplink_not_the_level(tmp_path: Path) -> None:
    base = gpuplace.Topology.from_parts(fabric=read_ibnetdiscover(SUPERPOD), gpus_per_node=8)
    slow_fabric = read_ibnetdiscover(_slowed(tmp_path))
    slow = gpuplace.Topology.from_parts(fabric=slow_fabric, gpus_per_node=8)
    assert [lv.bandwidth_gbps for lv in slow.levels] == [lv.bandwidth_gbps for lv in base.levels]
    before, after = fabric.uplink_capacity(base), fabric.uplink_capacity(slow)
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert len(changed) == 1, changed
    ((was, now),) = changed.values()
    assert was - now == pytest.approx((400 - 200) / 8)  # one NDR cable now HDR, in GB/s


def test_slurm_link_speed_scales_one_switch_uplink(tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(
        "SwitchName=s0 Nodes=n[0-3] LinkSpeed=100\n"
        "SwitchName=s1 Nodes=n[4-7] LinkSpeed=50\n"
        "SwitchName=s2 Nodes=n[8-11] LinkSpeed=100\n"
        "SwitchName=top Switches=s[0-2]\n"
    )
    t = gpuplace.Topology.from_parts(fabric=read_slurm_topology(conf), gpus_per_node=8)
    caps = fabric.uplink_capacity(t)
    assert caps["leaf:s1"] == pytest.approx(caps["leaf:s0"] / 2)
    assert caps["leaf:s0"] == caps["leaf:s2"]


def test_import_selects_hosts_and_warns_about_odd_ones(tmp_path: Path, capsys) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(
        "SwitchName=s0 Nodes=dgx[01-04],login01\n"
        "SwitchName=s1 Nodes=dgx[05-08],storage1\n"
        "SwitchName=top Switches=s[0-1]\n"
    )
    out = tmp_path / "c.yaml"
    assert main(["topo", "import", "--slurm", str(conf), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "login01, storage1" in err and "--exclude" in err
    assert len(gpuplace.Topology.load(out).hosts) == 10
    argv = ["topo", "import", "--slurm", str(conf), "-o", str(out), "--exclude", "login*"]
    assert main([*argv, "--exclude", "storage*"]) == 0
    err = capsys.readouterr().err
    assert "left out 2 hosts" in err and "not named like" not in err
    assert gpuplace.Topology.load(out).hosts == tuple(f"dgx{i:02d}" for i in range(1, 9))
    assert main(["topo", "import", "--slurm", str(conf), "--include", "nothing*"]) == 2
