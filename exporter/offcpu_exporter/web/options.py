"""The web server's command-line options (`--web.*`, the exporter-toolkit flags) and listen address."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from offcpu_exporter.config import format_duration, seconds
from offcpu_exporter.web.config_file import WebConfigError

__all__ = ["WebOptions", "add_arguments", "parse_listen_address"]


@dataclass(frozen=True)
class WebOptions:
    listen_address: str = ":9961"
    config_file: str = ""
    max_requests: int = 40  # handler requests in flight; more get 503 (0: unlimited)
    read_header_timeout: float = 10.0
    idle_timeout: float = 60.0
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 1024 * 1024
    max_connections: int = 4096

    @classmethod
    def from_args(cls, options: argparse.Namespace) -> WebOptions:
        return cls(
            listen_address=options.web_listen_address,
            config_file=options.web_config_file,
            max_requests=options.web_max_requests,
            read_header_timeout=options.web_read_header_timeout,
            idle_timeout=options.web_idle_timeout,
            max_header_bytes=options.web_max_header_bytes,
            max_body_bytes=options.web_max_body_bytes,
            max_connections=options.web_max_connections,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("web server")
    d = WebOptions()
    g.add_argument(
        "--web.listen-address",
        dest="web_listen_address",
        default=d.listen_address,
        metavar="ADDR",
        help="address to serve /metrics and the other endpoints on, host:port (default %(default)s; "
        "an empty host means every interface)",
    )
    g.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default=d.config_file,
        metavar="FILE",
        help="web config (TLS, basic auth) in the Prometheus exporter-toolkit web-config.yml format",
    )
    g.add_argument(
        "--web.max-requests",
        dest="web_max_requests",
        type=int,
        default=d.max_requests,
        metavar="N",
        help="requests handled at once; more are answered 503 (0: no limit; default %(default)s)",
    )
    g.add_argument(
        "--web.read-header-timeout",
        dest="web_read_header_timeout",
        type=seconds,
        default=d.read_header_timeout,
        metavar="DURATION",
        help="time a client has to send a request's headers (and body) "
        f"(default {format_duration(d.read_header_timeout)})",
    )
    g.add_argument(
        "--web.idle-timeout",
        dest="web_idle_timeout",
        type=seconds,
        default=d.idle_timeout,
        metavar="DURATION",
        help=f"keep-alive connections idle this long are closed (default {format_duration(d.idle_timeout)})",
    )
    g.add_argument(
        "--web.max-header-bytes",
        dest="web_max_header_bytes",
        type=int,
        default=d.max_header_bytes,
        metavar="BYTES",
        help="largest request line + headers accepted (default %(default)s)",
    )
    g.add_argument(
        "--web.max-body-bytes",
        dest="web_max_body_bytes",
        type=int,
        default=d.max_body_bytes,
        metavar="BYTES",
        help="largest request body accepted (default %(default)s)",
    )
    g.add_argument(
        "--web.max-connections",
        dest="web_max_connections",
        type=int,
        default=d.max_connections,
        metavar="N",
        help="open connections at once; more are closed at accept (default %(default)s)",
    )


def parse_listen_address(address: str) -> tuple[str | None, int]:
    """``host:port`` (``:9961``, ``127.0.0.1:9961``, ``[::1]:9961``) to (host or None for all, port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise WebConfigError(f"--web.listen-address {address!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host or None), int(port_text)
