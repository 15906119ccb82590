"""gzip for responses: whether the client takes it, and compressing a response that is worth it."""

from __future__ import annotations

import gzip

from offcpu_exporter.web import Request, Response

__all__ = ["accepts_gzip", "gzip_if_accepted"]

_GZIP_MIN_BYTES = 1024  # smaller bodies gain little and cost a compression


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding value allows gzip (honouring ``q=0``)."""
    wildcard = False
    for part in accept_encoding.split(","):
        token, *params = part.split(";")
        token = token.strip().lower()
        q = 1.0
        for p in params:
            k, _, v = p.strip().partition("=")
            if k.strip().lower() == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        if token in ("gzip", "x-gzip"):
            return q > 0
        if token == "*":
            wildcard = q > 0
    return wildcard


def gzip_if_accepted(request: Request, response: Response) -> Response:
    """The response gzipped when the client takes gzip, the body is large enough and not encoded yet."""
    if (
        len(response.body) >= _GZIP_MIN_BYTES
        and not any(k.lower() == "content-encoding" for k in response.headers)
        and accepts_gzip(request.headers.get("accept-encoding", ""))
    ):
        headers = {**response.headers, "Content-Encoding": "gzip"}
        return Response(response.status, gzip.compress(response.body, 6, mtime=0), response.content_type, headers)
    return response
