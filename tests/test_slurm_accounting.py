"""QOS and `-M` against real Slurm 22.05 accounting: a MariaDB server (Unix socket only) and
slurmdbd on loopback, and two clusters (slurmctld, one slurmd per node, munge) registered in it.

QOS: a job in a QOS that its partition allows runs on gpuplace's nodes; a QOS the partition
does not allow or denies, a time limit over the QOS's MaxWall, more nodes than its
MaxTRESPerJob, and a QOS slurmdbd does not know are refused by gpuplace naming the partition,
QOS and limit, with nothing queued (Slurm's own `sbatch --test-only` accepts the over-MaxWall
job, which would then pend for ever). `-M`: `gpuplace slurm sync -M beta` and `submit -M beta`,
run with the first cluster's slurm.conf, read and use the second cluster. Skipped, saying why,
without Slurm, munge, slurmdbd or MariaDB, or without root."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import gpuplace
import pytest
from gpuplace._util.hostlist import compress
from gpuplace.model.topology import Topology
from slurm_harness import (
    GpuplaceService,
    LoopbackAccounting,
    LoopbackSlurm,
    SlurmError,
    cli,
    missing_accounting,
    missing_daemons,
    wait_ranks,
)

pytestmark = pytest.mark.slurm

GPUS = 4
#: What every rank prints: its rank and the node it runs on.
RANK_SCRIPT = """#!/bin/sh
srun sh -c 'echo "rank $SLURM_PROCID $SLURMD_NODENAME"'
"""
#: QOS short: at most 10 minutes and 2 nodes a job; partition short takes only it, nolong
#: denies it.
QOS = {"short": "MaxWall=00:10:00 MaxTRESPerJob=node=2"}
PARTITIONS = (
    "PartitionName=short Nodes=ALL AllowQos=short MaxTime=INFINITE State=UP",
    "PartitionName=nolong Nodes=ALL DenyQos=short MaxTime=INFINITE State=UP",
)


def _skip_reason() -> str | None:
    missing = missing_daemons() + missing_accounting()
    if missing:
        return f"Slurm accounting not installed ({', '.join(missing)} missing)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    return None


@pytest.fixture(scope="module")
def clusters(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LoopbackSlurm, LoopbackSlurm]]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("slurm-accounting")
    with (
        LoopbackAccounting(base / "slurmdbd") as accounting,
        LoopbackSlurm(
            base / "alpha",
            2,
            2,
            gpus=GPUS,
            gpu_type="h100",
            accounting=accounting,
            cluster="alpha",
            qos=QOS,
            extra_conf=PARTITIONS,
        ) as alpha,
        LoopbackSlurm(
            base / "beta",
            2,
            3,
            gpus=GPUS,
            gpu_type="h100",
            accounting=accounting,
            cluster="beta",
            prefix="m",
        ) as beta,
    ):
        yield alpha, beta


def queued(slurm: LoopbackSlurm, *args: str) -> list[str]:
    out = slurm.run("squeue", "-h", *args, "-o", "%i %P %q %T").stdout
    return [ln.strip() for ln in out.splitlines() if ln.strip() and not ln.startswith("CLUSTER")]


def drain_queue(slurm: LoopbackSlurm) -> None:
    slurm.run("scancel", "-u", "root", check=False)
    slurm._wait(lambda: not slurm.run("squeue", "-h").stdout.strip(), 30, "jobs ended")


def test_job_in_an_allowed_qos_runs_on_gpuplaces_nodes(
    clusters: tuple[LoopbackSlurm, LoopbackSlurm], tmp_path: Path
):
    alpha, _ = clusters
    (tmp_path / "job.sh").write_text(RANK_SCRIPT)
    (tmp_path / "job.yaml").write_text("name: qjob\nparallelism: {tp: 4, dp: 2}\n")
    busy = alpha.occupy(["n01"])  # so gpuplace's choice is not simply the first nodes
    try:
        synced = cli(alpha, "slurm", "sync", "-o", "state.json", cwd=tmp_path)
        assert synced.returncode == 0, synced.stderr
        state = gpuplace.ClusterState.load(
            Topology.load(tmp_path / "state.topology.yaml"), tmp_path / "state.json"
        )
        expected = gpuplace.place(state, gpuplace.Job.load(tmp_path / "job.yaml"), "greedy")
        assert "n01" not in expected.nodes and len(expected.nodes) == 2
        submitted = cli(
            alpha,
            "slurm",
            "submit",
            "--job",
            "job.yaml",
            "--state",
            "state.json",
            "--format",
            "json",
            "--",
            "-p",
            "short",
            "-q",
            "short",
            "-t",
            "5",
            "-o",
            "out.txt",
            "job.sh",
            cwd=tmp_path,
        )
        assert submitted.returncode == 0, submitted.stderr
        job_id = json.loads(submitted.stdout)["job_id"]
        ranks = wait_ranks(tmp_path / "out.txt", 8)
        assert ranks == {r: expected.topology.host_of(int(g)) for r, g in enumerate(expected.gpus)}
        # slurmdbd recorded the job in QOS short, partition short, 5 minutes, on those nodes.
        want = f"short|short|00:05:00|{compress(sorted(expected.nodes))}"

        def accounted() -> list[str]:
            return alpha.run(
                "sacct",
                "-n",
                "-X",
                "-P",
                "-j",
                str(job_id),
                "-o",
                "QOS,Partition,Timelimit,NodeList",
            ).stdout.split()

        alpha._wait(lambda: accounted() == [want], 20, f"sacct showing {want}")
    finally:
        alpha.release(busy)
        drain_queue(alpha)


@pytest.mark.parametrize(
    ("job", "args", "reason"),
    [
        (
            "tp: 4, dp: 1",
            ["-p", "short", "-q", "normal"],
            "partition short does not allow QOS normal (AllowQos=short)",
        ),
        ("tp: 4, dp: 1", ["-p", "nolong", "-q", "short"], "partition nolong denies QOS short"),
        (
            "tp: 4, dp: 1",
            ["-p", "short", "-q", "short", "-t", "20"],
            "time limit 20 min is over QOS short's MaxWall 10 min",
        ),
        (
            "tp: 4, dp: 3",
            ["-p", "short", "-q", "short", "-t", "5"],
            "needs 3 nodes, over QOS short's MaxTRESPerJob node=2",
        ),
        (
            "tp: 4, dp: 1",
            ["-q", "nosuch"],
            "QOS nosuch does not exist in slurmdbd (QOS: normal, short)",
        ),
    ],
)
def test_qos_refusals_name_the_qos_and_queue_nothing(
    clusters: tuple[LoopbackSlurm, LoopbackSlurm],
    tmp_path: Path,
    job: str,
    args: list[str],
    reason: str,
):
    alpha, _ = clusters
    (tmp_path / "job.sh").write_text("#!/bin/sh\ntrue\n")
    (tmp_path / "job.yaml").write_text(f"name: refused\nparallelism: {{{job}}}\n")
    result = cli(alpha, "slurm", "submit", "--job", "job.yaml", "--", *args, "job.sh", cwd=tmp_path)
    assert result.returncode == 2, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuplace: error: "), result.stderr
    assert reason in lines[0], lines[0]
    assert queued(alpha) == []
    assert not list(tmp_path.glob("refused.*"))


def test_slurm_itself_accepts_the_over_maxwall_job_it_never_starts(
    clusters: tuple[LoopbackSlurm, LoopbackSlurm],
):
    """Why gpuplace reads the QOS: `sbatch --test-only` says the job starts now, and the real
    submission pends with QOSMaxWallDurationPerJobLimit."""
    alpha, _ = clusters
    argv = ["sbatch", "-p", "short", "-q", "short", "-t", "20", "-o", "/dev/null"]
    test = alpha.run(*argv[:1], "--test-only", *argv[1:], "--wrap", "true", check=False)
    assert "to start at" in test.stderr + test.stdout, test.stderr
    job = alpha.run(*argv[:1], "--parsable", *argv[1:], "--wrap", "true").stdout.strip()
    try:
        alpha._wait(
            lambda: (
                alpha.run("squeue", "-h", "-j", job, "-o", "%r").stdout.strip()
                == "QOSMaxWallDurationPerJobLimit"
            ),
            20,
            "job held by its QOS",
        )
        assert alpha.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "PENDING"
    finally:
        drain_queue(alpha)


def test_sync_and_submit_on_another_cluster_with_M(
    clusters: tuple[LoopbackSlurm, LoopbackSlurm], tmp_path: Path
):
    """Run with alpha's slurm.conf: -M beta reads beta's nodes, jobs and switches through
    slurmdbd, and runs the job there on gpuplace's nodes in rank order."""
    alpha, beta = clusters
    # The job stays running after its ranks print, so squeue -M shows where it runs.
    (tmp_path / "job.sh").write_text(RANK_SCRIPT + "sleep 120\n")
    (tmp_path / "job.yaml").write_text("name: far\nparallelism: {tp: 4, dp: 3}\n")
    busy = beta.occupy(["m02"])
    try:
        synced = cli(alpha, "slurm", "sync", "-M", "beta", "-o", "state.json", cwd=tmp_path)
        assert synced.returncode == 0, synced.stderr
        state = gpuplace.ClusterState.load(
            Topology.load(tmp_path / "state.topology.yaml"), tmp_path / "state.json"
        )
        topo = state.topology
        assert sorted(topo.hosts) == beta.nodes == ["m01", "m02", "m03", "m04", "m05", "m06"]
        leaf = {h: topo.domain_of(int(topo.host_gpus(h)[0]), "leaf") for h in topo.hosts}
        assert leaf == {
            "m01": "leaf1",
            "m02": "leaf1",
            "m03": "leaf1",
            "m04": "leaf2",
            "m05": "leaf2",
            "m06": "leaf2",
        }
        assert sorted(state.jobs) == [f"slurm-{busy}"]
        assert state.free_gpus == 6 * GPUS - GPUS
        expected = gpuplace.place(state, gpuplace.Job.load(tmp_path / "job.yaml"), "greedy")
        assert "m02" not in expected.nodes and len(expected.nodes) == 3

        submitted = cli(
            alpha,
            "slurm",
            "submit",
            "-M",
            "beta",
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
        assert submitted.returncode == 0, submitted.stderr
        ranks = wait_ranks(tmp_path / "out.txt", 12)
        assert ranks == {r: topo.host_of(int(g)) for r, g in enumerate(expected.gpus)}
        # squeue -M beta (from alpha) shows the job on gpuplace's nodes; alpha has none.
        shown = alpha.run("squeue", "-M", "beta", "-h", "-n", "far", "-o", "%N %T").stdout
        rows = [ln for ln in shown.splitlines() if ln and not ln.startswith("CLUSTER")]
        assert rows == [f"{compress(sorted(expected.nodes))} RUNNING"], shown
        assert queued(alpha) == []
    finally:
        drain_queue(beta)  # the job gpuplace submitted and the one holding m02
        beta.wait_idle()


def test_service_honours_qos_and_follows_a_cluster_by_M(
    clusters: tuple[LoopbackSlurm, LoopbackSlurm],
):
    """`gpuplace serve` following alpha (its slurm.conf) and beta (`--slurm-cluster beta`, by
    -M through slurmdbd): a place with slurm.qos gets alpha's nodes, or the QOS's reason."""
    alpha, beta = clusters
    with GpuplaceService(alpha, "--slurm-cluster", "beta") as service:
        # start() waited for the first cluster only.
        def both_followed() -> bool:
            status = service.status().get("clusters", [])
            return {c["cluster"] for c in status if c["slurm"]["last_ok"]} == {"slurm", "beta"}

        alpha._wait(both_followed, 30, "the service following both clusters")
        job = {"name": "svc", "parallelism": {"tp": 4, "dp": 2}}
        placed = service.request(
            "POST",
            "/v1/place",
            {
                "job": job,
                "cluster": "slurm",
                "dry_run": True,
                "slurm": {"partition": "short", "qos": "short", "time_limit": 5},
            },
        )
        assert len(placed["nodes"]) == 2 and set(placed["nodes"]) <= set(alpha.nodes)
        for slurm, reason in (
            ({"partition": "short", "qos": "short", "time_limit": 20}, "MaxWall 10 min"),
            ({"partition": "nolong", "qos": "short"}, "partition nolong denies QOS short"),
            ({"qos": "nosuch"}, "QOS nosuch does not exist in slurmdbd"),
        ):
            with pytest.raises(SlurmError, match=reason):
                service.request(
                    "POST",
                    "/v1/place",
                    {"job": job, "cluster": "slurm", "dry_run": True, "slurm": slurm},
                )
        far = service.request("POST", "/v1/place", {"job": job, "cluster": "beta", "dry_run": True})
        assert len(far["nodes"]) == 2 and set(far["nodes"]) <= set(beta.nodes)
