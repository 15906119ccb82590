"""HTTP/1.1 on the wire, through h11: bytes in, requests out (with explicit limits); responses in,
bytes out. No I/O here: the server feeds what it reads and writes what it gets back.

h11 parses the grammar of RFC 9112 (request line, header names and values, framing, keep-alive,
chunked bodies). On top of it, what an exporter adds: a request is refused with 400 when h11 is
lenient where Go's net/http (the exporter-toolkit's server) is not (control characters in a header
value, both Content-Length and Transfer-Encoding: a request-smuggling sign), 505 for an HTTP
version other than 1.0/1.1, 431 past the header limit, 413 past the body limit.
"""

from __future__ import annotations

import http
import re
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import formatdate
from urllib.parse import parse_qs, unquote, urlsplit

import h11

from offcpu_exporter.web import Request, Response

__all__ = ["BadRequest", "ClientGone", "Head", "Http1Connection", "with_body"]

_READ_CHUNK = 65536
# RFC 9110 5.5: CTLs other than HTAB are invalid in a field value; h11 refuses only NUL, CR and LF.
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_FIELD_VALUE_CTL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class BadRequest(Exception):
    """A request answered with `status` and `message`, then the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(Exception):
    """The client closed its side before a request was complete: nothing to answer."""


@dataclass(frozen=True, slots=True)
class Head:
    request: Request  # with a form body merged into its query
    keep_alive: bool


class Http1Connection:
    """One connection's HTTP/1.1 state. ``receive`` what the socket gave (``b""`` at EOF), call
    ``next_request`` until it returns a request (None: more bytes needed), answer it with the bytes
    of ``response``, then ``start_next`` (False: close the connection)."""

    read_size = _READ_CHUNK

    def __init__(self, max_header_bytes: int, max_body_bytes: int) -> None:
        self._max_header = max_header_bytes
        self._max_body = max_body_bytes
        # h11 refuses an incomplete head past this size (431) without buffering more.
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=max(max_header_bytes, 1))
        self._eof = False
        self._fed = 0  # bytes given to h11 since this request began (including pipelined leftovers)
        self._request: h11.Request | None = None
        self._body = bytearray()

    @property
    def has_buffered_bytes(self) -> bool:
        """Bytes of a next request (pipelined) are already here."""
        return bool(self._h11.trailing_data[0])

    def receive(self, data: bytes) -> None:
        if not data:
            self._eof = True
        self._fed += len(data)
        self._h11.receive_data(data)

    def next_request(self) -> Head | None:
        """The next complete request, None when more bytes are needed. Raises BadRequest to answer
        and close, ClientGone to close without answering."""
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as e:
                if self._eof:
                    raise ClientGone from None  # cut mid-request: nobody is left to read an answer
                # h11's message quotes the offending line: cut, since it goes to the log and the answer.
                raise BadRequest(e.error_status_hint, str(e)[:200]) from None
            if event is h11.NEED_DATA:
                if self._eof:
                    raise ClientGone
                return None
            if isinstance(event, h11.Request):
                self._begin(event)
            elif isinstance(event, h11.Data):
                self._body += event.data
                if len(self._body) > self._max_body:
                    raise BadRequest(413, "request body too large")
            elif isinstance(event, h11.EndOfMessage):
                return self._complete()
            elif isinstance(event, h11.ConnectionClosed):
                raise ClientGone
            else:  # PAUSED: start_next was not called; a server bug, not the client's
                raise RuntimeError(f"unexpected h11 event {event!r}")

    def _begin(self, event: h11.Request) -> None:
        head_bytes = self._fed - len(self._h11.trailing_data[0])
        if head_bytes > self._max_header:
            raise BadRequest(431, "request header fields too large")
        if event.http_version not in (b"1.0", b"1.1"):
            raise BadRequest(505, "unsupported HTTP version")
        names = {name for name, _ in event.headers}
        if any(_CTL.search(value) for _, value in event.headers):
            raise BadRequest(400, "control character in a header value")
        if b"transfer-encoding" in names and b"content-length" in names:
            raise BadRequest(400, "both Content-Length and Transfer-Encoding")
        for name, value in event.headers:
            if name == b"content-length" and int(value) > self._max_body:
                raise BadRequest(413, "request body too large")
        target = event.target.decode("ascii")  # h11 allows only visible ASCII in a target
        if not target.startswith(("/", "http://", "https://")):
            raise BadRequest(400, "bad request target")
        self._request = event

    def _complete(self) -> Head:
        event = self._request
        assert event is not None  # h11 gives EndOfMessage only after Request
        headers: dict[str, str] = {}
        for raw_name, raw_value in event.headers:
            key, value = raw_name.decode("ascii"), raw_value.decode("latin-1")
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        split = urlsplit(event.target.decode("ascii"))
        request = Request(
            method=event.method.decode("ascii"),
            path=unquote(split.path) or "/",
            query=parse_qs(split.query, keep_blank_values=True),
            headers=headers,
        )
        return Head(with_body(request, bytes(self._body)), self._h11.their_state is not h11.MUST_CLOSE)

    def response(
        self, response: Response, head_only: bool, keep_alive: bool, extra_headers: Mapping[str, str]
    ) -> list[bytes]:
        """The response's bytes (head, then the body unless `head_only`); `extra_headers` are the
        web config's, added to every response."""
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Date", formatdate(usegmt=True)),
        ]
        if any(k.lower() == "content-encoding" for k in response.headers):
            headers.append(("Vary", "Accept-Encoding"))
        headers.extend(response.headers.items())
        headers.extend(extra_headers.items())
        if not keep_alive:
            headers.append(("Connection", "close"))
        head = h11.Response(status_code=response.status, headers=_sendable(headers), reason=_reason(response.status))
        pieces = self._send(head)
        if response.body and not head_only:
            pieces += self._send(h11.Data(data=response.body))  # passed through, not copied
        return pieces + self._send(h11.EndOfMessage())

    def _send(self, event: h11.Event) -> list[bytes]:
        return self._h11.send_with_data_passthrough(event) or []

    def error_response(self, error: BadRequest, extra_headers: Mapping[str, str]) -> list[bytes]:
        """The answer to a refused request (the connection is closed after it)."""
        body = (error.message + "\n").encode("utf-8", "replace")
        return self.response(Response(error.status, body), False, False, extra_headers)

    def start_next(self) -> bool:
        """After a response: ready for the next request on this connection, or False to close it."""
        if self._h11.our_state is not h11.DONE or self._h11.their_state is not h11.DONE:
            return False
        self._h11.start_next_cycle()
        self._fed = len(self._h11.trailing_data[0])
        self._request = None
        self._body = bytearray()
        return True


def with_body(request: Request, body: bytes) -> Request:
    # Request has no body field: exporter endpoints take parameters in the query string. A body
    # is read (bounded) only to keep the connection in sync, and form bodies merge into query.
    if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        merged = {**request.query}
        for k, v in parse_qs(body.decode("latin-1"), keep_blank_values=True).items():
            merged.setdefault(k, []).extend(v)
        return Request(request.method, request.path, merged, request.headers)
    return request


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b"Status"


def _sendable(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    # A handler's or the config's header that h11 would refuse would leave the connection unable to
    # answer at all; such a header is dropped instead (the config file's are checked at load).
    out = []
    for name, value in headers:
        text = value.strip(" \t")
        if _TOKEN.fullmatch(name) and not _FIELD_VALUE_CTL.search(text):
            out.append((name.encode("ascii"), text.encode("latin-1", "replace")))
    return out
