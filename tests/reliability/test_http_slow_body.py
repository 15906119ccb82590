"""The web server's time limit covers the request body too: a client that sends complete headers
and then trickles the body is cut at the request deadline, and others' scrapes go on. (Slow
headers, 1,000 connections and size limits: tests/unit/web/test_web_server.py.)"""

from __future__ import annotations

import socket
import threading
import time

from offcpu_exporter.web.options import WebOptions
from offcpu_exporter.web.server import WebServer
from testkit.web_client import get, make_routes


def _trickle(port: int, cut_after: list[float]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        t0 = time.monotonic()
        sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n")
        sock.settimeout(0.5)
        for _ in range(40):
            try:
                sock.send(b"x")
                if sock.recv(1) == b"":
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        cut_after.append(time.monotonic() - t0)


def test_a_trickled_body_is_cut_at_the_request_deadline() -> None:
    s = WebServer(make_routes(), WebOptions(listen_address="127.0.0.1:0", read_header_timeout=1.5), lambda: True)
    s.start()
    cut_after: list[float] = []
    try:
        clients = [threading.Thread(target=_trickle, args=(s.port, cut_after)) for _ in range(5)]
        for t in clients:
            t.start()
        time.sleep(0.3)
        for _ in range(10):
            t0 = time.monotonic()
            assert get(s, "/metrics")[0] == 200
            assert time.monotonic() - t0 < 1.0
        for t in clients:
            t.join(30)
    finally:
        s.stop()
    # 40 bytes at one per 0.5 s would take 20 s: cut at the 1.5 s deadline instead.
    assert len(cut_after) == 5 and all(1.0 < c < 4.0 for c in cut_after), cut_after
