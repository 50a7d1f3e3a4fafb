"""`gpuplace serve` following a real Slurm 22.05 (slurmctld, one slurmd per node, munge, and
slurmrestd) on loopback, with the job_submit/lua plugin calling it over its socket:

- two tagged jobs submitted at once get different GPUs and both run, each rank on the host
  gpuplace planned for it; their holds follow the jobs and are released when they end;
- partitions (MaxTime), -C features, reservations (active and future) and time limits are
  honoured, and what cannot be placed falls back to Slurm's choice with the reason logged;
- an XID line in a kernel log the service tails drains the node in Slurm with a gpuplace
  reason and proposes the job's repair (the time it took is printed);
- a slurmrestd submission is pinned too; job=FILE is never opened inside slurmctld; when the
  service is down the plugin falls back at once, and a restarted service resumes its holds;
- a whole-node cluster without GPU GRES: sync, submit and the plugin; slurmctld down is
  answered in seconds.

Skipped, saying why, without Slurm and munge, LuaSocket, or root."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gpuplace.service.client import Client, ServiceError
from slurm_harness import CLI, GpuplaceService, LoopbackSlurm, cli, missing_daemons

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).parent.parent
GPUS = 8
BUS_IDS = ["0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00"]
BUS_IDS += ["0000:9a:00", "0000:ab:00", "0000:ba:00", "0000:db:00"]
RANK_SCRIPT = """#!/bin/sh
#GPUPLACE parallelism: {{tp: 4, dp: 3}}
srun sh -c 'echo "rank $SLURM_PROCID $SLURMD_NODENAME"'
sleep {sleep}
"""


def _lua_socket() -> bool:
    return any(
        Path(p, "socket", "unix.so").exists()
        for p in ("/usr/lib/x86_64-linux-gnu/lua/5.1", "/usr/local/lib/lua/5.1", "/usr/lib/lua/5.1")
    )


def _skip_reason() -> str | None:
    missing = missing_daemons()
    if missing:
        return f"Slurm/munge not installed ({', '.join(missing)} missing)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs"
    if not _lua_socket():
        return "LuaSocket for Lua 5.1 not installed (apt-get install lua-socket)"
    return None


def _world_readable_dir(prefix: str) -> Path:
    # slurmrestd runs as nobody, who must reach slurm.conf and the munge socket.
    base = tempfile.mkdtemp(prefix=prefix)
    os.chmod(base, 0o755)
    return Path(base)


@pytest.fixture(scope="module")
def served():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    workdir = _world_readable_dir("gpuplace-serve-")
    shutil.copy(ROOT / "contrib" / "slurm" / "job_submit.lua", workdir / "job_submit.lua")
    (workdir / "rules.yaml").write_text(json.dumps({"pci_bus_ids": {"dgx-h100": BUS_IDS}}))
    (workdir / "kern.log").write_text("")
    features = {n: "ib,hopper" for n in ("n01", "n02", "n03")}
    features.update({n: "roce,hopper" for n in ("n04", "n05", "n06")})
    slurm = LoopbackSlurm(
        workdir,
        2,
        3,
        gpus=GPUS,
        features=features,
        extra_conf=(
            "JobSubmitPlugins=lua",
            "PartitionName=small Nodes=n[04-06] MaxTime=30 State=UP",
        ),
    )
    service = GpuplaceService(
        slurm,
        "--host-type",
        "dgx-h100",
        "--rules",
        str(workdir / "rules.yaml"),
        "--follow-log",
        str(workdir / "kern.log"),
        "--hold-grace",
        "20",
    )
    try:
        with slurm:
            with service:
                yield slurm, service
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def squeue(slurm: LoopbackSlurm, job: str, field: str) -> str:
    return slurm.run("squeue", "-h", "-j", job, "-o", field).stdout.strip()


def wait_for(
    what: str, done, timeout: float = 30.0, *, log: tuple[LoopbackSlurm, int] | None = None
):
    """``done()``'s first true value within ``timeout``; on failure the gpuplace lines that
    slurmctld logged since ``log`` (a cluster and a :func:`log_mark`) are in the message."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = done()
        if value:
            return value
        time.sleep(0.2)
    said = "\n".join(log_lines(log[0], "gpuplace", log[1])) if log is not None else ""
    raise AssertionError(
        f"{what} within {timeout:.0f} s" + (f"; slurmctld logged:\n{said}" if said else "")
    )


def drain_queue(slurm: LoopbackSlurm) -> None:
    ids = slurm.run("squeue", "-h", "-o", "%i").stdout.split()
    if ids:
        slurm.run("scancel", *ids, check=False)
    wait_for("jobs ended", lambda: not slurm.run("squeue", "-h").stdout.strip())


def holds(service: GpuplaceService) -> dict[str, dict]:
    jobs = service.status()["clusters"][0]["jobs"]
    return {name: info for name, info in jobs.items() if "hold" in info}


def sbatch(slurm: LoopbackSlurm, *args: str) -> str:
    return slurm.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]


def log_mark(slurm: LoopbackSlurm) -> int:
    """Where slurmctld's log ends now: pass it to log_lines as `since` to see only what a later
    submission logged (earlier tests share the log and pinned jobs of their own)."""
    return (slurm.dir / "log" / "slurmctld.log").stat().st_size


def log_lines(slurm: LoopbackSlurm, needle: str, since: int = 0) -> list[str]:
    with (slurm.dir / "log" / "slurmctld.log").open("rb") as handle:
        handle.seek(since)
        text = handle.read().decode(errors="replace")
    return [line for line in text.splitlines() if needle in line]


def test_two_tagged_jobs_at_once_get_their_own_gpus_and_gpuplaces_rank_order(served):
    slurm, service = served
    (slurm.dir / "ranks.sh").write_text(RANK_SCRIPT.format(sleep=300))
    out = [slurm.dir / f"out-{i}.txt" for i in range(2)]
    mark = log_mark(slurm)
    try:
        with ThreadPoolExecutor(2) as pool:
            jobs = list(
                pool.map(
                    lambda path: sbatch(
                        slurm, "--comment=gpuplace", "-o", str(path), str(slurm.dir / "ranks.sh")
                    ),
                    out,
                )
            )
        for job in jobs:
            wait_for(f"job {job} running", lambda job=job: squeue(slurm, job, "%T") == "RUNNING")
        # Both run at once: the plans did not overlap, and Slurm granted what they planned.
        held = wait_for(
            "holds started",
            lambda: (
                h
                if len(h := holds(service)) == 2
                and all(i["hold"].get("started") for i in h.values())
                else None
            ),
        )
        by_job = {info["hold"]["slurm_job_id"]: name for name, info in held.items()}
        assert sorted(by_job) == sorted(int(j) for j in jobs)
        state = service.request("GET", "/v1/state")
        gpus = {j["name"]: j["gpus"] for j in state["jobs"]}
        first, second = (gpus[by_job[int(j)]] for j in jobs)
        assert len(first) == len(second) == 12 and set(first).isdisjoint(second)
        # Rank r ran on the host of the GPU gpuplace gave rank r.
        for job, path in zip(jobs, out, strict=True):
            lines = wait_for(
                f"output of {job}",
                lambda path=path: (
                    ls
                    if path.exists()
                    and len(
                        ls := [x for x in path.read_text().splitlines() if x.startswith("rank")]
                    )
                    == 12
                    else None
                ),
            )
            ran = {int(x.split()[1]): x.split()[2] for x in lines}
            planned = [f"n{g // GPUS + 1:02d}" for g in gpus[by_job[int(job)]]]
            # Hosts are n01..n06 in Slurm's node order, 8 GPUs each: GPU g is on n{g//8+1}.
            assert ran == dict(enumerate(planned)), (ran, planned)
        assert len(log_lines(slurm, "gpuplace: job ranks.sh pinned to", mark)) == 2
    finally:
        drain_queue(slurm)
    # The jobs ended: their holds are released.
    wait_for("holds released", lambda: holds(service) == {})


def test_tagged_sbatch_costs_little_inside_slurmctld(served):
    """The time a tagged sbatch adds over a plain one (the target is 50 ms; the figure is in
    benches/bench_serve.py's results): printed here, asserted nowhere."""
    slurm, _ = served
    plain, tagged = [], []
    mark = log_mark(slurm)
    try:
        for _ in range(5):
            start = time.perf_counter()
            sbatch(slurm, "-N", "1", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 300")
            plain.append(time.perf_counter() - start)
            start = time.perf_counter()
            sbatch(
                slurm,
                "-N",
                "1",
                "--exclusive",
                "--comment=gpuplace",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 300",
            )
            tagged.append(time.perf_counter() - start)
            drain_queue(slurm)
        print(
            f"\nsbatch median: plain {statistics.median(plain) * 1e3:.1f} ms, tagged "
            f"{statistics.median(tagged) * 1e3:.1f} ms"
        )
        assert len(log_lines(slurm, "pinned to", mark)) == 5
    finally:
        drain_queue(slurm)


def test_partitions_features_and_time_limits_are_honoured(served):
    slurm, service = served
    # The earlier tests' jobs were cancelled; their holds go when the service sees them end.
    wait_for("holds released", lambda: holds(service) == {})
    try:
        mark = log_mark(slurm)
        job = sbatch(
            slurm,
            "-N",
            "2",
            "--exclusive",
            "-p",
            "small",
            "-t",
            "10",
            "--comment=gpuplace",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        )
        line = wait_for(
            "pinned", lambda: log_lines(slurm, "pinned to n0", mark), log=(slurm, mark)
        )[-1]
        pinned = line.split("pinned to ")[1].split()[0].split(",")
        assert set(pinned) <= {"n04", "n05", "n06"}, line
        wait_for("running", lambda: squeue(slurm, job, "%T") == "RUNNING")
        # -C ib: only n01-n03 have it.
        mark = log_mark(slurm)
        sbatch(
            slurm,
            "-N",
            "1",
            "-C",
            "ib",
            "--comment=gpuplace",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        )
        line = wait_for(
            "pinned", lambda: log_lines(slurm, "pinned to n0", mark), log=(slurm, mark)
        )[-1]
        assert line.split("pinned to ")[1].split()[0] in ("n01", "n02", "n03"), line
        # Over the partition's MaxTime: gpuplace says so and leaves the job to Slurm.
        sbatch(
            slurm,
            "-N",
            "1",
            "-p",
            "small",
            "-t",
            "60",
            "--comment=gpuplace",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        )
        refused = wait_for("fallback", lambda: log_lines(slurm, "MaxTime"))
        assert "time limit 60 min is over partition small's MaxTime 30 min" in refused[-1]
    finally:
        drain_queue(slurm)


def test_reservations_active_and_future(served):
    slurm, service = served
    slurm.run(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=now1",
        "StartTime=now",
        "Duration=60",
        "Nodes=n02",
        "Users=root",
    )
    slurm.run(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=later",
        "StartTime=now+1800",
        "Duration=60",
        "Nodes=n05",
        "Users=root",
    )
    try:
        wait_for(
            "the service sees the reservations",
            lambda: (
                service.status()["clusters"][0]["slurm"]["last_ok"]
                and len(slurm.run("scontrol", "show", "res").stdout.split("ReservationName=")) == 3
            ),
        )
        time.sleep(1.5)  # two polls
        # Inside the reservation: its node.
        mark = log_mark(slurm)
        job = sbatch(
            slurm,
            "-N",
            "1",
            "--reservation=now1",
            "--comment=gpuplace",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        )
        line = wait_for("pinned", lambda: log_lines(slurm, "pinned to ", mark))[-1]
        assert "pinned to n02 " in line, line
        wait_for("running in the reservation", lambda: squeue(slurm, job, "%T") == "RUNNING")
        # Outside it, n02 is avoided: three ib nodes are not to be had.
        mark = log_mark(slurm)
        sbatch(
            slurm, "-N", "3", "-C", "ib", "--comment=gpuplace", "-o", "/dev/null", "--wrap", "true"
        )
        fallback = wait_for("fallback", lambda: log_lines(slurm, "in reservation now1", mark))
        assert "n02: in reservation now1 (active)" in fallback[-1]
        # A future reservation: a job with no time limit (the partition's is unlimited) may
        # not start on its node; one that ends before it starts may.
        mark = log_mark(slurm)
        sbatch(
            slurm,
            "-N",
            "3",
            "-C",
            "roce",
            "--comment=gpuplace",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        )
        fallback = wait_for("fallback", lambda: log_lines(slurm, "in reservation later", mark))
        assert "n05: in reservation later (from" in fallback[-1]
        assert "before the job's unlimited time limit ends" in fallback[-1]
        mark = log_mark(slurm)
        short = sbatch(
            slurm,
            "-N",
            "3",
            "-C",
            "roce",
            "-t",
            "10",
            "--exclusive",
            "--comment=gpuplace",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        )
        line = wait_for(
            "pinned",
            lambda: (
                log_lines(slurm, "pinned to n04,n05,n06", mark)
                or log_lines(slurm, "pinned to n04,n06,n05", mark)
            ),
        )
        assert line
        wait_for("short job running", lambda: squeue(slurm, short, "%T") == "RUNNING")
    finally:
        drain_queue(slurm)
        slurm.run("scontrol", "delete", "ReservationName=now1", check=False)
        slurm.run("scontrol", "delete", "ReservationName=later", check=False)


def test_an_xid_drains_the_node_in_slurm_and_proposes_the_repair(served):
    slurm, service = served
    try:
        job = sbatch(
            slurm,
            "-N",
            "2",
            "--exclusive",
            "-C",
            "ib",
            "--comment=gpuplace",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        )
        wait_for("running", lambda: squeue(slurm, job, "%T") == "RUNNING")
        hold = wait_for(
            "hold started",
            lambda: next((n for n, i in holds(service).items() if i["hold"].get("started")), None),
        )
        host = slurm.run("scontrol", "show", "hostnames", squeue(slurm, job, "%N")).stdout.split()[
            0
        ]
        line = (
            f"Dec  2 08:00:00 {host} kernel: NVRM: Xid (PCI:{BUS_IDS[4]}): 79, pid=1234, "
            "GPU has fallen off the bus.\n"
        )
        start = time.perf_counter()
        with open(slurm.dir / "kern.log", "a") as log:
            log.write(line)
        reason = wait_for(
            f"{host} drained in Slurm",
            lambda: next(
                (
                    r
                    for n, r in (
                        x.split(" ", 1)
                        for x in slurm.run(
                            "sinfo", "-h", "-N", "-o", "%N %E", "-t", "drain,draining,drained"
                        ).stdout.splitlines()
                        if " " in x
                    )
                    if n == host
                ),
                None,
            ),
            timeout=30,
        )
        drained_after = time.perf_counter() - start
        assert reason == f"gpuplace: XID 79 on GPU {host}:4", reason
        status = wait_for(
            "repair proposed",
            lambda: (s := service.status()["clusters"][0])["repairs_proposed"].get(hold) and s,
        )
        proposal = status["repairs_proposed"][hold]
        lost = [m for m in proposal["moved"] if m["kind"] == "lost"]
        assert len(lost) == 1 and lost[0]["reason"]
        new_host = proposal["rank_hosts"][lost[0]["rank"]]
        assert new_host != host
        print(
            f"\nXID 79 on {host} -> drained in Slurm after {drained_after:.2f} s; repair proposes {new_host}"
        )
    finally:
        drain_queue(slurm)
        for n in slurm.nodes:
            slurm.run("scontrol", "update", f"nodename={n}", "state=resume", check=False)


def test_job_file_is_never_opened_inside_slurmctld(served):
    slurm, _ = served
    start = time.perf_counter()
    job = sbatch(
        slurm, "-N", "1", "--comment=gpuplace:job=/dev/zero", "-o", "/dev/null", "--wrap", "true"
    )
    elapsed = time.perf_counter() - start
    assert job.isdigit() and elapsed < 2.0
    assert log_lines(slurm, "job=FILE is not read inside slurmctld")
    drain_queue(slurm)


def test_slurmrestd_submission_is_pinned(served):
    slurm, _ = served
    if shutil.which("slurmrestd", path=slurm.env["PATH"]) is None:
        pytest.skip("slurmrestd not installed (apt-get install slurmrestd)")
    if shutil.which("setpriv") is None or shutil.which("curl") is None:
        pytest.skip("setpriv and curl are needed to run slurmrestd and its client as nobody")
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    sockets = slurm.dir / "rest"
    sockets.mkdir(exist_ok=True)
    sockets.chmod(0o777)
    sock = sockets / "slurmrestd.sock"
    with open(slurm.dir / "log" / "slurmrestd.out", "wb") as log:
        rest = subprocess.Popen(
            [
                *as_nobody,
                "slurmrestd",
                "-a",
                "rest_auth/local",
                "-s",
                "openapi/v0.0.38",
                f"unix:{sock}",
            ],
            env=slurm.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for("slurmrestd socket", sock.exists, 20)
        body = {
            "job": {
                "name": "viarest",
                "nodes": 2,
                "comment": "gpuplace",
                "current_working_directory": "/tmp",
                "environment": {"PATH": "/bin:/usr/bin"},
                "standard_output": "/dev/null",
            },
            "script": "#!/bin/sh\nsleep 300\n",
        }
        answer = subprocess.run(
            [
                *as_nobody,
                "curl",
                "-s",
                "--unix-socket",
                str(sock),
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "-d",
                json.dumps(body),
                "http://localhost/slurm/v0.0.38/job/submit",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        reply = json.loads(answer.stdout)
        assert reply["errors"] == [], reply
        job = str(reply["job_id"])
        line = wait_for("pinned", lambda: log_lines(slurm, "gpuplace: job viarest pinned to"))[-1]
        planned = line.split("pinned to ")[1].split()[0].split(",")
        wait_for("running", lambda: squeue(slurm, job, "%T") == "RUNNING")
        ran_on = slurm.run("scontrol", "show", "hostnames", squeue(slurm, job, "%N")).stdout.split()
        assert ran_on == sorted(planned)
    finally:
        drain_queue(slurm)
        os.killpg(rest.pid, 15)
        rest.wait(timeout=10)


def test_service_down_falls_back_at_once_and_a_restart_resumes(served):
    slurm, service = served
    try:
        kept = sbatch(
            slurm,
            "-N",
            "1",
            "--exclusive",
            "--comment=gpuplace",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        )
        wait_for("running", lambda: squeue(slurm, kept, "%T") == "RUNNING")
        wait_for(
            "hold started", lambda: any(i["hold"].get("started") for i in holds(service).values())
        )
        before = holds(service)
        service.stop()
        start = time.perf_counter()
        job = sbatch(slurm, "-N", "1", "--comment=gpuplace", "-o", "/dev/null", "--wrap", "true")
        elapsed = time.perf_counter() - start
        assert job.isdigit() and elapsed < 2.0
        assert log_lines(slurm, "cannot reach gpuplace serve")
        service.start()
        after = holds(service)
        assert after == before  # replayed from the journal
    finally:
        drain_queue(slurm)


# ------------------------------------------------------------------------ without GRES
@pytest.fixture(scope="module")
def bare():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    workdir = _world_readable_dir("gpuplace-bare-")
    shutil.copy(ROOT / "contrib" / "slurm" / "job_submit.lua", workdir / "job_submit.lua")
    slurm = LoopbackSlurm(workdir, 1, 4, extra_conf=("JobSubmitPlugins=lua",))
    # slurmctld reads the plugin's settings from its environment at start.
    slurm.env["GPUPLACE_SOCKET"] = str(workdir / "gpuplace.sock")
    try:
        with slurm:
            yield slurm
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_cluster_without_gpu_gres(bare: LoopbackSlurm, tmp_path: Path):
    slurm = bare
    refused = cli(slurm, "slurm", "sync", "-o", "state.json", cwd=tmp_path)
    assert refused.returncode == 2 and "--gpus-per-node" in refused.stderr
    synced = cli(slurm, "slurm", "sync", "-o", "state.json", "--gpus-per-node", "8", cwd=tmp_path)
    assert synced.returncode == 0 and "no gpu GRES: whole nodes" in synced.stdout, synced.stderr
    (tmp_path / "job.yaml").write_text("name: whole\nparallelism: {tp: 8, dp: 2}\n")
    (tmp_path / "job.sh").write_text("#!/bin/sh\nsrun hostname\nsleep 300\n")
    done = cli(
        slurm,
        "slurm",
        "submit",
        "--job",
        "job.yaml",
        "--state",
        "state.json",
        "--",
        "-o",
        str(tmp_path / "out.txt"),
        "job.sh",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    job = done.stdout.split()[3]
    wait_for("running", lambda: squeue(slurm, job, "%T") == "RUNNING")
    assert (
        "--gres"
        not in slurm.run("scontrol", "show", "job", job).stdout.split("TresPerNode")[0][-1:]
    )
    try:
        with GpuplaceService(slurm, "--gpus-per-node", "8") as service:
            # The running job's nodes are held whole; a tagged job gets two others, whole.
            mark = log_mark(slurm)
            tagged = sbatch(
                slurm, "-N", "2", "--comment=gpuplace", "-o", "/dev/null", "--wrap", "sleep 300"
            )
            wait_for("tagged running", lambda: squeue(slurm, tagged, "%T") == "RUNNING")
            first = set(
                slurm.run("scontrol", "show", "hostnames", squeue(slurm, job, "%N")).stdout.split()
            )
            second = set(
                slurm.run(
                    "scontrol", "show", "hostnames", squeue(slurm, tagged, "%N")
                ).stdout.split()
            )
            assert len(second) == 2 and first.isdisjoint(second)
            assert log_lines(slurm, "pinned to", mark), "\n".join(log_lines(slurm, "lua:"))
            assert "OverSubscribe=NO" in slurm.run("scontrol", "show", "job", tagged).stdout
            assert service.status()["clusters"][0]["free_gpus"] == 0
    finally:
        drain_queue(slurm)


def test_one_service_follows_two_clusters(served, bare: LoopbackSlurm, tmp_path: Path):
    """Two Slurm clusters on one host, each with its own slurm.conf (--slurm-cluster
    NAME=SLURM_CONF): one service follows both and places on the one a request names."""
    gres_cluster, _ = served
    sock = tmp_path / "two.sock"
    env = {k: v for k, v in bare.env.items() if k != "SLURM_CONF"}
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [
                *CLI,
                "serve",
                "--slurm-cluster",
                f"gres={gres_cluster.env['SLURM_CONF']}",
                "--slurm-cluster",
                f"bare={bare.env['SLURM_CONF']}",
                "--host-type",
                "dgx-h100",
                "--journal",
                str(tmp_path / "j.db"),
                "--socket",
                str(sock),
                "--poll",
                "0.5",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        client = Client(str(sock), timeout=30)

        def ready():
            try:
                status = client.status()
            except ServiceError:
                return None
            clusters = {c["cluster"]: c for c in status["clusters"]}
            if set(clusters) == {"gres", "bare"} and all(
                c["slurm"]["last_ok"] for c in clusters.values()
            ):
                return clusters
            return None

        clusters = wait_for("both clusters followed", ready, 60)
        assert clusters["gres"]["gpus"] == 6 * GPUS and clusters["bare"]["gpus"] == 4 * GPUS
        placed = client.place(
            {"name": "on-bare", "parallelism": {"tp": 8, "dp": 2}},
            cluster="bare",
            slurm={"partition": "gpu", "time_limit": 10},
        )
        assert set(placed["nodes"]) <= {"n01", "n02", "n03", "n04"}
        assert "on-bare" in client.status("bare")["clusters"][0]["jobs"]
        assert "on-bare" not in client.status("gres")["clusters"][0]["jobs"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# Last: it stops the bare cluster's slurmctld.
def test_slurmctld_down_is_answered_in_seconds(bare: LoopbackSlurm, tmp_path: Path):
    slurm = bare
    slurm.stop_controller()
    start = time.perf_counter()
    result = cli(
        slurm,
        "slurm",
        "sync",
        "-o",
        "state.json",
        "--gpus-per-node",
        "8",
        "--slurm-timeout",
        "3",
        cwd=tmp_path,
    )
    elapsed = time.perf_counter() - start
    assert result.returncode == 2
    assert "slurmctld" in result.stderr and (
        "does not answer" in result.stderr or "did not answer" in result.stderr
    ), result.stderr
    assert elapsed < 15, elapsed
    print(f"\nslurmctld down: answered after {elapsed:.1f} s: {result.stderr.strip()}")
