"""The describer looks again at processes it described, oldest first and at a bounded rate: at
thousands of processes, choosing the next one and the looks themselves stay cheap (issue 27)."""

from __future__ import annotations

import threading
import time

import pytest

from offcpu_exporter.unwind import describer as describer_module
from offcpu_exporter.unwind.describer import Describer


class _Unwinder:
    def __init__(self) -> None:
        self.updates: list[tuple[float, int]] = []
        self.changes = 0

    def update(self, pid: int) -> list[object]:
        self.updates.append((time.monotonic(), pid))
        return []

    def forget(self, pid: int) -> None:
        pass


def test_looks_again_oldest_first_at_a_bounded_rate() -> None:
    unwinder = _Unwinder()
    describer = Describer(unwinder, refresh_seconds=0.2, refresh_rate=50)  # type: ignore[arg-type]
    describer.start()
    try:
        for pid in range(1, 2001):
            describer.want(pid)
        time.sleep(1.5)
    finally:
        describer.stop()
    first_pass = [pid for _, pid in unwinder.updates[:2000]]
    assert first_pass == list(range(1, 2001))  # new processes first, never held back by the rate
    described_at = unwinder.updates[1999][0]
    again = unwinder.updates[2000:]
    assert again, "nothing was looked at again"
    assert [pid for _, pid in again] == list(range(1, len(again) + 1)), "oldest first"
    # At most 50 a second, after the first became due (0.2 s after it was described).
    span = max(0.0, again[-1][0] - described_at)
    assert len(again) <= 50 * span + 2


class _SlowUnwinder(_Unwinder):
    """A table that takes a while to build (node's, from a cold cache: seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.building = threading.Event()
        self.release = threading.Event()

    def update(self, pid: int) -> list[object]:
        self.building.set()
        self.release.wait(10)
        return super().update(pid)


def test_a_process_being_described_is_still_pending() -> None:
    unwinder = _SlowUnwinder()
    describer = Describer(unwinder)  # type: ignore[arg-type]
    describer.start()
    try:
        describer.want(42)
        assert unwinder.building.wait(5)
        # Off the queue, not described yet: `record` must still wait for it.
        assert describer.pending == 1
        assert not describer.wait_idle(0.1)
        unwinder.release.set()
        assert describer.wait_idle(5)
        assert describer.pending == 0
    finally:
        unwinder.release.set()
        describer.stop()


class _ChangingOnce(_Unwinder):
    """Each process's first look describes it; the looks after find its maps unchanged."""

    def update(self, pid: int) -> list[object]:
        if all(p != pid for _, p in self.updates):
            self.changes += 1
        return super().update(pid)


def test_the_heap_is_trimmed_after_a_description_not_after_a_look_that_changed_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []

    def trim_if_grown() -> bool:
        trims.append(1)
        return False

    monkeypatch.setattr(describer_module.heap, "trim_if_grown", trim_if_grown)
    unwinder = _ChangingOnce()
    describer = Describer(unwinder, refresh_seconds=0.05, refresh_rate=200)  # type: ignore[arg-type]
    describer.start()
    try:
        for pid in (1, 2, 3):
            describer.want(pid)
        deadline = time.monotonic() + 5
        while len(unwinder.updates) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        describer.stop()
    assert len(unwinder.updates) >= 20  # looked again many times
    assert len(trims) == 3  # once per process described
