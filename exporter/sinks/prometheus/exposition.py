"""Rendered /metrics bodies, cached.

The data changes only once per flush, so a body (and its gzip) is rendered once per snapshot
sequence and self-metric state and format, and at most once a second (the exporter's own
process metrics, CPU and memory, stay that fresh). Concurrent scrapers wait for the one render in
progress instead of each rendering: 50 scrapers cost one render.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["ExpositionCache"]

_MAX_AGE_S = 1.0


@dataclass
class _Entry:
    key: Hashable
    rendered_at: float
    body: bytes
    gzipped: bytes | None = None


class ExpositionCache:
    def __init__(
        self, registry: CollectorRegistry, state: Callable[[], Hashable], max_age_s: float = _MAX_AGE_S
    ) -> None:
        self._registry = registry
        self._state = state
        self._max_age = max_age_s
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self.renders = 0

    def get(self, accept: str, gzip_ok: bool) -> tuple[bytes, str, bool]:
        """(body, content type, body is gzipped) for a request's Accept header."""
        encoder, content_type = choose_encoder(accept)
        with self._lock:
            key = self._state()
            now = time.monotonic()
            entry = self._entries.get(content_type)
            if entry is None or entry.key != key or now - entry.rendered_at >= self._max_age:
                entry = _Entry(key, now, encoder(self._registry))
                self._entries[content_type] = entry
                self.renders += 1
            if not gzip_ok:
                return entry.body, content_type, False
            if entry.gzipped is None:
                entry.gzipped = gzip.compress(entry.body, 6, mtime=0)
            return entry.gzipped, content_type, True
