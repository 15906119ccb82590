"""Pacing Python's cycle collector to the flush.

CPython's oldest-generation collection traverses every tracked object of the interpreter, and it
runs whenever the objects that survived the younger generations grew by a quarter since the last
one (gcmodule.c, `long_lived_pending`). A flush replaces the snapshot of the one before (its views,
samples and counters: thousands of objects at thousands of processes) and those survive into the
oldest generation before they are dropped, so that rule fired at about every flush: 150 ms of CPU
each at 2,000 processes, 40% of the flush's cost, spent finding almost nothing (issue 27).

Nearly all that the exporter discards is freed by reference counting, which freezing does not
change. So after each flush what is alive is frozen (gc.freeze(): left out of collections), and
collections only look at what the next flush makes. Cycles are rare here but not impossible (an
exception kept with its traceback, a logging record): every `full_every` seconds everything is
unfrozen and collected once, so that none outlives that period.

Freezing alone is not enough: the "quarter" is measured against the survivors counted at the last
oldest-generation collection, and with everything older frozen those are only what one flush made.
So the collector still ran the oldest generation about three times per flush at 10,000 processes
(65 ms each, 3% of a core), each time over what the flush was still building. From the first
flush on, the oldest generation is left to this pacer (its threshold out of reach); the younger
two are collected as usual.

Nor do the younger collections find anything in what a flush builds: its snapshot's objects all
survive them, each traversed by a young collection and again by a middle one before it is frozen
(at 10,000 processes ~100,000 objects per flush, 10-20% of the flush's time). So the collector is
paused for the flush (before_flush()) and resumes once what it built is frozen; what the other
threads make meanwhile waits for the collections after.
See https://docs.python.org/3/library/gc.html#gc.freeze
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

__all__ = ["CyclePacer"]

# Collections of the younger generation between two of the oldest: never reached.
_NEVER = 1 << 30


class CyclePacer:
    def __init__(self, *, full_every: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.full_every = full_every
        self._clock = clock
        self._next_full = clock() + full_every
        self.full_collections = 0
        self._thresholds: tuple[int, int, int] | None = None  # the collector's, before the first flush
        self._paused = False  # by before_flush(), until after_flush()

    def before_flush(self) -> None:
        """Call before a flush: no collection runs until after_flush()."""
        if gc.isenabled():
            gc.disable()
            self._paused = True

    def after_flush(self) -> None:
        """Call once a flush's snapshot is published (the previous one is garbage then), after
        before_flush() or not."""
        if self._thresholds is None:
            self._thresholds = gc.get_threshold()
            gc.set_threshold(self._thresholds[0], self._thresholds[1], _NEVER)
        now = self._clock()
        if now >= self._next_full:
            gc.unfreeze()
            gc.collect()
            self.full_collections += 1
            self._next_full = now + self.full_every
        gc.freeze()
        if self._paused:
            self._paused = False
            gc.enable()

    def close(self) -> None:
        """What is frozen goes back to the collector, and its thresholds are as they were (a pipeline
        that stops in a process that lives on)."""
        gc.unfreeze()
        if self._paused:
            self._paused = False
            gc.enable()
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
