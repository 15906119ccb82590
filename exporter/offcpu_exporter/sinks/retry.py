"""Sending one unit of data with retries: the part of delivery every push output shares.

The rule is the OTLP exporter specification's (opentelemetry-specification, protocol/exporter.md,
"Retry"), which suits any push protocol: retry what the peer or the network says is transient, with
exponential backoff and jitter, waiting at least what the server asks for (Retry-After, RetryInfo)
when it says; give up at the item's deadline rather than sleep past it; never retry a refusal.
Shutdown cuts a backoff short: `wait` returns early and the item is given up.

What is queued, for how long and what a give-up means differ by output and stay with each: OTLP
requests carry only their interval's increases and expire (sinks/otlp/profiles_delivery.py); SkyWalking
batches are kept for the next flush (sinks/skywalking/delivery.py).
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = ["Answer", "Attempt", "Backoff", "Outcome", "Verdict", "send_with_retries"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """``min(cap, base * 2**n) * U(1 - jitter, 1 + jitter)`` seconds before retry n + 1 (n from 0),
    or the server's delay when it gives one. The jitter keeps exporters restarted together from
    retrying in step."""

    base: float = 0.5
    cap: float = 5.0
    jitter: float = 0.2

    def delay(self, attempt: int, hint: float | None = None) -> float:
        if hint is not None:
            return max(0.0, hint)
        return min(self.cap, self.base * (2**attempt)) * random.uniform(1 - self.jitter, 1 + self.jitter)


class Answer(Protocol):
    """How one try went: delivered, or refused (retryable or not, with the server's delay hint).
    A transport's own result type serves as long as it says these four things."""

    @property
    def ok(self) -> bool: ...
    @property
    def retryable(self) -> bool: ...
    @property
    def retry_after(self) -> float | None: ...
    @property
    def message(self) -> str: ...


A = TypeVar("A", bound=Answer)


@dataclass(frozen=True, slots=True)
class Attempt:
    """An `Answer` for transports that only raise or return (SkyWalking's)."""

    ok: bool
    retryable: bool = False
    retry_after: float | None = None
    message: str = ""


class Verdict(enum.Enum):
    SENT = "sent"
    REFUSED = "refused"  # a non-retryable answer: retrying cannot help
    GAVE_UP = "gave up"  # deadline, attempts or shutdown: the peer may still take it later


@dataclass(frozen=True, slots=True)
class Outcome(Generic[A]):
    verdict: Verdict
    last: A | None  # the last try's answer (None: none was made)
    why: str = ""  # for GAVE_UP: what ended the retries


def send_with_retries(
    send: Callable[[float], A],
    *,
    deadline: float,
    timeout: float,
    backoff: Backoff,
    wait: Callable[[float], bool],
    attempts: int | None = None,
    on_retry: Callable[[A, int], None] = lambda answer, n: None,
    on_failure: Callable[[A, int], None] = lambda answer, n: None,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome[A]:
    """Calls ``send(rpc_timeout)`` until it succeeds, is refused, or must give up.

    `deadline` is on `clock` (the monotonic clock; tests give a fake one with a `wait` that moves it);
    each try gets at most `timeout` seconds and never more than what is left. `wait(seconds)` sleeps
    and returns False when shutdown cut it short. `attempts` bounds the tries (None: only the
    deadline does). `on_failure(answer, n)` runs after the n-th try failed retryably; `on_retry(answer,
    n)` after the backoff, before the n-th retry is sent."""
    last: A | None = None
    n = 0
    while True:
        left = deadline - clock()
        if left <= 0:
            return Outcome(Verdict.GAVE_UP, last, "deadline")
        last = send(min(timeout, left))
        if last.ok:
            return Outcome(Verdict.SENT, last)
        if not last.retryable:
            return Outcome(Verdict.REFUSED, last)
        n += 1
        on_failure(last, n)
        if attempts is not None and n >= attempts:
            return Outcome(Verdict.GAVE_UP, last, f"{attempts} attempts")
        delay = backoff.delay(n - 1, last.retry_after)
        if clock() + delay >= deadline:
            return Outcome(Verdict.GAVE_UP, last, "deadline")
        if not wait(delay):
            return Outcome(Verdict.GAVE_UP, last, "shutdown")
        on_retry(last, n)
