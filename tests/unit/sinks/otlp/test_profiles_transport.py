"""One export attempt (sinks/otlp/profiles_transport.py) against real receivers on loopback
(grpc.server with the official servicer, http.server): what each answer means for the retry rule
(retryable or not, the server's delay hint, partial success), and what goes on the wire. Retrying
itself is ProfilesDelivery's, tested on fake time in test_profiles_delivery.py."""

from __future__ import annotations

import re
from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
)

from offcpu_exporter.formats.otlp_profiles import EncodeOptions, encode_profiles
from offcpu_exporter.sinks.otlp.profiles_transport import GrpcProfilesClient, HttpProfilesClient, ProfilesClient
from testkit.otlp_receivers import Failure, GrpcReceiver, HttpReceiver, TcpRelay, free_port
from testkit.otlp_sink import sink_from_args
from testkit.snapshots import two_process_snapshot

pytestmark = pytest.mark.timeout(60)


def _request() -> ExportProfilesServiceRequest:
    request = encode_profiles(two_process_snapshot(), EncodeOptions(host_name="test-host"))
    assert request is not None
    return request


def _client(protocol: str, port: int) -> ProfilesClient:
    if protocol == "grpc":
        return GrpcProfilesClient(f"127.0.0.1:{port}", credentials=None, headers={})
    return HttpProfilesClient(f"http://127.0.0.1:{port}/v1development/profiles", headers={})


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request: pytest.FixtureRequest) -> Iterator[GrpcReceiver | HttpReceiver]:
    r = GrpcReceiver() if request.param == "grpc" else HttpReceiver()
    with r:
        yield r


def _protocol(receiver: GrpcReceiver | HttpReceiver) -> str:
    return "grpc" if isinstance(receiver, GrpcReceiver) else "http/protobuf"


@pytest.mark.parametrize(
    ("failure", "retryable", "retry_after"),
    [
        pytest.param(Failure(1, grpc.StatusCode.UNAVAILABLE, 503), True, None, id="unavailable"),
        pytest.param(Failure(1, grpc.StatusCode.INVALID_ARGUMENT, 400), False, None, id="invalid"),
        # RESOURCE_EXHAUSTED is retryable only with RetryInfo; HTTP 429 with Retry-After
        pytest.param(Failure(1, grpc.StatusCode.RESOURCE_EXHAUSTED, 429, retry_after=1.0), True, 1.0, id="hint"),
    ],
)
def test_an_answer_says_whether_to_retry_and_when(
    receiver: GrpcReceiver | HttpReceiver, failure: Failure, retryable: bool, retry_after: float | None
) -> None:
    receiver.fail_next(failure)
    client = _client(_protocol(receiver), receiver.port)
    try:
        result = client.export(_request(), timeout=5)
        assert not result.ok and result.retryable is retryable and result.retry_after == retry_after
        assert receiver.received.refused == 1 and receiver.received.profiles == []
        assert client.export(_request(), timeout=5).ok  # the next one is taken
    finally:
        client.close()
    assert len(receiver.received.profiles) == 1


def test_resource_exhausted_without_a_hint_is_permanent() -> None:
    with GrpcReceiver() as receiver:
        receiver.fail_next(Failure(count=1, grpc_code=grpc.StatusCode.RESOURCE_EXHAUSTED))
        client = _client("grpc", receiver.port)
        result = client.export(_request(), timeout=5)
        client.close()
    assert not result.ok and not result.retryable and result.message.startswith("RESOURCE_EXHAUSTED")


def test_partial_success_is_reported(receiver: GrpcReceiver | HttpReceiver) -> None:
    receiver.fail_next(Failure(count=1, partial_rejected=1))
    client = _client(_protocol(receiver), receiver.port)
    result = client.export(_request(), timeout=5)
    client.close()
    assert result.ok and result.rejected_profiles == 1 and result.partial_message == "test receiver rejects some"


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_nobody_listening_is_retryable(protocol: str) -> None:
    client = _client(protocol, free_port())
    result = client.export(_request(), timeout=2)
    client.close()
    assert not result.ok and result.retryable


@pytest.mark.parametrize(("compression", "gzipped"), [("gzip", True), ("none", False)])
def test_grpc_messages_are_gzip_compressed_on_the_wire(compression: str, gzipped: bool) -> None:
    with GrpcReceiver() as receiver:
        relay = TcpRelay(receiver.port)
        sink = sink_from_args(
            ["--otlp.endpoint", relay.endpoint, "--no-otlp.metrics", "--otlp.compression", compression]
        )
        sink.publish(two_process_snapshot())
        sink.close(5)
        relay.close()
        assert len(receiver.received.profiles) == 1
    # a gRPC message: 1 byte compressed-flag, 4 bytes length, then (gzip) 1f 8b
    assert bool(re.search(rb"\x01.{4}\x1f\x8b", bytes(relay.sent), re.DOTALL)) is gzipped
