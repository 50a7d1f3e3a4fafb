"""Rules from evidence to health, on real lines (tests/data/health) and their mutated copies;
gpuplace.health.ingest all or nothing; and `gpuplace health ingest` from the command line,
including the issue's demo (XID 79 + a port at half rate -> GPU failed, NIC degraded, job
named, repaired in one command) and --follow bounded in time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gpuplace
import gpuplace.health as H
import pytest
from gpuplace import _core
from gpuplace.cli import main
from gpuplace.sim.workload import training_job

DATA = Path(__file__).resolve().parent / "data" / "health"
M = DATA / "mutated"
BUS = f"dgx002={DATA / 'bus-ids-h100-nccl-tests-dstack-2604.csv'}"


@pytest.fixture
def state(superpod: gpuplace.Topology) -> gpuplace.ClusterState:
    return gpuplace.ClusterState(superpod)


@pytest.fixture
def one_host() -> gpuplace.ClusterState:
    return gpuplace.ClusterState(gpuplace.Topology.preset("dgx-h100"))


def _health(state: gpuplace.ClusterState) -> dict[str, tuple[str, float]]:
    return {h["name"]: (h["condition"], round(h["factor"], 4)) for h in state.unhealthy()}


def _changes(report: H.IngestReport) -> dict[str, tuple[str, float]]:
    return {c.name: (c.after, round(c.factor, 4)) for c in report.changes}


# ------------------------------------------------------------------------------- XIDs
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # real lines: XID 79 in both one-line forms and the multi-line report, XID 94, 43/31
        (
            DATA / "xid-catalogue-examples.log",
            {"dgx001:0": ("failed", 1.0), "dgx001:2": ("failed", 1.0)},
        ),
        (M / "journal-dgx002-xid79.log", {"dgx002:4": ("failed", 1.0)}),
        (DATA / "dmesg-T-xid-akash-support-244.log", {"dgx001:2": ("drained", 1.0)}),
        (M / "dmesg-T-xid48.log", {"dgx001:2": ("failed", 1.0)}),
        (M / "dmesg-T-xid95.log", {"dgx001:2": ("failed", 1.0)}),
        (M / "dmesg-T-xid63.log", {"dgx001:2": ("drained", 1.0)}),
        (DATA / "dmesg-ctime-xid-gpud-pr46.log", {}),  # Xid 13 / 109: the application's
    ],
    ids=lambda v: v.name if isinstance(v, Path) else "",
)
def test_xid_rules(state: gpuplace.ClusterState, source: Path, expected: dict) -> None:
    # the samples' PCI addresses, in index order, stand in for the host's nvidia-smi table
    table = {
        "xid-catalogue-examples.log": ["0000:01:00", "0000:03:00", "0000:05:00"],
        "dmesg-T-xid-akash-support-244.log": ["0000:00:05", "0000:00:07", "0000:00:08"],
        "dmesg-ctime-xid-gpud-pr46.log": ["0000:cb:00"],
    }
    key = source.name if source.name in table else "dmesg-T-xid-akash-support-244.log"
    rules = {"pci_bus_ids": {"dgx001": table[key]}}
    spec = str(source) if "dgx002" in source.name else f"dgx001={source}"
    sources = [spec, BUS] if "dgx002" in source.name else [spec]
    report = H.ingest(state, sources, rules=rules)
    assert _changes(report) == expected
    for c in report.changes:
        assert c.reason.startswith("XID ") and f"{source.name}:" in c.reason


def test_xid_79_without_an_xid_number(one_host: gpuplace.ClusterState) -> None:
    rules = {"pci_bus_ids": {"dgx001": ["0000:44:00", "0000:b3:00"]}}
    report = H.ingest(one_host, [DATA / "dmesg-fallen-off-bus-nvsentinel-155.log"], rules=rules)
    assert _changes(report) == {"dgx001:0": ("failed", 1.0), "dgx001:1": ("failed", 1.0)}
    assert "fallen off the bus" in report.changes[1].reason


def test_nvlink_xids(one_host: gpuplace.ClusterState, tmp_path: Path) -> None:
    lines = (DATA / "kmsg-nvlink-xid-gpud-pr1174.log").read_text().splitlines()
    log = tmp_path / "kmsg.log"
    log.write_text("\n".join([lines[0], lines[2], lines[3]]) + "\n")
    rules = {"pci_bus_ids": {"dgx001": ["0019:01:00", "0018:01:00", "0000:9b:00"]}}
    report = H.ingest(one_host, [log], rules=rules)
    assert _changes(report) == {
        "dgx001:0": ("degraded", 0.5),
        "dgx001:1": ("degraded", 0.9),
        "dgx001:2": ("drained", 1.0),
    }
    # The 149 reported on PCI 0000:00:00 is on no GPU of the table: an error, nothing changes.
    before = one_host.snapshot()
    with pytest.raises(
        gpuplace.InvalidState,
        match=r"kmsg-nvlink-xid-gpud-pr1174\.log:2: no GPU of dgx001 is at PCI 0000:00:00",
    ):
        H.ingest(one_host, [DATA / "kmsg-nvlink-xid-gpud-pr1174.log"], rules=rules)
    assert one_host.snapshot() == before


def test_xid_needs_a_bus_table_for_a_multi_gpu_host(state: gpuplace.ClusterState) -> None:
    before = state.snapshot()
    with pytest.raises(
        gpuplace.InvalidState,
        match=r"journal-dgx002-xid79\.log:2: GPU at PCI 0000:ab:00 of dgx002: no bus-id table",
    ):
        H.ingest(state, [M / "journal-dgx002-xid79.log"])
    with pytest.raises(gpuplace.InvalidState, match="does not name its host"):
        H.ingest(state, [DATA / "xid-catalogue-examples.log"])
    assert state.snapshot() == before


# ------------------------------------------------------------------------ nvidia-smi, DCGM
def test_nvidia_smi_rules(one_host: gpuplace.ClusterState) -> None:
    real = H.ingest(one_host.copy(), [DATA / "nvidia-smi-q-rtx4090-gpud.txt"])
    # the busy GPU runs at its power cap: power throttling, mildly degraded
    assert _changes(real) == {"dgx001:1": ("degraded", 0.9)}
    assert "SW Power Cap" in real.changes[0].reason
    mutated = H.ingest(one_host, [M / "nvidia-smi-q-row-remap-pending-thermal.txt"])
    # pending row remap (failed) outranks the thermal slowdown (degraded); both reasons kept
    assert _changes(mutated) == {"dgx001:0": ("failed", 1.0)}
    assert "pending row remap" in mutated.changes[0].reason
    assert "HW Thermal Slowdown" in mutated.changes[0].reason


def test_nvlink_rules(one_host: gpuplace.ClusterState) -> None:
    assert H.ingest(one_host.copy(), [DATA / "nvidia-smi-nvlink-s-a100-gpud.txt"]).changes == []
    assert (
        H.ingest(one_host.copy(), [DATA / "nvidia-smi-nvlink-e-h100-ml-engineering.txt"]).changes
        == []
    )
    down = H.ingest(one_host.copy(), [M / "nvidia-smi-nvlink-s-gpu3-inactive.txt"])
    assert _changes(down) == {"dgx001:3": ("degraded", 0.5)}  # 6 of 12 links at 25 GB/s
    errors = H.ingest(one_host, [M / "nvidia-smi-nvlink-e-link1-errors.txt"])
    assert _changes(errors) == {"dgx001:0": ("degraded", 0.9)}
    assert "replay errors 5200 > 1000" in errors.changes[0].reason


def test_dcgm_rules(one_host: gpuplace.ClusterState) -> None:
    power = H.ingest(one_host.copy(), [DATA / "dcgmi-health-c-l4-dcgm461.txt"])
    assert _changes(power) == {"dgx001:0": ("degraded", 0.9)}
    assert "DCGM health Power Warning" in power.changes[0].reason
    memory = H.ingest(one_host.copy(), [M / "dcgmi-health-c-gpu1-memory-failure.txt"])
    assert _changes(memory) == {"dgx001:0": ("degraded", 0.9), "dgx001:1": ("failed", 1.0)}
    for real in ("dcgmi-diag-r1-dcgm423-dcgm-253.txt", "dcgmi-diag-r2-dcgm331-go-dcgm-52.txt"):
        assert H.ingest(one_host.copy(), [DATA / real]).changes == []
    diag = H.ingest(one_host, [M / "dcgmi-diag-r2-memory-fail.txt"])
    assert _changes(diag) == {"dgx001:2": ("failed", 1.0)}  # the pcie Warn is ignored


# ---------------------------------------------------------------------------- InfiniBand
def test_port_state_rules(one_host: gpuplace.ClusterState) -> None:
    ibstat = H.ingest(one_host.copy(), [DATA / "ibstat-h100-some-down-gpud.txt"])
    # mlx5_5 is Down/Disabled; mlx5_11 is down too but is not a NIC of the topology; the
    # 100 Gb/s ConnectX-6 ports are compared with their own model, not the 400 Gb/s ones
    assert _changes(ibstat) == {"dgx001:mlx5_5": ("failed", 1.0)}
    assert any("mlx5_11" in u for u in ibstat.unmapped)
    assert H.ingest(one_host.copy(), [DATA / "ibstatus-a100-all-active-gpud.txt"]).changes == []
    half = H.ingest(one_host, [M / "ibstatus-a100-mlx5_3-half-rate.txt"])
    assert _changes(half) == {"dgx001:mlx5_3": ("degraded", 0.5)}
    assert "link trained at 100 of 200 Gb/s" in half.changes[0].reason


def test_counter_rules(one_host: gpuplace.ClusterState) -> None:
    clean = H.ingest(
        one_host.copy(), [f"dgx001:mlx5_0={DATA / 'perfquery-x-infiniband-diags-16.txt'}"]
    )
    assert clean.changes == []
    errors = H.ingest(one_host.copy(), [f"dgx001:mlx5_0={M / 'perfquery-x-symbol-errors.txt'}"])
    # symbol errors: 2e-4 packet loss -> the core's loss curve; recoveries -> the soft factor
    assert _core.loss_factor(2e-4) > 0.9
    assert _changes(errors) == {"dgx001:mlx5_0": ("degraded", 0.9)}
    assert "packet loss ~0.0002" in errors.changes[0].reason
    downed = H.ingest(one_host.copy(), [f"dgx001:mlx5_1={M / 'perfquery-x-link-downed.txt'}"])
    assert _changes(downed) == {"dgx001:mlx5_1": ("drained", 1.0)}
    with pytest.raises(gpuplace.InvalidState, match="does not name its HCA"):
        H.ingest(one_host, [M / "perfquery-x-link-downed.txt"])
    # ibdiagnet's port is a switch port: reported, not applied
    pm = H.ingest(one_host, [DATA / "ibdiagnet2-pm-gcm.txt"])
    assert pm.changes == [] and "GUID 0x0011223344550001" in pm.unmapped[0]


def test_optics_rules(one_host: gpuplace.ClusterState) -> None:
    for real in ("mlxlink-c-cx4-nvidia-forum.txt", "mlxlink-m-cx7-osfp-gcm.txt"):
        assert H.ingest(one_host.copy(), [f"dgx001:mlx5_2={DATA / real}"]).changes == []
    ber = H.ingest(one_host.copy(), [f"dgx001:mlx5_2={M / 'mlxlink-c-high-effective-ber.txt'}"])
    loss = 2e-7 * 33280
    assert _changes(ber) == {"dgx001:mlx5_2": ("degraded", round(_core.loss_factor(loss), 4))}
    # The same evidence on links that retry at the link level (the topology's transport).
    doc = one_host.topology.to_dict()
    for lv in doc["levels"]:
        lv["transport"] = "infiniband"
    ib = gpuplace.ClusterState(gpuplace.Topology.from_dict(doc))
    assert ib.topology.nic_transport == "infiniband"
    ib_ber = H.ingest(ib, [f"dgx001:mlx5_2={M / 'mlxlink-c-high-effective-ber.txt'}"])
    ib_factor = round(_core.loss_factor(loss, "infiniband"), 4)
    assert _changes(ib_ber) == {"dgx001:mlx5_2": ("degraded", ib_factor)}
    assert ib_factor > round(_core.loss_factor(loss), 4)
    hot = H.ingest(one_host, [f"dgx001:mlx5_2={M / 'mlxlink-m-module-hot.txt'}"])
    assert _changes(hot) == {"dgx001:mlx5_2": ("degraded", 0.9)}
    assert "module temperature 83 C >= warning 80 C" in hot.changes[0].reason


# ------------------------------------------------------------------- rules, all-or-nothing
def test_site_rules_override_and_typos_are_errors(
    one_host: gpuplace.ClusterState, tmp_path: Path
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("nvidia_smi:\n  throttle_reasons: [HW Slowdown]\n")
    assert (
        H.ingest(one_host.copy(), [DATA / "nvidia-smi-q-rtx4090-gpud.txt"], rules=site).changes
        == []
    )
    site.write_text("infiniband:\n  nominal_gbps: 400\n")
    rules = H.load_rules(site)
    report = H.ingest(one_host.copy(), [DATA / "ibstatus-hdr-nccl-1412.txt"], rules=rules)
    assert set(_changes(report).values()) == {("degraded", 0.5)}
    site.write_text("infiniband:\n  nominal_gbs: 400\n")
    with pytest.raises(
        gpuplace.InvalidState, match=r"site\.yaml: infiniband\.nominal_gbs: unknown rule setting"
    ):
        H.load_rules(site)
    with pytest.raises(gpuplace.InvalidState, match=r"dcgm_health\.Warning: expected one of"):
        H.load_rules({"dcgm_health": {"Warning": "sad"}})


def test_worst_condition_wins_and_worse_hardware_is_left_alone(
    one_host: gpuplace.ClusterState,
) -> None:
    one_host.fail(nic="dgx001:mlx5_3", reason="replaced cable pending")
    report = H.ingest(one_host, [M / "ibstatus-a100-mlx5_3-half-rate.txt"])
    assert report.changes == []
    assert report.unchanged == ["nic dgx001:mlx5_3 is already failed"]
    assert _health(one_host)["dgx001:mlx5_3"] == ("failed", 1.0)


def test_ingest_then_revert_returns_the_snapshot(state: gpuplace.ClusterState) -> None:
    state.allocate(gpuplace.place(state, training_job("llama", 64)))
    before = state.snapshot()
    report = H.ingest(
        state,
        [M / "journal-dgx002-xid79.log", BUS, f"dgx002={M / 'ibstatus-a100-mlx5_3-half-rate.txt'}"],
    )
    assert _changes(report) == {"dgx002:4": ("failed", 1.0), "dgx002:mlx5_3": ("degraded", 0.5)}
    assert state.snapshot() != before
    H.revert(state, report)
    assert state.snapshot() == before


def test_dry_run_and_failed_sources_change_nothing(state: gpuplace.ClusterState) -> None:
    before = state.snapshot()
    report = H.ingest(state, [M / "journal-dgx002-xid79.log", BUS], dry_run=True)
    assert _changes(report) == {"dgx002:4": ("failed", 1.0)} and not report.applied
    assert state.snapshot() == before
    # the second source is bad: the first one's evidence is not applied either
    with pytest.raises(gpuplace.InvalidState):
        H.ingest(
            state,
            [f"dgx002={M / 'ibstatus-a100-mlx5_3-half-rate.txt'}", M / "journal-dgx002-xid79.log"],
        )
    assert state.snapshot() == before


def test_strict_mode_names_file_and_line(one_host: gpuplace.ClusterState, tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(
        "kernel: NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus\nNVRM: Xid (PCI:garbage\n"
    )
    rules = {"pci_bus_ids": {"dgx001": ["0000:1b:00"]}}
    report = H.ingest(one_host.copy(), [log], rules=rules)
    assert report.sources[0].malformed[0][0] == 2 and len(report.changes) == 1
    with pytest.raises(gpuplace.InvalidState, match=r"kern\.log:2:"):
        H.ingest(one_host, [log], rules=rules, strict=True)
    assert one_host.unhealthy() == []


# ------------------------------------------------------------------------------- the CLI
def _demo_files(tmp_path: Path) -> list[str]:
    (tmp_path / "kern.log").write_bytes((M / "journal-dgx002-xid79.log").read_bytes())
    (tmp_path / "ibstatus.txt").write_bytes((M / "ibstatus-a100-mlx5_3-half-rate.txt").read_bytes())
    (tmp_path / "bus-ids.csv").write_bytes(
        (DATA / "bus-ids-h100-nccl-tests-dstack-2604.csv").read_bytes()
    )
    return [
        str(tmp_path / "kern.log"),
        f"dgx002={tmp_path / 'bus-ids.csv'}",
        f"dgx002={tmp_path / 'ibstatus.txt'}",
    ]


def _job_state(tmp_path: Path) -> str:
    topo = gpuplace.Topology.preset("h100-superpod", nodes=16)
    state = gpuplace.ClusterState(topo)
    state.allocate(gpuplace.place(state, training_job("llama", 64)))
    path = str(tmp_path / "s.json")
    state.save(path)
    return path


def test_cli_demo_xid79_and_half_rate_port_repaired_in_one_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_path = _job_state(tmp_path)
    files = _demo_files(tmp_path)
    args = ["health", "ingest", "--state", state_path, "-c", "h100-superpod", "--nodes", "16"]
    assert main([*args, *files, "--dry-run"]) == 0
    assert "dry run: nothing changed" in capsys.readouterr().out
    assert main([*args, *files, "--repair", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {(c["name"], c["after"]) for c in out["changes"]} == {
        ("dgx002:4", "failed"),
        ("dgx002:mlx5_3", "degraded"),
    }
    assert list(out["affected"]) == ["llama"]
    (repair,) = out["repairs"]
    assert repair["job"] == "llama" and repair["moved"]
    topo = gpuplace.Topology.preset("h100-superpod", nodes=16)
    state = gpuplace.ClusterState.load(topo, state_path)
    health = state.health()
    assert health[state.resolve_gpu("dgx002:4")] == 1
    assert not (health[state.jobs["llama"]] != 0).any(), "the repaired job uses no failed GPU"
    assert _health(state)["dgx002:mlx5_3"] == ("degraded", 0.5)


def test_cli_errors_are_one_line_and_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_path = _job_state(tmp_path)
    before = Path(state_path).read_bytes()
    kern = tmp_path / "kern.log"
    kern.write_bytes((M / "journal-dgx002-xid79.log").read_bytes())
    assert main(["health", "ingest", "--state", state_path, str(kern)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "gpuplace: error: kern.log:2: GPU at PCI 0000:ab:00 of dgx002"
    )
    assert Path(state_path).read_bytes() == before


def test_cli_follow_applies_lines_as_they_arrive(tmp_path: Path) -> None:
    state_path = _job_state(tmp_path)
    files = _demo_files(tmp_path)
    kern = tmp_path / "kern.log"
    kern.write_text(
        "Feb 14 05:03:41 dgx002 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE\n"
    )
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    out_path = tmp_path / "out.txt"
    out_handle = out_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuplace.cli", "health", "ingest", "--state", state_path,
         "--follow", "--poll", "0.1", "--follow-seconds", "60", str(kern), files[1]],
        stdout=out_handle, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        topo = gpuplace.Topology.preset("h100-superpod", nodes=16)
        assert gpuplace.ClusterState.load(topo, state_path).unhealthy() == []
        with kern.open("a") as handle:
            handle.write(M.joinpath("journal-dgx002-xid79.log").read_text().splitlines()[1] + "\n")
        appended = time.monotonic()
        failed = False
        while time.monotonic() - appended < 15 and not failed:
            time.sleep(0.1)
            failed = any(
                h["name"] == "dgx002:4"
                for h in gpuplace.ClusterState.load(topo, state_path).unhealthy()
            )
        assert failed, "the appended XID 79 did not reach the state file within 15 s"
        assert _wait_for_text(out_path, "gpu dgx002:4: ok -> failed"), out_path.read_text()
    finally:
        proc.send_signal(signal.SIGINT)  # --follow stops cleanly on Ctrl-C
        _, err = proc.communicate(timeout=30)
        out_handle.close()
    assert proc.returncode == 0, err


def _wait_for_text(path: Path, text: str, seconds: float = 15) -> bool:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if text in path.read_text():
            return True
        time.sleep(0.1)
    return False


def test_more_nvidia_smi_rules_on_mutated_real_output(
    one_host: gpuplace.ClusterState, tmp_path: Path
) -> None:
    """The real `nvidia-smi -q` sample with, per GPU, one section changed: uncorrectable ECC
    errors, a pending page retirement (the older drivers' key), a reset required."""
    real = (DATA / "nvidia-smi-q-rtx4090-gpud.txt").read_text()
    blocks = real.split("\nGPU 00000000:")
    blocks[1] = blocks[1].replace(
        "Volatile\n            SRAM Correctable              : N/A\n            SRAM Uncorrectable            : N/A",
        "Volatile\n            SRAM Correctable              : 3\n            SRAM Uncorrectable            : 1",
    )
    blocks[2] = blocks[2].replace(
        "Pending Page Blacklist            : N/A", "Pending Page Retirement           : Yes"
    )
    blocks[3] = blocks[3].replace(
        "Reset Required                    : No", "Reset Required                    : Yes"
    )
    path = tmp_path / "nvidia-smi-q.txt"
    path.write_text("\nGPU 00000000:".join(blocks))
    report = H.ingest(one_host, [path])
    # GPU 1 also runs at its power cap (the real sample): the drain outranks it
    assert _changes(report) == {
        "dgx001:0": ("drained", 1.0),
        "dgx001:1": ("drained", 1.0),
        "dgx001:2": ("drained", 1.0),
    }
    reasons = {c.name: c.reason for c in report.changes}
    assert reasons["dgx001:0"].startswith("uncorrectable ECC errors: nvidia-smi-q.txt:")
    assert "pending page retirement" in reasons["dgx001:1"]
    assert "GPU reset required" in reasons["dgx001:2"]


def test_cli_follow_a_dcgmi_health_log(tmp_path: Path) -> None:
    state_path = str(tmp_path / "s.json")
    gpuplace.ClusterState(gpuplace.Topology.preset("dgx-h100")).save(state_path)
    log = tmp_path / "dcgm.log"
    log.write_bytes((DATA / "dcgmi-health-c-l4-dcgm461.txt").read_bytes())
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    out_path = tmp_path / "out.txt"
    out_handle = out_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuplace.cli", "health", "ingest", "--state", state_path,
         "--follow", "--poll", "0.1", "--follow-seconds", "60", str(log)],
        stdout=out_handle, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    topo = gpuplace.Topology.preset("dgx-h100")

    def wait_for(name: str) -> bool:
        start = time.monotonic()
        while time.monotonic() - start < 15:
            if name in _health(gpuplace.ClusterState.load(topo, state_path)):
                return True
            time.sleep(0.1)
        return False

    try:
        assert wait_for("dgx001:0"), "the first table's power warning was not applied"
        with log.open("ab") as handle:
            handle.write((M / "dcgmi-health-c-gpu1-memory-failure.txt").read_bytes())
        assert wait_for("dgx001:1"), "the appended table's memory failure was not applied"
        assert _wait_for_text(out_path, "gpu dgx001:1: ok -> failed"), out_path.read_text()
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        out_handle.close()
    assert proc.returncode == 0, err
    health = _health(gpuplace.ClusterState.load(topo, state_path))
    assert health["dgx001:0"] == ("degraded", 0.9) and health["dgx001:1"] == ("failed", 1.0)
