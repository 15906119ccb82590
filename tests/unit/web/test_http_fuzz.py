"""Fuzzing the request path of a real server on loopback: requests made invalid on purpose (one
forbidden byte in a header name, a header value, the method or the target; a bad version; broken
framing) are never answered 2xx; arbitrary bytes get a well-formed refusal or a close, never a
hang or a crash; valid requests made from the grammar are served; and after every example a fresh
scrape still works. Bounded: a fixed number of examples, each exchange with a timeout."""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offcpu_exporter.web.options import WebOptions
from offcpu_exporter.web.server import WebServer
from testkit.web_client import METRICS, get, make_routes

FUZZ = settings(
    max_examples=150,
    deadline=None,  # each exchange has its own timeout below
    database=None,
    derandomize=True,  # the same examples in CI as on a laptop
    suppress_health_check=[HealthCheck.too_slow],
)
EXCHANGE_TIMEOUT_S = 5.0
TCHAR = set(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
# Bytes no header name may hold; ":" ends the name and CR/LF end the line, so they would change
# the request's structure rather than make one name invalid.
NOT_TCHAR = sorted(set(range(256)) - TCHAR - set(b":\r\n"))
# Control characters are invalid in a header value (RFC 9110 5.5); HTAB is allowed.
VALUE_CTL = sorted(set(range(0x20)) - set(b"\t\r\n") | {0x7F})
# A request target is visible ASCII only.
NOT_VCHAR = sorted(set(range(256)) - set(range(0x21, 0x7F)) - set(b"\r\n"))


class _Errors(logging.Handler):
    """Errors the server logs: a failed connection ("web connection failed") is a crash of its own."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


ERRORS = _Errors()


@pytest.fixture(scope="module")
def server() -> Iterator[WebServer]:
    options = WebOptions(
        listen_address="127.0.0.1:0", read_header_timeout=2.0, idle_timeout=2.0, max_header_bytes=4096,
        max_body_bytes=1024,
    )
    s = WebServer(make_routes(), options)
    s.start()
    server_log = logging.getLogger("offcpu_exporter.web.server")
    server_log.addHandler(ERRORS)
    yield s
    server_log.removeHandler(ERRORS)
    s.stop()


def exchange(port: int, data: bytes) -> bytes:
    """Send, half-close (so that an incomplete request ends at once), read to EOF; fail on a hang."""
    t0 = time.monotonic()
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=EXCHANGE_TIMEOUT_S) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before everything was sent: what came back is still checked
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail(f"no answer or close within {EXCHANGE_TIMEOUT_S} s to {data[:200]!r}")
    assert time.monotonic() - t0 < EXCHANGE_TIMEOUT_S
    return b"".join(chunks)


def statuses(answer: bytes) -> list[int]:
    return [int(s) for s in re.findall(rb"(?:^|\n|\r\n)HTTP/1\.1 (\d{3}) ", answer)]


def still_serving(s: WebServer) -> None:
    status, _, body = get(s, "/metrics", timeout=EXCHANGE_TIMEOUT_S)
    assert status == 200 and body == METRICS
    assert not ERRORS.records, [r.getMessage() for r in ERRORS.records]


def insert(text: bytes, index: int, byte: int) -> bytes:
    return text[:index] + bytes([byte]) + text[index:]


@st.composite
def invalid_requests(draw: st.DrawFn) -> bytes:
    method, target, version = b"GET", b"/metrics", b"HTTP/1.1"
    name, value = b"X-Scrape-Id", b"prometheus 42"
    host = b"Host: 127.0.0.1\r\n"
    framing = b""
    kind = draw(st.sampled_from(["name", "value", "method", "target", "version", "host", "framing"]))
    if kind == "name":  # after the first byte: a leading space would make the line a continuation
        name = insert(name, draw(st.integers(1, len(name))), draw(st.sampled_from(NOT_TCHAR)))
    elif kind == "value":
        value = insert(value, draw(st.integers(0, len(value))), draw(st.sampled_from(VALUE_CTL)))
    elif kind == "method":
        method = insert(method, draw(st.integers(0, len(method))), draw(st.sampled_from([*NOT_TCHAR[1:], 0])))
    elif kind == "target":
        target = insert(target, draw(st.integers(0, len(target))), draw(st.sampled_from(NOT_VCHAR)))
    elif kind == "version":
        version = draw(st.binary(max_size=12).filter(lambda v: b"\r" not in v and b"\n" not in v))
        version = b"HTTP/1.1x" if version in (b"HTTP/1.0", b"HTTP/1.1") else version
    elif kind == "host":
        host = draw(st.sampled_from([b"", host + host.replace(b"127.0.0.1", b"example.org")]))
    else:
        method = b"POST"
        framing = draw(
            st.sampled_from(
                [
                    b"Content-Length: 1\r\nContent-Length: 2\r\n",
                    b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n",
                    b"Content-Length: -1\r\n",
                    b"Content-Length: 1e3\r\n",
                    b"Content-Length: 0x10\r\n",
                    b"Transfer-Encoding: identity\r\n",
                    b"Content-Length: 2000\r\n",  # over the body limit
                ]
            )
        )
    return method + b" " + target + b" " + version + b"\r\n" + host + name + b": " + value + b"\r\n" + framing + b"\r\n"


@given(request=invalid_requests())
@FUZZ
@pytest.mark.timeout(240)
def test_an_invalid_request_is_never_answered_2xx(server: WebServer, request: bytes) -> None:
    answer = exchange(server.port, request)
    codes = statuses(answer)
    assert codes and all(400 <= c < 600 for c in codes), (request, answer[:200])
    still_serving(server)


@given(data=st.one_of(st.binary(max_size=600), st.binary(max_size=300).map(lambda b: b"GET /metrics HTTP/1.1\r\n" + b)))
@FUZZ
@pytest.mark.timeout(240)
def test_arbitrary_bytes_get_a_refusal_or_a_close(server: WebServer, data: bytes) -> None:
    answer = exchange(server.port, data)
    if answer:
        assert answer.startswith(b"HTTP/1.1 ") and re.match(rb"HTTP/1\.1 \d{3} ", answer), answer[:200]
    if b"Host:" not in data and b"HTTP/1.0" not in data:  # no valid request can be in it
        assert all(c >= 400 for c in statuses(answer)), (data, answer[:200])
    still_serving(server)


TOKENS = st.text(alphabet="".join(chr(c) for c in sorted(TCHAR)), min_size=1, max_size=12)
VALUES = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)


@given(
    method=st.sampled_from(["GET", "HEAD"]),
    path=st.sampled_from(["/metrics", "/healthz", "/nope", "/metrics?x=1&y=%20"]),
    headers=st.lists(st.tuples(TOKENS, VALUES, VALUES), max_size=6),
)
@FUZZ
@pytest.mark.timeout(240)
def test_valid_requests_from_the_grammar_are_served(
    server: WebServer, method: str, path: str, headers: list[tuple[str, str, str]]
) -> None:
    lines = "".join(
        f"{name}: {a} {b}\r\n" for name, a, b in headers
        if name.lower() not in ("host", "content-length", "transfer-encoding", "connection", "expect")
    )
    answer = exchange(server.port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n{lines}\r\n".encode())
    expected = 404 if path == "/nope" else 200
    assert statuses(answer)[:1] == [expected], answer[:200]
    if method == "GET" and path.startswith("/metrics"):
        assert answer.endswith(METRICS)
    assert not ERRORS.records, [r.getMessage() for r in ERRORS.records]
