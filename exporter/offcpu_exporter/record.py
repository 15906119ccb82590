"""`offcpu-exporter record`: run the pipeline for a while, sum every snapshot's increase and write
one profile (pprof, folded, html or text). On a terminal a progress line on stderr shows the time
left and what was seen so far, about once a second; when stderr is not a terminal it stays quiet.
The CLI parses the flags and builds the probe and the pipeline; `run` records with them.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, TextIO

from offcpu_exporter.clock import ktime_ns
from offcpu_exporter.formats import Accumulator, Profile, render
from offcpu_exporter.probe.loader import Probe, ProbeError
from offcpu_exporter.sinks import SinkStats
from offcpu_exporter.snapshot import Snapshot

if TYPE_CHECKING:
    from offcpu_exporter.k8s import PodMetadata
    from offcpu_exporter.pipeline import Pipeline

__all__ = ["UNWIND_TABLES_WAIT", "Progress", "RecordOptions", "RecordSink", "run", "write_profile"]

# The command's own messages, under the exporter's name as those of the rest of the CLI.
log = logging.getLogger("offcpu_exporter")

UNWIND_TABLES_WAIT = 120  # seconds record waits for its targets' unwind tables


@dataclass(frozen=True)
class RecordOptions:
    duration: float  # seconds
    format: str  # one of formats.FORMATS
    output: str  # a path, or "-" for standard output

    @classmethod
    def from_args(cls, options: argparse.Namespace) -> RecordOptions:
        return cls(duration=options.duration, format=options.format, output=options.output)

    @property
    def flush_interval(self) -> float:
        """Every second: the progress line shows fresh counts, and stacks are symbolized while their
        processes live (a process that exits before its first flush leaves only addresses)."""
        return min(1.0, self.duration)


def run(
    options: RecordOptions,
    probe: Probe,
    pipeline: Pipeline,
    metadata: PodMetadata,
    stop: threading.Event,
    output: BinaryIO,
) -> int:
    """Records for `options.duration` (or until `stop` is set) with a pipeline built with
    `options.flush_interval` and not started yet, and writes the profile to `output`; 1 when the
    probe cannot be attached."""
    try:
        probe.start()
    except ProbeError as e:
        log.error("%s", e)
        return 1
    metadata.start()
    # The targets' unwind tables first (a few seconds the first time a binary is seen), so that the
    # whole recording has complete stacks; what was counted meanwhile is flushed away.
    pipeline.sync_targets()
    if pipeline.describer is not None and pipeline.describer.pending:
        log.info("building unwind tables for %d process(es) before recording", pipeline.describer.pending)
        if not pipeline.describer.wait_idle(UNWIND_TABLES_WAIT):
            log.warning("unwind tables not ready after %d s: some stacks stop where frame pointers do",
                        UNWIND_TABLES_WAIT)
    # The window is [now, now + duration] on the probe's clock, whenever the last flush runs: the
    # kernel counts nothing after its end, and blocks still going on are counted up to it.
    start_ns = ktime_ns()
    pipeline.flush()
    end_ns = start_ns + int(options.duration * 1e9)
    pipeline.end_window_at(end_ns)
    log.info("recording for %g s", options.duration)
    recorder = RecordSink()
    pipeline.sinks = [recorder]
    pipeline.start()
    progress = Progress(options.duration, recorder.seen)
    progress.update()
    while not stop.wait(min(1.0, max(0.0, (end_ns - ktime_ns()) / 1e9))):
        if ktime_ns() >= end_ns:
            break
        progress.update()
    if ktime_ns() < end_ns:
        pipeline.end_window_at(ktime_ns())  # interrupted: the window ends now
    pipeline.stop()  # flushes once more: the recorder gets everything counted in the window
    metadata.close()
    probe.close()
    progress.finish()
    write_profile(options.format, recorder.profile(f"record {options.duration:g} s"), output)
    return 0


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
