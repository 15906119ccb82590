"""No thread is credited more off-CPU time than wall time: checked where increases are computed.

Every instant of a thread's life is counted at most once (the marks protocol, in_progress.py), so
what a thread is credited can never exceed the wall time it covers. Should a bug break that, the
outputs would lie quietly: this check clamps the excess, counts it
(`offcpu_exporter_clamped_seconds_total`) and logs it, so the bug shows instead.

Which wall time: each pass of a flush counts blocks in progress up to its `at` and what the kernel
counted since the previous read. A block the kernel counts in pass n began at the earliest at the
`at` of pass n-2: a block in progress at pass n-1 was credited up to that pass's `at`, and one that
ended before that pass read the blocks in progress was counted from the mark of pass n-2 at the
latest. So per thread, passes n-1 and n together count at most [at of pass n-2, the read of pass
n]. That holds while every block in progress is credited at every pass; with --min-block (a short
block is credited only once it ends, from its start) or --max-block (no credits) the bound is the
whole time since the probe was attached.

Threads only: per-process counters (without --per-thread) sum threads the kernel does not name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from offcpu_exporter.probe.maps import KernelMaps
from offcpu_exporter.ratelimit import RateLimitedLog

__all__ = ["WallTimeBound"]

log = logging.getLogger(__name__)

_Thread = tuple[int, int]  # (tgid, tid)


class _Figures(Protocol):
    ns: int


class WallTimeBound:
    def __init__(self, probe: KernelMaps) -> None:
        self.probe = probe
        self.clamped_ns = 0  # off-CPU time taken off threads that would have had more than wall time
        self.clamped_threads = 0  # times a thread's figures were clamped
        self._at: tuple[int, int] | None = None  # `at` of the last two passes (older, newer)
        self._last: dict[_Thread, int] = {}  # ns per thread counted by the last pass
        self._total: dict[_Thread, int] = {}  # ns per thread since the attach (when not sliding)
        self._log = RateLimitedLog(log, interval=60.0)

    def check(self, groups: Mapping[tuple[int, int, int], _Figures], read_at: int) -> None:
        """`groups`: (tgid, tid, reason) -> figures of this pass, whose ns are lowered where a
        thread would exceed its wall time; `read_at`: when the kernel's counters were read."""
        config = self.probe.config
        if not config.per_thread:
            return
        attached = self.probe.attached_ktime_ns
        older, _ = self._at or (attached, attached)
        sliding = config.in_progress_credit and config.min_block_ns == 0
        by_thread: dict[_Thread, list[_Figures]] = {}
        for (tgid, tid, _reason), group in groups.items():
            if tid:
                by_thread.setdefault((tgid, tid), []).append(group)
        last: dict[_Thread, int] = {}
        for thread, figures in by_thread.items():
            ns = sum(f.ns for f in figures)
            if sliding:
                over = self._last.get(thread, 0) + ns - (read_at - older)
            else:
                over = self._total.get(thread, 0) + ns - (read_at - attached)
            if over > 0:
                self._clamp(thread, figures, over, ns)
                ns -= over
            if sliding:
                last[thread] = ns
            else:
                self._total[thread] = self._total.get(thread, 0) + ns
        self._last = last

    def passed(self, at: int) -> None:
        """The pass that counted up to `at` is done."""
        self._at = (self._at[1] if self._at else self.probe.attached_ktime_ns, at)

    def forget(self, tgid: int) -> None:
        for thread in [t for t in self._total if t[0] == tgid]:
            del self._total[thread]

    def _clamp(self, thread: _Thread, figures: list[_Figures], over: int, ns: int) -> None:
        self.clamped_ns += over
        self.clamped_threads += 1
        self._log.log(logging.ERROR, "pid %d tid %d: %.6f s more off-CPU time than wall time (%.6f s counted "
                      "this pass): clamped (offcpu_exporter_clamped_seconds_total); this is a bug, please report it",
                      thread[0], thread[1], over / 1e9, ns / 1e9)
        for f in sorted(figures, key=lambda f: f.ns, reverse=True):
            take = min(f.ns, over)
            f.ns -= take
            over -= take
            if not over:
                break
