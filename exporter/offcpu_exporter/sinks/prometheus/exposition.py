"""Rendered /metrics bodies, cached.

The snapshot's metrics change only once per flush, so their body (and its gzip stream) is rendered
once per snapshot sequence, self-metric state and format; concurrent scrapers wait for the one
render in progress instead of each rendering. The exporter's own process metrics (CPU, memory, fds)
are small and rendered at most once a second, then appended: the gzip stream is continued from a
copy of the compressor state after the big part (`zlib.compressobj().copy()`), so the result is
one ordinary gzip member and the big part is never compressed twice.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["ExpositionCache"]

_PROCESS_MAX_AGE_S = 1.0
_OPENMETRICS_EOF = b"# EOF\n"


@dataclass
class _Main:
    key: Hashable
    body: bytes
    generation: int
    gzip_head: bytes | None = None
    compressor: Any = None  # zlib.Compress after `body`, not flushed


@dataclass
class _Tail:
    rendered_at: float
    body: bytes
    gzip_body: bytes | None = None  # the whole gzip body for (main, tail)
    gzip_generation: int = -1


class ExpositionCache:
    def __init__(
        self,
        registry: CollectorRegistry,
        process_registry: CollectorRegistry | None,
        state: Callable[[], Hashable],
        process_max_age_s: float = _PROCESS_MAX_AGE_S,
    ) -> None:
        self._registry = registry
        self._process_registry = process_registry
        self._state = state
        self._process_max_age = process_max_age_s
        self._lock = threading.Lock()
        self._main: dict[str, _Main] = {}
        self._tail: dict[str, _Tail] = {}
        self.renders = 0  # renders of the snapshot part

    def get(self, accept: str, gzip_ok: bool) -> tuple[bytes, str, bool]:
        """(body, content type, body is gzipped) for a request's Accept header."""
        encoder, content_type = choose_encoder(accept)
        openmetrics = content_type.startswith("application/openmetrics-text")
        with self._lock:
            key = self._state()
            main = self._main.get(content_type)
            if main is None or main.key != key:
                body = encoder(self._registry)
                if openmetrics and self._process_registry is not None and body.endswith(_OPENMETRICS_EOF):
                    body = body[: -len(_OPENMETRICS_EOF)]  # one # EOF, at the very end
                self.renders += 1
                main = _Main(key, body, self.renders)
                self._main[content_type] = main
            tail = self._tail.get(content_type)
            now = time.monotonic()
            if self._process_registry is None:
                tail = _Tail(now, b"")
            elif tail is None or now - tail.rendered_at >= self._process_max_age:
                tail = _Tail(now, encoder(self._process_registry))
                self._tail[content_type] = tail
            if not gzip_ok:
                return main.body + tail.body, content_type, False
            if main.compressor is None:
                main.compressor = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip header
                main.gzip_head = main.compressor.compress(main.body)
            if tail.gzip_body is None or tail.gzip_generation != main.generation:
                rest = main.compressor.copy()
                tail.gzip_body = main.gzip_head + rest.compress(tail.body) + rest.flush()
                tail.gzip_generation = main.generation
            return tail.gzip_body, content_type, True
