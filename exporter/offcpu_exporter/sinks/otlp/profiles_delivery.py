"""Background delivery of profile requests: bounded queue, retries with jittered exponential backoff.

`publish` only appends the snapshot to a bounded queue (the pipeline thread never encodes or waits);
one worker thread encodes and sends, oldest first, with the retry rule all push outputs share
(`offcpu_exporter.sinks.retry`). A retryable failure is retried after
``min(cap, base * 2**n) * U(0.8, 1.2)`` seconds (or the server's Retry-After / RetryInfo delay)
until the request's deadline (`max_delay` after its flush). Each request carries only the
increases of its interval, so a late request is still correct data: it is kept while it can be
delivered in time, and dropped and counted once it cannot (queue full: the oldest goes first;
deadline passed; still pending when `close` runs out of time; rejected as permanent: counted as
failed). Waits use an Event that `close` sets, so shutdown never sits out a backoff.

The deadlines are on `clock` and the backoffs are sat out by `wait(stop, seconds)` (Event.wait: True
as soon as `stop` is set), both given to the constructor so that tests can run an outage on fake
time; `close(timeout)` keeps to its timeout in real time whatever they are.

Counted in `SinkStats` (unit: requests): ``sent`` accepted (also when partially), ``retried``
re-sends, ``failed`` refused with a non-retryable error, ``dropped`` given up without a refusal.
Also ``dropped_ns`` (off-CPU ns in dropped/failed requests) and ``rejected_profiles`` (partial success).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
)

from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.sinks import SinkStats
from offcpu_exporter.sinks.retry import Backoff, Verdict, send_with_retries
from offcpu_exporter.snapshot import Snapshot

from .options import MAX_DELAY, QUEUE_SIZE, TIMEOUT
from .profiles_transport import ExportResult, ProfilesClient

__all__ = ["ProfilesDelivery"]

log = logging.getLogger(__name__)

Encoder = Callable[[Snapshot], list[ExportProfilesServiceRequest]]


@dataclass
class _Pending:
    snapshot: Snapshot
    deadline: float  # monotonic


def _offcpu_ns(snapshot: Snapshot) -> int:
    return sum(s.increase.ns for s in snapshot.samples)


class ProfilesDelivery:
    def __init__(
        self,
        client: ProfilesClient,
        encode: Encoder,
        stats: SinkStats,
        *,
        queue_size: int = QUEUE_SIZE,
        max_delay: float = MAX_DELAY,
        timeout: float = TIMEOUT,
        backoff: Backoff | None = None,
        name: str = "otlp-profiles",
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[threading.Event, float], bool] = threading.Event.wait,
    ) -> None:
        self._client = client
        self._encode = encode
        self._stats = stats
        self._queue_size = queue_size
        self._max_delay = max_delay
        self._timeout = timeout
        self._backoff = backoff or Backoff()
        self._clock = clock
        self._wait = wait
        self._queue: collections.deque[_Pending] = collections.deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()  # set by close when its time is up: abort everything
        self._closing = False
        self._busy = False
        self._log = RateLimitedLog(log, interval=30.0)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- pipeline thread ------------------------------------------------------------------
    def publish(self, snapshot: Snapshot) -> None:
        if not any(s.increase for s in snapshot.samples):
            return  # nothing was off CPU: no request (and nothing to lose)
        evicted: _Pending | None = None
        with self._cond:
            if self._closing:
                return
            if len(self._queue) >= self._queue_size:
                evicted = self._queue.popleft()
            self._queue.append(_Pending(snapshot, self._clock() + self._max_delay))
            self._cond.notify()
        if evicted is not None:
            self._drop(evicted.snapshot, f"queue full ({self._queue_size} requests)")

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + (1 if self._busy else 0)

    def close(self, timeout: float) -> None:
        end = time.monotonic() + max(0.0, timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while (self._queue or self._busy) and time.monotonic() < end:
                self._cond.wait(max(0.0, min(0.1, end - time.monotonic())))
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(max(0.0, end - time.monotonic()) + 1.0)
        with self._cond:
            left = list(self._queue)
            self._queue.clear()
        for item in left:
            self._drop(item.snapshot, "exporter shutting down")
        self._client.close()

    # -- worker thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing and not self._stop.is_set():
                    self._cond.wait()
                if self._stop.is_set() or (self._closing and not self._queue):
                    return
                item = self._queue.popleft()
                self._busy = True
            try:
                self._deliver(item)
            except Exception:  # never let one bad snapshot kill the sender
                log.exception("OTLP profiles: unexpected error; the request is dropped")
                self._drop(item.snapshot, "internal error")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _deliver(self, item: _Pending) -> None:
        requests = self._encode(item.snapshot)
        for n, request in enumerate(requests):
            outcome = self._send(request, item.deadline)
            if outcome == "sent":
                continue
            # the rest of this snapshot shares its fate (same deadline, same collector)
            rest = sum(_request_ns(r) for r in requests[n:])
            what = "failed" if outcome == "failed" else "dropped"
            self._stats.add(what, len(requests) - n)
            self._stats.add("dropped_ns", rest)
            return

    def _send(self, request: ExportProfilesServiceRequest, deadline: float) -> str:
        if self._stop.is_set():
            self._log.log(logging.WARNING, "OTLP profiles: request dropped at shutdown")
            return "dropped"

        def retrying(answer: ExportResult, n: int) -> None:
            self._log.log(
                logging.WARNING,
                "OTLP profiles: export to %s failed, retrying: %s",
                self._client.description,
                answer.message,
            )
            self._stats.add("retried")

        outcome = send_with_retries(
            lambda timeout: self._client.export(request, timeout),
            deadline=deadline,
            timeout=self._timeout,
            backoff=self._backoff,
            wait=lambda seconds: not self._wait(self._stop, seconds),
            on_retry=retrying,
            clock=self._clock,
        )
        result = outcome.last
        if outcome.verdict is Verdict.SENT and result is not None:
            self._stats.add("sent")
            if result.rejected_profiles or result.partial_message:
                self._stats.add("rejected_profiles", result.rejected_profiles)
                self._log.log(
                    logging.WARNING,
                    "OTLP profiles: partial success from %s: %d profiles rejected: %s",
                    self._client.description,
                    result.rejected_profiles,
                    result.partial_message,
                )
            return "sent"
        message = result.message if result is not None else ""
        if outcome.verdict is Verdict.REFUSED:
            self._log.log(
                logging.ERROR,
                "OTLP profiles: %s refused the request (not retried): %s",
                self._client.description,
                message,
            )
            return "failed"
        if outcome.why == "shutdown":
            self._log.log(logging.WARNING, "OTLP profiles: request dropped at shutdown")
        elif result is None:
            self._log.log(
                logging.WARNING,
                "OTLP profiles: request dropped, not delivered to %s within %.0f s",
                self._client.description,
                self._max_delay,
            )
        else:
            self._log.log(
                logging.WARNING,
                "OTLP profiles: request dropped, %s unreachable until its deadline: %s",
                self._client.description,
                message,
            )
        return "dropped"

    def _drop(self, snapshot: Snapshot, why: str) -> None:
        ns = _offcpu_ns(snapshot)
        self._stats.add("dropped")
        self._stats.add("dropped_ns", ns)
        self._log.log(logging.WARNING, "OTLP profiles: request dropped (%s): %.3f s off-CPU lost", why, ns / 1e9)


def _request_ns(request: ExportProfilesServiceRequest) -> int:
    """Off-CPU ns in a request (its off_cpu/nanoseconds profiles)."""
    strings = request.dictionary.string_table
    total = 0
    for rp in request.resource_profiles:
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                if strings[p.sample_type.type_strindex] == "off_cpu":
                    total += sum(v for s in p.samples for v in s.values)
    return total
