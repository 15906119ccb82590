"""Request parsing on the wire: malformed requests get 400 (or 431/413/501/505), never a handler's 200;
valid ones, pipelined or with chunked bodies, are served. A real server on loopback for each case."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from offcpu_exporter.web import Response
from offcpu_exporter.web.http1 import BadRequest, ClientGone, Http1Connection
from offcpu_exporter.web.options import WebOptions
from offcpu_exporter.web.server import WebServer
from testkit.web_client import METRICS, get, make_routes, raw_exchange


@pytest.fixture(scope="module")
def server() -> Iterator[WebServer]:
    s = WebServer(
        make_routes(),
        WebOptions(listen_address="127.0.0.1:0", max_header_bytes=2048, max_body_bytes=100, read_header_timeout=3.0),
    )
    s.start()
    yield s
    s.stop()


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer[9:12])


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /metrics HTTP/1.1\r\nHo(st: x\r\n\r\n", 400),  # "(" is not allowed in a header name
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400),  # NUL in a value
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n", 400),  # another control character
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\x7fb\r\n\r\n", 400),  # DEL
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A : b\r\n\r\n", 400),  # space before the colon
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
        (b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET /met\x01rics HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET /metrics\xff HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400),  # neither origin- nor absolute-form
        (b"G(T /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.x\r\nHost: x\r\n\r\n", 400),
        (b"GET /metrics HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n", 413),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"65\r\n" + b"x" * 101, 413),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 3000 + b"\r\n\r\n", 431),
    ],
)
def test_a_malformed_request_is_refused(server: WebServer, request_bytes: bytes, status: int) -> None:
    answer = raw_exchange(server.port, request_bytes)
    assert status_of(answer) == status
    assert b"Connection: close" in answer.split(b"\r\n\r\n", 1)[0]
    assert get(server, "/metrics")[0] == 200


def test_valid_requests_are_served(server: WebServer) -> None:
    answer = raw_exchange(server.port, b"GET /metrics HTTP/1.0\r\n\r\n")  # HTTP/1.0 needs no Host
    assert status_of(answer) == 200 and answer.endswith(METRICS)
    chunked = b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    assert status_of(raw_exchange(server.port, chunked + b"3\r\nabc\r\n0\r\n\r\n")) == 200
    folded_ok = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Tab: a\tb\r\nConnection: close\r\n\r\n"
    assert status_of(raw_exchange(server.port, folded_ok)) == 200


def test_pipelined_requests_are_answered_in_order_and_a_bad_one_ends_the_connection(server: WebServer) -> None:
    good = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = raw_exchange(server.port, good + good + b"GET /healthz HTTP/1.1\r\nHo(st: x\r\n\r\n" + good)
    assert [int(s) for s in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)] == [200, 200, 400]


def test_bad_requests_are_counted(server: WebServer) -> None:
    before = server.counters().bad_requests
    raw_exchange(server.port, b"GET / HTTP/1.1\r\nHost: \x00\r\n\r\n")
    assert server.counters().bad_requests == before + 1


def test_the_parser_without_a_socket() -> None:
    http = Http1Connection(max_header_bytes=1024, max_body_bytes=10)
    http.receive(b"GET /q?a=1 HTTP/1.1\r\nHost: x\r\nAccept: a\r\nAccept: b\r\n\r\nGET / HTT")
    head = http.next_request()
    assert head is not None and head.keep_alive
    assert head.request.path == "/q" and head.request.arg("a") == "1" and head.request.headers["accept"] == "a, b"
    pieces = http.response(Response(200, b"hi\n"), head_only=False, keep_alive=True, extra_headers={"X-C": "1"})
    wire = b"".join(pieces)
    assert wire.startswith(b"HTTP/1.1 200 OK\r\n") and b"X-C: 1\r\n" in wire and wire.endswith(b"\r\n\r\nhi\n")
    assert http.start_next() and http.has_buffered_bytes
    assert http.next_request() is None  # the pipelined request is not complete yet
    http.receive(b"P/1.1\r\nHost: x\r\n")
    http.receive(b"")
    with pytest.raises(ClientGone):  # cut mid-request: nobody to answer
        http.next_request()
    form = Http1Connection(1024, 100)
    form.receive(
        b"POST /x?a=1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        b"Content-Length: 7\r\n\r\nb=2&a=3"
    )
    head = form.next_request()
    assert head is not None and head.request.query == {"a": ["1", "3"], "b": ["2"]}
    too_big = Http1Connection(1024, 100)
    too_big.receive(b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 2000)
    with pytest.raises(BadRequest) as e:
        too_big.next_request()
    assert e.value.status == 431


def test_a_header_h11_would_refuse_is_dropped_not_fatal() -> None:
    http = Http1Connection(1024, 10)
    http.receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert http.next_request() is not None
    bad = Response(200, b"ok", headers={"X-Bad": "a\r\nInjected: 1", "Bad Name": "v", "X-Good": "v"})
    wire = b"".join(http.response(bad, head_only=False, keep_alive=True, extra_headers={}))
    assert b"Injected" not in wire and b"Bad Name" not in wire and b"X-Good: v\r\n" in wire
