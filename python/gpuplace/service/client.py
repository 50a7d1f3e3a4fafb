"""A small client of ``gpuplace serve`` (standard library only): over its Unix socket or
HTTP, with the bearer token when one is set. Errors come back as :class:`ServiceError` carrying
the service's message and HTTP status."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from typing import Any
from urllib.parse import quote, urlsplit

from gpuplace.errors import GpuplaceError

__all__ = ["Client", "ServiceError"]


class ServiceError(GpuplaceError):
    """The service refused a request (or could not be reached); ``status`` is the HTTP status
    (0 when there was no answer)."""

    def __init__(self, message: str, status: int = 0, body: Any = None):
        super().__init__(message)
        self.status = status
        self.body = body


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client:
    """``address``: a Unix socket path (``/run/gpuplace/gpuplace.sock`` or ``unix:PATH``) or
    ``http://HOST:PORT`` or ``https://HOST:PORT``; ``ssl_context``: for ``https``, the
    context that verifies the service (its CA) and carries this client's certificate where the
    service asks for one (``gpuplace serve --tls-client-ca``); None: the system's defaults."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.address = address
        self.token = token
        self.timeout = timeout
        self.ssl_context = ssl_context
        if address.startswith(("http://", "https://")):
            parts = urlsplit(address)
            self._tcp: tuple[str, int, bool] | None = (
                parts.hostname or "127.0.0.1",
                parts.port or (443 if parts.scheme == "https" else 80),
                parts.scheme == "https",
            )
            self._unix = None
        else:
            self._tcp = None
            self._unix = address[5:] if address.startswith("unix:") else address

    def _connection(self) -> http.client.HTTPConnection:
        if self._unix is not None:
            return _UnixConnection(self._unix, self.timeout)
        assert self._tcp is not None
        host, port, tls = self._tcp
        if tls:
            return http.client.HTTPSConnection(
                host, port, timeout=self.timeout, context=self.ssl_context
            )
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request; the decoded JSON answer, or ServiceError."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._connection()
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ServiceError(f"gpuplace serve at {self.address} did not answer: {exc}") from None
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = raw.decode(errors="replace")
        if response.status >= 400:
            message = (
                answer.get("error") or answer.get("Error") if isinstance(answer, dict) else answer
            )
            raise ServiceError(str(message or f"HTTP {response.status}"), response.status, answer)
        return answer

    # ------------------------------------------------------------------ the API
    def place(self, job: dict[str, Any], **options: Any) -> dict[str, Any]:
        return self.request("POST", "/v1/place", {"job": job, **options})

    def release(self, job: str, cluster: str | None = None) -> dict[str, Any]:
        return self.request("POST", "/v1/release", {"job": job, "cluster": cluster})

    def repair(self, job: str, **options: Any) -> dict[str, Any]:
        return self.request("POST", "/v1/repair", {"job": job, **options})

    def explain(self, job: dict[str, Any], cluster: str | None = None) -> dict[str, Any]:
        return self.request("POST", "/v1/explain", {"job": job, "cluster": cluster})

    def health(self, text: str, **options: Any) -> dict[str, Any]:
        return self.request("POST", "/v1/health", {"text": text, **options})

    def status(self, cluster: str | None = None) -> dict[str, Any]:
        query = f"?cluster={quote(cluster)}" if cluster else ""
        return self.request("GET", f"/v1/status{query}")

    def state(self, cluster: str | None = None) -> dict[str, Any]:
        query = f"?cluster={quote(cluster)}" if cluster else ""
        return self.request("GET", f"/v1/state{query}")
