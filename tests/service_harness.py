"""`gpuplace serve` in-process for tests and benchmarks: an engine on a fresh journal, the
FastAPI service, and uvicorn on a Unix socket (or 127.0.0.1) on a background thread, stopped by
the context manager also when a test fails."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpuplace
from gpuplace.service.app import Limits, Service
from gpuplace.service.client import Client
from gpuplace.service.engine import Engine
from gpuplace.service.journal import Durability, Journal
from gpuplace.service.server import Server, listen_tcp, listen_unix

#: PCI bus ids of a DGX H100's eight GPUs in index order (NVIDIA DGX H100 user guide), so that
#: kernel-log XID lines map to a GPU index.
DGX_H100_BUS_IDS = [
    "0000:18:00",
    "0000:2a:00",
    "0000:3a:00",
    "0000:5d:00",
    "0000:9a:00",
    "0000:ab:00",
    "0000:ba:00",
    "0000:db:00",
]
RULES = {"pci_bus_ids": {"dgx-h100": DGX_H100_BUS_IDS}}


def xid_line(host: str, gpu: int, xid: int = 79) -> str:
    """A kernel-log line reporting an XID on a DGX H100's GPU ``gpu``."""
    return (
        f"Dec  2 08:00:00 {host} kernel: NVRM: Xid (PCI:{DGX_H100_BUS_IDS[gpu]}): {xid}, pid=0, "
        "GPU has fallen off the bus.\n"
    )


@dataclass
class Running:
    engine: Engine
    service: Service
    server: Server
    client: Client
    address: str
    port: int | None
    journal: Journal

    def post(self, path: str, body: bytes | Any, headers: dict[str, str] | None = None):
        """(status, decoded answer) of a POST, over TCP or the socket."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn = connection(self)
        try:
            conn.request(
                "POST",
                path,
                body=data,
                headers={"Content-Type": "application/json", **(headers or {})},
            )
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode(errors="replace")


def connection(running: Running, timeout: float = 30) -> http.client.HTTPConnection:
    if running.port is not None:
        return http.client.HTTPConnection("127.0.0.1", running.port, timeout=timeout)

    class Unix(http.client.HTTPConnection):
        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(running.address)
            self.sock = sock

    return Unix("localhost", timeout=timeout)


@contextlib.contextmanager
def running_service(
    directory: Path,
    state: Callable[[], gpuplace.ClusterState] | gpuplace.ClusterState | None = None,
    *,
    limits: Limits | None = None,
    token: str | None = None,
    tcp: bool = False,
    extender_prefix: str | None = "/k8s",
    idle_timeout: float = 5.0,
    journal: Path | None = None,
    rules: Any = None,
    durability: Durability = "power",
    tls: dict[str, Any] | None = None,
    client_ssl: ssl.SSLContext | None = None,
) -> Iterator[Running]:
    """``tls``: uvicorn's TLS settings (``ssl_certfile``, ``ssl_keyfile`` and, for client
    certificates, ``ssl_ca_certs`` with ``ssl_cert_reqs``), on TCP; ``client_ssl``: the
    context of the ``Client`` the test gets."""
    if state is None:
        state = gpuplace.ClusterState(gpuplace.Topology.preset("h100-superpod", nodes=4))
    build = state if callable(state) else (lambda s=state: s)
    journal_obj = Journal(journal or directory / "journal.db", durability=durability)
    topo_name = build().topology.name
    engine = Engine.open(journal_obj, [(topo_name, build)], rules=rules or RULES)
    service = Service(engine, limits=limits, token=token, extender_prefix=extender_prefix)
    if tcp or tls:
        client_certs = bool(tls and tls.get("ssl_ca_certs"))
        sock = listen_tcp("127.0.0.1", 0, token=token, tls=client_certs)
        port = sock.getsockname()[1]
        address = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    else:
        path = directory / "gpuplace.sock"
        sock = listen_unix(path)
        port = None
        address = str(path)
    server = Server(service, [sock], idle_timeout=idle_timeout, ssl=tls)
    server.start()
    try:
        yield Running(
            engine,
            service,
            server,
            Client(address, token=token, ssl_context=client_ssl),
            address,
            port,
            journal_obj,
        )
    finally:
        server.stop()
        service.close()
        journal_obj.close()
