"""Command-line options of the OTLP sink, resolved with OpenTelemetry's environment variables.

Each signal (metrics, profiles) gets its own transport settings, as the OTLP exporter specification
lays out (https://opentelemetry.io/docs/specs/otel/protocol/exporter/): for every setting the
flag wins, then ``OTEL_EXPORTER_OTLP_<SIGNAL>_<SETTING>``, then ``OTEL_EXPORTER_OTLP_<SETTING>``,
then the default. A per-signal HTTP endpoint is used as it is; the generic one (and
``--otlp.endpoint``) is a base URL that gets ``/v1/metrics`` or ``/v1development/profiles``.
Durations in the environment are milliseconds (the specification), on the flags Go-style.
Environment values are read in `resolve`, so a stray bad variable stops start-up (exit status 2)
only when the OTLP sink is actually on.
"""

from __future__ import annotations

import argparse
import os
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
from opentelemetry.util.re import parse_env_headers

from offcpu_exporter.config import positive_int, seconds

__all__ = [
    "PROTOCOLS",
    "SERVICE_NAME_FIELDS",
    "OtlpConfig",
    "SignalEndpoint",
    "add_arguments",
    "resolve",
]

PROTOCOLS = ("grpc", "http/protobuf")
COMPRESSIONS = ("gzip", "none")
HTTP_PATHS = {"metrics": "/v1/metrics", "profiles": "/v1development/profiles"}
SIGNALS = ("metrics", "profiles")
SERVICE_NAME_FIELDS = ("exe", "comm", "pid", "namespace", "pod", "container")
_T = TypeVar("_T")


@dataclass(frozen=True)
class SignalEndpoint:
    """Where one signal goes and how. For gRPC `target` is ``host:port``; for HTTP it is the full URL."""

    target: str
    insecure: bool
    protocol: str = "grpc"
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    timeout: float = 10.0  # seconds, per attempt
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
    metrics_interval: float = 15.0
    service_name: str = "{exe}"
    top_stacks: int = 10
    max_processes: int = 200
    stack_attribute: bool = False
    switches_profile: bool = True
    queue_size: int = 12
    max_delay: float = 60.0

    @property
    def signals(self) -> tuple[SignalEndpoint, ...]:
        return tuple(s for s in (self.profiles, self.metrics) if s is not None)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


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


def _env(setting: str) -> str:
    return f"[OTEL_EXPORTER_OTLP_{{METRICS,PROFILES}}_{setting}, OTEL_EXPORTER_OTLP_{setting}]"


def add_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """The flags; `environ` is read later, by `resolve` (the argument stays for callers' symmetry)."""
    group = parser.add_argument_group(
        "OTLP push (OpenTelemetry Collector, Grafana Pyroscope)",
        "Off unless an endpoint is given here or in OTEL_EXPORTER_OTLP_ENDPOINT (or "
        "OTEL_EXPORTER_OTLP_{METRICS,PROFILES}_ENDPOINT). A flag applies to both signals; where it is "
        "not given, each signal takes its OTEL_EXPORTER_OTLP_<SIGNAL>_* variable, then the generic "
        "OTEL_EXPORTER_OTLP_* one (durations there in milliseconds), then the default.",
    )
    # The transport settings: each flag sets both signals; unset, each signal reads its variables.
    def transport(setting: str, what: str, **kwargs: Any) -> None:
        flag = setting.lower().replace("_", "-")
        group.add_argument(f"--otlp.{flag}", dest=f"otlp_{setting.lower()}", default=None,
                           help=f"{what} {_env(setting)}", **kwargs)

    transport("ENDPOINT", "collector base URL, e.g. http://127.0.0.1:4317 (grpc) or http://127.0.0.1:4318 "
              "(http/protobuf); a bare host:port means TLS unless --otlp.insecure", metavar="URL")
    transport("PROTOCOL", "transport (default: grpc)", choices=PROTOCOLS)
    transport("INSECURE", "plaintext instead of TLS; default: plaintext for http:// URLs, TLS otherwise",
              action=argparse.BooleanOptionalAction)
    transport("HEADERS", "request headers / gRPC metadata, e.g. X-Scope-OrgID=tenant1 (values URL-encoded)",
              metavar="K=V,...")
    transport("TIMEOUT", "timeout of one export attempt (default: 10s; milliseconds in the variables)",
              metavar="DURATION", type=seconds)
    transport("COMPRESSION", "(default: gzip)", choices=COMPRESSIONS)
    transport("CERTIFICATE", "CA bundle to verify the collector's TLS certificate (default: the system's)",
              metavar="PEM")
    transport("CLIENT_CERTIFICATE", "mTLS: this exporter's certificate (chain), for collectors that require one",
              metavar="PEM")
    transport("CLIENT_KEY", "mTLS: the private key of --otlp.client-certificate", metavar="PEM")
    group.add_argument(
        "--otlp.interval",
        dest="otlp_interval",
        metavar="DURATION",
        type=seconds,
        default=None,
        help="metrics export interval (default: 15s); profiles are pushed after every flush "
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


class _Settings:
    """One signal's settings: flag > OTEL_EXPORTER_OTLP_<SIGNAL>_<X> > OTEL_EXPORTER_OTLP_<X> > default."""

    def __init__(self, signal: str, env: Mapping[str, str]) -> None:
        self.signal = signal.upper()
        self.env = env

    def get(self, flag: _T | None, setting: str, parse: Callable[[str, str], _T], default: _T) -> _T:
        found = self.source(flag, setting)
        if found is None:
            return default
        name, raw = found
        return flag if flag is not None else parse(name, raw)  # type: ignore[return-value]

    def source(self, flag: object, setting: str) -> tuple[str, str] | None:
        """(where, raw value) of the setting that applies, or None for the default."""
        if flag is not None:
            return f"--otlp.{setting.lower().replace('_', '-')}", str(flag)
        for name in (f"OTEL_EXPORTER_OTLP_{self.signal}_{setting}", f"OTEL_EXPORTER_OTLP_{setting}"):
            raw = self.env.get(name, "").strip()
            if raw:
                return name, raw
        return None


def _signal_endpoint(signal: str, options: argparse.Namespace, env: Mapping[str, str]) -> SignalEndpoint | None:
    settings = _Settings(signal, env)
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
        timeout=settings.get(options.otlp_timeout, "TIMEOUT", _milliseconds, 10.0),
        compression=settings.get(options.otlp_compression, "COMPRESSION", _choice(COMPRESSIONS), "gzip"),
        certificate=files["CERTIFICATE"],
        client_certificate=files["CLIENT_CERTIFICATE"],
        client_key=files["CLIENT_KEY"],
    )


def resolve(options: argparse.Namespace, environ: Mapping[str, str] | None = None) -> OtlpConfig | None:
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
        interval = _milliseconds("OTEL_METRIC_EXPORT_INTERVAL", raw) if raw and metrics else 15.0
    return OtlpConfig(
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
