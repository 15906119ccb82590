"""The exporter's HTTP server: the handlers registered in `offcpu_exporter.web.Routes`, plus `/` (an
index page), `/healthz` (alive) and `/readyz` (the probe is attached).

Why asyncio rather than `ThreadingHTTPServer`: a thread per connection makes 1,000 idle
keep-alive connections 1,000 threads, and its socket timeout applies to each `recv`, so a client
sending one header byte per second never trips it (slowloris). Here one event-loop thread owns
all sockets: an idle connection costs a coroutine, and every request has a real deadline for its
headers (`asyncio.timeout_at`), like Go's `http.Server.ReadHeaderTimeout`; TLS handshakes get
the same deadline. Handlers, which may block (a pprof profile waits N seconds), run on a bounded
thread pool, so they block neither other requests nor the probe loop. The HTTP/1.1 subset an
exporter needs (GET/HEAD, Content-Length bodies, keep-alive) is parsed here with explicit limits.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import gzip
import html
import http
import logging
import resource
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from urllib.parse import parse_qs, unquote, urlsplit

from offcpu_exporter.config import format_duration, seconds
from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.web import Request, Response, Routes
from offcpu_exporter.web.auth import BasicAuth
from offcpu_exporter.web.config_file import WebConfig, WebConfigError, load_web_config

__all__ = ["WebOptions", "WebServer", "add_arguments", "parse_listen_address"]

log = logging.getLogger(__name__)

_GZIP_MIN_BYTES = 1024
_WRITE_TIMEOUT_S = 60.0
_BUILTIN_PATHS = ("/", "/healthz", "/readyz")


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
    def from_namespace(cls, ns: argparse.Namespace) -> WebOptions:
        return cls(
            listen_address=ns.web_listen_address,
            config_file=ns.web_config_file,
            max_requests=ns.web_max_requests,
            read_header_timeout=ns.web_read_header_timeout,
            idle_timeout=ns.web_idle_timeout,
            max_header_bytes=ns.web_max_header_bytes,
            max_body_bytes=ns.web_max_body_bytes,
            max_connections=ns.web_max_connections,
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


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Closed(Exception):
    """The client went away or ran out of time: close without answering (as Go's server does)."""


@dataclass
class _Parsed:
    request: Request
    keep_alive: bool


class WebServer:
    """``WebServer(routes, options, ready).start()``; ``stop()`` at shutdown."""

    def __init__(
        self,
        routes: Routes,
        options: WebOptions | argparse.Namespace,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self._opts = options if isinstance(options, WebOptions) else WebOptions.from_namespace(options)
        self._routes = routes
        self._ready = ready
        self._host, self._port = parse_listen_address(self._opts.listen_address)
        for name in ("max_requests", "max_header_bytes", "max_body_bytes", "max_connections"):
            if getattr(self._opts, name) < 0:
                raise WebConfigError(f"--web.{name.replace('_', '-')} must not be negative")
        if self._opts.read_header_timeout <= 0 or self._opts.idle_timeout <= 0:
            raise WebConfigError("--web.read-header-timeout and --web.idle-timeout must be positive")
        self._config: WebConfig = load_web_config(self._opts.config_file) if self._opts.config_file else WebConfig()
        self._ssl: ssl.SSLContext | None = self._config.tls.context() if self._config.tls else None
        self._auth = BasicAuth(self._config.users)
        workers = self._opts.max_requests or 64
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="web-handler")
        # bcrypt checks are serialized anyway (BasicAuth); one thread keeps them off the loop.
        self._auth_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="web-auth")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._open = 0
        self._warn = RateLimitedLog(log, interval=60.0)
        self.addresses: list[tuple[str, int]] = []

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self.addresses[0][1] if self.addresses else self._port

    @property
    def url(self) -> str:
        host = self.addresses[0][0] if self.addresses else (self._host or "127.0.0.1")
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self._ssl else 'http'}://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        """Bind and serve on a background thread; raises OSError when the address cannot be bound."""
        _raise_open_files_limit()
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="web", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._bind(), loop).result(timeout)
        except BaseException:
            self.stop()
            raise
        log.info(
            "serving on %s (TLS %s, basic auth %s)",
            self.url,
            "on" if self._ssl else "off",
            "on" if self._auth.enabled else "off",
        )

    def stop(self, timeout: float = 5.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._auth_pool.shutdown(wait=False, cancel_futures=True)
        self._loop = self._thread = None

    async def _bind(self) -> None:
        self._server = await asyncio.start_server(
            self._connection,
            self._host,
            self._port,
            ssl=self._ssl,
            ssl_handshake_timeout=self._opts.read_header_timeout if self._ssl else None,
            limit=max(self._opts.max_header_bytes, 1024),
            backlog=1024,
            reuse_address=True,
        )
        self.addresses = [s.getsockname()[:2] for s in self._server.sockets]

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)

    # ---- one connection ----------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self._opts.max_connections and self._open >= self._opts.max_connections:
            self._warn.warning("%d connections open: closing a new one", self._open)
            writer.transport.abort()
            return
        self._open += 1
        if task is not None:
            self._tasks.add(task)  # type: ignore[arg-type]
        try:
            if not self._client_san_allowed(writer):
                return
            accepted = asyncio.get_running_loop().time()
            first = True
            while True:
                try:
                    parsed = await self._read_request(reader, accepted if first else None)
                except _BadRequest as e:
                    await self._write(writer, Response(e.status, (e.message + "\n").encode()), False, False)
                    return
                first = False
                response = await self._respond(parsed.request)
                keep = parsed.keep_alive and self._loop is not None
                await self._write(writer, response, parsed.request.method == "HEAD", keep)
                if not keep:
                    return
        except (_Closed, ConnectionError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not kill the server
            log.exception("web connection failed")
        finally:
            self._open -= 1
            if task is not None:
                self._tasks.discard(task)  # type: ignore[arg-type]
            writer.close()

    def _client_san_allowed(self, writer: asyncio.StreamWriter) -> bool:
        allowed = self._config.tls.client_allowed_sans if self._config.tls else ()
        if not allowed:
            return True
        cert = writer.get_extra_info("peercert") or {}
        names = {value for _kind, value in cert.get("subjectAltName", ())}
        if names.intersection(allowed):
            return True
        self._warn.warning("client certificate SANs %s not in client_allowed_sans", sorted(names))
        return False

    async def _read_request(self, reader: asyncio.StreamReader, accepted: float | None) -> _Parsed:
        loop = asyncio.get_running_loop()
        opts = self._opts
        try:
            if accepted is not None:
                # A new connection: the whole request head within the header timeout from accept.
                deadline = accepted + opts.read_header_timeout
                async with asyncio.timeout_at(deadline):
                    first = await reader.readexactly(1)
            else:
                # Keep-alive: wait up to the idle timeout for the next request to begin.
                async with asyncio.timeout(opts.idle_timeout):
                    first = await reader.readexactly(1)
                deadline = loop.time() + opts.read_header_timeout
            async with asyncio.timeout_at(deadline):
                head = first + await reader.readuntil(b"\r\n\r\n")
                parsed, length = self._parse_head(head)
                if length:
                    body = await reader.readexactly(length)
                    parsed = _Parsed(_with_body(parsed.request, body), parsed.keep_alive)
                return parsed
        except asyncio.LimitOverrunError:
            raise _BadRequest(431, "request header fields too large") from None
        except (TimeoutError, asyncio.IncompleteReadError):
            raise _Closed from None

    def _parse_head(self, head: bytes) -> tuple[_Parsed, int]:
        if len(head) > self._opts.max_header_bytes:
            raise _BadRequest(431, "request header fields too large")
        lines = head[:-4].decode("latin-1").lstrip("\r\n").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper():
            raise _BadRequest(400, "malformed request line")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _BadRequest(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
                raise _BadRequest(400, "malformed header line")
            key, value = name.lower(), value.strip(" \t")
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if "transfer-encoding" in headers:
            raise _BadRequest(501, "chunked request bodies are not supported")
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit():
            raise _BadRequest(400, "bad Content-Length")
        length = int(length_text)
        if length > self._opts.max_body_bytes:
            raise _BadRequest(413, "request body too large")
        if not (target.startswith("/") or target.startswith(("http://", "https://"))):
            raise _BadRequest(400, "bad request target")
        split = urlsplit(target)
        connection = headers.get("connection", "").lower()
        keep_alive = version == "HTTP/1.1" and "close" not in connection
        request = Request(
            method=method,
            path=unquote(split.path) or "/",
            query=parse_qs(split.query, keep_blank_values=True),
            headers=headers,
        )
        return _Parsed(request, keep_alive), length

    # ---- answering -----------------------------------------------------------------------------

    async def _respond(self, request: Request) -> Response:
        loop = asyncio.get_running_loop()
        if self._auth.enabled:
            authorization = request.headers.get("authorization")
            # Cached successes are checked on the loop, so that password guessers queueing bcrypt
            # checks on the auth thread do not delay scrapes with known credentials.
            ok = self._auth.check_cached(authorization)
            if ok is None:
                ok = await loop.run_in_executor(self._auth_pool, self._auth.check, authorization)
            if not ok:
                return Response(401, b"Unauthorized\n", headers={"WWW-Authenticate": "Basic"})
        if request.path in _BUILTIN_PATHS:
            # Served on the loop, outside the request limit: a busy exporter is still alive.
            return self._builtin(request)
        handler = self._routes.get(request.path)
        if handler is None:
            return Response(404, b"404 page not found\n")
        limit = self._opts.max_requests
        if limit and self._in_flight >= limit:
            self._warn.warning("more than %d requests at once: answering 503", limit)
            return Response(503, f"Limit of concurrent requests reached ({limit}), try again later.\n".encode())
        self._in_flight += 1
        try:
            return await loop.run_in_executor(self._pool, self._handle, handler, request)
        finally:
            self._in_flight -= 1

    def _handle(self, handler: Callable[[Request], Response], request: Request) -> Response:
        """On a worker thread: the handler, then gzip when the client takes it."""
        try:
            response = handler(request)
        except Exception:
            log.exception("handler for %s failed", request.path)
            return Response(500, b"internal server error\n")
        if (
            len(response.body) >= _GZIP_MIN_BYTES
            and not any(k.lower() == "content-encoding" for k in response.headers)
            and accepts_gzip(request.headers.get("accept-encoding", ""))
        ):
            headers = {**response.headers, "Content-Encoding": "gzip"}
            return Response(response.status, gzip.compress(response.body, 6, mtime=0), response.content_type, headers)
        return response

    def _builtin(self, request: Request) -> Response:
        if request.path == "/healthz":
            return Response(200, b"OK\n")
        if request.path == "/readyz":
            try:
                ready = bool(self._ready())
            except Exception:
                log.exception("readiness check failed")
                ready = False
            return Response(200, b"OK\n") if ready else Response(503, b"probe not attached\n")
        links = "".join(
            f'<li><a href="{html.escape(p)}">{html.escape(p)}</a></li>'
            for p in [*self._routes.paths(), "/healthz", "/readyz"]
        )
        page = (
            '<!DOCTYPE html><html><head><meta charset="utf-8"><title>offcpu-exporter</title></head>'
            "<body><h1>offcpu-exporter</h1><p>Off-CPU time per process and stack.</p>"
            f"<ul>{links}</ul></body></html>\n"
        )
        return Response(200, page.encode(), "text/html; charset=utf-8")

    async def _write(self, writer: asyncio.StreamWriter, response: Response, head_only: bool, keep_alive: bool) -> None:
        try:
            reason = http.HTTPStatus(response.status).phrase
        except ValueError:
            reason = "Status"
        lines = [
            f"HTTP/1.1 {response.status} {reason}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            f"Date: {formatdate(usegmt=True)}",
        ]
        encoded = any(k.lower() == "content-encoding" for k in response.headers)
        if encoded:
            lines.append("Vary: Accept-Encoding")
        lines.extend(f"{k}: {v}" for k, v in response.headers.items() if _header_ok(k, v))
        lines.extend(f"{k}: {v}" for k, v in self._config.headers.items())
        if not keep_alive:
            lines.append("Connection: close")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
        writer.write(data if head_only else data + response.body)
        async with asyncio.timeout(_WRITE_TIMEOUT_S):
            await writer.drain()


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding value allows gzip (honouring ``q=0``)."""
    wildcard = False
    for part in accept_encoding.split(","):
        token, *params = part.split(";")
        token = token.strip().lower()
        q = 1.0
        for p in params:
            k, _, v = p.strip().partition("=")
            if k.strip().lower() == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        if token in ("gzip", "x-gzip"):
            return q > 0
        if token == "*":
            wildcard = q > 0
    return wildcard


def _header_ok(name: str, value: str) -> bool:
    return not any(c in name or c in value for c in "\r\n")


def _with_body(request: Request, body: bytes) -> Request:
    # Request has no body field: exporter endpoints take parameters in the query string. A body
    # is read (bounded) only to keep the connection in sync, and form bodies merge into query.
    if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        merged = {**request.query}
        for k, v in parse_qs(body.decode("latin-1"), keep_blank_values=True).items():
            merged.setdefault(k, []).extend(v)
        return Request(request.method, request.path, merged, request.headers)
    return request


def _raise_open_files_limit() -> None:
    # Each connection is a file descriptor; Go raises the soft RLIMIT_NOFILE to the hard limit
    # at start for the same reason (https://github.com/golang/go/issues/46279).
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
