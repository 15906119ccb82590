"""Delivery of profile requests (sinks/otlp/profiles_delivery.py) to a collector that is up, down or
refusing, on fake time: the backoffs, deadlines and flush cadence are seconds on a ManualClock, so
a 10 s outage runs in milliseconds. The collector is a scripted ProfilesClient; the requests are the
real encoder's. The transports' own answers (which gRPC codes and HTTP statuses are retryable, the
servers' delay hints) are checked against real receivers in test_profiles_transport.py, and one
real collector outage against a real exporter in tests/reliability/test_outputs_down.py.

Snapshots carry figures that encode their sequence number, so every delivered request can be
checked against the snapshot it came from, and delivered + dropped must add up to everything
published.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
)

from offcpu_exporter.formats.otlp_profiles import EncodeOptions, encode_profiles_split
from offcpu_exporter.sinks import SinkStats
from offcpu_exporter.sinks.otlp.profiles_delivery import ProfilesDelivery
from offcpu_exporter.sinks.otlp.profiles_transport import ExportResult
from offcpu_exporter.sinks.retry import Backoff
from offcpu_exporter.snapshot import Counter, Reason, Snapshot
from testkit.manual_clock import ManualClock
from testkit.otlp_profiles import check_request, decode
from testkit.snapshots import APP, STACK_SLEEP, snapshot_of, two_process_snapshot

pytestmark = pytest.mark.timeout(30)

BASE_NS = 1_800_000_000_000_000_000
FLUSH = 0.5  # seconds between snapshots, as with --flush-interval 0.5
DOWN = ExportResult(False, True, None, "UNAVAILABLE: the collector is down")
ENCODE = partial(encode_profiles_split, options=EncodeOptions(host_name="test-host"))


def snap(seq: int) -> Snapshot:
    return two_process_snapshot(sequence=seq, scale=seq, time_ns=BASE_NS + seq * 5_000_000_000)


def ns_of(seq: int) -> int:
    """The off-CPU ns in snap(seq)."""
    return 500_000_000 * seq + 170_000_000


def seq_of(request: ExportProfilesServiceRequest) -> int:
    p = request.resource_profiles[0].scope_profiles[0].profiles[0]
    return (p.time_unix_nano + p.duration_nano - BASE_NS) // 5_000_000_000


class Collector:
    """A ProfilesClient: accepts while `up`, answers UNAVAILABLE while down; `script` answers the
    next tries instead (an ok answer stores the request)."""

    description = "test collector"

    def __init__(self) -> None:
        self.up = True
        self.script: list[ExportResult] = []
        self.received: list[ExportProfilesServiceRequest] = []
        self.timeouts: list[float] = []
        self.closed = False

    def export(self, request: ExportProfilesServiceRequest, timeout: float) -> ExportResult:
        self.timeouts.append(timeout)
        answer = self.script.pop(0) if self.script else (ExportResult(True) if self.up else DOWN)
        if answer.ok:
            self.received.append(request)
        return answer

    def close(self) -> None:
        self.closed = True

    def seqs(self) -> list[int]:
        return [seq_of(r) for r in self.received]


class Run:
    """A ProfilesDelivery on a ManualClock, sending to a Collector."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.collector = Collector()
        self.stats = SinkStats()
        self._delivery: ProfilesDelivery | None = None

    def start(self, **options: Any) -> ProfilesDelivery:
        self._delivery = ProfilesDelivery(
            self.collector, ENCODE, self.stats, clock=self.clock.now, wait=self.clock.wait, **options
        )
        return self._delivery

    @property
    def delivery(self) -> ProfilesDelivery:
        assert self._delivery is not None
        return self._delivery

    def idle(self) -> bool:
        return self.delivery.pending() == 0

    def publish(self, snapshot: Snapshot) -> None:
        """Publishes and lets the sender do what it can before time moves on."""
        self.delivery.publish(snapshot)
        self.clock.settle(self.idle)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds, self.idle)


@pytest.fixture
def run() -> Iterator[Run]:
    r = Run()
    yield r
    if r._delivery is not None:
        r._delivery.close(0)


def test_retries_an_unavailable_collector_with_backoff_then_delivers(run: Run) -> None:
    run.collector.script = [DOWN, DOWN]
    run.start()
    run.publish(snap(1))
    assert run.collector.received == [] and run.stats.get("retried") == 0
    run.advance(0.4)  # the first backoff is 0.5 s +-20%
    assert len(run.collector.timeouts) == 1
    run.advance(10)
    assert run.collector.seqs() == [1] and len(run.collector.timeouts) == 3
    first, second = run.clock.waits
    assert 0.4 <= first <= 0.6 and 0.8 <= second <= 1.2
    assert run.stats.values() == {"retried": 2, "sent": 1}


def test_a_refusal_is_not_retried_and_its_data_is_counted_lost(run: Run, caplog: pytest.LogCaptureFixture) -> None:
    run.collector.script = [ExportResult(False, False, None, "INVALID_ARGUMENT: no")]
    run.start()
    with caplog.at_level(logging.ERROR):
        run.publish(snap(1))
        run.advance(60)
    assert run.clock.waits == [] and len(run.collector.timeouts) == 1
    assert run.stats.values() == {"failed": 1, "dropped_ns": ns_of(1)}
    assert "refused the request" in caplog.text and "INVALID_ARGUMENT: no" in caplog.text


def test_the_servers_delay_is_waited_for(run: Run) -> None:
    run.collector.script = [ExportResult(False, True, 3.0, "RESOURCE_EXHAUSTED: later")]
    run.start()
    run.publish(snap(1))
    run.advance(2.9)
    assert run.collector.received == []
    run.advance(0.1)
    assert run.clock.waits == [3.0] and run.collector.seqs() == [1]
    assert run.stats.values() == {"retried": 1, "sent": 1}


def test_partial_success_is_logged_and_counted(run: Run, caplog: pytest.LogCaptureFixture) -> None:
    run.collector.script = [ExportResult(True, rejected_profiles=1, partial_message="one is too old")]
    run.start()
    with caplog.at_level(logging.WARNING):
        run.publish(snap(1))
    assert run.stats.values() == {"sent": 1, "rejected_profiles": 1}
    assert "partial success" in caplog.text and "one is too old" in caplog.text


def test_a_full_queue_drops_the_oldest(run: Run) -> None:
    run.collector.up = False
    run.start(queue_size=2, max_delay=60)
    run.publish(snap(1))  # taken by the sender, which backs off
    for seq in (2, 3, 4, 5):
        run.publish(snap(seq))
    assert run.stats.values() == {"dropped": 2, "dropped_ns": ns_of(2) + ns_of(3)}
    assert run.delivery.pending() == 3
    run.collector.up = True
    run.advance(10)
    assert run.collector.seqs() == [1, 4, 5]
    assert run.stats.get("sent") == 3 and run.stats.get("dropped") == 2


def test_a_request_past_its_deadline_is_dropped(run: Run) -> None:
    run.collector.up = False
    run.start(max_delay=1.5, timeout=10, backoff=Backoff(0.5, 5.0, 0.0))
    run.publish(snap(1))
    run.advance(0.4)
    assert run.stats.get("dropped") == 0
    # the retry at 0.5 s fails; the next backoff (1 s) would end at the deadline: given up now
    run.advance(0.2)
    assert run.stats.values() == {"retried": 1, "dropped": 1, "dropped_ns": ns_of(1)}
    assert run.clock.waits == [0.5]
    assert run.collector.timeouts == [1.5, 1.0]  # each try gets what is left of 1.5 s, not 10 s
    run.collector.up = True
    run.advance(10)
    assert run.collector.received == []


def test_close_cuts_the_backoff_short_and_counts_what_is_pending(run: Run) -> None:
    run.collector.up = False
    run.start(queue_size=2, max_delay=60)
    for seq in (1, 2, 3):
        run.publish(snap(seq))
    start = time.monotonic()
    run.delivery.close(0.2)
    assert time.monotonic() - start < 2.0, "close sat out a backoff"
    assert run.collector.closed and run.clock.now() == 1000.0  # no fake time passed either
    assert run.stats.values() == {"dropped": 3, "dropped_ns": ns_of(1) + ns_of(2) + ns_of(3)}


def test_publish_never_blocks_while_the_collector_is_down(run: Run) -> None:
    run.collector.up = False
    run.start()
    snapshot = snap(1)
    start = time.monotonic()
    for _ in range(200):
        run.delivery.publish(snapshot)
    assert time.monotonic() - start < 0.5
    run.delivery.close(0.2)
    assert run.stats.get("dropped") == 200 and run.stats.get("sent") == 0


def test_idle_snapshots_send_nothing(run: Run) -> None:
    run.start()
    run.publish(snapshot_of([(APP, 0, "", Reason.SLEEPING, STACK_SLEEP, Counter(3, 30), Counter())]))
    run.delivery.close(1)
    assert run.collector.timeouts == [] and run.stats.values() == {}


def test_collector_down_then_back(run: Run) -> None:
    """The collector is down for 10 s, then comes back: delivery resumes by itself, the queue stays
    bounded, what could not be delivered is counted, and what arrives afterwards is exact."""
    run.start(queue_size=4, max_delay=6, timeout=2)
    published: list[int] = []
    max_pending = 0

    def flushes(n: int) -> None:
        nonlocal max_pending
        for _ in range(n):
            run.advance(FLUSH)
            seq = len(published) + 1
            run.publish(snap(seq))
            published.append(seq)
            max_pending = max(max_pending, run.delivery.pending())

    flushes(3)
    assert run.collector.seqs() == [1, 2, 3]
    run.collector.up = False
    flushes(20)  # 10 s
    during = run.stats.values()
    assert during.get("retried", 0) > 0 and during.get("dropped", 0) > 0, during
    assert during.get("sent") == 3
    last_before = published[-1]
    run.collector.up = True
    flushes(20)
    run.advance(10)  # time for whatever is still queued
    assert run.delivery.pending() == 0
    run.delivery.close(1)

    stats = run.stats.values()
    seqs = run.collector.seqs()
    # memory: the queue never held more than its bound (+ the request in flight)
    assert max_pending <= 4 + 1
    # every delivered request is valid and exactly the snapshot it came from; none twice
    for request in run.collector.received:
        check_request(request)
        ns = sum(s.value for s in decode(request) if s.sample_type == "off_cpu/nanoseconds")
        assert ns == ns_of(seq_of(request))
    assert len(seqs) == len(set(seqs))
    # the books: delivered + counted as lost is everything published, request by request and in ns
    assert sum(ns_of(s) for s in seqs) + stats["dropped_ns"] == sum(ns_of(s) for s in published)
    assert stats["sent"] == len(seqs) and stats["sent"] + stats["dropped"] == len(published)
    assert "failed" not in stats
    # the backoff: every retry counted; 0.5 s doubling (+-20%), and the 4 s one never fits in a
    # request's 6 s; each try within its 2 s timeout
    assert stats["retried"] == len(run.clock.waits)
    assert all(0.4 <= w <= 2.4 for w in run.clock.waits) and max(run.clock.waits) >= 1.6
    assert all(0 < t <= 2 for t in run.collector.timeouts)
    # the outage lost data in the middle only; once data flowed again everything newer arrived
    missing = set(published) - set(seqs)
    assert missing and min(missing) > 3
    first_new = min(s for s in seqs if s > last_before)
    assert set(range(first_new, published[-1] + 1)) <= set(seqs)
    assert first_new <= last_before + 6  # within 3 s of the collector's return
