"""Flattening received OTLP metrics requests for assertions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

__all__ = ["Point", "points", "resource_of"]


def _any(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class Point:
    name: str
    unit: str
    attributes: dict[str, Any]
    value: float
    monotonic: bool
    cumulative: bool


def points(request: ExportMetricsServiceRequest, prefix: str = "offcpu.") -> list[Point]:
    out = []
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if not m.name.startswith(prefix) or m.WhichOneof("data") != "sum":
                    continue
                cumulative = (
                    m.sum.aggregation_temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
                )
                for dp in m.sum.data_points:
                    value = dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int
                    attrs = {kv.key: _any(kv.value) for kv in dp.attributes}
                    out.append(Point(m.name, m.unit, attrs, value, m.sum.is_monotonic, cumulative))
    return out


def resource_of(request: ExportMetricsServiceRequest) -> dict[str, Any]:
    return {kv.key: _any(kv.value) for kv in request.resource_metrics[0].resource.attributes}
