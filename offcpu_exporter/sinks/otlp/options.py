"""Command-line options of the OTLP sink and their defaults from the standard environment variables.

The OpenTelemetry environment variables (``OTEL_EXPORTER_OTLP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``)
are read here once, as option defaults, and the resolved values are handed to both the metrics
exporter (opentelemetry-sdk) and the profiles transport, so that the two signals never disagree
about an endpoint, a header or a timeout.
"""

from __future__ import annotations

import argparse
import os
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from opentelemetry.util.re import parse_env_headers

from offcpu_exporter.config import format_duration, positive_int, seconds

__all__ = [
    "PROTOCOLS",
    "SERVICE_NAME_FIELDS",
    "OtlpConfig",
    "SignalEndpoint",
    "add_arguments",
    "resolve",
]

PROTOCOLS = ("grpc", "http/protobuf")
HTTP_PATHS = {"metrics": "/v1/metrics", "profiles": "/v1development/profiles"}
SERVICE_NAME_FIELDS = ("exe", "comm", "pid", "namespace", "pod", "container")


@dataclass(frozen=True)
class SignalEndpoint:
    """Where one signal goes. For gRPC `target` is ``host:port``; for HTTP it is the full URL."""

    target: str
    insecure: bool


@dataclass(frozen=True)
class OtlpConfig:
    protocol: str
    profiles: SignalEndpoint | None
    metrics: SignalEndpoint | None
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    timeout: float = 10.0  # seconds, per attempt
    compression: str = "gzip"
    certificate: str | None = None
    metrics_interval: float = 15.0
    service_name: str = "{exe}"
    top_stacks: int = 10
    max_processes: int = 200
    stack_attribute: bool = False
    switches_profile: bool = True
    queue_size: int = 12
    max_delay: float = 60.0


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


@dataclass(frozen=True)
class _BadEnvironment:
    """An unusable environment value, reported by `resolve` (the CLI turns it into exit status 2)
    only when the sink is actually configured: a stray variable must not stop other commands."""

    name: str
    raw: str
    problem: str = "is not a positive number of milliseconds"

    def __str__(self) -> str:  # what --help shows as the default
        return f"invalid {self.name}"

    def error(self) -> ValueError:
        return ValueError(f"{self.name}={self.raw!r} {self.problem}")


def _milliseconds_env(name: str, default_seconds: float, environ: Mapping[str, str]) -> float | _BadEnvironment:
    """OTEL_* durations are milliseconds (the specification), unlike the options (seconds)."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default_seconds
    try:
        value = float(raw) / 1000.0
    except ValueError:
        return _BadEnvironment(name, raw)
    return value if value > 0 else _BadEnvironment(name, raw)


def _shown(default: float | _BadEnvironment) -> str:
    return format_duration(default) if isinstance(default, float) else str(default)


def _bool_env(name: str, environ: Mapping[str, str]) -> bool | None:
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return None
    return raw == "true"


def _service_name_template(text: str) -> str:
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"bad template {text!r}: {error}") from None
    unknown = names - set(SERVICE_NAME_FIELDS)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown field(s) {', '.join(sorted(unknown))} in {text!r}; known: {', '.join(SERVICE_NAME_FIELDS)}"
        )
    return text


def add_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    env = os.environ if environ is None else environ
    group = parser.add_argument_group(
        "OTLP push (OpenTelemetry Collector, Grafana Pyroscope)",
        "Off unless an endpoint is given here or in OTEL_EXPORTER_OTLP_ENDPOINT "
        "(or OTEL_EXPORTER_OTLP_{METRICS,PROFILES}_ENDPOINT). Defaults come from the standard "
        "OTEL_EXPORTER_OTLP_* variables.",
    )
    group.add_argument(
        "--otlp.endpoint",
        dest="otlp_endpoint",
        metavar="URL",
        default=None,
        help="collector base URL, e.g. http://127.0.0.1:4317 (grpc) or http://127.0.0.1:4318 "
        "(http/protobuf); a bare host:port means TLS unless --otlp.insecure "
        "[OTEL_EXPORTER_OTLP_ENDPOINT]",
    )
    raw_protocol = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip() or "grpc"
    protocol_default: str | _BadEnvironment = (
        raw_protocol
        if raw_protocol in PROTOCOLS
        else _BadEnvironment("OTEL_EXPORTER_OTLP_PROTOCOL", raw_protocol, f"is not one of {', '.join(PROTOCOLS)}")
    )
    group.add_argument(
        "--otlp.protocol",
        dest="otlp_protocol",
        choices=PROTOCOLS,
        default=protocol_default,
        help="transport for both signals (default: %(default)s) [OTEL_EXPORTER_OTLP_PROTOCOL]",
    )
    group.add_argument(
        "--otlp.insecure",
        dest="otlp_insecure",
        action=argparse.BooleanOptionalAction,
        default=_bool_env("OTEL_EXPORTER_OTLP_INSECURE", env),
        help="plaintext instead of TLS; default: plaintext for http:// URLs, TLS otherwise "
        "[OTEL_EXPORTER_OTLP_INSECURE]",
    )
    group.add_argument(
        "--otlp.headers",
        dest="otlp_headers",
        metavar="K=V,...",
        default=env.get("OTEL_EXPORTER_OTLP_HEADERS", ""),
        help="request headers / gRPC metadata, e.g. X-Scope-OrgID=tenant1 (values URL-encoded) "
        "[OTEL_EXPORTER_OTLP_HEADERS]",
    )
    timeout_default = _milliseconds_env("OTEL_EXPORTER_OTLP_TIMEOUT", 10.0, env)
    group.add_argument(
        "--otlp.timeout",
        dest="otlp_timeout",
        metavar="DURATION",
        type=seconds,
        default=timeout_default,
        help=f"timeout of one export attempt (default: {_shown(timeout_default)}) [OTEL_EXPORTER_OTLP_TIMEOUT, in ms]",
    )
    raw_compression = env.get("OTEL_EXPORTER_OTLP_COMPRESSION", "").strip().lower() or "gzip"
    compression_default: str | _BadEnvironment = (
        raw_compression
        if raw_compression in ("gzip", "none")
        else _BadEnvironment("OTEL_EXPORTER_OTLP_COMPRESSION", raw_compression, "is not gzip or none")
    )
    group.add_argument(
        "--otlp.compression",
        dest="otlp_compression",
        choices=("gzip", "none"),
        default=compression_default,
        help="(default: %(default)s) [OTEL_EXPORTER_OTLP_COMPRESSION]",
    )
    group.add_argument(
        "--otlp.certificate",
        dest="otlp_certificate",
        metavar="PEM",
        default=env.get("OTEL_EXPORTER_OTLP_CERTIFICATE") or None,
        help="CA bundle to verify the collector's TLS certificate [OTEL_EXPORTER_OTLP_CERTIFICATE]",
    )
    interval_default = _milliseconds_env("OTEL_METRIC_EXPORT_INTERVAL", 15.0, env)
    group.add_argument(
        "--otlp.interval",
        dest="otlp_interval",
        metavar="DURATION",
        type=seconds,
        default=interval_default,
        help=f"metrics export interval (default: {_shown(interval_default)}); profiles are pushed after every flush "
        "[OTEL_METRIC_EXPORT_INTERVAL, in ms]",
    )
    group.add_argument(
        "--otlp.profiles",
        dest="otlp_profiles",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="push off-CPU profiles (default: on)",
    )
    group.add_argument(
        "--otlp.metrics",
        dest="otlp_metrics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="push the off-CPU counters as OTLP metrics (default: on)",
    )
    group.add_argument(
        "--otlp.switches-profile",
        dest="otlp_switches_profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also send the switch counts as a second profile off_cpu_switches/count (default: on)",
    )
    group.add_argument(
        "--otlp.service-name",
        dest="otlp_service_name",
        metavar="TEMPLATE",
        type=_service_name_template,
        default="{exe}",
        help="service.name of each profiled process; fields: "
        + ", ".join(f"{{{f}}}" for f in SERVICE_NAME_FIELDS)
        + " (default: %(default)s)",
    )
    group.add_argument(
        "--otlp.top-stacks",
        dest="otlp_top_stacks",
        metavar="K",
        type=positive_int,
        default=10,
        help="per-stack metrics: at most K stacks per process, the rest summed in stack_id=other "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--otlp.max-processes",
        dest="otlp_max_processes",
        metavar="N",
        type=_non_negative_int,
        default=200,
        help="processes with their own metric series; the rest are summed in one series with "
        "process.executable.name=other (0: no limit; default: %(default)s)",
    )
    group.add_argument(
        "--otlp.stack-attribute",
        dest="otlp_stack_attribute",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="add the folded stack as attribute offcpu.stack to per-stack metrics (default: off)",
    )
    group.add_argument(
        "--otlp.queue-size",
        dest="otlp_queue_size",
        metavar="N",
        type=positive_int,
        default=12,
        help="profile requests kept while the collector is unreachable; older ones are dropped (default: %(default)s)",
    )
    group.add_argument(
        "--otlp.max-delay",
        dest="otlp_max_delay",
        metavar="DURATION",
        type=seconds,
        default=60.0,
        help="a profile request not delivered within this time after its flush is dropped (default: 1m)",
    )


def _split_endpoint(url: str, insecure: bool | None, what: str) -> tuple[str, str, bool]:
    """Returns (host:port, path, insecure) for a base URL or a bare host:port."""
    url = url.strip()
    parts = urlsplit(url) if "://" in url else None
    if parts is None:
        host_port, path = url, ""
        tls_default = True  # the SDK's rule: no scheme means TLS unless told otherwise
    else:
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{what}: scheme must be http or https: {url!r}")
        host_port, path = parts.netloc, parts.path.rstrip("/")
        tls_default = parts.scheme == "https"
    if not host_port or "/" in host_port:
        raise ValueError(f"{what}: expected a URL such as http://host:4317 or host:port, got {url!r}")
    if parts is not None and parts.scheme == "https" and insecure:
        raise ValueError(f"{what}: https:// together with --otlp.insecure")
    effective_insecure = (not tls_default) if insecure is None else insecure
    return host_port, path, effective_insecure


def _signal_endpoint(
    signal: str, protocol: str, flag: str | None, insecure: bool | None, env: Mapping[str, str]
) -> SignalEndpoint | None:
    """`--otlp.endpoint` is a base URL for both signals; so is OTEL_EXPORTER_OTLP_ENDPOINT, while
    OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT is used as-is (the OTLP exporter specification's rule)."""
    specific = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
    general = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if flag:
        url, as_is, what = flag, False, "--otlp.endpoint"
    elif specific:
        url, as_is, what = specific, True, f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
    elif general:
        url, as_is, what = general, False, "OTEL_EXPORTER_OTLP_ENDPOINT"
    else:
        return None
    host_port, path, effective_insecure = _split_endpoint(url, insecure, what)
    if protocol == "grpc":
        # gRPC has no URL path: the service name is the path. A path here is almost always a
        # copy of an OTLP/HTTP URL, which would silently go nowhere.
        if path:
            raise ValueError(f"{what}: a gRPC endpoint has no path: {url!r}")
        return SignalEndpoint(host_port, effective_insecure)
    scheme = "http" if effective_insecure else "https"
    full_path = path if as_is else path + HTTP_PATHS[signal]
    return SignalEndpoint(f"{scheme}://{host_port}{full_path}", effective_insecure)


def _any_endpoint_env(env: Mapping[str, str]) -> bool:
    names = (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    )
    return any(env.get(n, "").strip() for n in names)


def resolve(options: argparse.Namespace, environ: Mapping[str, str] | None = None) -> OtlpConfig | None:
    """The sink's configuration, or None when it is off. Raises ValueError on contradictory input."""
    env = os.environ if environ is None else environ
    for value in (options.otlp_protocol, options.otlp_compression, options.otlp_timeout, options.otlp_interval):
        if isinstance(value, _BadEnvironment) and (options.otlp_endpoint or _any_endpoint_env(env)):
            raise value.error()
    protocol = options.otlp_protocol
    profiles = (
        _signal_endpoint("profiles", protocol, options.otlp_endpoint, options.otlp_insecure, env)
        if options.otlp_profiles
        else None
    )
    metrics = (
        _signal_endpoint("metrics", protocol, options.otlp_endpoint, options.otlp_insecure, env)
        if options.otlp_metrics
        else None
    )
    if profiles is None and metrics is None:
        return None
    raw_headers = options.otlp_headers or ""
    headers = dict(parse_env_headers(raw_headers, liberal=True)) if raw_headers.strip() else {}
    for name in headers:
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"--otlp.headers: bad header name {name!r}")
    if options.otlp_certificate and not os.path.isfile(options.otlp_certificate):
        raise ValueError(f"--otlp.certificate: no such file: {options.otlp_certificate}")
    return OtlpConfig(
        protocol=protocol,
        profiles=profiles,
        metrics=metrics,
        headers=headers,
        timeout=options.otlp_timeout,
        compression=options.otlp_compression,
        certificate=options.otlp_certificate,
        metrics_interval=options.otlp_interval,
        service_name=options.otlp_service_name,
        top_stacks=options.otlp_top_stacks,
        max_processes=options.otlp_max_processes,
        stack_attribute=options.otlp_stack_attribute,
        switches_profile=options.otlp_switches_profile,
        queue_size=options.otlp_queue_size,
        max_delay=options.otlp_max_delay,
    )
