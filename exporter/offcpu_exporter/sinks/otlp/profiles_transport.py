"""Sending ExportProfilesServiceRequest messages: gRPC and OTLP/HTTP clients, each one attempt.

The Python SDK has no profiles exporter, so the generated stub is called here with the rules the
SDK's exporters and the OTLP specification use: gzip, metadata headers, a timeout per attempt, and a
classification of every failure as retryable (with the server's delay hint when it sends one) or
not. Retrying itself is `profiles_delivery.ProfilesDelivery`'s job.
"""

from __future__ import annotations

import email.utils
import gzip
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import grpc
import requests
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
    ExportProfilesServiceResponse,
)
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2_grpc import (
    ProfilesServiceStub,
)

from offcpu_exporter import __version__

__all__ = ["ExportResult", "GrpcProfilesClient", "HttpProfilesClient", "ProfilesClient", "TlsSession"]

log = logging.getLogger(__name__)

USER_AGENT = f"offcpu-exporter/{__version__}"

# The OTLP specification's retryable gRPC codes. RESOURCE_EXHAUSTED is retryable only when the
# server says when to come back (RetryInfo), otherwise it is a permanent "too big"/quota refusal.
_RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
_RETRYABLE_HTTP = frozenset({429, 502, 503, 504})

# gRPC's own reconnect backoff grows to 120 s by default: a collector that comes back would then
# wait up to two minutes for the channel to try again. Keep it short so data flows soon after.
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 1000),
    ("grpc.max_reconnect_backoff_ms", 3000),
    ("grpc.primary_user_agent", USER_AGENT),
)


@dataclass(frozen=True)
class ExportResult:
    ok: bool
    retryable: bool = False
    retry_after: float | None = None  # seconds the server asked to wait
    message: str = ""
    rejected_profiles: int = 0  # partial success
    partial_message: str = ""


def _partial(response: ExportProfilesServiceResponse) -> ExportResult:
    ps = response.partial_success
    return ExportResult(True, rejected_profiles=ps.rejected_profiles, partial_message=ps.error_message)


class ProfilesClient(Protocol):
    description: str

    def export(self, request: ExportProfilesServiceRequest, timeout: float) -> ExportResult: ...

    def close(self) -> None: ...


class GrpcProfilesClient:
    def __init__(
        self,
        target: str,
        *,
        credentials: grpc.ChannelCredentials | None,
        headers: Mapping[str, str],
        compression: str = "gzip",
    ) -> None:
        """`credentials`: TLS (and mTLS) of the channel, None for plaintext (SignalEndpoint.grpc_credentials)."""
        self.description = f"grpc {target}"
        # gRPC metadata keys must be lower case (X-Scope-OrgID -> x-scope-orgid); the server
        # sees them case-insensitively, as HTTP/2 headers.
        self._metadata = tuple((k.lower(), v) for k, v in headers.items())
        comp = grpc.Compression.Gzip if compression == "gzip" else grpc.Compression.NoCompression
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS, compression=comp)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=_CHANNEL_OPTIONS, compression=comp)
        self._stub = ProfilesServiceStub(self._channel)

    def export(self, request: ExportProfilesServiceRequest, timeout: float) -> ExportResult:
        try:
            response = self._stub.Export(request, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as error:
            return self._classify(error)
        return _partial(response)

    @staticmethod
    def _classify(error: grpc.RpcError) -> ExportResult:
        code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = error.details() if isinstance(error, grpc.Call) else str(error)
        retry_after = None
        if isinstance(error, grpc.Call):
            for key, value in error.trailing_metadata() or ():
                if key == "google.rpc.retryinfo-bin" and isinstance(value, bytes):
                    info = RetryInfo()
                    try:
                        info.ParseFromString(value)
                    except Exception:  # a malformed hint is no reason to lose the request
                        continue
                    retry_after = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
        retryable = code in _RETRYABLE_CODES or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_after is not None)
        return ExportResult(False, retryable, retry_after, f"{code.name}: {details}")

    def close(self) -> None:
        self._channel.close()


def _retry_after(value: str | None) -> float | None:
    """Retry-After is delay-seconds or an HTTP-date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class TlsSession(requests.Session):
    """A requests session whose own CA bundle (`verify`, from --otlp.certificate) is used even where
    REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE is set: requests lets those variables override
    Session.verify (https://github.com/psf/requests/issues/3829), and the collector's private CA
    would then fail verification."""

    def merge_environment_settings(self, url, proxies, stream, verify, cert):  # type: ignore[no-untyped-def]
        settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None and isinstance(self.verify, str):
            settings["verify"] = self.verify
        return settings


class HttpProfilesClient:
    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        compression: str = "gzip",
        certificate: str | None = None,
        client_cert: tuple[str, str] | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.description = f"http {url}"
        self._url = url
        self._gzip = compression == "gzip"
        self._session = session or TlsSession()
        self._session.headers.update(headers)
        self._session.headers.update({"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT})
        if self._gzip:
            self._session.headers["Content-Encoding"] = "gzip"
        self._verify: str | bool = certificate or True
        self._session.cert = client_cert  # mTLS: (certificate, key) files

    def export(self, request: ExportProfilesServiceRequest, timeout: float) -> ExportResult:
        body = request.SerializeToString()
        if self._gzip:
            body = gzip.compress(body, compresslevel=6)
        try:
            response = self._session.post(self._url, data=body, timeout=timeout, verify=self._verify)
        except requests.exceptions.RequestException as error:
            # refused, reset, DNS, TLS handshake, timeout: the collector may be restarting
            return ExportResult(False, True, None, f"{type(error).__name__}: {error}")
        if 200 <= response.status_code < 300:
            parsed = ExportProfilesServiceResponse()
            if response.content and "protobuf" in response.headers.get("Content-Type", ""):
                try:
                    parsed.ParseFromString(response.content)
                except Exception:  # the data arrived; an odd reply body does not change that
                    log.debug("unparseable OTLP/HTTP response body from %s", self._url)
            return _partial(parsed)
        message = f"HTTP {response.status_code}: {response.text[:200]}"
        if response.status_code in _RETRYABLE_HTTP:
            return ExportResult(False, True, _retry_after(response.headers.get("Retry-After")), message)
        return ExportResult(False, False, None, message)

    def close(self) -> None:
        self._session.close()
