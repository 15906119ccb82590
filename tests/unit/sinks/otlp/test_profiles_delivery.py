"""Profiles pushed to real receivers on loopback (grpc.server with the official servicer, http.server)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator

import grpc
import pytest

from testkit.otlp_profiles import check_request, decode
from testkit.otlp_receivers import Failure, GrpcReceiver, HttpReceiver, TcpRelay, free_port
from testkit.otlp_sink import sink_from_args
from testkit.snapshots import two_process_snapshot

pytestmark = pytest.mark.timeout(60)

NS_IN_SNAPSHOT = 670_000_000  # two_process_snapshot(): 550 ms + 120 ms


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request: pytest.FixtureRequest) -> Iterator[GrpcReceiver | HttpReceiver]:
    r = GrpcReceiver() if request.param == "grpc" else HttpReceiver()
    r.protocol = request.param  # type: ignore[union-attr]
    with r:
        yield r


def _args(receiver: GrpcReceiver | HttpReceiver, *extra: str) -> list[str]:
    return [
        "--otlp.endpoint",
        receiver.endpoint,
        "--otlp.protocol",
        receiver.protocol,  # type: ignore[union-attr]
        "--otlp.headers",
        "X-Scope-OrgID=tenant-1",
        "--no-otlp.metrics",
        *extra,
    ]


def _offcpu_ns(requests: list) -> int:
    return sum(s.value for r in requests for s in decode(r) if s.sample_type == "off_cpu/nanoseconds")


def test_delivers_valid_profiles_with_headers(receiver: GrpcReceiver | HttpReceiver) -> None:
    sink = sink_from_args(_args(receiver))
    sink.publish(two_process_snapshot(sequence=1))
    sink.publish(two_process_snapshot(sequence=2))
    sink.close(10)
    got = receiver.received
    assert len(got.profiles) == 2
    for request in got.profiles:
        check_request(request)
    assert _offcpu_ns(got.profiles) == 2 * NS_IN_SNAPSHOT
    assert all(h.get("x-scope-orgid") == "tenant-1" for h in got.headers)
    if isinstance(receiver, HttpReceiver):
        assert all(h.get("content-encoding") == "gzip" for h in got.headers)
    assert sink.stats.values() == {"sent": 2}


def test_retries_unavailable_then_delivers(receiver: GrpcReceiver | HttpReceiver) -> None:
    receiver.fail_next(Failure(count=2, grpc_code=grpc.StatusCode.UNAVAILABLE, http_status=503))
    sink = sink_from_args(_args(receiver))
    sink.publish(two_process_snapshot())
    assert receiver.received.wait_for(lambda r: len(r.profiles) == 1, timeout=15)
    sink.close(5)
    assert receiver.received.refused == 2
    assert sink.stats.get("retried") == 2 and sink.stats.get("sent") == 1
    assert sink.stats.get("dropped") == 0 and sink.stats.get("failed") == 0
    assert _offcpu_ns(receiver.received.profiles) == NS_IN_SNAPSHOT


def test_permanent_error_is_not_retried(receiver: GrpcReceiver | HttpReceiver, caplog) -> None:
    receiver.fail_next(Failure(count=1, grpc_code=grpc.StatusCode.INVALID_ARGUMENT, http_status=400))
    sink = sink_from_args(_args(receiver))
    with caplog.at_level(logging.ERROR):
        sink.publish(two_process_snapshot())
        sink.close(5)
    assert receiver.received.refused == 1 and not receiver.received.profiles
    assert sink.stats.get("failed") == 1 and sink.stats.get("retried") == 0
    assert sink.stats.get("dropped_ns") == NS_IN_SNAPSHOT
    assert "refused the request" in caplog.text


def test_server_retry_hint_is_honoured(receiver: GrpcReceiver | HttpReceiver) -> None:
    # RESOURCE_EXHAUSTED is retryable only with RetryInfo; HTTP 429 with Retry-After
    receiver.fail_next(Failure(count=1, grpc_code=grpc.StatusCode.RESOURCE_EXHAUSTED, http_status=429, retry_after=1.0))
    sink = sink_from_args(_args(receiver))
    start = time.monotonic()
    sink.publish(two_process_snapshot())
    assert receiver.received.wait_for(lambda r: len(r.profiles) == 1, timeout=15)
    assert time.monotonic() - start >= 0.95
    sink.close(5)
    assert sink.stats.get("retried") == 1 and sink.stats.get("sent") == 1


def test_resource_exhausted_without_hint_is_permanent() -> None:
    with GrpcReceiver() as receiver:
        receiver.protocol = "grpc"  # type: ignore[attr-defined]
        receiver.fail_next(Failure(count=1, grpc_code=grpc.StatusCode.RESOURCE_EXHAUSTED))
        sink = sink_from_args(_args(receiver))
        sink.publish(two_process_snapshot())
        sink.close(5)
    assert sink.stats.get("failed") == 1 and sink.stats.get("retried") == 0


def test_partial_success_is_logged_and_counted(receiver: GrpcReceiver | HttpReceiver, caplog) -> None:
    receiver.fail_next(Failure(count=1, partial_rejected=1))
    sink = sink_from_args(_args(receiver))
    with caplog.at_level(logging.WARNING):
        sink.publish(two_process_snapshot())
        sink.close(5)
    assert sink.stats.get("sent") == 1 and sink.stats.get("rejected_profiles") == 1
    assert "partial success" in caplog.text and "test receiver rejects some" in caplog.text


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_full_queue_drops_oldest_and_close_is_bounded(protocol: str) -> None:
    port = free_port()  # nobody listens
    sink = sink_from_args(
        [
            "--otlp.endpoint",
            f"http://127.0.0.1:{port}",
            "--otlp.protocol",
            protocol,
            "--no-otlp.metrics",
            "--otlp.queue-size",
            "2",
            "--otlp.max-delay",
            "60",
        ]
    )
    for seq in range(1, 6):
        sink.publish(two_process_snapshot(sequence=seq))
    start = time.monotonic()
    sink.close(1.0)
    assert time.monotonic() - start < 3.0, "close sat out a backoff"
    stats = sink.stats.values()
    assert stats.get("sent", 0) == 0
    assert stats["dropped"] == 5  # 2 or 3 for the full queue, the rest at shutdown
    assert stats["dropped_ns"] == 5 * NS_IN_SNAPSHOT
    assert stats.get("retried", 0) >= 1


def test_request_past_its_deadline_is_dropped() -> None:
    port = free_port()
    sink = sink_from_args(
        ["--otlp.endpoint", f"http://127.0.0.1:{port}", "--no-otlp.metrics", "--otlp.max-delay", "1.5"]
    )
    sink.publish(two_process_snapshot())
    deadline = time.monotonic() + 10
    while sink.stats.get("dropped") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sink.stats.get("dropped") == 1
    sink.close(1)


def test_publish_never_blocks() -> None:
    port = free_port()
    sink = sink_from_args(["--otlp.endpoint", f"127.0.0.1:{port}", "--otlp.insecure", "--no-otlp.metrics"])
    snap = two_process_snapshot()
    start = time.monotonic()
    for _ in range(200):
        sink.publish(snap)
    assert time.monotonic() - start < 0.5
    sink.close(0.2)
    assert sink.stats.get("dropped") == 200


def test_idle_snapshots_send_nothing(receiver: GrpcReceiver | HttpReceiver) -> None:
    from offcpu_exporter.snapshot import Counter, Reason
    from testkit.snapshots import APP, STACK_SLEEP, snapshot_of

    sink = sink_from_args(_args(receiver))
    sink.publish(snapshot_of([(APP, 0, "", Reason.SLEEPING, STACK_SLEEP, Counter(3, 30), Counter())]))
    sink.close(2)
    assert receiver.received.profiles == [] and sink.stats.values() == {}


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


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_close_keeps_to_its_timeout_with_both_signals_and_no_collector(protocol: str) -> None:
    port = free_port()
    snap = two_process_snapshot()
    sink = sink_from_args(
        ["--otlp.endpoint", f"http://127.0.0.1:{port}", "--otlp.protocol", protocol, "--otlp.interval", "0.2"],
        latest=lambda: snap,
    )
    sink.publish(snap)
    time.sleep(0.5)  # a metrics export or two are failing by now
    start = time.monotonic()
    sink.close(2.0)
    assert time.monotonic() - start < 3.0
    assert sink.stats.get("dropped") == 1 and sink.stats.get("sent") == 0
