"""The OTLP sink's configuration resolved from its options and OpenTelemetry's environment variables
(the rules are in `options`): where each signal goes and how, checked, or a ValueError that stops
start-up with one line (exit status 2)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import grpc
from opentelemetry.util.re import parse_env_headers

from offcpu_exporter.series.selection import DEFAULT_LIMITS

from .options import (
    COMPRESSIONS,
    HTTP_PATHS,
    MAX_DELAY,
    METRICS_INTERVAL,
    PROTOCOLS,
    QUEUE_SIZE,
    TIMEOUT,
    SignalSettings,
)

__all__ = ["OtlpConfig", "SignalEndpoint"]


@dataclass(frozen=True)
class SignalEndpoint:
    """Where one signal goes and how. For gRPC `target` is ``host:port``; for HTTP it is the full URL."""

    target: str
    insecure: bool
    protocol: str = "grpc"
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    timeout: float = TIMEOUT  # seconds, per attempt
    compression: str = "gzip"
    certificate: str | None = None  # CA bundle that verifies the collector
    client_certificate: str | None = None  # mTLS: this exporter's certificate chain and key
    client_key: str | None = None

    def grpc_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS (and mTLS) credentials of a gRPC channel; None when plaintext."""
        if self.insecure:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.certificate),
            private_key=_read(self.client_key),
            certificate_chain=_read(self.client_certificate),
        )

    def requests_cert(self) -> tuple[str, str] | None:
        """The client certificate and key for `requests` (mTLS over HTTP)."""
        if self.client_certificate and self.client_key:
            return self.client_certificate, self.client_key
        return None


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


@dataclass(frozen=True)
class OtlpConfig:
    profiles: SignalEndpoint | None
    metrics: SignalEndpoint | None
    metrics_interval: float = METRICS_INTERVAL
    service_name: str = "{exe}"
    top_stacks: int = DEFAULT_LIMITS.top_stacks
    max_processes: int = DEFAULT_LIMITS.max_processes
    stack_attribute: bool = False
    switches_profile: bool = True
    queue_size: int = QUEUE_SIZE
    max_delay: float = MAX_DELAY

    @classmethod
    def from_args(cls, options: argparse.Namespace, environ: Mapping[str, str] | None = None) -> OtlpConfig | None:
        """The sink's configuration, or None when it is off. Raises ValueError on contradictory input,
        and on an unusable environment value of a signal that is on."""
        env = os.environ if environ is None else environ
        profiles = _signal_endpoint("profiles", options, env) if options.otlp_profiles else None
        metrics = _signal_endpoint("metrics", options, env) if options.otlp_metrics else None
        if profiles is None and metrics is None:
            return None
        interval = options.otlp_interval
        if interval is None:
            raw = env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
            interval = _milliseconds("OTEL_METRIC_EXPORT_INTERVAL", raw) if raw and metrics else METRICS_INTERVAL
        return cls(
            profiles=profiles,
            metrics=metrics,
            metrics_interval=interval,
            service_name=options.otlp_service_name,
            top_stacks=options.otlp_top_stacks,
            max_processes=options.otlp_max_processes,
            stack_attribute=options.otlp_stack_attribute,
            switches_profile=options.otlp_switches_profile,
            queue_size=options.otlp_queue_size,
            max_delay=options.otlp_max_delay,
        )

    @property
    def signals(self) -> tuple[SignalEndpoint, ...]:
        return tuple(s for s in (self.profiles, self.metrics) if s is not None)


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


# -- parsers of environment values: (variable name, raw text) -> value, or ValueError naming the variable


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.lower() if choices is COMPRESSIONS else raw
        if value not in choices:
            raise ValueError(f"{name}={raw!r} is not one of {', '.join(choices)}")
        return value

    return parse


def _milliseconds(name: str, raw: str) -> float:
    try:
        value = float(raw) / 1000.0
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{name}={raw!r} is not a positive number of milliseconds")
    return value


def _boolean(name: str, raw: str) -> bool:
    return raw.lower() == "true"


def _signal_endpoint(signal: str, options: argparse.Namespace, env: Mapping[str, str]) -> SignalEndpoint | None:
    settings = SignalSettings(signal, env)
    where = settings.source(options.otlp_endpoint, "ENDPOINT")
    if where is None:
        return None
    what, url = where
    # A per-signal URL is the whole URL; --otlp.endpoint and the generic variable are base URLs.
    as_is = what == f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
    protocol = settings.get(options.otlp_protocol, "PROTOCOL", _choice(PROTOCOLS), "grpc")
    insecure = settings.get(options.otlp_insecure, "INSECURE", _boolean, None)  # type: ignore[arg-type]
    host_port, path, effective_insecure = _split_endpoint(url, insecure, what)
    if protocol == "grpc":
        # gRPC has no URL path: the service name is the path. A path here is almost always a
        # copy of an OTLP/HTTP URL, which would silently go nowhere.
        if path:
            raise ValueError(f"{what}: a gRPC endpoint has no path: {url!r}")
        target = host_port
    else:
        scheme = "http" if effective_insecure else "https"
        target = f"{scheme}://{host_port}{path if as_is else path + HTTP_PATHS[signal]}"
    headers_from = settings.source(options.otlp_headers, "HEADERS")
    headers = dict(parse_env_headers(headers_from[1], liberal=True)) if headers_from else {}
    for name in headers:
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"{headers_from[0]}: bad header name {name!r}")  # type: ignore[index]
    files = {}
    for setting in ("CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"):
        flag = getattr(options, f"otlp_{setting.lower()}")
        found = settings.source(flag, setting)
        if found is not None and not os.path.isfile(found[1]):
            raise ValueError(f"{found[0]}: no such file: {found[1]}")
        files[setting] = found[1] if found else None
    if bool(files["CLIENT_CERTIFICATE"]) != bool(files["CLIENT_KEY"]):
        raise ValueError(f"{signal}: a client certificate needs its key and a key its certificate "
                         "(--otlp.client-certificate, --otlp.client-key)")
    if files["CLIENT_CERTIFICATE"] and effective_insecure:
        raise ValueError(f"{signal}: a client certificate (mTLS) needs TLS, but the endpoint is plaintext ({url!r})")
    return SignalEndpoint(
        target=target,
        insecure=effective_insecure,
        protocol=protocol,
        headers=headers,
        timeout=settings.get(options.otlp_timeout, "TIMEOUT", _milliseconds, TIMEOUT),
        compression=settings.get(options.otlp_compression, "COMPRESSION", _choice(COMPRESSIONS), "gzip"),
        certificate=files["CERTIFICATE"],
        client_certificate=files["CLIENT_CERTIFICATE"],
        client_key=files["CLIENT_KEY"],
    )
