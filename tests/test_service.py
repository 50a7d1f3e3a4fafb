"""`gpuplace serve` without a scheduler: the API over its Unix socket (place, release, repair,
explain, health, status, state), its errors, its limits (token, body size, queue, time), its
metrics and schema, the journal's replay after a restart, and `kill -9` during placements
losing none that was acknowledged."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import ssl
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gpuplace
import numpy as np
import pytest
from gpuplace.placement.result import SolveResult
from gpuplace.service.app import Limits
from gpuplace.service.client import Client, ServiceError
from gpuplace.service.engine import Engine
from gpuplace.service.journal import Journal, JournalError
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


def test_snapshots_taken_while_placing_replay_the_same_state(tmp_path: Path) -> None:
    """Snapshots are built on the journal's own thread from what was copied under the lock:
    a hold changed after the copy does not leak into it, the spec documents it reuses are the
    ones made afresh, and a restart from the last snapshot (plus the events after it) is the
    state the engine had. Each durability sets SQLite's synchronous as documented."""
    topology = gpuplace.Topology.preset("h100-superpod", nodes=8)
    path = tmp_path / "j.db"
    journal = Journal(path, durability="process")
    try:
        assert journal._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        engine = Engine.open(
            journal, [(topology.name, lambda: gpuplace.ClusterState(topology))], snapshot_every=3
        )
        for i in range(10):
            engine.place(gpuplace.Job(name=f"j{i}", tp=4, dp=1))
        engine.release("j3")
        rt = engine.cluster(None)
        take = engine.snapshot_body()
        with engine.lock:
            engine._record({"op": "hold", "cluster": rt.name, "name": "j4", "set": {"label": "x"}})
        body = take()["clusters"][rt.name]
        assert {h["name"]: h for h in body["holds"]}["j4"].get("label") is None
        assert rt.holds["j4"].label == "x"
        with pytest.raises(dataclasses.FrozenInstanceError):  # what the copies rely on
            rt.holds["j4"].label = "y"  # type: ignore[misc]
        assert rt.holds["j4"].to_dict() == rt.holds["j4"].doc
        assert rt.holds["j4"].to_dict() is not rt.holds["j4"].doc
        assert rt.state.snapshot(spec_docs=rt.spec_docs) == rt.state.snapshot()
        assert set(rt.spec_docs) == set(rt.state.jobs)
        expected = rt.state.snapshot()
        holds = {name: hold.to_dict() for name, hold in rt.holds.items()}
    finally:
        journal.close()
    again = Journal(path)
    try:
        assert again._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        recovered = again.recover()
        assert recovered.snapshot is not None and recovered.snapshot_seq >= 9
        restarted = Engine.open(again, []).cluster(None)
        assert restarted.state.snapshot() == expected
        assert {name: hold.to_dict() for name, hold in restarted.holds.items()} == holds
        assert restarted.state.snapshot(spec_docs=restarted.spec_docs) == expected
    finally:
        again.close()
    with pytest.raises(JournalError, match="durability 'disk': expected one of process, power"):
        Journal(tmp_path / "other.db", durability="disk")  # type: ignore[arg-type]


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


def _serve(tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
    with open(tmp_path / "serve.log", "ab") as log:  # the child keeps its own descriptor
        return _popen(tmp_path, env, log, *extra)


def _popen(tmp_path: Path, env: dict[str, str], log, *extra: str) -> subprocess.Popen[bytes]:
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
            *extra,
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


@pytest.mark.parametrize("durability", ["process", "power"])
def test_kill_9_loses_no_acknowledged_placement(tmp_path: Path, durability: str) -> None:
    """Four clients place one-GPU jobs as fast as they can; the service is killed with
    SIGKILL mid-way; after a restart every placement that was acknowledged is there, on the
    GPU it was acknowledged with, in either durability (``process`` syncs nothing at commit:
    what the kernel holds survives the process). (benches/bench_serve.py does this with
    1,000.)"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    sock = tmp_path / "s.sock"
    mode = ("--durability", durability)
    proc = _serve(tmp_path, env, *mode)
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
        proc = _serve(tmp_path, env, *mode)
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


@pytest.mark.parametrize("durability", ["process", "power"])
def test_engine_never_gives_a_gpu_twice_under_concurrent_writers(
    tmp_path: Path, durability: str
) -> None:
    with running_service(tmp_path, limits=Limits(workers=8), durability=durability) as svc:
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


def _asgi(app, path: str, raw: bytes, content_type: str | None = "application/json"):
    """(status, decoded body, headers) of one POST through an ASGI application, in process."""
    import asyncio

    headers = [(b"content-length", str(len(raw)).encode())]
    if content_type is not None:
        headers.append((b"content-type", content_type.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    out: dict = {"body": b""}

    async def run() -> None:
        given = [False]

        async def receive() -> dict:
            if not given[0]:
                given[0] = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                out["status"] = message["status"]
                out["headers"] = {k.decode().lower(): v.decode() for k, v in message["headers"]}
            else:
                out["body"] += message.get("body", b"")

        await app(scope, receive, send)

    asyncio.run(run())
    try:
        body = json.loads(out["body"])
    except ValueError:
        body = out["body"].decode()
    return out["status"], body, out["headers"]


@pytest.mark.parametrize("durability", ["process", "power"])
def test_lean_place_and_release_answer_as_the_fastapi_routes_do(
    tmp_path: Path, durability: str
) -> None:
    """``/v1/place`` and ``/v1/release`` skip FastAPI's layers for a body that validates; every
    request gets the same status and answer as through the FastAPI route (the schema's), bad
    ones included: nothing is accepted that FastAPI refuses, no error says less."""
    with running_service(tmp_path, durability=durability) as svc:
        svc.client.place(job("held", 8, 1))
        lean, full = svc.service.asgi, svc.service.app
        place_cases: list[tuple[bytes, str | None]] = [
            (json.dumps({"job": job("d1", 8, 2), "dry_run": True}).encode(), "application/json"),
            (
                json.dumps({"job": job("d2", 8, 1), "dry_run": True}).encode(),
                "application/json; charset=utf-8",
            ),
            (json.dumps({"job": job("d3"), "dry_run": True}).encode(), "application/x+json"),
            (json.dumps({"job": job("d4"), "dry_run": True}).encode(), None),  # no type
            (json.dumps({"job": job("d5"), "dry_run": True}).encode(), "text/plain"),
            (b"", "application/json"),
            (b"{not json", "application/json"),
            (b'{"job": {"name": "x"}, "dry_run": NaN}', "application/json"),
            (b"[1, 2]", "application/json"),
            (json.dumps({"jobb": 1}).encode(), "application/json"),
            (json.dumps({"job": job("x"), "time_limit": -1}).encode(), "application/json"),
            (json.dumps({"job": job("x"), "dry_run": "perhaps"}).encode(), "application/json"),
            (json.dumps({"job": {"name": "x", "parallelism": {"tp": "eight"}}}).encode(), None),
            (
                json.dumps({"job": {"name": "x", "parallelism": {"tp": "eight"}}}).encode(),
                "application/json",
            ),
            (json.dumps({"job": {"parallelism": {"tp": 8}}}).encode(), "application/json"),
            (json.dumps({"job": job("held")}).encode(), "application/json"),  # name in use
            (json.dumps({"job": job("big", 8, 9)}).encode(), "application/json"),  # infeasible
            (json.dumps({"job": job("x"), "solver": "nope"}).encode(), "application/json"),
            (json.dumps({"job": job("x"), "cluster": "other"}).encode(), "application/json"),
        ]
        for raw, ctype in place_cases:
            a = _asgi(lean, "/v1/place", raw, ctype)
            b = _asgi(full, "/v1/place", raw, ctype)
            if isinstance(a[1], dict):
                a[1].pop("elapsed_s", None)
                b[1].pop("elapsed_s", None)
            assert a[:2] == b[:2], (raw, ctype)
            assert a[2].get("content-type") == b[2].get("content-type"), (raw, ctype)
        # A valid dry run was answered in full, by both.
        status, answer, _ = _asgi(lean, "/v1/place", place_cases[0][0])
        assert status == 200 and answer["held"] is False and len(answer["rank_table"]) == 16
        release_cases = [
            json.dumps({"job": "nope"}).encode(),
            json.dumps({"job": 5}).encode(),
            json.dumps({}).encode(),
            b"{",
        ]
        for raw in release_cases:
            assert _asgi(lean, "/v1/release", raw)[:2] == _asgi(full, "/v1/release", raw)[:2]
        # The one held job is still the only one: no dry run or refusal held anything.
        assert list(svc.client.status()["clusters"][0]["jobs"]) == ["held"]
        ok = _asgi(lean, "/v1/release", json.dumps({"job": "held"}).encode())
        assert ok[0] == 200 and ok[1]["released_gpus"] == 8


def test_the_place_answer_is_the_placement_with_its_rank_table(tmp_path: Path) -> None:
    """The service builds its answer in one pass over the ranks; it must say exactly what
    ``Placement.to_dict()`` and ``rank_table()`` say (a field added there shows up here)."""
    from gpuplace.service.app import placement_answer

    state = gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=8))
    state.allocate(gpuplace.place(state, gpuplace.Job(name="first", tp=4), "greedy"))
    for spec, solver in (
        (gpuplace.Job(name="one", tp=2), "greedy"),
        (gpuplace.Job(name="three-nodes", tp=8, dp=3), "greedy"),
        (gpuplace.Job(name="scattered", tp=2, dp=6), "first-fit"),
    ):
        placement = gpuplace.place(state, spec, solver)
        for seq in (None, 7):
            expected = {
                **placement.to_dict(),
                "rank_table": placement.rank_table(),
                "held": seq is not None,
                "journal_seq": seq,
            }
            got = placement_answer(placement, seq)
            assert got == expected
            assert list(got) == list(expected)  # the same order of fields too
            assert json.loads(json.dumps(got)) == json.loads(json.dumps(expected))


@pytest.mark.parametrize("durability", ["process", "power"])
def test_a_held_engine_lock_never_stalls_the_event_loop(tmp_path: Path, durability: str) -> None:
    """A placement answered on the event loop takes the engine's lock only when it is free:
    while another thread holds it (a Slurm poll, a snapshot), the placement waits on a worker
    and the service keeps answering everyone else."""
    with running_service(tmp_path, durability=durability) as svc:
        answers: list[int] = []
        with svc.engine.lock:
            placer = threading.Thread(
                target=lambda: answers.append(svc.post("/v1/place", {"job": job("w")})[0])
            )
            placer.start()
            time.sleep(0.3)
            assert answers == []  # waiting for the lock, on a worker
            # Answered while the lock is held (the client gives up after 5 s otherwise).
            assert Client(svc.address, timeout=5).request("GET", "/healthz")["ok"] is True
        placer.join(timeout=30)
        assert answers == [200]
        assert "w" in svc.client.status()["clusters"][0]["jobs"]


def test_jobs_parsed_once_per_shape_are_the_jobs_the_parser_gives() -> None:
    """The service parses each job shape once; a later request of that shape gets the cached
    job under its own name, equal to what parsing its document gives; documents that do not
    parse get the parser's own error every time."""
    from gpuplace.errors import InvalidJob
    from gpuplace.service.app import JobCache

    cache = JobCache()
    shapes = [
        {"parallelism": {"tp": 8, "dp": 2}},
        {"parallelism": {"tp": 8, "pp": 2, "dp": 2}, "rank_order": ["pp", "tp", "cp", "ep", "dp"]},
        {
            "parallelism": {"tp": 4, "dp": 4},
            "communication": {"dp": {"kind": "all-reduce", "bytes": 1.5e9}},
            "constraints": {"confine": {"tp": "node"}, "max_span": "spine"},
        },
        {
            "parallelism": {"tp": 8, "dp": 2},
            "model": {
                "parameters": 7e9,
                "layers": 32,
                "hidden_size": 4096,
                "sequence_length": 4096,
            },
        },
        {"parallelism": {"tp": 2}, "policy": {"pool": "research", "priority_class": "batch"}},
        {"parallelism": {"tp": 8, "dp": {"min": 1, "max": 4}}},  # elastic: never cached
        {"traffic": {"ranks": 3, "edges": [[0, 1, 5.0], [1, 2, 7.0]]}},
    ]
    for shape in shapes:
        for name in ("first", "second", "third"):
            doc = {"name": name, **shape}
            got = cache.job(doc)
            want = gpuplace.Job.from_dict(doc, source="job")
            assert got.name == name
            assert got.to_dict() == want.to_dict()
            assert got.gpus == want.gpus and got.degrees == want.degrees
    # One entry per shape that is not elastic.
    assert len(cache._jobs) == len(shapes) - 1
    for bad in (
        {"name": "x", "parallelism": {"tp": "eight"}},
        {"name": "", "parallelism": {"tp": 8}},
        {"parallelism": {"tp": 8}},
        {"name": "x", "paralelism": {"tp": 8}},
        ["not", "a", "mapping"],
    ):
        for _ in range(2):
            with pytest.raises(InvalidJob) as got_error:
                cache.job(bad)
            with pytest.raises(InvalidJob) as want_error:
                gpuplace.Job.from_dict(bad, source="job")
            assert str(got_error.value) == str(want_error.value)


@pytest.mark.parametrize("durability", ["process", "power"])
def test_a_full_service_refuses_the_event_loop_path_too(tmp_path: Path, durability: str) -> None:
    """A greedy placement that would run on the event loop counts in the same bound as the
    pool's requests: with the queue full it is answered 503 at once, holding nothing."""
    limits = Limits(workers=1, queue=1, timeout=SLOW_SECONDS * 4)
    with running_service(tmp_path, limits=limits, durability=durability) as svc:
        results: list[int] = []
        slow = threading.Thread(
            target=lambda: results.append(
                svc.post("/v1/place", {"job": job("slow"), "solver": "test-slow"})[0]
            )
        )
        slow.start()
        deadline = time.monotonic() + 30
        while svc.service.pending < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, answer = svc.post("/v1/place", {"job": job("quick")})
        assert status == 503 and "busy" in answer["error"], answer
        slow.join(timeout=30)
        assert results == [200]
        assert list(svc.client.status()["clusters"][0]["jobs"]) == ["slow"]
        assert svc.client.place(job("quick"))["held"]


def test_the_event_loop_commits_the_events_it_appends(tmp_path: Path) -> None:
    """With ``process`` durability the thread the journal defers to commits its own events
    (its flush), in order with everyone else's: the committer leaves them alone, writes the
    events of other threads (and the deferred ones queued before them), and takes over a
    flush that finds a commit under way. A restart reads every event, in order."""
    path = tmp_path / "j.db"
    journal = Journal(path, durability="process")
    seqs: list[int] = []
    try:
        assert journal.inline and not Journal(tmp_path / "p.db", durability="power").inline
        scheduled: list[int] = []
        journal.defer_to(threading.get_ident(), lambda: scheduled.append(1) or True)
        seqs += [journal.append({"n": 0}), journal.append({"n": 1})]
        assert len(scheduled) == 2
        time.sleep(0.3)  # the committer was not woken for them
        assert journal.committed < seqs[0] and journal.pending() == 2
        assert journal.flush() and journal.committed == seqs[1] and journal.pending() == 0
        # Another thread's event: the committer writes it, and the deferred one before it.
        seqs.append(journal.append({"n": 2}))
        other = threading.Thread(target=lambda: seqs.append(journal.append({"n": 3})))
        other.start()
        other.join()
        journal.wait(seqs[3], timeout=30)
        assert journal.committed == seqs[3]
        # A flush that finds a commit under way leaves its events to the committer.
        seqs.append(journal.append({"n": 4}))
        with journal._write_lock:
            assert not journal.flush()
        journal.wait(seqs[4], timeout=30)
        # Deferring to a thread that cannot flush now (False) wakes the committer at once.
        journal.defer_to(threading.get_ident(), lambda: False)
        seqs.append(journal.append({"n": 5}))
        journal.wait(seqs[5], timeout=30)
        journal.defer_to(None)
    finally:
        journal.close()
    again = Journal(path)
    try:
        events = again.recover().events
        assert [seq for seq, _ in events] == seqs == sorted(seqs)
        assert [event["n"] for _, event in events] == list(range(6))
    finally:
        again.close()


def test_status_is_built_outside_the_engine_lock(tmp_path: Path) -> None:
    """``Engine.status`` copies what it reports under the lock and builds the answer after
    releasing it (another thread takes the lock meanwhile); the answer lists each job's GPU
    count, nodes (as a hostlist) and hold, and follows a job moved to other GPUs."""
    from gpuplace._util.hostlist import compress

    topology = gpuplace.Topology.preset("h100-superpod", nodes=8)
    journal = Journal(tmp_path / "j.db", durability="process")
    try:
        engine = Engine.open(journal, [(topology.name, lambda: gpuplace.ClusterState(topology))])
        for i in range(5):
            engine.place(gpuplace.Job(name=f"j{i}", tp=4, dp=i + 1))
        rt = engine.cluster(None)
        taken: list[bool] = []
        build = engine._nodes

        def nodes(*args):  # called while the answer is built: is the lock free?
            other = threading.Thread(
                target=lambda: taken.append(
                    engine.lock.acquire(timeout=10) and not engine.lock.release()
                )
            )
            other.start()
            other.join()
            return build(*args)

        engine._nodes = nodes  # type: ignore[method-assign]
        status = engine.status()
        assert taken == [True] * 5
        engine._nodes = build  # type: ignore[method-assign]

        def expected() -> dict:
            return {
                name: {
                    "gpus": len(gpus),
                    "nodes": compress(sorted({topology.host_of(int(g)) for g in gpus})),
                    "hold": rt.holds[name].to_dict(),
                }
                for name, gpus in rt.state.jobs.items()
            }

        (cluster,) = status["clusters"]
        assert cluster["jobs"] == expected() and cluster["free_gpus"] == rt.state.free_gpus
        # j0 moved to the last host's GPUs: the next status says so.
        free = np.flatnonzero(rt.state.free_mask())[-4:]
        with engine.lock:
            engine._record(
                {"op": "replace", "cluster": rt.name, "name": "j0", "gpus": free.tolist()}
            )
        again = engine.status()["clusters"][0]["jobs"]
        assert again == expected() and again["j0"]["nodes"] == topology.host_of(int(free[0]))
    finally:
        journal.close()


def test_a_flush_leaves_snapshots_to_the_committer(tmp_path: Path) -> None:
    """The event loop's flush writes the events queued and leaves a snapshot queued among them
    to the committer (a large transaction the loop would wait for); written after those events,
    the snapshot still replaces exactly the events up to its number."""
    path = tmp_path / "j.db"
    journal = Journal(path, durability="process")
    try:
        journal.defer_to(threading.get_ident(), lambda: True)
        first = journal.append({"n": 0})
        with journal._write_lock:  # no commit can start: the snapshot stays queued
            covered = journal.snapshot(lambda: {"clusters": {}, "n": "snap"})
            assert covered == first
            deadline = time.monotonic() + 30
            while journal.pending() < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            later = [journal.append({"n": 1}), journal.append({"n": 2})]
            assert journal._commit_batch(events_only=True) == 3
            assert journal.committed == later[-1] and journal.pending() == 1
        deadline = time.monotonic() + 30
        while journal.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert journal.pending() == 0
    finally:
        journal.close()
    again = Journal(path)
    try:
        recovered = again.recover()
        assert recovered.snapshot == {"clusters": {}, "n": "snap"}
        assert recovered.snapshot_seq == first
        assert [event["n"] for _, event in recovered.events] == [1, 2]
    finally:
        again.close()


def _certificate_authority(name: str) -> tuple[Any, Any]:
    """A self-signed CA (key, certificate) made with ``cryptography``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _issue(ca: tuple[Any, Any], name: str, directory: Path, *, server: bool) -> tuple[Path, Path]:
    """A certificate for ``name`` signed by ``ca`` (for the server: valid for 127.0.0.1),
    written as PEM files; returns (certificate, key)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_with_client_certificates(tmp_path: Path) -> None:
    """The kube-scheduler's way in (it sends no token): TLS on TCP with client certificates
    signed by the CA given (``--tls-client-ca``). A client with such a certificate is served;
    one without a certificate, or with one from another CA, is refused in the handshake and
    changes nothing. The service listens on loopback only."""
    from cryptography.hazmat.primitives import serialization

    ca = _certificate_authority("gpuplace test CA")
    ca_pem = tmp_path / "ca.crt"
    ca_pem.write_bytes(ca[1].public_bytes(serialization.Encoding.PEM))
    server_cert, server_key = _issue(ca, "gpuplace-serve", tmp_path, server=True)
    client_cert, client_key = _issue(ca, "kube-scheduler", tmp_path, server=False)
    rogue_cert, rogue_key = _issue(
        _certificate_authority("another CA"), "intruder", tmp_path, server=False
    )

    def context(cert: Path | None, key: Path | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(ca_pem))
        if cert is not None and key is not None:
            ctx.load_cert_chain(str(cert), str(key))
        return ctx

    tls = {
        "ssl_certfile": str(server_cert),
        "ssl_keyfile": str(server_key),
        "ssl_ca_certs": str(ca_pem),
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
    }
    with running_service(tmp_path, tls=tls, client_ssl=context(client_cert, client_key)) as svc:
        assert svc.address.startswith("https://127.0.0.1:")
        placed = svc.client.place(job("over-tls"))
        assert placed["held"] and len(placed["gpus"]) == 8
        for cert, key in ((None, None), (rogue_cert, rogue_key)):
            stranger = Client(svc.address, ssl_context=context(cert, key), timeout=10)
            with pytest.raises(ServiceError, match="did not answer"):
                stranger.place(job(f"stranger-{cert is None}"))
        # A client that does not trust the service's CA refuses it in turn.
        with pytest.raises(ServiceError, match="CERTIFICATE_VERIFY_FAILED"):
            Client(svc.address, ssl_context=ssl.create_default_context(), timeout=10).status()
        assert list(svc.client.status()["clusters"][0]["jobs"]) == ["over-tls"]
