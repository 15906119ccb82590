"""The off-CPU counters pushed as OTLP metrics through opentelemetry-sdk.

Observable counters (cumulative) read the newest snapshot at every collection of the SDK's
PeriodicExportingMetricReader; nothing is copied per flush. Names and attributes, next to the
Prometheus names they correspond to:

| OTLP                    | unit       | Prometheus                       |
|-------------------------|------------|----------------------------------|
| `offcpu.time`           | `s`        | `offcpu_seconds_total`           |
| `offcpu.switches`       | `{switch}` | `offcpu_switches_total`          |
| `offcpu.stack.time`     | `s`        | `offcpu_stack_seconds_total`     |
| `offcpu.stack.switches` | `{switch}` | `offcpu_stack_switches_total`    |

Per-process attributes: `process.pid`, `process.executable.name`, `offcpu.reason`, and when known
`k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name`. Per-stack attributes: `process.pid`,
`process.executable.name`, `offcpu.stack_id`, `offcpu.user_function`, `offcpu.kernel_function`
(and `offcpu.stack`, the folded stack, when enabled).

Which processes and stacks get their own series is decided by the Prometheus sink's `Selection`
(its own instance), so both outputs bound cardinality the same way and keep every series
monotonic and the stacks of a process summing exactly to its total: top K stacks per process
plus `offcpu.stack_id=other`, at most N processes plus one folded process (no `process.pid`,
`process.executable.name=other`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from offcpu_exporter import __version__
from offcpu_exporter.series.selection import DEFAULT_LIMITS, Selection, one_per_pid
from offcpu_exporter.sinks import SinkStats
from offcpu_exporter.snapshot import SWITCH_REASONS, ZERO, Counter, ProcessView, Reason, Snapshot

from .endpoints import OtlpConfig

__all__ = [
    "OTHER",
    "CountingMetricExporter",
    "OffcpuMetrics",
    "build_meter_provider",
    "build_metric_exporter",
    "exporter_resource",
    "shutdown",
]

log = logging.getLogger(__name__)

OTHER = "other"
METER_NAME = "offcpu-exporter"


def _process_attributes(view: ProcessView) -> dict[str, Any]:
    info = view.info
    attrs: dict[str, Any] = {"process.pid": info.pid, "process.executable.name": info.exe_name}
    for key, value in (
        ("k8s.namespace.name", info.namespace),
        ("k8s.pod.name", info.pod),
        ("k8s.container.name", info.container),
    ):
        if value:
            attrs[key] = value
    return attrs


@dataclass(frozen=True)
class _Rows:
    process_time: list[Observation]
    process_switches: list[Observation]
    stack_time: list[Observation]
    stack_switches: list[Observation]


class OffcpuMetrics:
    """Computes the observations once per snapshot and serves them to the four callbacks."""

    def __init__(
        self,
        latest: Callable[[], Snapshot],
        top_stacks: int,
        stack_attribute: bool = False,
        max_processes: int = DEFAULT_LIMITS.max_processes,
    ) -> None:
        self._latest = latest
        self._selection = Selection(max_processes=max_processes, top_stacks=top_stacks, flags="--otlp")
        self._stack_attribute = stack_attribute
        self._lock = threading.Lock()
        self._sequence = -1
        self._rows = _Rows([], [], [], [])

    def register(self, provider: MeterProvider) -> None:
        meter = provider.get_meter(METER_NAME, __version__)
        meter.create_observable_counter(
            "offcpu.time", [self._process_time], unit="s", description="Time threads were off CPU"
        )
        meter.create_observable_counter(
            "offcpu.switches",
            [self._process_switches],
            unit="{switch}",
            description="Times threads were switched off CPU",
        )
        meter.create_observable_counter(
            "offcpu.stack.time", [self._stack_time], unit="s", description="Off-CPU time per stack (top K)"
        )
        meter.create_observable_counter(
            "offcpu.stack.switches",
            [self._stack_switches],
            unit="{switch}",
            description="Switches off CPU per stack (top K)",
        )

    def rows(self) -> _Rows:
        snapshot = self._latest()
        with self._lock:
            if snapshot.sequence != self._sequence:
                self._rows = self._compute(snapshot)
                self._sequence = snapshot.sequence
            return self._rows

    def _compute(self, snapshot: Snapshot) -> _Rows:
        rows = _Rows([], [], [], [])
        view = self._selection.view(snapshot)
        for series in one_per_pid(view.processes):
            info = series.view.info
            attrs = _process_attributes(series.view)
            self._add_reasons(rows, attrs, series.view.by_reason)
            base: dict[str, Any] = {"process.pid": info.pid, "process.executable.name": info.exe_name}
            for stack_series in series.stacks:
                stack = stack_series.stack
                a = {
                    **base,
                    "offcpu.stack_id": stack.stack_id,
                    "offcpu.user_function": stack.user_function,
                    "offcpu.kernel_function": stack.kernel_function,
                }
                if self._stack_attribute:
                    a["offcpu.stack"] = stack.folded()
                self._add_stack(rows, a, stack_series.value)
            self._add_stack(rows, self._other_stack(base), series.other)
        if view.folded is not None:
            folded = {"process.executable.name": OTHER}
            self._add_reasons(rows, folded, view.folded.by_reason)
            self._add_stack(rows, self._other_stack(folded), view.folded.total)
        return rows

    @staticmethod
    def _add_reasons(rows: _Rows, attrs: dict[str, Any], by_reason: Any) -> None:
        # every reason, zeros included, as /metrics does: a series that exists from the start
        # gives rate() a baseline when the reason first occurs
        for reason in Reason:
            counter = by_reason.get(reason, ZERO)
            a = {**attrs, "offcpu.reason": reason.label}
            rows.process_time.append(Observation(counter.ns / 1e9, a))
            if reason in SWITCH_REASONS:  # time lost without a switch has no switches
                rows.process_switches.append(Observation(counter.count, a))

    def _other_stack(self, base: dict[str, Any]) -> dict[str, Any]:
        a = {**base, "offcpu.stack_id": OTHER, "offcpu.user_function": OTHER, "offcpu.kernel_function": OTHER}
        if self._stack_attribute:
            a["offcpu.stack"] = OTHER
        return a

    @staticmethod
    def _add_stack(rows: _Rows, attrs: dict[str, Any], value: Counter) -> None:
        rows.stack_time.append(Observation(value.ns / 1e9, attrs))
        rows.stack_switches.append(Observation(value.count, attrs))

    def _process_time(self, options: CallbackOptions) -> Iterable[Observation]:
        return self.rows().process_time

    def _process_switches(self, options: CallbackOptions) -> Iterable[Observation]:
        return self.rows().process_switches

    def _stack_time(self, options: CallbackOptions) -> Iterable[Observation]:
        return self.rows().stack_time

    def _stack_switches(self, options: CallbackOptions) -> Iterable[Observation]:
        return self.rows().stack_switches


class CountingMetricExporter(MetricExporter):
    """Delegates to the OTLP exporter and counts its results (``metrics_sent``/``metrics_failed``).

    A failed cumulative export loses no data (the next one carries the same totals), so these are
    kept apart from the profile counts (sent/dropped/...) of the sink."""

    def __init__(self, delegate: MetricExporter, stats: SinkStats) -> None:
        super().__init__(
            preferred_temporality=delegate._preferred_temporality,
            preferred_aggregation=delegate._preferred_aggregation,
        )
        self._delegate = delegate
        self._stats = stats

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        result = self._delegate.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        self._stats.add("metrics_sent" if result is MetricExportResult.SUCCESS else "metrics_failed")
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._delegate.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._delegate.shutdown(timeout_millis=timeout_millis, **kwargs)


def exporter_resource(host_name: str) -> Resource:
    """The exporter's own resource. OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win over these
    defaults, as in every OpenTelemetry component (Resource.create alone would let ours win)."""
    defaults = {"service.name": "offcpu-exporter", "service.version": __version__, "host.name": host_name}
    return Resource.create(defaults).merge(OTELResourceDetector().detect())


_GRPC_COMPRESSION = {"gzip": grpc.Compression.Gzip, "none": grpc.Compression.NoCompression}


def build_metric_exporter(config: OtlpConfig) -> MetricExporter:
    endpoint = config.metrics
    assert endpoint is not None
    if endpoint.protocol == "grpc":
        # The gRPC class ignores OTEL_EXPORTER_OTLP_PROTOCOL: the class itself is the choice.
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        from .profiles_transport import _CHANNEL_OPTIONS

        return GrpcExporter(
            endpoint=endpoint.target,
            insecure=endpoint.insecure,
            credentials=endpoint.grpc_credentials(),
            headers=dict(endpoint.headers),
            timeout=endpoint.timeout,
            compression=_GRPC_COMPRESSION[endpoint.compression],
            channel_options=_CHANNEL_OPTIONS,  # type: ignore[arg-type]  # the SDK's hint is too narrow
        )
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    from .profiles_transport import TlsSession

    return HttpExporter(
        endpoint=endpoint.target,
        certificate_file=endpoint.certificate,
        client_certificate_file=endpoint.client_certificate,
        client_key_file=endpoint.client_key,
        session=TlsSession(),
        headers=dict(endpoint.headers),
        timeout=endpoint.timeout,
        compression=Compression.Gzip if endpoint.compression == "gzip" else Compression.NoCompression,
    )


class _RepeatFilter(logging.Filter):
    """At most one record per message template per `interval` seconds. The SDK's OTLP exporters log
    every failed export (several lines per attempt); with the collector down for an hour that would
    be thousands of identical lines."""

    def __init__(self, interval: float = 60.0) -> None:
        super().__init__()
        self._interval = interval
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        now = time.monotonic()
        key = f"{record.name}:{record.msg}"
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                return False
            self._last[key] = now
        return True


_SDK_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk.metrics._internal.export",
)


def quiet_sdk_repeats() -> None:
    for name in _SDK_EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RepeatFilter) for f in logger.filters):
            logger.addFilter(_RepeatFilter())


def build_meter_provider(
    exporter: MetricExporter, interval: float, resource: Resource, metrics: OffcpuMetrics, timeout: float
) -> MeterProvider:
    reader = PeriodicExportingMetricReader(
        exporter,
        export_interval_millis=interval * 1000.0,
        export_timeout_millis=max(timeout, 1.0) * 1000.0 * 2,
    )
    quiet_sdk_repeats()
    provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
    metrics.register(provider)
    return provider


def shutdown(provider: MeterProvider, timeout: float) -> None:
    """Flushes the last collection (the final snapshot's totals) and stops the reader thread."""
    try:
        provider.shutdown(timeout_millis=max(0.0, timeout) * 1000.0)
    except Exception:  # shutdown must finish the exporter's exit, whatever the collector does
        log.exception("OTLP metrics: error at shutdown")
