"""`offcpu-exporter record`: run the pipeline for a while, sum every snapshot's increase and write
one profile (pprof, folded, html or text). On a terminal a progress line on stderr shows the time
left and what was seen so far, about once a second; when stderr is not a terminal it stays quiet.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO, TextIO

from offcpu_exporter.formats import Accumulator, Profile, render
from offcpu_exporter.sinks import SinkStats
from offcpu_exporter.snapshot import Snapshot

__all__ = ["Progress", "RecordSink", "write_profile"]


class RecordSink:
    """Takes every snapshot the pipeline makes (the final one at stop included)."""

    name = "record"

    def __init__(self) -> None:
        self.stats = SinkStats()
        self._lock = threading.Lock()
        self._accumulator = Accumulator()

    def publish(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._accumulator.add(snapshot)
        self.stats.add("sent")

    def close(self, timeout: float) -> None:
        pass

    def seen(self) -> tuple[int, int, float]:
        """Distinct stacks, processes and off-CPU seconds so far."""
        with self._lock:
            a = self._accumulator
            return a.stacks, a.processes, a.total.seconds

    def profile(self, description: str = "") -> Profile:
        with self._lock:
            return self._accumulator.profile(description)


class Progress:
    """One status line rewritten in place with a carriage return; nothing unless `stream` is a TTY."""

    def __init__(
        self,
        duration: float,
        seen: Callable[[], tuple[int, int, float]],
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self.enabled = self._stream.isatty()
        self._duration = duration
        self._seen = seen
        self._clock = clock
        self._started = clock()
        self._width = 0

    def update(self) -> None:
        if not self.enabled:
            return
        left = max(0.0, self._duration - (self._clock() - self._started))
        stacks, processes, seconds = self._seen()
        line = (
            f"recording: {left:4.0f} s left, {stacks} stack{'' if stacks == 1 else 's'}, "
            f"{processes} process{'' if processes == 1 else 'es'}, {seconds:.3f} s off CPU"
        )
        self._stream.write("\r" + line.ljust(self._width))
        self._stream.flush()
        self._width = len(line)

    def finish(self) -> None:
        """Erases the line so that what follows (a profile on stdout) starts clean."""
        if self.enabled and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()


def write_profile(fmt: str, profile: Profile, output: BinaryIO) -> None:
    output.write(render(fmt, profile))
    output.flush()
