"""`gpuplace serve` under load, on a 16,384-GPU cluster (h100-superpod, 2,048 nodes).

1. Latency of a placement request at a fixed arrival rate (open loop: request i is due at
   i / rate, its latency counted from then, so a service that falls behind is charged for the
   queue it builds): 100 and 1,000 requests/s of 8-GPU jobs (tp 8), each released 1,024
   placements later (the cluster stays about half full; the releases are half the traffic).
   The peer, measured in the same run: the library call the service makes for each request
   (``gpuplace.place`` + ``allocate`` on a state in memory), without HTTP or the journal.
2. 50 clients placing and releasing at once while 1,000 idle connections stay open: every
   request answered, latency with and without the idle crowd.
3. ``kill -9`` of the service during 1,000 placements from 8 clients; after the restart, every
   acknowledged placement is there, on its GPUs.
4. With Slurm installed (root): the time a ``--comment=gpuplace`` sbatch adds over a plain one,
   through the job_submit/lua plugin and the service, on a loopback Slurm.

Targets (issue 24): p99 <= 10 ms at 1,000 requests/s; a tagged sbatch adds <= 50 ms.

    python benches/bench_serve.py [--quick] [--out benches/results/bench_serve.txt]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gpuplace
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

NODES = 2048  # 16,384 GPUs
CLI = [sys.executable, "-m", "gpuplace.cli"]


# ------------------------------------------------------------------------------ helpers
def start_service(directory: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with open(directory / "serve.log", "ab") as log:
        proc = subprocess.Popen(
            [
                *CLI,
                "serve",
                "--cluster",
                "h100-superpod",
                "--nodes",
                str(NODES),
                "--journal",
                str(directory / "journal.db"),
                "--socket",
                str(directory / "gpuplace.sock"),
                "--log-level",
                "warning",
                *extra,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    sock = directory / "gpuplace.sock"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gpuplace serve exited: {(directory / 'serve.log').read_text()}")
        if sock.exists():
            try:
                request_sync(sock, "GET", "/healthz")
                return proc
            except OSError:
                pass
        time.sleep(0.1)
    raise SystemExit("gpuplace serve did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _frame(method: str, path: str, body: object | None) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: gpuplace\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def request_sync(
    sock_path: Path, method: str, path: str, body: object | None = None
) -> tuple[int, object]:
    import http.client

    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(60)
            s.connect(str(sock_path))
            self.sock = s

    conn = Conn("localhost", timeout=60)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


class Connection:
    """One keep-alive HTTP/1.1 connection over the Unix socket (asyncio)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, path: Path) -> Connection:
        reader, writer = await asyncio.open_unix_connection(str(path))
        return cls(reader, writer)

    async def request(
        self, method: str, path: str, body: object | None = None
    ) -> tuple[int, bytes]:
        self.writer.write(_frame(method, path, body))
        await self.writer.drain()
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        payload = await self.reader.readexactly(length)
        return status, payload

    def close(self) -> None:
        self.writer.close()


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# ------------------------------------------------------------------------------ 1. rates
async def _open_loop(
    sock: Path, rate: float, seconds: float, connections: int
) -> dict[str, object]:
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await Connection.open(sock))
    total = int(rate * seconds)
    place_latency: list[float] = []
    all_latency: list[float] = []
    failures: dict[int, int] = {}
    keep = 1024
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    placed: list[str] = []

    async def one(i: int, due: float, method: str, path: str, body: object) -> None:
        conn = await pool.get()
        try:
            status, _ = await conn.request(method, path, body)
        finally:
            pool.put_nowait(conn)
        latency = loop.time() - due
        all_latency.append(latency)
        if path == "/v1/place":
            place_latency.append(latency)
        if status != 200:
            failures[status] = failures.get(status, 0) + 1

    tasks = []
    for i in range(total):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if i % 2 == 0:
            name = f"r{rate:g}-{i}"
            placed.append(name)
            body: object = {"job": {"name": name, "parallelism": {"tp": 8, "dp": 1}}}
            tasks.append(asyncio.create_task(one(i, due, "POST", "/v1/place", body)))
        else:
            victim = placed[-keep] if len(placed) > keep else None
            if victim is None:  # warming up: one more placement
                name = f"r{rate:g}-{i}"
                placed.append(name)
                body = {"job": {"name": name, "parallelism": {"tp": 8, "dp": 1}}}
                tasks.append(asyncio.create_task(one(i, due, "POST", "/v1/place", body)))
            else:
                placed.remove(victim)
                tasks.append(
                    asyncio.create_task(one(i, due, "POST", "/v1/release", {"job": victim}))
                )
    await asyncio.gather(*tasks)
    elapsed = loop.time() - start
    while not pool.empty():
        pool.get_nowait().close()
    return {
        "rate": rate,
        "requests": total,
        "achieved": total / elapsed,
        "place_p50_ms": pct(place_latency, 50) * 1e3,
        "place_p99_ms": pct(place_latency, 99) * 1e3,
        "all_p50_ms": pct(all_latency, 50) * 1e3,
        "all_p99_ms": pct(all_latency, 99) * 1e3,
        "failures": failures,
        "placements": len(place_latency),
    }


async def _closed_loop(sock: Path, seconds: float, connections: int = 32) -> float:
    """Requests per second when every connection sends its next place/release as soon as the
    last is answered: the most the service sustains here."""
    pool = [await Connection.open(sock) for _ in range(connections)]
    done = 0
    stop_at = time.monotonic() + seconds

    async def worker(k: int, conn: Connection) -> None:
        nonlocal done
        i = 0
        while time.monotonic() < stop_at:
            if i % 2 == 0:
                body: object = {"job": {"name": f"c{k}-{i}", "parallelism": {"tp": 8, "dp": 1}}}
                await conn.request("POST", "/v1/place", body)
            else:
                await conn.request("POST", "/v1/release", {"job": f"c{k}-{i - 1}"})
            i += 1
            done += 1

    await asyncio.gather(*(worker(k, c) for k, c in enumerate(pool)))
    for conn in pool:
        conn.close()
    return done / seconds


def peer_library_call(samples: int = 2000) -> dict[str, float]:
    """What the service does for one request, as a library call: place + allocate (and a
    release 1,024 placements later), on a state in memory."""
    state = gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=NODES))
    times = []
    names: list[str] = []
    for i in range(samples):
        job = gpuplace.Job(name=f"p{i}", tp=8, dp=1)
        t = time.perf_counter()
        state.allocate(gpuplace.place(state, job, "greedy"))
        times.append(time.perf_counter() - t)
        names.append(job.name)
        if len(names) > 1024:
            state.release(names.pop(0))
    return {"p50_ms": pct(times, 50) * 1e3, "p99_ms": pct(times, 99) * 1e3}


# ------------------------------------------------------------------- 2. crowd and idle
def crowd(sock: Path, clients: int = 50, per_client: int = 20, idle: int = 0) -> dict[str, object]:
    idle_socks = []
    for _ in range(idle):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(sock))
        idle_socks.append(s)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def client(c: int) -> None:
        for i in range(per_client):
            name = f"crowd{idle}-{c}-{i}"
            t = time.perf_counter()
            try:
                status, _ = request_sync(
                    sock, "POST", "/v1/place", {"job": {"name": name, "parallelism": {"dp": 1}}}
                )
            except OSError:
                status = 0
            dt = time.perf_counter() - t
            with lock:
                latencies.append(dt)
                statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                request_sync(sock, "POST", "/v1/release", {"job": name})

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    # The idle connections are closed by the service's idle timeout, not by us.
    closed = 0
    for s in idle_socks:
        s.settimeout(10)
        try:
            closed += s.recv(1) == b""
        except OSError:
            closed += 1
        s.close()
    return {
        "clients": clients,
        "idle": idle,
        "requests": clients * per_client,
        "statuses": statuses,
        "p50_ms": pct(latencies, 50) * 1e3,
        "p99_ms": pct(latencies, 99) * 1e3,
        "seconds": elapsed,
        "idle_closed_by_server": closed,
    }


# ------------------------------------------------------------------------- 3. kill -9
def kill_nine(directory: Path, total: int = 1000, clients: int = 8) -> dict[str, object]:
    proc = start_service(directory)
    sock = directory / "gpuplace.sock"
    acknowledged: dict[str, list[int]] = {}
    lock = threading.Lock()
    counter = iter(range(total))
    kill_at = random.Random(24).randint(total // 4, 3 * total // 4)

    def client() -> None:
        for i in counter:
            name = f"k{i}"
            try:
                status, answer = request_sync(
                    sock, "POST", "/v1/place", {"job": {"name": name, "parallelism": {"dp": 1}}}
                )
            except OSError:
                return
            if status == 200:
                with lock:
                    acknowledged[name] = answer["gpus"]  # type: ignore[index]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    while len(acknowledged) < kill_at and any(t.is_alive() for t in threads):
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for t in threads:
        t.join()
    acked = dict(acknowledged)
    proc = start_service(directory)
    try:
        _, state = request_sync(sock, "GET", "/v1/state")
        held = {j["name"]: sorted(j["gpus"]) for j in state["jobs"]}  # type: ignore[index]
    finally:
        stop(proc)
    lost = [n for n in acked if n not in held]
    moved = [n for n in acked if n in held and held[n] != sorted(acked[n])]
    every = [g for gpus in held.values() for g in gpus]
    return {
        "requests": total,
        "killed_after_acknowledged": kill_at,
        "acknowledged": len(acked),
        "after_restart": len(held),
        "lost": len(lost),
        "moved": len(moved),
        "gpu_given_twice": len(every) - len(set(every)),
    }


# ------------------------------------------------------------------------------ 4. Slurm
def slurm_overhead(samples: int) -> dict[str, object] | None:
    from slurm_harness import GpuplaceService, LoopbackSlurm, missing_daemons

    if missing_daemons() or os.geteuid() != 0:
        return None
    base = Path(tempfile.mkdtemp(prefix="gpuplace-bench-slurm-"))
    os.chmod(base, 0o755)
    shutil.copy(ROOT / "contrib" / "slurm" / "job_submit.lua", base / "job_submit.lua")
    slurm = LoopbackSlurm(base, 2, 4, gpus=8, extra_conf=("JobSubmitPlugins=lua",))
    # Before slurmctld starts: it reads the plugin's GPUPLACE_SOCKET from its environment.
    service = GpuplaceService(slurm, "--host-type", "dgx-h100")
    plain, tagged = [], []
    try:
        with slurm, service:
            for _ in range(samples):
                for kind, times in (("plain", plain), ("tagged", tagged)):
                    args = ["sbatch", "--parsable", "-N", "1", "--exclusive", "-o", "/dev/null"]
                    if kind == "tagged":
                        args.append("--comment=gpuplace")
                    t = time.perf_counter()
                    slurm.run(*args, "--wrap", "sleep 300")
                    times.append(time.perf_counter() - t)
                slurm.run("scancel", "--partition=gpu", check=False)
                slurm._wait(lambda: not slurm.run("squeue", "-h").stdout.strip(), 30, "jobs ended")
            pinned = (slurm.dir / "log" / "slurmctld.log").read_text().count("pinned to")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {
        "samples": samples,
        "plain_ms": statistics.median(plain) * 1e3,
        "tagged_ms": statistics.median(tagged) * 1e3,
        "added_ms": (statistics.median(tagged) - statistics.median(plain)) * 1e3,
        "pinned": pinned,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--out", default=None, help="also write the report here")
    args = parser.parse_args()
    seconds = 5.0 if args.quick else 20.0
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    say(f"gpuplace serve on h100-superpod, {NODES} nodes ({NODES * 8} GPUs); Unix socket")
    say(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores (shared; load average "
        f"{os.getloadavg()[0]:.1f} at the start)"
    )
    peer = peer_library_call()
    say("")
    say("1. placement latency at a fixed arrival rate (8-GPU jobs, released 1,024 later)")
    say(
        "| rate (req/s) | requests | achieved | place p50 | place p99 | all p50 | all p99 | errors |"
    )
    say("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        proc = start_service(directory)
        try:
            for rate in (100.0, 1000.0):
                result = asyncio.run(
                    _open_loop(directory / "gpuplace.sock", rate, seconds, connections=64)
                )
                say(
                    f"| {rate:,.0f} | {result['requests']:,} | {result['achieved']:,.0f}/s | "
                    f"{result['place_p50_ms']:.2f} ms | {result['place_p99_ms']:.2f} ms | "
                    f"{result['all_p50_ms']:.2f} ms | {result['all_p99_ms']:.2f} ms | "
                    f"{result['failures'] or 'none'} |"
                )
            most = asyncio.run(_closed_loop(directory / "gpuplace.sock", seconds / 2))
            say(
                f"closed loop (32 connections, each sending its next request when answered): "
                f"{most:,.0f} requests/s"
            )
            say(
                f"peer (same run): the library call per request, place + allocate in memory: "
                f"p50 {peer['p50_ms']:.3f} ms, p99 {peer['p99_ms']:.3f} ms"
            )
        finally:
            stop(proc)
    say("")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        proc = start_service(directory)  # a fresh cluster: part 1 left it full of jobs
        try:
            say(
                "2. 50 clients at once (place + release, 20 each), with and without 1,000 idle connections"
            )
            say(
                "| idle connections | requests | statuses | p50 | p99 | wall | idle closed by the server |"
            )
            say("|---|---|---|---|---|---|---|")
            for idle in (0, 1000):
                r = crowd(directory / "gpuplace.sock", idle=idle)
                say(
                    f"| {idle:,} | {r['requests']} | {r['statuses']} | {r['p50_ms']:.1f} ms | "
                    f"{r['p99_ms']:.1f} ms | {r['seconds']:.1f} s | {r['idle_closed_by_server']} |"
                )
        finally:
            stop(proc)
    say("")
    say("3. kill -9 during 1,000 placements (8 clients), then a restart")
    with tempfile.TemporaryDirectory() as tmp:
        k = kill_nine(Path(tmp))
    say(
        f"killed after {k['killed_after_acknowledged']} acknowledged; acknowledged "
        f"{k['acknowledged']}, held after the restart {k['after_restart']}, lost {k['lost']}, "
        f"moved {k['moved']}, GPUs given twice {k['gpu_given_twice']}"
    )
    say("")
    say("4. job_submit/lua through the service on a loopback Slurm 22.05 (sbatch -N 1 --exclusive)")
    slurm = slurm_overhead(5 if args.quick else 15)
    if slurm is None:
        say("skipped: Slurm and munge not installed, or not root")
    else:
        say(
            f"median of {slurm['samples']}: plain sbatch {slurm['plain_ms']:.1f} ms, tagged "
            f"{slurm['tagged_ms']:.1f} ms: {slurm['added_ms']:.1f} ms added "
            f"({slurm['pinned']} jobs pinned)"
        )
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
