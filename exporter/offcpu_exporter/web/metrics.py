"""The web server's own counters on /metrics: requests refused by the parser and web config
reloads, as exporter-toolkit's users find them (a rotated certificate that did not load must show
somewhere other than the log)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from offcpu_exporter.web.server import WebCounters

__all__ = ["WebCollector"]


class WebCollector(Collector):
    def __init__(self, counters: Callable[[], WebCounters]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[CounterMetricFamily]:
        now = self._counters()
        bad = CounterMetricFamily(
            "offcpu_exporter_http_bad_requests", "HTTP requests refused as malformed or too large (answered 4xx)."
        )
        bad.add_metric([], now.bad_requests)
        reloads = CounterMetricFamily(
            "offcpu_exporter_web_config_reloads",
            "Changed web config files read again, by result (a failed one leaves the last good one in force).",
            labels=["result"],
        )
        reloads.add_metric(["success"], now.config_reloads)
        reloads.add_metric(["failure"], now.config_reload_failures)
        yield bad
        yield reloads
