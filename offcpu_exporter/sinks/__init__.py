"""Outputs. Each sink turns snapshots into its format and transports them.

A sink module exposes ``add_arguments(parser)`` (its own option group) and
``create(options, context) -> Sink | None`` (``None`` when its options leave it disabled).
``publish`` is called by the pipeline thread after every flush and must never block it:
queue the work and return. ``close`` is called once at shutdown, after the final snapshot
was published, and delivers what is pending within the timeout.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from offcpu_exporter.snapshot import Snapshot
from offcpu_exporter.web import Routes

__all__ = ["Sink", "SinkContext", "SinkModule", "SinkStats"]


class Sink(Protocol):
    name: str
    stats: SinkStats

    def publish(self, snapshot: Snapshot) -> None: ...

    def close(self, timeout: float) -> None: ...


class SinkStats:
    """Thread-safe delivery counters of one sink, exported as self-metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = {}

    def add(self, what: str, n: int = 1) -> None:
        """`what` is one of: sent, dropped, retried, failed (or a sink-specific name)."""
        with self._lock:
            self._values[what] = self._values.get(what, 0) + n

    def get(self, what: str) -> int:
        with self._lock:
            return self._values.get(what, 0)

    def values(self) -> Mapping[str, int]:
        with self._lock:
            return dict(self._values)


@dataclass
class SinkContext:
    """What the wiring hands to every sink at creation."""

    latest: Callable[[], Snapshot]  # the newest snapshot (never blocks)
    flush_now: Callable[[float], Snapshot]  # ask the pipeline for a flush now; waits up to timeout s
    routes: Routes  # register HTTP handlers on the exporter's web server
    history: Callable[[float], list[Snapshot]] = field(default=lambda seconds: [])  # last N seconds
    sinks: list[Sink] = field(default_factory=list)  # every created sink (for self-metrics)
    extra: dict[str, Any] = field(default_factory=dict)


class SinkModule(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def create(self, options: argparse.Namespace, context: SinkContext) -> Sink | None: ...
