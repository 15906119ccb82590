"""A client of the exporter's web server for tests: GET over (TLS) loopback, raw exchanges, basic
authentication (the header, and a --web.config.file with users), and routes that serve a fixed
/metrics body and a /debug/slow that waits."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import threading

import bcrypt

from offcpu_exporter.web import Request, Response, Routes
from offcpu_exporter.web.server import WebServer

METRICS = b"".join(b'offcpu_seconds_total{pid="%d"} %d\n' % (i, i) for i in range(2000))


def make_routes(release: threading.Event | None = None) -> Routes:
    routes = Routes()
    routes.add("/metrics", lambda req: Response(200, METRICS, "text/plain; version=0.0.4; charset=utf-8"))

    def slow(req: Request) -> Response:
        assert release is not None
        release.wait(30)
        return Response(200, b"done\n")

    routes.add("/debug/slow", slow)
    return routes


def get(
    s: WebServer,
    path: str,
    headers: dict[str, str] | None = None,
    method: str = "GET",
    context: ssl.SSLContext | None = None,
    timeout: float = 10,
) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if context is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", s.port, timeout=timeout, context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def raw_exchange(port: int, data: bytes, timeout: float = 5) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def hashed(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()  # cost 4: fast tests


def users_yaml(users: dict[str, str]) -> str:
    """A --web.config.file allowing `users` (name -> password) with basic authentication."""
    return "basic_auth_users:\n" + "".join(f"  {u}: '{hashed(p)}'\n" for u, p in users.items())
