"""Background delivery of message batches with a bounded buffer and retries.

`publish` (called from `Sink.publish` on the pipeline thread) only appends to the buffer and wakes
the worker. On each wake (one per flush) the worker sends everything pending, one stream per task,
retrying with jittered exponential backoff within a deadline (the rule all push outputs share:
`offcpu_exporter.sinks.retry`); a batch that still fails stays in the
buffer and goes again on the next flush. The buffer holds at most `limit` messages: beyond it the
oldest are dropped, counted in the sink's stats (``dropped``) and logged (rate-limited). This fixes
Rover's behaviour of losing an interval whenever a send fails.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Profile_pb2 as pb
from offcpu_exporter.formats.skywalking import TaskMetadata
from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.sinks import SinkStats
from offcpu_exporter.sinks.retry import Attempt, Backoff, Verdict, send_with_retries
from offcpu_exporter.sinks.skywalking.options import RPC_TIMEOUT

__all__ = ["Batch", "Delivery", "RetryPolicy", "Transport", "describe_error"]

log = logging.getLogger(__name__)


class Transport(Protocol):
    name: str

    def send(self, task: TaskMetadata, messages: Sequence[pb.EBPFProfilingData], timeout: float) -> None:
        """Delivers the batch as one unit or raises (grpc.RpcError, OSError)."""

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Batch:
    task: TaskMetadata
    messages: tuple[pb.EBPFProfilingData, ...]


_BACKOFF = Backoff(base=0.5, cap=4.0)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 4  # per flush, per stream
    backoff: Backoff = _BACKOFF
    deadline: float = 15.0  # seconds of trying per flush, all streams together
    rpc_timeout: float = RPC_TIMEOUT


class Delivery:
    def __init__(
        self,
        transport: Transport,
        stats: SinkStats,
        limit: int,
        policy: RetryPolicy | None = None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._transport = transport
        self._stats = stats
        self._limit = max(1, limit)
        self._policy = policy or RetryPolicy()
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._pending: deque[Batch] = deque()
        self._pending_messages = 0
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._close_deadline = 0.0
        self._idle = threading.Condition(self._lock)
        self._busy = False
        self._in_flight = 0  # messages taken by the worker and not yet sent or put back
        self._warn_drop = RateLimitedLog(log)
        self._warn_fail = RateLimitedLog(log)
        self._thread = threading.Thread(target=self._run, name=f"skywalking-{transport.name}", daemon=True)
        self._thread.start()

    # -- pipeline side -------------------------------------------------------------------------

    def publish(self, batches: Sequence[Batch]) -> None:
        """Queues the batches and wakes the worker; never waits for I/O."""
        with self._lock:
            for batch in batches:
                if batch.messages:
                    self._pending.append(batch)
                    self._pending_messages += len(batch.messages)
            self._trim_locked()
            self._wake.set()  # under the lock, so wait_idle never sees queued work as done

    def pending(self) -> int:
        with self._lock:
            return self._pending_messages

    def wait_idle(self, timeout: float) -> bool:
        """For tests and shutdown: waits until a wake's work is done (sent or put back)."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._busy or self._wake.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout: float) -> None:
        """Sends what is pending within `timeout`; what is still pending then is counted dropped."""
        self._close_deadline = time.monotonic() + max(0.0, timeout)
        self._closing.set()
        self._wake.set()
        self._thread.join(max(0.0, timeout) + 1.0)
        with self._lock:
            # A send still running past the timeout is not known to have arrived: counted too.
            left = self._pending_messages + (self._in_flight if self._thread.is_alive() else 0)
            self._pending.clear()
            self._pending_messages = 0
            self._in_flight = 0
        if left:
            self._stats.add("dropped", left)
            log.warning("skywalking %s: %d messages not delivered at shutdown", self._transport.name, left)

    # -- worker side ---------------------------------------------------------------------------

    def _trim_locked(self) -> None:
        dropped = 0
        while self._pending_messages > self._limit and self._pending:
            oldest = self._pending[0]
            excess = self._pending_messages - self._limit
            if len(oldest.messages) <= excess:
                self._pending.popleft()
                removed = len(oldest.messages)
            else:
                self._pending[0] = dataclasses.replace(oldest, messages=oldest.messages[excess:])
                removed = excess
            self._pending_messages -= removed
            dropped += removed
        if dropped:
            self._stats.add("dropped", dropped)
            self._warn_drop.warning(
                "skywalking %s: buffer full (%d messages), dropped the %d oldest",
                self._transport.name,
                self._limit,
                dropped,
            )

    def _take_all(self) -> list[Batch]:
        with self._lock:
            batches = list(self._pending)
            self._in_flight = self._pending_messages
            self._pending.clear()
            self._pending_messages = 0
            self._busy = True
            self._wake.clear()
        # One stream per task and flush: batches of the same task (re-sent ones first) merge.
        merged: dict[tuple[str, str, int], list[pb.EBPFProfilingData]] = {}
        tasks: dict[tuple[str, str, int], TaskMetadata] = {}
        for batch in batches:
            key = (batch.task.task_id, batch.task.process_id, batch.task.profiling_start_ms)
            merged.setdefault(key, []).extend(batch.messages)
            tasks[key] = batch.task
        return [Batch(tasks[key], tuple(messages)) for key, messages in merged.items()]

    def _put_back(self, batches: list[Batch]) -> None:
        with self._lock:
            self._in_flight = 0
            for batch in reversed(batches):
                self._pending.appendleft(batch)
                self._pending_messages += len(batch.messages)
            self._trim_locked()

    def _wait(self, seconds: float) -> bool:
        """Sleeps a backoff; False when shutdown cut it short and its time is up."""
        if self._closing.is_set():
            seconds = min(seconds, max(0.0, self._close_deadline - time.monotonic()))
        self._closing.wait(seconds)  # shutdown cuts the backoff short
        return not (self._closing.is_set() and time.monotonic() >= self._close_deadline)

    def _deliver(self, batch: Batch, deadline: float) -> bool:
        def send(timeout: float) -> Attempt:
            task = dataclasses.replace(batch.task, current_ms=self._clock_ms())
            try:
                self._transport.send(task, batch.messages, timeout)
            except Exception as exc:  # grpc.RpcError, OSError: the transport's failure modes
                return Attempt(False, retryable=True, message=describe_error(exc))
            return Attempt(True)

        def retrying(answer: Attempt, n: int) -> None:
            self._stats.add("retried")

        def failed(answer: Attempt, n: int) -> None:
            self._warn_fail.warning(
                "skywalking %s: sending %d messages of task %s failed (attempt %d): %s",
                self._transport.name,
                len(batch.messages),
                batch.task.task_id,
                n,
                answer.message,
            )

        policy = self._policy
        outcome = send_with_retries(
            send,
            deadline=deadline,
            timeout=policy.rpc_timeout,
            backoff=policy.backoff,
            wait=self._wait,
            attempts=policy.attempts,
            on_retry=retrying,
            on_failure=failed,
        )
        if outcome.verdict is not Verdict.SENT:
            return False
        self._stats.add("sent", len(batch.messages))
        with self._lock:
            self._in_flight -= len(batch.messages)
        return True

    def _run(self) -> None:
        while True:
            self._wake.wait()
            batches = self._take_all()
            closing = self._closing.is_set()
            deadline = self._close_deadline if closing else time.monotonic() + self._policy.deadline
            failed: list[Batch] = []
            for batch in batches:
                if failed or not self._deliver(batch, deadline):
                    # The peer is down: keep this and the later batches for the next flush.
                    failed.append(batch)
            if failed:
                self._stats.add("failed", len(failed))
                self._put_back(failed)
            with self._lock:
                self._busy = False
                self._in_flight = 0
                self._idle.notify_all()
            if closing or (self._closing.is_set() and time.monotonic() >= self._close_deadline):
                return


def describe_error(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if callable(code) and callable(details):
        return f"{code()}: {details()}"
    return str(exc) or type(exc).__name__
