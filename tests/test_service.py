"""`gpuplace serve` without a scheduler: the API over its Unix socket (place, release, repair,
explain, health, status, state), its errors, its limits (token, body size, queue, time), its
metrics and schema, the journal's replay after a restart, and `kill -9` during placements
losing none that was acknowledged."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import gpuplace
import numpy as np
import pytest
from gpuplace.placement.result import SolveResult
from gpuplace.service.app import Limits
from gpuplace.service.client import Client, ServiceError
from gpuplace.service.engine import Engine
from gpuplace.service.journal import Journal
from gpuplace.service.server import ListenError, listen_tcp
from service_harness import connection, running_service, xid_line

CLI = [sys.executable, "-m", "gpuplace.cli"]
#: A solver that takes its time, to fill the worker pool and run past the time limit.
SLOW_SECONDS = 1.5


@gpuplace.register_solver("test-slow", "greedy after a pause (tests of the service's limits)")
def _slow(state: gpuplace.ClusterState, job: gpuplace.Job, seed: int, time_limit) -> SolveResult:
    time.sleep(SLOW_SECONDS)
    return SolveResult(gpus=gpuplace.place(state, job, "greedy").gpus)


def job(name: str, tp: int = 8, dp: int = 1) -> dict:
    return {"name": name, "parallelism": {"tp": tp, "dp": dp}}


def test_place_release_status_and_state_over_the_socket(tmp_path: Path) -> None:
    with running_service(tmp_path) as svc:
        mode = stat.S_IMODE(os.stat(svc.address).st_mode)
        assert mode == 0o660  # only the owner and the socket's group may connect
        first = svc.client.place(job("a", 8, 2))
        assert first["held"] and len(first["gpus"]) == 16 and first["journal_seq"] >= 2
        assert [r["rank"] for r in first["rank_table"]] == list(range(16))
        second = svc.client.place(job("b", 8, 1))
        assert set(first["gpus"]).isdisjoint(second["gpus"])
        dry = svc.client.place(job("c", 8, 1), dry_run=True)
        assert not dry["held"] and set(dry["gpus"]).isdisjoint(first["gpus"] + second["gpus"])
        status = svc.client.status()
        (cluster,) = status["clusters"]
        assert cluster["free_gpus"] == 8 and set(cluster["jobs"]) == {"a", "b"}
        assert status["journal"]["committed"] == second["journal_seq"]
        # The state document is a state-file body: the library restores it.
        doc = svc.client.state()
        restored = gpuplace.ClusterState.restore(svc.engine.cluster(None).state.topology, doc)
        assert sorted(restored.jobs["a"].tolist()) == sorted(first["gpus"])
        assert svc.client.release("a")["released_gpus"] == 16
        assert set(svc.client.status()["clusters"][0]["jobs"]) == {"b"}


def test_errors_say_what_is_wrong_with_the_right_status(tmp_path: Path) -> None:
    with running_service(tmp_path, limits=Limits(max_body=4096)) as svc:
        svc.client.place(job("a", 8, 3))
        cases = [
            ({"job": {"name": "x", "parallelism": {"tp": "eight"}}}, 400, "parallelism.tp"),
            ({"job": job("big", 8, 2)}, 409, "needs 16 GPUs"),
            ({"job": job("a", 8, 1)}, 409, "job name 'a' is in use"),
            ({"job": job("x"), "solver": "nope"}, 400, "unknown solver"),
            ({"job": job("x"), "cluster": "other"}, 404, "no cluster 'other'"),
            ({"jobb": 1}, 400, "job: Field required"),
        ]
        for body, status, message in cases:
            got, answer = svc.post("/v1/place", body)
            assert got == status, answer
            assert message in answer["error"], answer
        got, answer = svc.post("/v1/place", {"job": job("big", 8, 2)})
        assert answer["explanation"]["placeable"] is False
        assert svc.post("/v1/release", {"job": "nope"})[0] == 404
        got, answer = svc.post("/v1/place", b"x" * 5000)
        assert got == 413 and "over 4096 bytes" in answer["error"]
        got, answer = svc.post("/v1/place", b"{not json")
        assert got == 400
        # Nothing above changed the state.
        assert list(svc.client.status()["clusters"][0]["jobs"]) == ["a"]


def test_repair_explain_and_health_evidence(tmp_path: Path) -> None:
    with running_service(tmp_path) as svc:
        placed = svc.client.place(job("train", 8, 2))
        host = placed["nodes"][0]
        explained = svc.client.explain(job("next", 8, 2))
        assert explained["placeable"] is True
        # An XID 79 (GPU fell off the bus) on the job's first host, GPU 3.
        report = svc.client.health(xid_line(host, 5), host=host)
        assert [(c["kind"], c["after"]) for c in report["changes"]] == [("gpu", "failed")]
        assert list(report["affected"]) == ["train"]
        proposal = report["repairs"]["train"]
        # The tp group of the lost GPU moves whole (it must stay inside one node).
        assert proposal["applied"] is False and len(proposal["moved"]) == 8
        assert [m["rank"] for m in proposal["moved"] if m["kind"] == "lost"] == [5]
        assert report["hosts"] == [host]
        # Proposed only: the job still holds its old GPUs; the status lists the proposal.
        status = svc.client.status()["clusters"][0]
        assert "train" in status["repairs_proposed"]
        applied = svc.client.repair("train", apply=True)
        assert applied["applied"] is True
        held = svc.engine.cluster(None).state.job_gpus("train").tolist()
        lost = next(m for m in applied["moved"] if m["kind"] == "lost")
        assert lost["new_gpu"] == held[5] and lost["old_gpu"] not in held
        assert applied["rank_hosts"][5] != host


def test_a_failed_gpu_taints_its_kubernetes_node(tmp_path: Path) -> None:
    """Without Slurm, the configured command taints the node (a stand-in for kubectl that
    records its arguments: no API server runs here)."""
    record = tmp_path / "kubectl.args"
    fake = tmp_path / "kubectl"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    fake.chmod(0o755)
    with running_service(tmp_path) as svc:
        svc.engine.cluster(None).taint_command = [str(fake), "--context", "test"]
        report = svc.client.health(xid_line("dgx003", 1), host="dgx003")
        (action,) = report["scheduler"]
        assert action["action"] == "kubernetes taint" and action["host"] == "dgx003"
        assert action["reason"] == "gpuplace: XID 79 on GPU dgx003:1"
    assert record.read_text().split() == [
        "--context",
        "test",
        "taint",
        "nodes",
        "dgx003",
        "gpuplace.io/unhealthy=true:NoSchedule",
        "--overwrite",
    ]


def test_restart_replays_the_journal(tmp_path: Path) -> None:
    topology = gpuplace.Topology.preset("h100-superpod", nodes=8)
    journal = tmp_path / "j.db"
    with running_service(tmp_path, gpuplace.ClusterState(topology), journal=journal) as svc:
        for i in range(6):
            svc.client.place(job(f"j{i}", 8, 1))
        svc.client.release("j2")
        svc.client.health(xid_line("dgx005", 2), host="dgx005")
        before = svc.engine.cluster(None).state.snapshot()
    # A fresh engine on the same journal resumes exactly that state (events replayed) ...
    again = Journal(journal)
    try:
        engine = Engine.open(again, [])
        assert engine.cluster(None).state.snapshot() == before
        assert set(engine.cluster(None).holds) == {"j0", "j1", "j3", "j4", "j5"}
        # ... and from a snapshot plus the events after it.
        again.snapshot(engine.snapshot_body())
        engine.release("j0")
        again.wait(again.last)
    finally:
        again.close()
    third = Journal(journal)
    try:
        recovered = third.recover()
        assert recovered.snapshot is not None and len(recovered.events) == 1
        engine = Engine.open(third, [])
        assert set(engine.cluster(None).state.jobs) == {"j1", "j3", "j4", "j5"}
    finally:
        third.close()


def test_token_and_where_it_may_listen(tmp_path: Path) -> None:
    # A non-loopback address (TEST-NET-1, RFC 5737) is refused before any socket is bound.
    with pytest.raises(ListenError, match=r"refusing to listen on 192\.0\.2\.1 without"):
        listen_tcp("192.0.2.1", 0, token=None)
    token = "s3cret-token-0123456789"
    with running_service(tmp_path, token=token, tcp=True) as svc:
        assert svc.address.startswith("http://127.0.0.1:")
        with pytest.raises(ServiceError, match="bearer token") as err:
            Client(svc.address).status()
        assert err.value.status == 401
        with pytest.raises(ServiceError, match="bearer token"):
            Client(svc.address, token="wrong-token-0123456789").status()
        assert svc.client.status()["clusters"]
        # Liveness needs no token.
        conn = connection(svc)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()


def test_a_full_queue_is_refused_and_a_slow_request_times_out_changing_nothing(
    tmp_path: Path,
) -> None:
    limits = Limits(workers=1, queue=2, timeout=SLOW_SECONDS / 3)
    with running_service(tmp_path, limits=limits) as svc:
        results: list[int] = []

        def slow(name: str) -> None:
            results.append(svc.post("/v1/place", {"job": job(name), "solver": "test-slow"})[0])

        threads = [threading.Thread(target=slow, args=(f"s{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Two got a worker slot or a place in the queue and ran out of time (504); the others
        # found the queue full (503).
        assert sorted(results) == [503, 503, 504, 504], results
        time.sleep(SLOW_SECONDS * 2.5)  # let the abandoned solves finish
        assert svc.client.status()["clusters"][0]["jobs"] == {}  # none was applied late
        assert svc.client.place(job("quick"))["held"]


def test_metrics_and_schema(tmp_path: Path) -> None:
    with running_service(tmp_path) as svc:
        svc.client.place(job("a"))
        svc.post("/v1/place", {"job": job("b", 8, 9)})  # infeasible
        conn = connection(svc)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        for needle in (
            'gpuplace_placements_total{cluster="h100-superpod-4",outcome="placed"} 1.0',
            'gpuplace_placements_total{cluster="-",outcome="infeasible"} 1.0',
            'gpuplace_request_seconds_count{route="/v1/place"} 2.0',
            "gpuplace_queue_depth 0.0",
            'gpuplace_state_free_gpus{cluster="h100-superpod-4"} 24.0',
            'gpuplace_state_jobs{cluster="h100-superpod-4"} 1.0',
            "gpuplace_journal_commit_seconds_count",
        ):
            assert needle in text, needle
        conn = connection(svc)
        conn.request("GET", "/openapi.json")
        schema = json.loads(conn.getresponse().read())
        conn.close()
        for route in ("/v1/place", "/v1/release", "/v1/repair", "/v1/explain", "/v1/health"):
            assert "post" in schema["paths"][route]
        assert "/v1/status" in schema["paths"] and "/k8s/filter" in schema["paths"]
        assert "PlaceRequest" in schema["components"]["schemas"]


def _serve(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(tmp_path / "serve.log", "ab") as log:  # the child keeps its own descriptor
        return _popen(tmp_path, env, log)


def _popen(tmp_path: Path, env: dict[str, str], log) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *CLI,
            "serve",
            "--cluster",
            "h100-superpod",
            "--nodes",
            "512",
            "--journal",
            str(tmp_path / "j.db"),
            "--socket",
            str(tmp_path / "s.sock"),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _wait_socket(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gpuplace serve exited with {proc.returncode}")
        if path.exists():
            try:
                Client(str(path), timeout=5).request("GET", "/healthz")
                return
            except ServiceError:
                pass
        time.sleep(0.1)
    raise AssertionError("gpuplace serve did not start")


def test_kill_9_loses_no_acknowledged_placement(tmp_path: Path) -> None:
    """Four clients place one-GPU jobs as fast as they can; the service is killed with
    SIGKILL mid-way; after a restart every placement that was acknowledged is there, on the
    GPU it was acknowledged with. (benches/bench_serve.py does this with 1,000.)"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    sock = tmp_path / "s.sock"
    proc = _serve(tmp_path, env)
    acknowledged: dict[str, list[int]] = {}
    lock = threading.Lock()
    try:
        _wait_socket(sock, proc)

        def client(worker: int) -> None:
            c = Client(str(sock), timeout=10)
            for i in range(400):
                name = f"w{worker}-{i}"
                try:
                    answer = c.place({"name": name, "parallelism": {"dp": 1}})
                except ServiceError:
                    return  # the service died under us: this one was not acknowledged
                with lock:
                    acknowledged[name] = answer["gpus"]

        threads = [threading.Thread(target=client, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        while len(acknowledged) < 150:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        for t in threads:
            t.join(timeout=30)
        assert 150 <= len(acknowledged) < 1600
        proc = _serve(tmp_path, env)
        _wait_socket(sock, proc)
        jobs = Client(str(sock)).status()["clusters"][0]["jobs"]
        state = Client(str(sock)).state()
        on_disk = {j["name"]: sorted(j["gpus"]) for j in state["jobs"]}
        missing = [name for name in acknowledged if name not in jobs]
        assert missing == []
        assert all(on_disk[n] == sorted(g) for n, g in acknowledged.items())
        # GPUs are never given twice, across the crash.
        every = [g for gpus in on_disk.values() for g in gpus]
        assert len(every) == len(set(every))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert not sock.exists()  # a clean stop removes its socket


def test_engine_never_gives_a_gpu_twice_under_concurrent_writers(tmp_path: Path) -> None:
    with running_service(tmp_path, limits=Limits(workers=8)) as svc:
        errors: list[str] = []

        def worker(w: int) -> None:
            c = Client(svc.address)
            for i in range(8):
                try:
                    c.place({"name": f"{w}-{i}", "parallelism": {"dp": 1}})
                    if i % 3 == 0:
                        c.release(f"{w}-{i}")
                except ServiceError as exc:
                    errors.append(str(exc))

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        state = svc.engine.cluster(None).state
        state.check()
        held = np.concatenate(list(state.jobs.values()))
        assert len(held) == len(set(held.tolist()))
        # 64 placed, 24 released, 32 GPUs: the ones that found no room say so.
        assert all("needs 1 GPUs" in e or "free" in e for e in errors), errors
