"""`gpuplace slurm` against real Slurm 22.05 (slurmctld, one slurmd per node, munge) on loopback,
with `Gres=gpu:8` backed by empty device files: sync reads busy and drained nodes, a submitted
job runs on exactly gpuplace's nodes with its srun ranks in gpuplace's order, Slurm refusing is
a clear error naming the node and why, with nothing left queued. (The job_submit/lua plugin and
`gpuplace serve` are in test_slurm_serve.py.) Skipped, saying why, without Slurm and munge or
without root."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import gpuplace
import numpy as np
import pytest
from gpuplace.cli.schemas import SCHEMAS
from gpuplace.integrations import slurm as sl
from gpuplace.model.topology import Topology
from jsonschema import Draft202012Validator
from slurm_harness import LoopbackSlurm, cli, missing_daemons, rank_lines, wait_ranks

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).parent.parent
GPUS = 8
#: What every rank prints: its rank, the node it runs on and the GPU it takes.
RANK_SCRIPT = """#!/bin/sh
srun sh -c 'if [ -n "$GPUPLACE_PER_RANK_CUDA" ]; then
  CUDA_VISIBLE_DEVICES=$(awk -v r="$SLURM_PROCID" "\\$1 == r {print \\$3}" "$GPUPLACE_RANKS")
fi
echo "rank $SLURM_PROCID $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"'
"""


def _skip_reason() -> str | None:
    missing = missing_daemons()
    if missing:
        return f"Slurm/munge not installed ({', '.join(missing)} missing)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    # Two leaves of three nodes; slurm.conf lists them out of name order.
    order = ["n04", "n01", "n05", "n02", "n06", "n03"]
    with LoopbackSlurm(
        tmp_path_factory.mktemp("slurm-submit"), 2, 3, gpus=GPUS, gpu_type="h100", node_order=order
    ) as slurm:
        yield slurm


def queued(slurm: LoopbackSlurm) -> list[str]:
    return slurm.run("squeue", "-h", "-o", "%i %j %T").stdout.split("\n")[:-1]


def drain_queue(slurm: LoopbackSlurm) -> None:
    slurm.run("scancel", "--partition=gpu", check=False)
    slurm._wait(lambda: not slurm.run("squeue", "-h").stdout.strip(), 30, "jobs ended")


def test_sync_reads_gpus_jobs_busy_and_drained_nodes(cluster: LoopbackSlurm, tmp_path: Path):
    slurm = cluster
    job = slurm.run(
        "sbatch",
        "--parsable",
        "-w",
        "n02",
        "--gres=gpu:h100:3",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 300",
    ).stdout.strip()
    slurm._wait(
        lambda: "RUNNING" in slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout,
        20,
        "job started",
    )
    slurm.run("scontrol", "update", "nodename=n05", "state=drain", "reason=gpuplace-test")
    try:
        result = cli(
            slurm, "slurm", "sync", "-o", "state.json", "--host-type", "dgx-h100", cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
        state = gpuplace.ClusterState.load(
            Topology.load(tmp_path / "state.topology.yaml"), tmp_path / "state.json"
        )
        topo = state.topology
        # Slurm's node order, the switch tree, the host type and GRES count.
        assert list(topo.hosts) == ["n01", "n02", "n03", "n04", "n05", "n06"]
        assert topo.domain_of(int(topo.host_gpus("n01")[0]), "leaf") == "leaf1"
        assert topo.domain_of(int(topo.host_gpus("n04")[0]), "leaf") == "leaf2"
        assert set(topo.host_types) == {"dgx-h100"} and topo.num_gpus == 6 * GPUS
        # The running job holds exactly its 3 GPUs on n02 (Slurm gave indices 0-2).
        held = state.jobs[f"slurm-{job}"]
        assert sorted(held.tolist()) == topo.host_gpus("n02")[:3].tolist()
        # The drained node is out of service.
        unhealthy = state.unhealthy()
        assert [(u["name"], u["condition"]) for u in unhealthy] == [("n05", "drained")]
        assert state.free_gpus == 6 * GPUS - 3 - GPUS
    finally:
        slurm.run("scontrol", "update", "nodename=n05", "state=resume")
        drain_queue(slurm)


def test_submitted_job_runs_on_gpuplaces_nodes_in_rank_order(cluster: LoopbackSlurm, tmp_path):
    slurm = cluster
    (tmp_path / "job.sh").write_text(RANK_SCRIPT)
    (tmp_path / "job.yaml").write_text("name: train\nparallelism: {tp: 8, dp: 2}\n")
    # Half of leaf1 busy, so the placement has a choice to make.
    busy = slurm.occupy(["n01"])
    try:
        result = cli(slurm, "slurm", "sync", "-o", "state.json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        state = gpuplace.ClusterState.load(
            Topology.load(tmp_path / "state.topology.yaml"), tmp_path / "state.json"
        )
        # An exclusive job without GRES holds its node whole.
        assert state.free_mask()[state.topology.host_gpus("n01")].sum() == 0
        expected = gpuplace.place(state, gpuplace.Job.load(tmp_path / "job.yaml"), "greedy")

        dry = cli(
            slurm,
            "slurm",
            "submit",
            "--job",
            "job.yaml",
            "--state",
            "state.json",
            "--dry-run",
            "--",
            "-o",
            "out.txt",
            "job.sh",
            cwd=tmp_path,
        )
        assert dry.returncode == 0, dry.stderr
        assert f"--nodelist={expected.hostlist()}" in dry.stdout
        assert "--exclusive" in dry.stdout and "--ntasks=16" in dry.stdout
        assert queued(slurm) == [f"{busy} wrap RUNNING"]  # the dry run submitted nothing
        assert not list(tmp_path.glob("*.hostfile"))

        real = cli(
            slurm,
            "slurm",
            "submit",
            "--job",
            "job.yaml",
            "--state",
            "state.json",
            "--",
            "-o",
            "out.txt",
            "job.sh",
            cwd=tmp_path,
        )
        assert real.returncode == 0, real.stderr
        by_rank = wait_ranks(tmp_path / "out.txt", 16)
        assert by_rank == {
            r: expected.topology.host_of(int(g)) for r, g in enumerate(expected.gpus)
        }
    finally:
        drain_queue(slurm)


def test_srun_ranks_follow_an_unsorted_placement(
    cluster: LoopbackSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Rank order is gpuplace's even when it is not Slurm's node order, and where ranks do not
    fill their nodes each takes the GPU gpuplace chose."""
    slurm = cluster
    for key in [k for k in os.environ if k.startswith(("SLURM_", "SBATCH_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    state = sl.sync(sl.run_json("sinfo"), sl.run_json("squeue"), str(slurm.dir / "topology.conf"))
    placement = gpuplace.place(state, gpuplace.Job(name="mixed", tp=4, dp=3), "greedy")
    # Reverse the ranks: rank 0 now runs on the last node gpuplace used.
    reordered = dataclasses.replace(placement, gpus=np.asarray(placement.gpus[::-1]))
    assert reordered.nodes != sorted(reordered.nodes)
    (tmp_path / "job.sh").write_text(RANK_SCRIPT)
    sub = sl.submission(
        reordered, ["-o", str(tmp_path / "out.txt"), str(tmp_path / "job.sh")], directory=tmp_path
    )
    assert sub.env.get("GPUPLACE_PER_RANK_CUDA") == "1"
    try:
        sl.submit(sub)
        ranks = rank_lines(tmp_path / "out.txt", len(reordered.gpus))
        got = sorted((int(x[1]), x[2], x[3]) for x in ranks)
        assert got == [(r["rank"], r["host"], str(r["device"])) for r in reordered.rank_table()]
    finally:
        drain_queue(slurm)


def test_slurm_refusing_leaves_nothing_submitted(cluster: LoopbackSlurm, tmp_path: Path):
    slurm = cluster
    (tmp_path / "job.sh").write_text("#!/bin/sh\ntrue\n")
    (tmp_path / "job.yaml").write_text("name: late\nparallelism: {tp: 8, dp: 1}\n")
    result = cli(slurm, "slurm", "sync", "-o", "state.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    state = gpuplace.ClusterState.load(
        Topology.load(tmp_path / "state.topology.yaml"), tmp_path / "state.json"
    )
    chosen = gpuplace.place(state, gpuplace.Job.load(tmp_path / "job.yaml"), "greedy").nodes
    taker = slurm.occupy(chosen)  # someone takes the node between sync and submit
    try:
        refused = cli(
            slurm,
            "slurm",
            "submit",
            "--job",
            "job.yaml",
            "--state",
            "state.json",
            "--",
            "job.sh",
            cwd=tmp_path,
        )
        assert refused.returncode == 2, refused.stdout
        lines = refused.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuplace: error: "), refused.stderr
        # The error names the node and why it is not free.
        assert f"{chosen[0]} is held by job {taker} (wrap)" in lines[0], lines[0]
        assert queued(slurm) == [f"{taker} wrap RUNNING"]
        assert not list(tmp_path.glob("late.*"))
        # A drained node is refused by Slurm itself; the hostfile an earlier submission of
        # the same job left (its job may still read it) is put back as it was.
        slurm.release(taker)
        slurm.run("scontrol", "update", f"nodename={chosen[0]}", "state=drain", "reason=t")
        (tmp_path / "late.hostfile").write_text("n99\n")
        drained = cli(
            slurm,
            "slurm",
            "submit",
            "--job",
            "job.yaml",
            "--state",
            "state.json",
            "--",
            "job.sh",
            cwd=tmp_path,
        )
        assert drained.returncode == 2
        assert "Slurm refused the job" in drained.stderr
        assert "Requested node configuration is not available" in drained.stderr
        assert queued(slurm) == []
        assert [p.name for p in tmp_path.glob("late.*")] == ["late.hostfile"]
        assert (tmp_path / "late.hostfile").read_text() == "n99\n"
    finally:
        slurm.run("scontrol", "update", f"nodename={chosen[0]}", "state=resume", check=False)
        drain_queue(slurm)


def test_synced_state_keeps_slurms_node_order(cluster: LoopbackSlurm, tmp_path: Path):
    """slurm.conf lists the nodes out of name order; with the synced state the slurm-tree
    baseline names the nodes Slurm itself picks (`sbatch --test-only`), which it only does
    when the hosts are in Slurm's node order."""
    slurm = cluster
    busy = slurm.occupy(["n02", "n06"])
    try:
        assert cli(slurm, "slurm", "sync", "-o", "state.json", cwd=tmp_path).returncode == 0
        state = gpuplace.ClusterState.load(
            Topology.load(tmp_path / "state.topology.yaml"), tmp_path / "state.json"
        )
        for count in (1, 2, 3, 4):
            expected, answer = slurm.choose(count)
            job = gpuplace.Job(name=f"probe{count}", dp=count * GPUS)
            chosen = sorted(gpuplace.place(state, job, "slurm-tree").nodes)
            assert chosen == expected, answer
    finally:
        slurm.release(busy)


def test_slurm_commands_print_json_that_matches_their_schemas(
    cluster: LoopbackSlurm, tmp_path: Path
) -> None:
    """sync, pick and submit (dry run and real) with --format json: one JSON object each, valid
    against its schema, saying what the table output says."""
    slurm = cluster
    (tmp_path / "job.sh").write_text(RANK_SCRIPT)
    (tmp_path / "job.yaml").write_text("name: train\nparallelism: {tp: 8, dp: 2}\n")

    def run_json(*args: str) -> dict[str, Any]:
        ours, dash, sbatch = list(args), [], []
        if "--" in ours:
            at = ours.index("--")
            ours, dash, sbatch = ours[:at], ["--"], ours[at + 1 :]
        result = cli(slurm, *ours, "--format", "json", *dash, *sbatch, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) == 1, result.stdout
        return json.loads(lines[0])

    busy = slurm.occupy(["n01"])
    try:
        synced = run_json("slurm", "sync", "-o", "state.json")
        Draft202012Validator(SCHEMAS["slurm-sync"]).validate(synced)
        assert synced["nodes"] == 6 and synced["gpus"] == 6 * GPUS
        assert synced["free_gpus"] == 5 * GPUS and synced["jobs"] == [f"slurm-{busy}"]
        assert Path(tmp_path / synced["topology"]).exists() or Path(synced["topology"]).exists()

        picked = run_json("slurm", "pick", "--state", "state.json", "--nodes", "2")
        Draft202012Validator(SCHEMAS["slurm-pick"]).validate(picked)
        assert len(picked["nodes"]) == 2 and "n01" not in picked["nodes"]

        args = ("slurm", "submit", "--job", "job.yaml", "--state", "state.json")
        dry = run_json(*args, "--dry-run", "--", "-o", "out.txt", "job.sh")
        Draft202012Validator(SCHEMAS["slurm-submit"]).validate(dry)
        assert dry["dry_run"] is True and dry["job_id"] is None and dry["gpus"] == 16
        assert f"--nodelist={dry['hostlist']}" in dry["argv"]
        assert queued(slurm) == [f"{busy} wrap RUNNING"]  # nothing submitted

        real = run_json(*args, "--", "-o", "out.txt", "job.sh")
        Draft202012Validator(SCHEMAS["slurm-submit"]).validate(real)
        assert real["dry_run"] is False and isinstance(real["job_id"], int)
        assert real["nodes"] == dry["nodes"]
        assert set(wait_ranks(tmp_path / "out.txt", 16).values()) == set(real["nodes"])
    finally:
        slurm.release(busy)
        drain_queue(slurm)
