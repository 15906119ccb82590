"""The Kubernetes API server as a pod reaches it: the in-cluster address, the service account's CA
and bearer token, and bounded GET requests (one JSON document, or a stream of JSON lines).

Built on the standard library's ``http.client`` on purpose: the exporter needs two GETs of one
resource, and the official client (126 MB on disk, ~23 MB resident once imported) or even
``requests`` with urllib3 (~6 MB resident, otherwise never imported by a default deployment) would
cost more memory than the pod metadata they serve.

The token is read from disk again every minute and after a 401: the kubelet rotates projected
service-account tokens (they expire within hours), and a token cached from start-up would stop
working.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

__all__ = ["SERVICE_ACCOUNT_DIR", "ApiError", "ApiServer", "InCluster"]

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_MAX_AGE = 60.0  # seconds a token read from disk is used before it is read again
_ERROR_BODY_LIMIT = 64 * 1024  # enough for a Status object; an error page is not read to its end


class ApiError(Exception):
    """A request the API server refused or answered with an error status (or one that never got
    an answer: status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


@dataclass(frozen=True, slots=True)
class InCluster:
    """Where the API server is and how to authenticate to it, as the kubelet sets up every pod."""

    host: str
    port: int
    token_path: str
    ca_path: str

    @classmethod
    def from_environment(cls, environ: Mapping[str, str],
                         service_account_dir: str = SERVICE_ACCOUNT_DIR) -> InCluster | None:
        """The pod's configuration, or None (with the reason logged) outside a cluster."""
        host = environ.get("KUBERNETES_SERVICE_HOST", "")
        if not host:
            log.info("kubernetes metadata off: not running in a cluster (no KUBERNETES_SERVICE_HOST)")
            return None
        token = os.path.join(service_account_dir, "token")
        if not os.path.exists(token):
            log.info("kubernetes metadata off: no service account token at %s", token)
            return None
        try:
            port = int(environ.get("KUBERNETES_SERVICE_PORT") or 443)
        except ValueError:
            log.warning("kubernetes metadata off: KUBERNETES_SERVICE_PORT is not a port number")
            return None
        return cls(host.strip("[]"), port, token, os.path.join(service_account_dir, "ca.crt"))


class _Token:
    """The bearer token, re-read from disk when older than TOKEN_MAX_AGE or when refused."""

    def __init__(self, path: str, clock: Callable[[], float]) -> None:
        self._path = path
        self._clock = clock
        self._value = ""
        self._read_at = float("-inf")

    def get(self) -> str:
        if self._clock() - self._read_at >= TOKEN_MAX_AGE:
            self.reload()
        return self._value

    def reload(self) -> None:
        try:
            with open(self._path) as f:
                self._value = f.read().strip()
        except OSError as exc:  # mid-rotation, or gone: keep the last one and say why it may fail
            log.debug("cannot read the service account token %s: %s", self._path, exc)
        self._read_at = self._clock()


class ApiServer:
    """GET requests to the API server, each bounded: `timeout` for connecting and for every read."""

    def __init__(self, config: InCluster, timeout: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.timeout = timeout
        self._token = _Token(config.token_path, clock)
        self._lock = threading.Lock()
        self._streaming: http.client.HTTPSConnection | None = None

    def get(self, path: str, query: Mapping[str, str]) -> Any:
        """One JSON document."""
        connection, response = self._open(path, query, self.timeout)
        try:
            return json.loads(response.read())
        finally:
            connection.close()

    def lines(self, path: str, query: Mapping[str, str], read_timeout: float) -> Iterator[bytes]:
        """The lines of a streamed response (a watch), until the server ends it. A read that waits
        longer than `read_timeout` raises (a connection that died without a word); `interrupt`
        ends the stream from another thread."""
        connection, response = self._open(path, query, read_timeout)
        with self._lock:
            self._streaming = connection
        try:
            while True:
                line = response.readline()
                if not line:
                    return
                yield line
        finally:
            with self._lock:
                self._streaming = None
            connection.close()

    def interrupt(self) -> None:
        """End a stream in progress now (shutting the socket wakes a thread blocked reading it)."""
        with self._lock:
            sock = self._streaming.sock if self._streaming is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)

    def _open(self, path: str, query: Mapping[str, str],
              read_timeout: float) -> tuple[http.client.HTTPSConnection, http.client.HTTPResponse]:
        target = f"{path}?{urlencode(query)}" if query else path
        for attempt in (1, 2):
            connection = self._connect()
            try:
                connection.request("GET", target, headers={"Authorization": f"Bearer {self._token.get()}",
                                                           "Accept": "application/json"})
                response = connection.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                raise ApiError(0, f"GET {path}: {exc or type(exc).__name__}") from exc
            if response.status == 200:
                if connection.sock is not None:
                    connection.sock.settimeout(read_timeout)
                return connection, response
            message = _status_message(response)
            connection.close()
            if response.status == 401 and attempt == 1:
                self._token.reload()  # rotated since it was read: once more with the new one
                continue
            raise ApiError(response.status, f"GET {path}: {message}")
        raise AssertionError("unreachable")

    def _connect(self) -> http.client.HTTPSConnection:
        # A fresh context per connection: the CA file is rotated with the token's volume too.
        try:
            context = ssl.create_default_context(cafile=self.config.ca_path)
        except (OSError, ssl.SSLError) as exc:
            raise ApiError(0, f"cannot load the CA certificate {self.config.ca_path}: {exc}") from exc
        return http.client.HTTPSConnection(self.config.host, self.config.port, timeout=self.timeout,
                                           context=context)


def _status_message(response: http.client.HTTPResponse) -> str:
    """The API server's reason (a Status object's message) or the HTTP reason phrase."""
    try:
        body = response.read(_ERROR_BODY_LIMIT)
        status = json.loads(body)
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])
    except (OSError, ValueError, http.client.HTTPException):
        pass
    return response.reason or "error"
