"""Command-line options of the OTLP sink, resolved with OpenTelemetry's environment variables.

Each signal (metrics, profiles) gets its own transport settings, as the OTLP exporter specification
lays out (https://opentelemetry.io/docs/specs/otel/protocol/exporter/): for every setting the
flag wins, then ``OTEL_EXPORTER_OTLP_<SIGNAL>_<SETTING>``, then ``OTEL_EXPORTER_OTLP_<SETTING>``,
then the default. A per-signal HTTP endpoint is used as it is; the generic one (and
``--otlp.endpoint``) is a base URL that gets ``/v1/metrics`` or ``/v1development/profiles``.
Durations in the environment are milliseconds (the specification), on the flags Go-style.
Environment values are read in `OtlpConfig.from_args` (endpoints.py), so a stray bad variable stops
start-up (exit status 2) only when the OTLP sink is actually on.
"""

from __future__ import annotations

import argparse
import os
import string
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from offcpu_exporter.config import format_duration, positive_int, seconds
from offcpu_exporter.series.selection import DEFAULT_LIMITS

# Defaults stated once: the flags' help, the OTLP config (endpoints.py) and the profiles delivery read them.
TIMEOUT = 10.0  # seconds per export attempt (OTEL_EXPORTER_OTLP_TIMEOUT's default)
METRICS_INTERVAL = 15.0  # seconds between metric exports
QUEUE_SIZE = 12  # profile requests kept while the collector is unreachable
MAX_DELAY = 60.0  # seconds a profile request may wait for delivery after its flush

__all__ = [
    "COMPRESSIONS",
    "HTTP_PATHS",
    "PROTOCOLS",
    "SERVICE_NAME_FIELDS",
    "SignalSettings",
    "add_arguments",
    "enabled",
]

PROTOCOLS = ("grpc", "http/protobuf")
COMPRESSIONS = ("gzip", "none")
HTTP_PATHS = {"metrics": "/v1/metrics", "profiles": "/v1development/profiles"}
SIGNALS = ("metrics", "profiles")
SERVICE_NAME_FIELDS = ("exe", "comm", "pid", "namespace", "pod", "container")
_T = TypeVar("_T")


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
    """The flags; `environ` is read later, by `OtlpConfig.from_args` (the argument stays for callers'
    symmetry)."""
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
    transport("TIMEOUT",
              f"timeout of one export attempt (default: {format_duration(TIMEOUT)}; milliseconds in the variables)",
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
        help=f"metrics export interval (default: {format_duration(METRICS_INTERVAL)}); profiles are pushed after "
        "every flush [OTEL_METRIC_EXPORT_INTERVAL, in ms]",
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
        default=DEFAULT_LIMITS.top_stacks,
        help="per-stack metrics: at most K stacks per process, the rest summed in stack_id=other "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--otlp.max-processes",
        dest="otlp_max_processes",
        metavar="N",
        type=_non_negative_int,
        default=DEFAULT_LIMITS.max_processes,
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
        default=QUEUE_SIZE,
        help="profile requests kept while the collector is unreachable; older ones are dropped (default: %(default)s)",
    )
    group.add_argument(
        "--otlp.max-delay",
        dest="otlp_max_delay",
        metavar="DURATION",
        type=seconds,
        default=MAX_DELAY,
        help="a profile request not delivered within this time after its flush is dropped "
        f"(default: {format_duration(MAX_DELAY)})",
    )


class SignalSettings:
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


def enabled(options: argparse.Namespace, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a signal that is on has an endpoint (from the flag or the environment): only then is
    the sink, with gRPC, requests and the OpenTelemetry SDK, imported (see `OtlpConfig.from_args`)."""
    env = os.environ if environ is None else environ
    on = [signal for signal in SIGNALS if getattr(options, f"otlp_{signal}")]
    return any(SignalSettings(signal, env).source(options.otlp_endpoint, "ENDPOINT") for signal in on)
