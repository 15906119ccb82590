"""The HTTP/1.1 subset an exporter needs, on the wire: a request head parsed with explicit limits
(GET/HEAD and the rest, Content-Length bodies, keep-alive; no chunked request bodies), form bodies
merged into the query, and a response head."""

from __future__ import annotations

import http
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import formatdate
from urllib.parse import parse_qs, unquote, urlsplit

from offcpu_exporter.web import Request, Response

__all__ = ["BadRequest", "Head", "parse_head", "response_head", "with_body"]


class BadRequest(Exception):
    """A request answered with `status` and `message`, then the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Head:
    request: Request
    keep_alive: bool
    body_length: int


def parse_head(head: bytes, max_header_bytes: int, max_body_bytes: int) -> Head:
    """The request line and headers up to and including the blank line (``\\r\\n\\r\\n``)."""
    if len(head) > max_header_bytes:
        raise BadRequest(431, "request header fields too large")
    lines = head[:-4].decode("latin-1").lstrip("\r\n").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper():
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
            raise BadRequest(400, "malformed header line")
        key, value = name.lower(), value.strip(" \t")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if "transfer-encoding" in headers:
        raise BadRequest(501, "chunked request bodies are not supported")
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit():
        raise BadRequest(400, "bad Content-Length")
    length = int(length_text)
    if length > max_body_bytes:
        raise BadRequest(413, "request body too large")
    if not (target.startswith("/") or target.startswith(("http://", "https://"))):
        raise BadRequest(400, "bad request target")
    split = urlsplit(target)
    connection = headers.get("connection", "").lower()
    keep_alive = version == "HTTP/1.1" and "close" not in connection
    request = Request(
        method=method,
        path=unquote(split.path) or "/",
        query=parse_qs(split.query, keep_blank_values=True),
        headers=headers,
    )
    return Head(request, keep_alive, length)


def with_body(request: Request, body: bytes) -> Request:
    # Request has no body field: exporter endpoints take parameters in the query string. A body
    # is read (bounded) only to keep the connection in sync, and form bodies merge into query.
    if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        merged = {**request.query}
        for k, v in parse_qs(body.decode("latin-1"), keep_blank_values=True).items():
            merged.setdefault(k, []).extend(v)
        return Request(request.method, request.path, merged, request.headers)
    return request


def response_head(response: Response, keep_alive: bool, extra_headers: Mapping[str, str]) -> bytes:
    """Status line and headers; `extra_headers` are the web config's (added to every response)."""
    try:
        reason = http.HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Status"
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        f"Date: {formatdate(usegmt=True)}",
    ]
    encoded = any(k.lower() == "content-encoding" for k in response.headers)
    if encoded:
        lines.append("Vary: Accept-Encoding")
    lines.extend(f"{k}: {v}" for k, v in response.headers.items() if _header_ok(k, v))
    lines.extend(f"{k}: {v}" for k, v in extra_headers.items())
    if not keep_alive:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")


def _header_ok(name: str, value: str) -> bool:
    return not any(c in name or c in value for c in "\r\n")
