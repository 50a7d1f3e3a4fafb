"""Where ``gpuplace serve`` listens, and the server that runs it.

By default a Unix socket (mode 0660, optionally handed to a group: only root and that group
may connect) or TCP on loopback. Binding TCP to any other address needs a token (the service
refuses to start without one); TLS (with client certificates for kube-scheduler, which cannot
send a token) is uvicorn's. The server is uvicorn, asyncio all the way: a connection costs a
file descriptor and a few kilobytes, not a thread, the listen backlog is 4096, and a connection
that stays idle (before its first request or between two) is closed after ``idle_timeout``
seconds, so a crowd of idle clients never locks the others out. The soft limit on open files
is raised to the hard limit at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import ipaddress
import os
import resource
import socket
import stat
import threading
from pathlib import Path
from typing import Any

import uvicorn

from gpuplace.errors import GpuplaceError
from gpuplace.service.app import Service

try:  # the faster parser when installed (uvicorn's choice too)
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - h11 is always there
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base  # type: ignore[assignment]

__all__ = ["ListenError", "Server", "is_loopback", "listen_tcp", "listen_unix", "raise_fd_limit"]

BACKLOG = 4096


class ListenError(GpuplaceError):
    """The service cannot listen where asked (or may not without a token)."""


class IdleClosingProtocol(_Base):
    """uvicorn's HTTP protocol, with its keep-alive timer armed from the moment a connection
    opens: one that never sends a request is closed like an idle keep-alive connection."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard one; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def listen_unix(path: str | Path, *, mode: int = 0o660, group: str | None = None) -> socket.socket:
    """A listening Unix socket at ``path`` with ``mode`` (and ``group``). A stale socket file
    (nobody listening) is replaced; a live one is an error."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ListenError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # stale: its server is gone
        else:
            raise ListenError(f"{path}: another service is listening there")
        finally:
            probe.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # no moment where others may connect
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {path}: {exc.strerror}") from None
    finally:
        os.umask(old)
    if group is not None:
        try:
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
        except KeyError:
            sock.close()
            raise ListenError(f"no such group {group!r}") from None
    os.chmod(path, mode)
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


def listen_tcp(host: str, port: int, *, token: str | None, tls: bool = False) -> socket.socket:
    """A listening TCP socket. Anything but loopback needs a token or TLS with client
    certificates (``tls``)."""
    if not is_loopback(host) and token is None and not tls:
        raise ListenError(
            f"refusing to listen on {host} without authentication: give --token-file (or TLS "
            "with --tls-client-ca), or listen on 127.0.0.1 or a Unix socket"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


class Server:
    """uvicorn serving a :class:`Service` on given sockets."""

    def __init__(
        self,
        service: Service,
        sockets: list[socket.socket],
        *,
        idle_timeout: float = 5.0,
        ssl: dict[str, Any] | None = None,
        log_level: str = "warning",
    ):
        self.service = service
        self.sockets = sockets
        config = uvicorn.Config(
            service.asgi,
            http=IdleClosingProtocol,
            lifespan="off",
            log_level=log_level,
            access_log=False,
            timeout_keep_alive=max(1, round(idle_timeout)),
            timeout_graceful_shutdown=10,
            backlog=BACKLOG,
            server_header=False,
            # Nothing here reads the client's address or scheme, so no X-Forwarded-* rewriting
            # (uvicorn's default wraps every request in a middleware for it).
            proxy_headers=False,
            **(ssl or {}),
        )
        self.uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM (uvicorn's handlers), in this thread."""
        self.uvicorn.run(sockets=self.sockets)

    def start(self, timeout: float = 30.0) -> None:
        """Serve on a background thread (tests, benchmarks); returns once it accepts."""

        # (uvicorn installs signal handlers only on the main thread.)
        def run() -> None:
            asyncio.run(self.uvicorn.serve(sockets=self.sockets))

        self._thread = threading.Thread(target=run, name="gpuplace-server", daemon=True)
        self._thread.start()
        deadline = timeout
        waited = 0.0
        while not self.uvicorn.started:
            if not self._thread.is_alive():
                raise ListenError("the server stopped while starting")
            if waited > deadline:
                raise ListenError(f"the server did not start within {timeout:g} s")
            threading.Event().wait(0.02)
            waited += 0.02

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()
