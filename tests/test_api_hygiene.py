"""API hygiene: what a caller looks up by name or id raises a gpuplace error naming it (never a
bare KeyError, ValueError or IndexError); enum labels come from the core's enums alone; the
code written once (the topology document builder, the readers' guard, file reading) behaves
as each of its old copies did."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
from pathlib import Path

import gpuplace
import pytest
from gpuplace import ClusterState, Condition, Health, SparePolicy, Topology
from gpuplace.cli import main
from gpuplace.cli.health import repair_cmd
from gpuplace.cli.health_ingest import ingest_cmd
from gpuplace.errors import GpuplaceError, InvalidJob, InvalidState, InvalidTopology
from gpuplace.integrations import slurm
from gpuplace.io import read_nvidia_smi_topo
from gpuplace.model.policy import Comparison
from gpuplace.model.presets import hgx_node_type, topology_document
from gpuplace.placement.repair import spare_policy
from gpuplace.sim import clusters
from gpuplace.sim.workload import fragment


@pytest.fixture(scope="module")
def pod() -> Topology:
    return Topology.preset("h100-superpod", nodes=4)


# ------------------------------------------------------------------- names and ids
def test_an_unknown_level_is_an_invalid_topology_naming_the_levels(pod: Topology) -> None:
    state = ClusterState(pod)
    for lookup in (pod.level_index, pod.domain_sizes, pod.domain_count, state.free_counts):
        with pytest.raises(InvalidTopology, match=r"no level named 'rack' \(levels: node, leaf"):
            lookup("rack")
    assert pod.level_index("host") == pod.node_level  # the aliases still resolve


@pytest.mark.parametrize("gpu", [-1, -32, 32, 10**9])
def test_a_gpu_id_outside_the_cluster_is_refused_not_wrapped(pod: Topology, gpu: int) -> None:
    # -1 used to index from the end and name the last host.
    for lookup in (pod.host_of, pod.local_index, lambda g: pod.domain_of(g, "leaf")):
        with pytest.raises(
            InvalidTopology, match=rf"GPU {gpu} does not exist \(GPU ids are 0..31\)"
        ):
            lookup(gpu)
    assert (pod.host_of(31), pod.local_index(31), pod.domain_of(31, "leaf")) == (
        "dgx004",
        7,
        "su001",
    )


def test_an_unknown_simulator_cluster_names_the_known_ones() -> None:
    with pytest.raises(
        InvalidTopology, match="unknown cluster 'lingjunn'; expected one of lingjun, pai"
    ):
        clusters.cluster("lingjunn")


@pytest.mark.parametrize(
    ("occupancy", "high_water", "field"),
    [
        (1.0, None, "occupancy"),
        (-0.1, None, "occupancy"),
        (float("nan"), None, "occupancy"),
        (0.5, 0.4, "high_water"),
        (0.5, 1.0, "high_water"),
    ],
)
def test_fragment_refuses_a_fraction_out_of_range_and_changes_nothing(
    pod: Topology, occupancy: float, high_water: float | None, field: str
) -> None:
    state = ClusterState(pod)
    with pytest.raises(InvalidState, match=f"^{field}: expected a fraction"):
        fragment(state, occupancy, high_water=high_water)
    assert state.free_gpus == pod.num_gpus


@pytest.mark.parametrize("text", [">=", "  ", "<"])
def test_an_empty_attribute_condition_is_an_invalid_job(text: str) -> None:
    with pytest.raises(InvalidJob):
        Comparison.parse(text)


def test_every_lookup_error_is_also_a_value_error_for_generic_callers(pod: Topology) -> None:
    # Callers that caught ValueError from fragment/Comparison keep working.
    for call in (lambda: fragment(ClusterState(pod), 2.0), lambda: Comparison.parse("")):
        with pytest.raises(ValueError):
            call()


# --------------------------------------------------------------------- enum labels
def test_condition_severity_is_the_order_in_which_the_core_lets_one_override_another(
    pod: Topology,
) -> None:
    # The health judge ranks conditions by Condition.severity; the core decides a GPU's health
    # from its own and its host's conditions. Both must agree for every pair.
    effective = {Condition.Failed: Health.Failed, Condition.Drained: Health.Drained}
    worse = [c for c in Condition.members() if c != Condition.Ok]
    assert Condition.Ok.severity == 0
    assert sorted(worse, key=lambda c: c.severity) == [
        Condition.Degraded,
        Condition.Drained,
        Condition.Failed,
    ]
    for on_host, on_gpu in itertools.product(worse, repeat=2):
        state = ClusterState(pod)
        for target, condition in ((dict(host="dgx001"), on_host), (dict(gpu=3), on_gpu)):
            if condition == Condition.Degraded:
                state.degrade(factor=0.5, **target)
            else:
                getattr(state, {Condition.Failed: "fail", Condition.Drained: "drain"}[condition])(
                    **target
                )
        worst = max(on_host, on_gpu, key=lambda c: c.severity)
        assert state.health()[3] == int(effective.get(worst, Health.Ok)), (on_host, on_gpu)


def test_spare_policy_takes_the_members_their_labels_and_the_old_booleans() -> None:
    for member in SparePolicy.members():
        assert spare_policy(member) == member
        assert spare_policy(member.label) == member
    assert spare_policy(None) == spare_policy(True) == SparePolicy.Allow
    assert spare_policy(False) == SparePolicy.Forbid
    with pytest.raises(InvalidJob, match='expected one of allow, forbid, only, got "maybe"'):
        spare_policy("maybe")
    with pytest.raises(InvalidJob, match="a SparePolicy or one of allow, forbid, only"):
        spare_policy(2)


def test_both_spares_options_offer_exactly_the_core_labels() -> None:
    labels = [p.label for p in SparePolicy.members()]
    for command in (repair_cmd, ingest_cmd):
        (option,) = [p for p in command.params if p.name == "spares"]
        assert list(option.type.choices) == labels
        assert option.default == SparePolicy.Allow.label


@pytest.mark.parametrize(("spares", "on_spares"), [("only", True), ("forbid", False)])
def test_repair_cli_passes_the_spare_policy_through(
    tmp_path: Path, pod: Topology, capsys: pytest.CaptureFixture[str], spares: str, on_spares: bool
) -> None:
    state = ClusterState(pod)
    spare_gpus = set(state.reserve_spares(hosts=["dgx004"]).tolist())
    state.allocate(gpuplace.place(state, gpuplace.Job(name="j", tp=8, dp=2)))
    state.fail(host=pod.host_of(int(state.jobs["j"][0])))
    path = tmp_path / "state.json"
    state.save(path)
    args = ["repair", "--state", str(path), "-c", "h100-superpod", "--nodes", "4", "--job", "j"]
    assert main([*args, "--spares", spares, "--format", "json"]) == 0
    moved = {m["new_gpu"] for m in json.loads(capsys.readouterr().out)["moved"]}
    assert len(moved) == 8
    assert (moved <= spare_gpus) == on_spares and (not moved & spare_gpus) == (not on_spares)


# ------------------------------------------------------------------- written once
def test_topology_document_builds_what_the_loader_accepts() -> None:
    doc = topology_document(
        "two-leaves",
        [("node", 370.8, 1.0), ("leaf", 50.0, 2.5), ("spine", 50.0, 3.0)],
        {"hgx": hgx_node_type("H100", power_w=700)},
        [
            {"name": f"n{i}", "type": "hgx", "domains": {"leaf": f"l{i // 2}", "spine": "s"}}
            for i in range(4)
        ],
        oversubscription={"leaf": 2, "spine": 1},
    )
    assert [lv.get("oversubscription") for lv in doc["levels"]] == [None, 2, None]
    assert doc["node_types"]["hgx"]["gpu_nic"] == list(range(8))
    topo = Topology.from_dict(doc)
    assert (topo.num_gpus, topo.level_names, topo.nics.names[9]) == (
        32,
        ["node", "leaf", "spine"],
        "n1:mlx5_1",
    )


@pytest.mark.parametrize(
    ("name", "params", "gpus", "nics_per_host"),
    [
        ("dgx-h100", {}, 8, 8),
        ("h100-superpod", {"nodes": 40, "oversubscription": 2}, 320, 8),
        ("gb200-nvl72", {"racks": 9}, 648, 4),
        ("a100-pod", {"nodes": 21}, 168, 8),
    ],
)
def test_presets_with_one_nic_per_gpu_are_built_by_the_one_builder(
    name: str, params: dict[str, int], gpus: int, nics_per_host: int
) -> None:
    topo = Topology.preset(name, **params)
    host_type = next(iter(topo.to_dict()["node_types"].values()))
    assert topo.num_gpus == gpus
    assert host_type["nics"] == [f"mlx5_{i}" for i in range(nics_per_host)]
    assert host_type["gpu_nic"] == list(range(nics_per_host))


def test_both_readers_guards_turn_a_surprise_into_their_own_error() -> None:
    from gpuplace.health.readers._base import guarded as evidence_guard
    from gpuplace.io._common import guarded as topology_guard

    def broken(source: object, *, strict: bool = False) -> None:
        raise ZeroDivisionError("boom")

    for guard, error in ((topology_guard, InvalidTopology), (evidence_guard, InvalidState)):
        with pytest.raises(
            error, match=r"^dmesg\.txt: unexpected parse failure \(ZeroDivisionError: boom\)"
        ):
            guard(broken)("/var/log/dmesg.txt", strict=True)
        with pytest.raises(error, match=r"^<stream>: unexpected parse failure"):
            guard(broken)(source=io.StringIO("x"))
        assert guard(broken).__name__ == "broken"


def test_slurm_outputs_are_read_with_the_documents_errors(tmp_path: Path) -> None:
    missing = tmp_path / "sinfo.json"
    with pytest.raises(InvalidState, match=f"^{missing}: no such file$"):
        slurm.read_sinfo(missing)
    bad = tmp_path / "squeue.out"
    bad.write_text('{"jobs": [\n  {"job_id": 1,,}\n]}')
    with pytest.raises(InvalidState, match=rf"^{bad}: line 2, column \d+: invalid JSON"):
        slurm.read_squeue(bad)
    with pytest.raises(InvalidState, match=r"^sinfo --json: line 1, column 1: invalid JSON"):
        slurm.read_sinfo(io.StringIO("not json"))
    with pytest.raises(InvalidTopology, match=f"^{tmp_path / 'topology.conf'}: no such file$"):
        slurm.read_topology(tmp_path / "topology.conf")
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s1 Nodes=n[1-2]\n")
    assert set(slurm.read_topology(conf).hosts) == {"n1", "n2"}


def test_reader_signatures_survive_the_guard() -> None:
    # The guard keeps the reader's name, docstring and keyword arguments.
    assert read_nvidia_smi_topo.__name__ == "read_nvidia_smi_topo"
    assert "nvidia-smi" in (read_nvidia_smi_topo.__doc__ or "")
    with pytest.raises(GpuplaceError):
        read_nvidia_smi_topo(io.StringIO(""))


def test_importing_gpuplace_and_its_cli_does_not_import_ortools() -> None:
    """OR-Tools (and pandas behind it) load only when a CP-SAT solver runs: every command and
    every scheduler hook importing gpuplace would otherwise pay over a second for them."""
    code = (
        "import sys, gpuplace, gpuplace.cli\n"
        "heavy = sorted(m for m in ('ortools', 'pandas') if m in sys.modules)\n"
        "state = gpuplace.ClusterState(gpuplace.Topology.preset('h100-superpod', nodes=4))\n"
        "gpuplace.place(state, gpuplace.Job(name='j', tp=8, dp=2), 'greedy')\n"
        "print(','.join(heavy + sorted(m for m in ('ortools', 'pandas') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    # and a CP-SAT solve imports it when needed
    state = gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=2))
    placement = gpuplace.place(state, gpuplace.Job(name="j", tp=8, dp=2), "cpsat")
    assert len(placement.gpus) == 16
