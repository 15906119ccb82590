"""The Prometheus sink: `/metrics` on the exporter's web server.

It never copies data on publish: each scrape reads the latest snapshot through the collector.
Metric names and labels are listed in docs/prometheus.md.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Hashable

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from offcpu_exporter.series.selection import Selection
from offcpu_exporter.sinks import SinkContext, SinkStats
from offcpu_exporter.sinks.prometheus.collector import OffCPUCollector
from offcpu_exporter.sinks.prometheus.exposition import ExpositionCache
from offcpu_exporter.sinks.prometheus.options import DEFAULTS, PrometheusOptions
from offcpu_exporter.snapshot import Snapshot
from offcpu_exporter.web import Request, Response
from offcpu_exporter.web.compression import accepts_gzip

__all__ = ["PrometheusSink", "create"]

log = logging.getLogger(__name__)


class PrometheusSink:
    name = "prometheus"

    def __init__(self, context: SinkContext, options: PrometheusOptions = DEFAULTS, bcc: str | None = None) -> None:
        self.stats = SinkStats()
        self._context = context
        self.selection = Selection(
            max_processes=options.max_processes,
            top_stacks=options.top_stacks,
            top_threads=options.top_threads,
            group_histograms=options.histogram_by == "container",
        )
        self.registry = CollectorRegistry()
        self.collector = OffCPUCollector(
            context.latest,
            lambda: list(context.sinks),
            self.selection,
            stack_label=options.stack_label,
            bcc=bcc,
            per_thread=options.per_thread,
            call_path_frames=options.call_path_frames,
        )
        self.registry.register(self.collector)
        # The exporter's own process: CPU, memory, open fds, Python GC (as every client library exports).
        self.process_registry = CollectorRegistry()
        ProcessCollector(registry=self.process_registry)
        PlatformCollector(registry=self.process_registry)
        GCCollector(registry=self.process_registry)
        self.cache = ExpositionCache(self.registry, self.process_registry, self._state)
        context.routes.add(options.path, self.handle)

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
    return PrometheusSink(context, PrometheusOptions.from_args(options))
