"""The exporter's HTTP server: the handlers registered in `offcpu_exporter.web.Routes`, plus `/` (an
index page), `/healthz` (alive) and `/readyz` (the probe is attached).

Why asyncio rather than `ThreadingHTTPServer`: a thread per connection makes 1,000 idle
keep-alive connections 1,000 threads, and its socket timeout applies to each `recv`, so a client
sending one header byte per second never trips it (slowloris). Here one event-loop thread owns
all sockets: an idle connection costs a coroutine, and every request has a real deadline for its
headers (`asyncio.timeout_at`), like Go's `http.Server.ReadHeaderTimeout`; TLS handshakes get
the same deadline. Handlers, which may block (a pprof profile waits N seconds), run on a bounded
thread pool, so they block neither other requests nor the probe loop. The bytes on the wire are
`http1`'s job (through h11), gzip `compression`'s, basic auth `auth`'s, the web config in force
`config_watch`'s, the flags `options`'.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import html
import logging
import resource
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass

from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.web import Request, Response, Routes
from offcpu_exporter.web.compression import gzip_if_accepted
from offcpu_exporter.web.config_file import WebConfig, WebConfigError
from offcpu_exporter.web.config_watch import WebConfigWatcher
from offcpu_exporter.web.http1 import BadRequest, ClientGone, Head, Http1Connection
from offcpu_exporter.web.options import WebOptions, parse_listen_address

__all__ = ["WebCounters", "WebServer"]

log = logging.getLogger(__name__)

_WRITE_TIMEOUT_S = 60.0
# After refusing a request, what the client still sends is read and dropped for this long (or up to
# this many bytes) before closing: closing with unread bytes makes the kernel send a reset, which can
# destroy the error response before the client reads it. Go's server waits 500 ms the same way.
_LINGER_S = 0.5
_LINGER_BYTES = 1 << 20
_BUILTIN_PATHS = ("/", "/healthz", "/readyz")


class _Closed(Exception):
    """The client went away or ran out of time: close without answering (as Go's server does)."""


@dataclass(frozen=True)
class WebCounters:
    bad_requests: int  # requests refused as malformed or too large (4xx/5xx from the parser)
    config_reloads: int  # changed web config files put in force
    config_reload_failures: int  # changed web config files that did not load (the last good one stayed)


class WebServer:
    """``WebServer(routes, options, ready).start()``; ``stop()`` at shutdown."""

    def __init__(
        self,
        routes: Routes,
        options: WebOptions,
        ready: Callable[[], bool] = lambda: True,
        config_check_interval: float = 1.0,
    ) -> None:
        self._opts = options
        self._routes = routes
        self._ready = ready
        self._host, self._port = parse_listen_address(self._opts.listen_address)
        for name in ("max_requests", "max_header_bytes", "max_body_bytes", "max_connections"):
            if getattr(self._opts, name) < 0:
                raise WebConfigError(f"--web.{name.replace('_', '-')} must not be negative")
        if self._opts.read_header_timeout <= 0 or self._opts.idle_timeout <= 0:
            raise WebConfigError("--web.read-header-timeout and --web.idle-timeout must be positive")
        self._web_config = WebConfigWatcher(self._opts.config_file, config_check_interval)
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
        self._bad_requests = 0
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
        return f"{'https' if self._web_config.tls else 'http'}://{host}:{self.port}"

    def counters(self) -> WebCounters:
        return WebCounters(self._bad_requests, self._web_config.reloads, self._web_config.failures)

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
            "on" if self._web_config.tls else "off",
            "on" if self._web_config.current().auth.enabled else "off",
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
            serving = self._web_config.current()
            if serving.ssl_context is not None:
                # TLS starts here rather than in start_server, so that every connection gets the
                # context of the config in force (a rotated certificate). Nothing was awaited since
                # the accept, so the client's first bytes are still unread and go to the handshake.
                await writer.start_tls(serving.ssl_context, ssl_handshake_timeout=self._opts.read_header_timeout)
                if not self._client_san_allowed(writer, serving.config):
                    return
            accepted = asyncio.get_running_loop().time()
            http = Http1Connection(self._opts.max_header_bytes, self._opts.max_body_bytes)
            first = True
            while True:
                try:
                    parsed = await self._read_request(reader, http, accepted if first else None)
                except BadRequest as e:
                    self._bad_requests += 1
                    self._warn.warning(
                        "bad request from %s answered %d: %s", writer.get_extra_info("peername"), e.status, e.message
                    )
                    await self._write(writer, http.error_response(e, self._web_config.current().config.headers))
                    await _linger(reader, writer)
                    return
                first = False
                response = await self._respond(parsed.request)
                keep = parsed.keep_alive and self._loop is not None
                head_only = parsed.request.method == "HEAD"
                extra_headers = self._web_config.current().config.headers
                await self._write(writer, http.response(response, head_only, keep, extra_headers))
                if not keep or not http.start_next():
                    return
        except (_Closed, ConnectionError, TimeoutError, ssl.SSLError):
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

    def _client_san_allowed(self, writer: asyncio.StreamWriter, config: WebConfig) -> bool:
        allowed = config.tls.client_allowed_sans if config.tls else ()
        if not allowed:
            return True
        cert = writer.get_extra_info("peercert") or {}
        names = {value for _kind, value in cert.get("subjectAltName", ())}
        if names.intersection(allowed):
            return True
        self._warn.warning("client certificate SANs %s not in client_allowed_sans", sorted(names))
        return False

    async def _read_request(
        self, reader: asyncio.StreamReader, http: Http1Connection, accepted: float | None
    ) -> Head:
        opts = self._opts
        try:
            parsed = http.next_request()  # a pipelined request may be here in full already
            if parsed is not None:
                return parsed
            if accepted is not None:
                # A new connection: the whole request within the header timeout from accept.
                deadline = accepted + opts.read_header_timeout
            else:
                if not http.has_buffered_bytes:
                    # Keep-alive: wait up to the idle timeout for the next request to begin.
                    async with asyncio.timeout(opts.idle_timeout):
                        http.receive(await reader.read(http.read_size))
                deadline = asyncio.get_running_loop().time() + opts.read_header_timeout
            async with asyncio.timeout_at(deadline):
                while (parsed := http.next_request()) is None:
                    http.receive(await reader.read(http.read_size))
                return parsed
        except (TimeoutError, ClientGone):
            raise _Closed from None

    # ---- answering -----------------------------------------------------------------------------

    async def _respond(self, request: Request) -> Response:
        loop = asyncio.get_running_loop()
        auth = self._web_config.current().auth  # users added or removed in the file count from now on
        if auth.enabled:
            authorization = request.headers.get("authorization")
            # Cached successes are checked on the loop, so that password guessers queueing bcrypt
            # checks on the auth thread do not delay scrapes with known credentials.
            ok = auth.check_cached(authorization)
            if ok is None:
                ok = await loop.run_in_executor(self._auth_pool, auth.check, authorization)
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
        return gzip_if_accepted(request, response)

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

    async def _write(self, writer: asyncio.StreamWriter, pieces: list[bytes]) -> None:
        writer.writelines(pieces)
        async with asyncio.timeout(_WRITE_TIMEOUT_S):
            await writer.drain()


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    if not writer.can_write_eof():  # TLS: no half-close; the close_notify is sent at close
        return
    writer.write_eof()
    dropped = 0
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(_LINGER_S):
            while dropped < _LINGER_BYTES and (data := await reader.read(65536)):
                dropped += len(data)


def _raise_open_files_limit() -> None:
    # Each connection is a file descriptor; Go raises the soft RLIMIT_NOFILE to the hard limit
    # at start for the same reason (https://github.com/golang/go/issues/46279).
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
