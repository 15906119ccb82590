"""The OTLP sink: wiring only, resolved options -> encoder, transports and the metrics SDK."""

from __future__ import annotations

import argparse
import logging
import socket
import time
from functools import partial

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import OTELResourceDetector

from offcpu_exporter.formats.otlp_profiles import EncodeOptions, encode_profiles_split
from offcpu_exporter.sinks import SinkContext, SinkStats
from offcpu_exporter.snapshot import Snapshot

from . import metrics as otlp_metrics
from .endpoints import OtlpConfig, SignalEndpoint
from .profiles_delivery import ProfilesDelivery
from .profiles_transport import GrpcProfilesClient, HttpProfilesClient, ProfilesClient

__all__ = ["OtlpSink", "create"]

log = logging.getLogger(__name__)


class OtlpSink:
    """Profiles go through a background delivery queue; metrics through the SDK's own reader thread."""

    name = "otlp"

    def __init__(self, config: OtlpConfig, context: SinkContext, host_name: str | None = None) -> None:
        self.stats = SinkStats()
        self.config = config
        env_resource = {k: str(v) for k, v in OTELResourceDetector().detect().attributes.items()}
        host = host_name or env_resource.get("host.name") or socket.gethostname()
        self._profiles: ProfilesDelivery | None = None
        self._provider: MeterProvider | None = None
        if config.profiles is not None:
            encode_options = EncodeOptions(
                host_name=host,
                service_name=config.service_name,
                switches_profile=config.switches_profile,
                extra_resource_attributes=env_resource,
            )
            self._profiles = ProfilesDelivery(
                _profiles_client(config),
                partial(encode_profiles_split, options=encode_options),
                self.stats,
                queue_size=config.queue_size,
                max_delay=config.max_delay,
                timeout=config.profiles.timeout,
            )
        if config.metrics is not None:
            exporter = otlp_metrics.CountingMetricExporter(otlp_metrics.build_metric_exporter(config), self.stats)
            self._provider = otlp_metrics.build_meter_provider(
                exporter,
                config.metrics_interval,
                otlp_metrics.exporter_resource(host),
                otlp_metrics.OffcpuMetrics(
                    context.latest, config.top_stacks, config.stack_attribute, config.max_processes
                ),
                config.metrics.timeout,
            )

    def publish(self, snapshot: Snapshot) -> None:
        if self._profiles is not None:
            self._profiles.publish(snapshot)

    def close(self, timeout: float) -> None:
        """Both signals within `timeout`: pending profiles first (they are lost otherwise), then the
        final metrics export; profiles leave the metrics at least a quarter of the time."""
        end = time.monotonic() + max(0.0, timeout)
        if self._profiles is not None:
            share = timeout * 0.75 if self._provider is not None else timeout
            self._profiles.close(share)
        if self._provider is not None:
            otlp_metrics.shutdown(self._provider, max(0.1, end - time.monotonic()))


def _profiles_client(config: OtlpConfig) -> ProfilesClient:
    endpoint = config.profiles
    assert endpoint is not None
    if endpoint.protocol == "grpc":
        return GrpcProfilesClient(
            endpoint.target,
            credentials=endpoint.grpc_credentials(),
            headers=endpoint.headers,
            compression=endpoint.compression,
        )
    return HttpProfilesClient(
        endpoint.target,
        headers=endpoint.headers,
        compression=endpoint.compression,
        certificate=endpoint.certificate,
        client_cert=endpoint.requests_cert(),
    )


def create(options: argparse.Namespace, context: SinkContext) -> OtlpSink | None:
    """Raises ValueError (the CLI's one-line error, exit status 2) on contradictory options."""
    config = OtlpConfig.from_args(options)
    if config is None:
        return None
    sink = OtlpSink(config, context)
    log.info(
        "OTLP push: profiles %s, metrics %s every %.0f s",
        _describe(config.profiles),
        _describe(config.metrics),
        config.metrics_interval,
    )
    return sink


def _describe(endpoint: SignalEndpoint | None) -> str:
    if endpoint is None:
        return "off"
    tls = "plaintext" if endpoint.insecure else ("mTLS" if endpoint.client_certificate else "TLS")
    return f"{endpoint.target} ({endpoint.protocol}, {tls})"
