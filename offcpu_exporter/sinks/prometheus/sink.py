"""The Prometheus sink: `/metrics` on the exporter's web server.

It never copies data on publish: each scrape reads the latest snapshot through the collector.
Metric names and labels are listed in docs/prometheus.md.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Hashable

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from offcpu_exporter.sinks import SinkContext, SinkStats
from offcpu_exporter.sinks.prometheus.collector import OffCPUCollector
from offcpu_exporter.sinks.prometheus.exposition import ExpositionCache
from offcpu_exporter.sinks.prometheus.top_series import Selection
from offcpu_exporter.snapshot import Snapshot
from offcpu_exporter.waitsite import CALL_PATH_FRAMES
from offcpu_exporter.web import Request, Response
from offcpu_exporter.web.server import accepts_gzip

__all__ = ["PrometheusSink", "create"]

log = logging.getLogger(__name__)


class PrometheusSink:
    name = "prometheus"

    def __init__(
        self,
        context: SinkContext,
        top_stacks: int = 10,
        max_processes: int = 200,
        stack_label: bool = False,
        bcc: str | None = None,
        per_thread: bool = False,
        top_threads: int = 10,
        call_path_frames: int = CALL_PATH_FRAMES,
        path: str = "/metrics",
    ) -> None:
        if not path.startswith("/"):
            raise ValueError(f"--web.telemetry-path must start with '/': {path!r}")
        if top_stacks < 0 or max_processes < 0 or top_threads < 0:
            raise ValueError(
                "--prometheus.top-stacks, --prometheus.top-threads and --prometheus.max-processes must not be negative"
            )
        self.stats = SinkStats()
        self._context = context
        self.selection = Selection(max_processes=max_processes, top_stacks=top_stacks, top_threads=top_threads)
        self.registry = CollectorRegistry()
        self.collector = OffCPUCollector(
            context.latest,
            lambda: list(context.sinks),
            self.selection,
            stack_label=stack_label,
            bcc=bcc,
            per_thread=per_thread,
            call_path_frames=call_path_frames,
        )
        self.registry.register(self.collector)
        # The exporter's own process: CPU, memory, open fds, Python GC (as every client library exports).
        self.process_registry = CollectorRegistry()
        ProcessCollector(registry=self.process_registry)
        PlatformCollector(registry=self.process_registry)
        GCCollector(registry=self.process_registry)
        self.cache = ExpositionCache(self.registry, self.process_registry, self._state)
        context.routes.add(path, self.handle)

    def _state(self) -> Hashable:
        stats = tuple(
            sorted((s.name, tuple(sorted(s.stats.values().items()))) for s in self._context.sinks if s is not self)
        )
        return self._context.latest().sequence, stats

    def handle(self, request: Request) -> Response:
        try:
            body, content_type, gzipped = self.cache.get(
                request.headers.get("accept", ""), accepts_gzip(request.headers.get("accept-encoding", ""))
            )
        except Exception:
            self.stats.add("failed")
            raise
        self.stats.add("sent")
        return Response(200, body, content_type, {"Content-Encoding": "gzip"} if gzipped else {})

    def publish(self, snapshot: Snapshot) -> None:
        """Nothing to do: scrapes read the latest snapshot."""

    def close(self, timeout: float) -> None:
        """Nothing pending: a scrape is answered or not."""


def create(options: argparse.Namespace, context: SinkContext) -> PrometheusSink:
    return PrometheusSink(
        context,
        top_stacks=options.prometheus_top_stacks,
        max_processes=options.prometheus_max_processes,
        stack_label=options.prometheus_stack_label,
        per_thread=getattr(options, "per_thread", False),
        top_threads=options.prometheus_top_threads,
        call_path_frames=options.prometheus_call_path_frames,
        path=options.web_telemetry_path,
    )
