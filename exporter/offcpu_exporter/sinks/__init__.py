"""Outputs. Each sink turns snapshots into its format and transports them.

Each output is a package with two modules. ``options`` is light (argparse only): it exposes
``add_arguments(parser)`` (its own option group) and ``enabled(options) -> bool`` (raising ValueError
on contradictory options), and may expose ``add_subcommands(subparsers)``; the CLI imports every
output's ``options`` to build its parser. ``sink`` exposes ``create(options, context) -> Sink | None``
and is imported only when ``enabled`` says so, so that outputs left off cost no memory: gRPC,
requests, the OpenTelemetry SDK and the generated protobuf code are ~30 MB of RSS.
``publish`` is called by the pipeline thread after every flush and must never block it:
queue the work and return. ``close`` is called once at shutdown, after the final snapshot
was published, and delivers what is pending within the timeout.
"""

from __future__ import annotations

import argparse
import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

from offcpu_exporter.snapshot import Snapshot
from offcpu_exporter.web import Routes

__all__ = ["OUTPUTS", "Output", "OutputOptions", "Sink", "SinkContext", "SinkModule", "SinkStats"]


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


class OutputOptions(Protocol):
    """An output's ``options`` module."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def enabled(self, options: argparse.Namespace) -> bool: ...


class SinkModule(Protocol):
    """An output's ``sink`` module."""

    def create(self, options: argparse.Namespace, context: SinkContext) -> Sink | None: ...


@dataclass(frozen=True)
class Output:
    """An output plugged into ``serve``: the package that holds its ``options`` and ``sink`` modules."""

    package: str

    @property
    def options(self) -> OutputOptions:
        return cast(OutputOptions, importlib.import_module(f"{self.package}.options"))

    def sink_module(self) -> SinkModule:
        return cast(SinkModule, importlib.import_module(f"{self.package}.sink"))

    def create(self, options: argparse.Namespace, context: SinkContext) -> Sink | None:
        """The sink, or None when its options leave it off (then its module is not even imported)."""
        if not self.options.enabled(options):
            return None
        return self.sink_module().create(options, context)


# In the order they are created (and their self-metrics listed).
OUTPUTS: tuple[Output, ...] = tuple(
    Output(f"offcpu_exporter.sinks.{name}") for name in ("prometheus", "otlp", "skywalking", "pprof")
)
