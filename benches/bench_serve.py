"""`gpuplace serve` under load, on a 16,384-GPU cluster (h100-superpod, 2,048 nodes).

1. Latency of a placement request at a fixed arrival rate (open loop: request i is due at
   i / rate, its latency counted from then, so a service that falls behind is charged for the
   queue it builds; a closed-loop tool such as wrk would wait for each answer before sending
   the next and hide that queue): 100 and 1,000 requests/s of 8-GPU jobs (tp 8), each
   released 1,024 placements later (the cluster stays about half full; the releases are half
   the traffic), on a fresh service per run, median of ``--runs``. The load generator is
   compiled: gpuplace-loadgen (benches/loadgen, std-only Rust, built here with ``cargo build
   --release -p gpuplace-loadgen`` on first use), a process of its own with one blocking
   thread per keep-alive connection (64), each sleeping until its next request is due; it
   sends the same requests in the same order as the Python generator and reports the same
   figures. ``--generator python`` runs the Python one instead (asyncio on uvloop in this
   process; it spent 200-350 us of CPU per request, about half of what the service spends,
   on the same two cores; the results before the compiled one were measured with it), and so
   does a checkout without cargo or whose build fails (the report says which ran). Either
   shares the machine's cores with the service, so the CPU each spends per request is
   reported, and so is the share of the host's CPU time the hypervisor stole during each run
   (``steal`` in /proc/stat: on a shared virtual machine the tail follows it). This
   checkout is measured in both durabilities (``--durability process``, the default, and
   ``power``, an fsync per group commit), so the fsync's cost shows.
   Peers, measured in the same run: with ``--peer DIR`` the service of
   another checkout (``DIR`` is its python/ directory; the runs alternate between the two),
   and the library call the service makes for each request (``gpuplace.place`` +
   ``allocate`` on a state in memory), without HTTP or the journal; and the floor: a uvicorn
   application that answers every request with a fixed body, driven by the same generator
   (what the machine, the generator and the HTTP server cost before gpuplace does anything).
2. 50 clients placing and releasing at once while 1,000 idle connections stay open: every
   request answered, latency with and without the idle crowd.
3. ``kill -9`` of the service during 1,000 placements from 8 clients, in each durability;
   after the restart, every acknowledged placement is there, on its GPUs.
4. With Slurm installed (root): the time a ``--comment=gpuplace`` sbatch adds over a plain one,
   through the job_submit/lua plugin and the service, on a loopback Slurm.

Targets (issue 24): p99 <= 10 ms at 1,000 requests/s; a tagged sbatch adds <= 50 ms.

    python benches/bench_serve.py [--quick] [--runs 3] [--peer OTHER/python]
        [--generator native|python] [--out benches/results/bench_serve.txt]
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
from typing import Any

import gpuplace
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

NODES = 2048  # 16,384 GPUs
CLI = [sys.executable, "-m", "gpuplace.cli"]


# ------------------------------------------------------------------------------ helpers
def start_service(
    directory: Path, *extra: str, python: str | None = None
) -> subprocess.Popen[bytes]:
    """``gpuplace serve`` on 16,384 GPUs; ``python``: another checkout's python/ directory
    (the peer), imported first."""
    paths = [p for p in sys.path if p]
    if python is not None:
        paths.insert(0, str(Path(python).resolve()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
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
    return _answering(
        proc,
        directory / "gpuplace.sock",
        "/healthz",
        120,
        lambda: f"gpuplace serve exited: {(directory / 'serve.log').read_text()}",
    )


def _answering(
    proc: subprocess.Popen[bytes], sock: Path, path: str, seconds: float, exited: Any
) -> subprocess.Popen[bytes]:
    """``proc`` once it answers GET ``path`` on ``sock``; ``exited()``: the message if it
    exits first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(exited())
        if sock.exists():
            try:
                request_sync(sock, "GET", path)
                return proc
            except OSError:
                pass
        time.sleep(0.05)
    raise SystemExit(f"{' '.join(map(str, proc.args))[:60]}... did not start")


#: The floor: an ASGI application that answers every request with a fixed body, on the same
#: server (uvicorn, httptools, uvloop) and socket as the service. Measured with the same load
#: generator, it is what this machine, the generator and the HTTP server cost before gpuplace
#: does anything.
_FLOOR_APP = """
import sys, uvicorn
BODY = b'{"held": true}'
HEAD = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEAD})
    await send({"type": "http.response.body", "body": BODY})
uvicorn.run(app, uds=sys.argv[1], log_level="warning", access_log=False, loop="uvloop",
            http="httptools", lifespan="off", proxy_headers=False, server_header=False)
"""


FLOOR = "<floor>"


def start_floor(directory: Path) -> subprocess.Popen[bytes]:
    sock = directory / "gpuplace.sock"
    proc = subprocess.Popen([sys.executable, "-c", _FLOOR_APP, str(sock)])
    return _answering(proc, sock, "/", 60, lambda: "the floor server exited")


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


class _Client(asyncio.Protocol):
    """The client end of one keep-alive HTTP/1.1 connection: one request in flight, its
    answer found with ``bytes.find`` as the data arrives (a reader awaiting each header line
    cost the load generator three times the CPU; it shares the service's two cores)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"content-length:")
        stop = head.find(b"\r\n", at)
        length = int(head[at + 15 : stop if stop >= 0 else len(head)]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        status = int(head.split(b" ", 2)[1])
        payload = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        waiter, self.waiter = self.waiter, None
        if not waiter.done():
            waiter.set_result((status, payload))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("the service closed the connection"))


class Connection:
    """One keep-alive HTTP/1.1 connection over the Unix socket."""

    def __init__(self, transport: asyncio.Transport, protocol: _Client):
        self.transport = transport
        self.protocol = protocol

    @classmethod
    async def open(cls, path: Path) -> Connection:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_unix_connection(_Client, str(path))
        return cls(transport, protocol)  # type: ignore[arg-type]

    async def request(
        self, method: str, path: str, body: object | None = None
    ) -> tuple[int, bytes]:
        return await self.send(_frame(method, path, body))

    async def send(self, frame: bytes) -> tuple[int, bytes]:
        waiter = asyncio.get_running_loop().create_future()
        self.protocol.waiter = waiter
        self.transport.write(frame)
        return await waiter

    def close(self) -> None:
        self.transport.close()


def run_async(coroutine: Any) -> Any:
    """Run on uvloop when installed (lighter per request, as the service runs)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency of gpuplace serve
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_steal() -> tuple[int, int]:
    """(stolen, total) clock ticks of every CPU so far, from /proc/stat: "steal" is time the
    hypervisor ran something else while this virtual machine's CPU wanted to run (zero on
    bare metal). Where it is high, no code here can keep its tail short."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_percent(before: tuple[int, int], after: tuple[int, int]) -> float:
    total = after[1] - before[1]
    return 100.0 * (after[0] - before[0]) / total if total > 0 else float("nan")


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# ------------------------------------------------------------------------------ 1. rates
async def _open_loop(
    sock: Path, rate: float, seconds: float, connections: int, prefix: str = "r"
) -> dict[str, Any]:
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await Connection.open(sock))
    total = int(rate * seconds)
    place_latency: list[float] = []
    all_latency: list[float] = []
    failures: dict[int, int] = {}
    keep = 1024
    # perf_counter, not loop.time(): uvloop's clock ticks in whole milliseconds.
    clock = time.perf_counter
    start = clock() + 0.2
    placed: list[str] = []

    async def one(i: int, due: float, method: str, path: str, body: object) -> None:
        conn = await pool.get()
        try:
            status, _ = await conn.request(method, path, body)
        finally:
            pool.put_nowait(conn)
        latency = clock() - due
        all_latency.append(latency)
        if path == "/v1/place":
            place_latency.append(latency)
        if status != 200:
            failures[status] = failures.get(status, 0) + 1

    tasks = []
    for i in range(total):
        due = start + i / rate
        delay = due - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if i % 2 == 0:
            name = f"{prefix}{rate:g}-{i}"
            placed.append(name)
            body: object = {"job": {"name": name, "parallelism": {"tp": 8, "dp": 1}}}
            tasks.append(asyncio.create_task(one(i, due, "POST", "/v1/place", body)))
        else:
            victim = placed[-keep] if len(placed) > keep else None
            if victim is None:  # warming up: one more placement
                name = f"{prefix}{rate:g}-{i}"
                placed.append(name)
                body = {"job": {"name": name, "parallelism": {"tp": 8, "dp": 1}}}
                tasks.append(asyncio.create_task(one(i, due, "POST", "/v1/place", body)))
            else:
                placed.remove(victim)
                tasks.append(
                    asyncio.create_task(one(i, due, "POST", "/v1/release", {"job": victim}))
                )
    await asyncio.gather(*tasks)
    elapsed = clock() - start
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
def kill_nine(
    directory: Path, *extra: str, total: int = 1000, clients: int = 8
) -> dict[str, object]:
    proc = start_service(directory, *extra)
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
    proc = start_service(directory, *extra)
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

            def polls() -> int:
                return int(service.status()["clusters"][0]["slurm"]["polls"])

            def settle() -> None:
                """Every node idle in Slurm and a whole poll of the service's follower since:
                a tagged job then finds its nodes free (else it falls back to Slurm's choice,
                untimed work of another kind). A poll under way may have read the nodes
                before they came free, hence two."""
                slurm._wait(
                    lambda: set(slurm.run("sinfo", "-h", "-o", "%t").stdout.split()) == {"idle"},
                    60,
                    "nodes idle",
                )
                seen = polls()
                slurm._wait(lambda: polls() >= seen + 2, 60, "a poll after the nodes came free")

            for _ in range(samples):
                settle()
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


def describe_checkout(python: str) -> str:
    """A checkout named by its commit (never by a path of this machine)."""
    try:
        out = subprocess.run(
            ["git", "-C", python, "log", "-1", "--format=%h (%cs)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "another checkout"
    return f"commit {out}"


def build_loadgen() -> tuple[Path | None, str]:
    """The compiled load generator (benches/loadgen), built here once: (its executable, "")
    or (None, why it could not be built)."""
    command = [
        "cargo",
        "build",
        "--release",
        "-p",
        "gpuplace-loadgen",
        "-q",
        "--message-format=json-render-diagnostics",
    ]
    try:
        built = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    except FileNotFoundError:
        return None, "cargo is not installed"
    except subprocess.TimeoutExpired:
        return None, "cargo build did not finish in 10 minutes"
    if built.returncode != 0:
        tail = " ".join((built.stderr or built.stdout).strip().splitlines()[-3:])
        return None, f"cargo build failed: {tail}"
    for line in built.stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("reason") == "compiler-artifact" and message.get("executable"):
            if message.get("target", {}).get("name") == "gpuplace-loadgen":
                return Path(message["executable"]), ""
    return None, "cargo build named no gpuplace-loadgen executable"


def _native_open_loop(
    loadgen: Path, sock: Path, rate: float, seconds: float, connections: int, prefix: str = "r"
) -> dict[str, Any]:
    """``_open_loop``'s requests and figures, sent and measured by the compiled generator in
    a process of its own (plus ``cpu_seconds``: the CPU it spent, all of its run)."""
    command = [str(loadgen), "--socket", str(sock), "--rate", repr(rate), "--seconds"]
    command += [repr(seconds), "--connections", str(connections), "--prefix", prefix]
    run = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    if run.returncode != 0:
        raise SystemExit(f"gpuplace-loadgen exited {run.returncode}: {run.stderr.strip()}")
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    for key in ("place_p50_ms", "place_p99_ms", "all_p50_ms", "all_p99_ms"):
        if result[key] is None:  # no answer of that kind: NaN, as pct() gives
            result[key] = float("nan")
    # Statuses as the Python generator keys them (int); connection errors keep their name.
    result["failures"] = {int(k) if k.isdigit() else k: v for k, v in result["failures"].items()}
    if result["cpu_seconds"] is None:  # /proc/self/stat unreadable
        result["cpu_seconds"] = float("nan")
    return result


def measure_rate(
    rate: float,
    seconds: float,
    python: str | None,
    extra: tuple[str, ...] = (),
    loadgen: Path | None = None,
) -> dict[str, Any]:
    """One open-loop run on a fresh service (after 100 warm-up placements), with the CPU the
    service and the load generator spent per request. ``python`` None: this checkout;
    ``FLOOR``: the floor server instead of a service. ``loadgen``: the compiled generator's
    executable, else the Python one (in this process) runs."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        if python == FLOOR:
            proc = start_floor(directory)
        else:
            proc = start_service(directory, *extra, python=python)
        try:
            sock = directory / "gpuplace.sock"
            run_async(_open_loop(sock, 100.0, 1.0, connections=8, prefix="warm"))
            service_cpu, own_cpu = cpu_seconds(proc.pid), own_cpu_seconds()
            steal = host_steal()
            if loadgen is not None:
                result = _native_open_loop(loadgen, sock, rate, seconds, connections=64)
            else:
                result = run_async(_open_loop(sock, rate, seconds, connections=64))
            result["steal_percent"] = steal_percent(steal, host_steal())
            n = result["requests"]
            result["service_cpu_us"] = (cpu_seconds(proc.pid) - service_cpu) / n * 1e6
            generator_cpu = (
                result["cpu_seconds"] if loadgen is not None else own_cpu_seconds() - own_cpu
            )
            result["generator_cpu_us"] = generator_cpu / n * 1e6
        finally:
            stop(proc)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--out", default=None, help="also write the report here")
    parser.add_argument(
        "--peer",
        default=None,
        help="another checkout's python/ directory: its service measured in part 1 too",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per rate and version")
    parser.add_argument(
        "--rates-only", action="store_true", help="part 1 only (the rates and the peers)"
    )
    parser.add_argument(
        "--generator",
        choices=("native", "python"),
        default="native",
        help="part 1's open-loop load generator: native (benches/loadgen, compiled; built "
        "here with cargo, the Python one if that fails) or python (asyncio in this process, "
        "as results before it were measured)",
    )
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
    loadgen: Path | None = None
    if args.generator == "native":
        loadgen, why = build_loadgen()
        if loadgen is None:
            say(f"the compiled load generator could not be built ({why}): the Python one runs")
    if loadgen is not None:
        say(
            "load generator: gpuplace-loadgen (benches/loadgen, compiled Rust, a process of its "
            "own: one thread per keep-alive connection, sleeping until its next request is due)"
        )
    else:
        say(
            "load generator: Python (asyncio on uvloop, in the bench's process; --generator python)"
        )
    library = peer_library_call()
    # This checkout in each durability mode (the fsync's cost shown, not hidden), and the
    # peer as it starts by default.
    versions: list[tuple[str, str | None, tuple[str, ...]]] = [
        (f"this, {mode}", None, ("--durability", mode)) for mode in ("process", "power")
    ]
    if args.peer:
        versions.append(("peer", args.peer, ()))
    versions.append(("floor (fixed answer)", FLOOR, ()))
    say("")
    say(
        "1. placement latency at a fixed arrival rate (8-GPU jobs, released 1,024 later; a "
        f"fresh service per run, median of {args.runs} runs, the versions alternating)"
    )
    if args.peer:
        say(f"peer: the service of {describe_checkout(args.peer)}, in the same runs")
    say(
        "floor: a uvicorn application answering every request with a fixed body (no gpuplace), "
        "the same generator, in the same runs: the machine's own tail"
    )
    say(
        "| server | rate (req/s) | requests | achieved | place p50 | place p99 (runs) | "
        "all p99 | errors | service CPU/request | generator CPU/request | "
        "CPU stolen by the host (runs, in the p99s' order) |"
    )
    say("|---|---|---|---|---|---|---|---|---|---|---|")
    for rate in (100.0, 1000.0):
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in versions}
        for _ in range(args.runs):
            for label, python, extra in versions:
                runs[label].append(measure_rate(rate, seconds, python, extra, loadgen))
        for label, _, _ in versions:
            rs = runs[label]
            by_p99 = sorted(rs, key=lambda r: r["place_p99_ms"])
            p99s = [r["place_p99_ms"] for r in by_p99]
            steals = ", ".join(f"{r['steal_percent']:.1f} %" for r in by_p99)
            errors: dict[int, int] = {}
            for r in rs:
                for k, v in r["failures"].items():
                    errors[k] = errors.get(k, 0) + v
            say(
                f"| {label} | {rate:,.0f} | {rs[0]['requests']:,} x {len(rs)} | "
                f"{statistics.median(r['achieved'] for r in rs):,.0f}/s | "
                f"{statistics.median(r['place_p50_ms'] for r in rs):.2f} ms | "
                f"{statistics.median(p99s):.2f} ms ({', '.join(f'{v:.1f}' for v in p99s)}) | "
                f"{statistics.median(r['all_p99_ms'] for r in rs):.2f} ms | {errors or 'none'} | "
                f"{statistics.median(r['service_cpu_us'] for r in rs):,.0f} us | "
                f"{statistics.median(r['generator_cpu_us'] for r in rs):,.0f} us | {steals} |"
            )
    for label, python, extra in versions:
        if python == FLOOR:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            proc = start_service(directory, *extra, python=python)
            try:
                most = run_async(_closed_loop(directory / "gpuplace.sock", seconds / 2))
            finally:
                stop(proc)
        say(
            f"closed loop, {label} (32 connections, each sending its next request when "
            f"answered): {most:,.0f} requests/s"
        )
    say(
        f"the library call per request (same run), place + allocate in memory: "
        f"p50 {library['p50_ms']:.3f} ms, p99 {library['p99_ms']:.3f} ms"
    )
    say(f"load average at the end of part 1: {os.getloadavg()[0]:.1f}")
    if not args.rates_only:
        say("")
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            proc = start_service(directory)
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
        say("3. kill -9 during 1,000 placements (8 clients), then a restart, in each durability")
        for mode in ("process", "power"):
            with tempfile.TemporaryDirectory() as tmp:
                k = kill_nine(Path(tmp), "--durability", mode)
            say(
                f"{mode}: killed after {k['killed_after_acknowledged']} acknowledged; acknowledged "
                f"{k['acknowledged']}, held after the restart {k['after_restart']}, lost "
                f"{k['lost']}, moved {k['moved']}, GPUs given twice {k['gpu_given_twice']}"
            )
        say("")
        say(
            "4. job_submit/lua through the service on a loopback Slurm 22.05 (sbatch -N 1 --exclusive)"
        )
        slurm = slurm_overhead(5 if args.quick else 15)
        if slurm is None:
            say("skipped: Slurm and munge not installed, or not root")
        else:
            say(
                f"median of {slurm['samples']}: plain sbatch {slurm['plain_ms']:.1f} ms, tagged "
                f"{slurm['tagged_ms']:.1f} ms: {slurm['added_ms']:.1f} ms added "
                f"({slurm['pinned']} of {slurm['samples']} tagged jobs pinned)"
            )
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
