"""The kernel's own per-thread accounting, and a running exporter's figures read against it.

Truth per thread: on-CPU ns (/proc/PID/task/TID/schedstat, field 1) and switches (`nr_switches` in
/proc/PID/task/TID/sched). Over a window [T0, T1] a thread alive throughout was off CPU for
(T1 - T0) - (on-CPU at T1 - on-CPU at T0).

An exporter's counters are as of its last flush (`offcpu_exporter_last_flush_timestamp_seconds`),
not as of the scrape: the kernel's figures are read every few ms around the flushes, and
interpolated to each flush's own moment.
"""

from __future__ import annotations

import bisect
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["ExporterFigures", "KernelTruth", "ProcessWindow", "parse_exposition", "read_threads"]

_Thread = tuple[int, int]  # (pid, tid)


def read_threads(pids: Iterable[int]) -> dict[_Thread, tuple[int, int]]:
    """(pid, tid) -> (on-CPU ns, switches) of every thread of `pids` now."""
    out: dict[_Thread, tuple[int, int]] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for name in tids:
            base = f"/proc/{pid}/task/{name}"
            try:
                with open(f"{base}/schedstat", encoding="ascii") as f:
                    on_ns = int(f.read().split()[0])
                with open(f"{base}/sched", encoding="ascii") as f:
                    switches = next(int(line.split(":")[1]) for line in f if line.startswith("nr_switches"))
            except (OSError, ValueError, StopIteration):
                continue
            out[(pid, int(name))] = (on_ns, switches)
    return out


@dataclass(frozen=True)
class ExporterFigures:
    time_ns: int  # the flush's moment (wall clock)
    flushes: int
    seconds: dict[int, float]  # pid -> off-CPU seconds (all reasons)
    switches: dict[int, float]
    clamped_seconds: float


_SAMPLE = re.compile(r'^(offcpu_seconds_total|offcpu_switches_total)\{[^}]*pid="(\d+)"[^}]*\} (\S+)$')


def parse_exposition(text: str) -> ExporterFigures | None:
    """The per-process totals of a /metrics page; None before the first flush."""
    seconds: dict[int, float] = {}
    switches: dict[int, float] = {}
    stamp = flushes = clamped = None
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            into = seconds if m.group(1) == "offcpu_seconds_total" else switches
            pid = int(m.group(2))
            into[pid] = into.get(pid, 0.0) + float(m.group(3))
        elif line.startswith("offcpu_exporter_last_flush_timestamp_seconds "):
            stamp = float(line.split()[1])
        elif line.startswith("offcpu_exporter_flushes_total "):
            flushes = int(float(line.split()[1]))
        elif line.startswith("offcpu_exporter_clamped_seconds_total "):
            clamped = float(line.split()[1])
    if stamp is None or flushes is None:
        return None
    return ExporterFigures(round(stamp * 1e9), flushes, seconds, switches, clamped or 0.0)


@dataclass(frozen=True)
class ProcessWindow:
    pid: int
    threads: int
    exporter_seconds: float
    truth_seconds: float
    exporter_switches: float
    truth_switches: float


class KernelTruth:
    """Reads `pids`' threads every `period` s while waiting for the exporter's flushes."""

    def __init__(self, pids: Callable[[], list[int]], scrape: Callable[[], str], *, period: float = 0.01) -> None:
        self.pids = pids
        self.scrape = scrape
        self.period = period
        self._times: list[int] = []
        self._readings: list[dict[_Thread, tuple[int, int]]] = []

    def _read(self) -> None:
        before = time.time_ns()
        threads = read_threads(self.pids())
        self._times.append((before + time.time_ns()) // 2)
        self._readings.append(threads)

    def next_flush(self, *, after_ns: int = 0, timeout: float = 120.0) -> ExporterFigures:
        """The first flush whose moment is past `after_ns`, with the kernel read on both sides of it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read()
            figures = parse_exposition(self.scrape())
            if figures is not None and figures.time_ns > after_ns:
                while self._times[-1] <= figures.time_ns:  # published within ms: read once more
                    time.sleep(self.period)
                    self._read()
                return figures
            time.sleep(self.period)
        raise TimeoutError(f"no flush past {after_ns} within {timeout} s")

    def at(self, time_ns: int) -> dict[_Thread, tuple[float, float]]:
        """Each thread's (on-CPU ns, switches) at `time_ns`, interpolated between the readings around it."""
        i = bisect.bisect_left(self._times, time_ns)
        if i == 0 or i == len(self._times):
            raise ValueError("no kernel readings on both sides of that moment")
        t0, t1 = self._times[i - 1], self._times[i]
        r0, r1 = self._readings[i - 1], self._readings[i]
        w = (time_ns - t0) / (t1 - t0)
        return {thread: (a[0] + w * (r1[thread][0] - a[0]), a[1] + w * (r1[thread][1] - a[1]))
                for thread, a in r0.items() if thread in r1}

    def window(self, first: ExporterFigures, last: ExporterFigures) -> list[ProcessWindow]:
        """Per process whose threads lived through [first, last]: the exporter's figures and the truth."""
        start, end = self.at(first.time_ns), self.at(last.time_ns)
        wall = last.time_ns - first.time_ns
        by_pid: dict[int, list[_Thread]] = {}
        for thread in start.keys() | end.keys():
            by_pid.setdefault(thread[0], []).append(thread)
        out = []
        for pid, threads in sorted(by_pid.items()):
            if any(t not in start or t not in end for t in threads):
                continue  # a thread began or ended inside the window: its wall time is not the window's
            on = sum(end[t][0] - start[t][0] for t in threads)
            switches = sum(end[t][1] - start[t][1] for t in threads)
            out.append(ProcessWindow(
                pid, len(threads),
                last.seconds.get(pid, 0.0) - first.seconds.get(pid, 0.0), (len(threads) * wall - on) / 1e9,
                last.switches.get(pid, 0.0) - first.switches.get(pid, 0.0), switches))
        return out
