"""Fake time for code that takes a clock and a wait (`ProfilesDelivery(clock=..., wait=...)`): it
stands still until the test moves it, and a thread in `wait` sleeps until the clock reaches its
wake-up time or its stop event is set. No real time passes for a backoff, so an outage of minutes
runs in milliseconds, and every wait the code asked for is recorded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["ManualClock"]


class ManualClock:
    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._cond = threading.Condition()
        self._wakeups: list[float] = []  # of the threads in wait()
        self.waits: list[float] = []  # every wait asked for, in seconds, in order

    def now(self) -> float:
        """The clock (for ``clock=``)."""
        with self._cond:
            return self._now

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Event.wait on fake time (for ``wait=``): True as soon as `stop` is set, False when the
        clock has reached now + `seconds` without it."""
        with self._cond:
            self.waits.append(seconds)
            wake = self._now + seconds
            self._wakeups.append(wake)
            self._cond.notify_all()
            try:
                while self._now < wake and not stop.is_set():
                    self._cond.wait(0.005)  # `stop` belongs to the code under test: looked at every 5 ms
            finally:
                self._wakeups.remove(wake)
                self._cond.notify_all()
            return stop.is_set()

    def advance(self, seconds: float, idle: Callable[[], bool], timeout: float = 10.0) -> None:
        """Moves the clock on by `seconds`, stopping at each wake-up on the way: the woken thread runs
        until it waits again or `idle()` says it has nothing left to do, then time moves on."""
        with self._cond:
            target = self._now + seconds
        while True:
            with self._cond:
                due = [w for w in self._wakeups if w <= target]
                self._now = max(self._now, min(due, default=target))
                self._cond.notify_all()
                done = not due and self._now >= target
            self.settle(idle, timeout)
            if done:
                return

    def settle(self, idle: Callable[[], bool], timeout: float = 10.0) -> None:
        """Waits (in real time, briefly) until the threads under test wait for a time still to come,
        or none waits and `idle()`."""
        end = time.monotonic() + timeout
        while True:
            with self._cond:
                waiting = list(self._wakeups)
                now = self._now
            if waiting and all(w > now for w in waiting):
                return
            if not waiting and idle():
                return
            if time.monotonic() > end:
                raise AssertionError(f"the code under test did not settle (waits until {waiting}, now {now})")
            time.sleep(0.001)
