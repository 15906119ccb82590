"""The retry rule every push output uses (OTLP profiles, SkyWalking): a scripted peer, fake time
that moves only when the rule waits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from offcpu_exporter.sinks.retry import Attempt, Backoff, Verdict, send_with_retries

DOWN = Attempt(False, retryable=True, message="UNAVAILABLE")


class Peer:
    def __init__(self, *answers: Attempt) -> None:
        self._answers: Iterator[Attempt] = iter(answers)
        self.timeouts: list[float] = []

    def send(self, timeout: float) -> Attempt:
        self.timeouts.append(timeout)
        return next(self._answers)


class Sleeps:
    """The clock and the wait: a wait moves the clock on by what it waited."""

    def __init__(self, cut_after: int | None = None) -> None:
        self.now = 100.0
        self.waited: list[float] = []
        self._cut_after = cut_after

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waited.append(seconds)
        if self._cut_after is not None and len(self.waited) > self._cut_after:
            return False
        self.now += seconds
        return True


def test_retries_with_exponential_jittered_backoff_until_sent() -> None:
    peer, sleeps, retries = Peer(DOWN, DOWN, DOWN, Attempt(True)), Sleeps(), []
    outcome = send_with_retries(peer.send, deadline=sleeps.now + 60, timeout=10, backoff=Backoff(0.5, 5.0, 0.2),
                                wait=sleeps.wait, clock=sleeps.clock,
                                on_retry=lambda answer, n: retries.append(n))  # fmt: skip
    assert outcome.verdict is Verdict.SENT
    assert len(peer.timeouts) == 4 and retries == [1, 2, 3]
    for waited, base in zip(sleeps.waited, (0.5, 1.0, 2.0), strict=True):
        assert base * 0.8 <= waited <= base * 1.2


def test_the_servers_delay_is_honoured_and_a_refusal_is_not_retried() -> None:
    refused = Attempt(False, False, message="INVALID_ARGUMENT")
    peer, sleeps = Peer(Attempt(False, True, retry_after=3.0), refused), Sleeps()
    outcome = send_with_retries(peer.send, deadline=sleeps.now + 60, timeout=10, backoff=Backoff(),
                                wait=sleeps.wait, clock=sleeps.clock)  # fmt: skip
    assert outcome.verdict is Verdict.REFUSED and outcome.last is not None
    assert outcome.last.message == "INVALID_ARGUMENT"
    assert sleeps.waited == [3.0] and len(peer.timeouts) == 2


def test_gives_up_rather_than_sleep_past_the_deadline_and_tries_get_what_is_left() -> None:
    peer, sleeps = Peer(DOWN, DOWN), Sleeps()
    outcome = send_with_retries(peer.send, deadline=sleeps.now + 2.0, timeout=10, backoff=Backoff(2.5, 5.0, 0.0),
                                wait=sleeps.wait, clock=sleeps.clock)  # fmt: skip
    assert outcome.verdict is Verdict.GAVE_UP and outcome.why == "deadline"
    assert sleeps.waited == [] and peer.timeouts == [2.0]


def test_the_backoffs_use_up_the_deadline_on_the_given_clock() -> None:
    peer, sleeps = Peer(*[DOWN] * 10), Sleeps()
    outcome = send_with_retries(peer.send, deadline=sleeps.now + 10, timeout=3, backoff=Backoff(0.5, 5.0, 0.0),
                                wait=sleeps.wait, clock=sleeps.clock)  # fmt: skip
    # tries at 0, 0.5, 1.5, 3.5 and 7.5 s; the next backoff (5 s) would end past the deadline
    assert outcome.verdict is Verdict.GAVE_UP and outcome.why == "deadline"
    assert sleeps.waited == [0.5, 1.0, 2.0, 4.0]
    assert peer.timeouts == [3, 3, 3, 3, 2.5]  # the last try gets only what is left


@pytest.mark.parametrize(
    ("cut_after", "attempts", "why", "tries"), [(0, None, "shutdown", 1), (None, 2, "2 attempts", 2)]
)
def test_shutdown_and_the_attempt_bound_end_the_retries(cut_after: int | None, attempts: int | None, why: str,
                                                        tries: int) -> None:  # fmt: skip
    peer, sleeps, failures = Peer(DOWN, DOWN, DOWN), Sleeps(cut_after), []
    outcome = send_with_retries(peer.send, deadline=sleeps.now + 60, timeout=10, backoff=Backoff(0.01, 0.01),
                                wait=sleeps.wait, clock=sleeps.clock, attempts=attempts,
                                on_failure=lambda answer, n: failures.append(n))  # fmt: skip
    assert outcome.verdict is Verdict.GAVE_UP and outcome.why == why
    assert len(peer.timeouts) == tries and failures == list(range(1, tries + 1))
