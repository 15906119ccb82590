"""The OTLP sink as the CLI builds it (sinks/otlp/sink.py), against real receivers on loopback: the
profiles arrive valid, with the configured headers and compression, and close keeps to its
timeout with both signals and no collector."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from testkit.otlp_profiles import check_request, decode
from testkit.otlp_receivers import GrpcReceiver, HttpReceiver, free_port
from testkit.otlp_sink import sink_from_args
from testkit.snapshots import two_process_snapshot

pytestmark = pytest.mark.timeout(60)

NS_IN_SNAPSHOT = 670_000_000  # two_process_snapshot(): 550 ms + 120 ms


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request: pytest.FixtureRequest) -> Iterator[GrpcReceiver | HttpReceiver]:
    r = GrpcReceiver() if request.param == "grpc" else HttpReceiver()
    with r:
        yield r


def test_delivers_valid_profiles_with_headers(receiver: GrpcReceiver | HttpReceiver) -> None:
    protocol = "grpc" if isinstance(receiver, GrpcReceiver) else "http/protobuf"
    sink = sink_from_args(["--otlp.endpoint", receiver.endpoint, "--otlp.protocol", protocol,
                           "--otlp.headers", "X-Scope-OrgID=tenant-1", "--no-otlp.metrics"])  # fmt: skip
    sink.publish(two_process_snapshot(sequence=1))
    sink.publish(two_process_snapshot(sequence=2))
    sink.close(10)
    got = receiver.received
    assert len(got.profiles) == 2
    for request in got.profiles:
        check_request(request)
    ns = sum(s.value for r in got.profiles for s in decode(r) if s.sample_type == "off_cpu/nanoseconds")
    assert ns == 2 * NS_IN_SNAPSHOT
    assert all(h.get("x-scope-orgid") == "tenant-1" for h in got.headers)
    if isinstance(receiver, HttpReceiver):
        assert all(h.get("content-encoding") == "gzip" for h in got.headers)
    assert sink.stats.values() == {"sent": 2}


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
