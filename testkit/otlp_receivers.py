"""OTLP receivers on loopback for tests: a real grpc.server with the official generated servicers
(profiles v1development and metrics v1) and an http.server speaking OTLP/HTTP (protobuf, gzip).

Both record every request with its headers, and can be told to answer with a failure (an error
code or HTTP status, optionally a retry hint) for the next N requests.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2,
    profiles_service_pb2_grpc,
)

from testkit.tls import Pki

__all__ = ["Failure", "GrpcReceiver", "HttpReceiver", "Received", "TcpRelay", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Received:
    """What a receiver got, in arrival order."""

    profiles: list[profiles_service_pb2.ExportProfilesServiceRequest] = field(default_factory=list)
    metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # of the accepted requests
    refused: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)  # predicates may take it again
    arrived: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.arrived = threading.Condition(self.lock)

    def wait_for(self, predicate: Callable[[Received], bool], timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self.arrived:
            while not predicate(self):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.arrived.wait(left)
            return True


@dataclass
class Failure:
    """Answer the next `count` requests with this failure."""

    count: int
    grpc_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    http_status: int = 503
    retry_after: float | None = None
    partial_rejected: int = 0  # instead of failing: accept with a partial-success response


class _Servicers(profiles_service_pb2_grpc.ProfilesServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, owner: GrpcReceiver) -> None:
        self.owner = owner

    def _fail(self, failure: Failure | None, context: grpc.ServicerContext) -> None:
        if failure is None or failure.partial_rejected:
            return
        if failure.retry_after is not None:
            info = RetryInfo(
                retry_delay=Duration(seconds=int(failure.retry_after), nanos=int(failure.retry_after % 1 * 1e9))
            )
            context.set_trailing_metadata((("google.rpc.retryinfo-bin", info.SerializeToString()),))
        with self.owner.received.lock:
            self.owner.received.refused += 1
        context.abort(failure.grpc_code, "test receiver refuses")

    def Export(self, request, context):  # type: ignore[no-untyped-def]  # both services call it Export
        failure = self.owner.take_failure()
        self._fail(failure, context)
        headers = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        received = self.owner.received
        with received.arrived:
            received.headers.append(headers)
            if isinstance(request, profiles_service_pb2.ExportProfilesServiceRequest):
                received.profiles.append(request)
                response = profiles_service_pb2.ExportProfilesServiceResponse()
                if failure is not None and failure.partial_rejected:
                    response.partial_success.rejected_profiles = failure.partial_rejected
                    response.partial_success.error_message = "test receiver rejects some"
            else:
                received.metrics.append(request)
                response = metrics_service_pb2.ExportMetricsServiceResponse()
            received.arrived.notify_all()
        return response


class _Receiver:
    """What both receivers share: a loopback port, what was received, failures scripted by tests."""

    def __init__(self, port: int | None, mtls: Pki | None) -> None:
        self.mtls = mtls
        self.port = port or free_port()
        self.received = Received()
        self._failures: list[Failure] = []
        self._flock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.mtls else 'http'}://127.0.0.1:{self.port}"

    def fail_next(self, failure: Failure) -> None:
        with self._flock:
            self._failures.append(failure)

    def take_failure(self) -> Failure | None:
        with self._flock:
            if not self._failures:
                return None
            failure = self._failures[0]
            failure.count -= 1
            if failure.count <= 0:
                self._failures.pop(0)
            return failure


class GrpcReceiver(_Receiver):
    """An OTLP gRPC receiver on 127.0.0.1; `stop()` then `start()` brings it back on the same port.
    With `mtls`, it serves TLS with the PKI's server certificate and requires a client certificate
    signed by its CA."""

    def __init__(self, port: int | None = None, mtls: Pki | None = None) -> None:
        super().__init__(port, mtls)
        self._server: grpc.Server | None = None

    def start(self) -> GrpcReceiver:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        servicers = _Servicers(self)
        profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(servicers, server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(servicers, server)
        address = f"127.0.0.1:{self.port}"
        if self.mtls is None:
            bound = server.add_insecure_port(address)
        else:
            credentials = grpc.ssl_server_credentials(
                [(self.mtls.server_key.read_bytes(), self.mtls.server_cert.read_bytes())],
                root_certificates=self.mtls.ca.read_bytes(),
                require_client_auth=True,
            )
            bound = server.add_secure_port(address, credentials)
        if bound != self.port:
            raise RuntimeError(f"port {self.port} is taken")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None

    def __enter__(self) -> GrpcReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HttpReceiver(_Receiver):
    """An OTLP/HTTP receiver on 127.0.0.1 for /v1development/profiles and /v1/metrics. With `mtls`,
    HTTPS that requires a client certificate signed by the PKI's CA."""

    def __init__(self, port: int | None = None, mtls: Pki | None = None) -> None:
        super().__init__(port, mtls)
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> HttpReceiver:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.headers.get("Content-Type") != "application/x-protobuf":
                    self._reply(415, b"want application/x-protobuf", "text/plain")
                    return
                failure = owner.take_failure()
                if failure is not None and not failure.partial_rejected:
                    with owner.received.lock:
                        owner.received.refused += 1
                    extra = {"Retry-After": str(int(failure.retry_after))} if failure.retry_after else {}
                    self._reply(failure.http_status, b"test receiver refuses", "text/plain", extra)
                    return
                received = owner.received
                if self.path == "/v1development/profiles":
                    request = profiles_service_pb2.ExportProfilesServiceRequest.FromString(body)
                    response = profiles_service_pb2.ExportProfilesServiceResponse()
                    if failure is not None:
                        response.partial_success.rejected_profiles = failure.partial_rejected
                        response.partial_success.error_message = "test receiver rejects some"
                    with received.arrived:
                        received.profiles.append(request)
                        received.headers.append({k.lower(): v for k, v in self.headers.items()})
                        received.arrived.notify_all()
                elif self.path == "/v1/metrics":
                    mrequest = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    response = metrics_service_pb2.ExportMetricsServiceResponse()
                    with received.arrived:
                        received.metrics.append(mrequest)
                        received.headers.append({k.lower(): v for k, v in self.headers.items()})
                        received.arrived.notify_all()
                else:
                    self._reply(404, b"no such path", "text/plain")
                    return
                self._reply(200, response.SerializeToString(), "application/x-protobuf")

            def _reply(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if self.mtls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.mtls.server_cert, self.mtls.server_key)
            context.load_verify_locations(self.mtls.ca)
            context.verify_mode = ssl.CERT_REQUIRED
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HttpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TcpRelay:
    """A loopback TCP relay that records what the client sent: to look at the bytes on the wire
    (e.g. whether gRPC messages are compressed), which the gRPC server API does not show."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sent = bytearray()
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(8)
        self.port = int(self._listener.getsockname()[1])
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(65536):
                if record:
                    with self._lock:
                        self.sent.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
