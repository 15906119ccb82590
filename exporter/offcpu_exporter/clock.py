"""The probe's clock and the wall clock that dates snapshots.

The probe times every block with bpf_ktime_get_ns(), CLOCK_MONOTONIC; snapshots, windows and every
output are dated in wall time. Reading both clocks at each flush to convert one instant would make a
window's wall duration differ from the kernel time counted in it by the jitter of those reads (a
nanosecond to a few hundred): a thread blocked throughout a window was credited 1 ns more than the
window, in CI. Both clocks advance at the same rate (NTP's frequency adjustments slew
CLOCK_MONOTONIC as they slew CLOCK_REALTIME, see clock_gettime(2)), so their difference changes only
when the wall clock is stepped (settimeofday, an NTP step, a leap second): it is kept, and taken
again only after a step. A window that spans a step is as long as the kernel counted it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["WallClock", "ktime_ns", "wall_ns_at"]

# A difference that moved more than this was a step of the wall clock, not the jitter of two reads.
_STEP_NS = 1_000_000
# Reads of the two clocks further apart than this were interrupted (preempted, or the vCPU taken
# away): their difference is not trusted, they are read again.
_CLOSE_READS_NS = 50_000
_ATTEMPTS = 5


def ktime_ns() -> int:
    """The clock of bpf_ktime_get_ns(): CLOCK_MONOTONIC."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class WallClock:
    """Kernel instants (CLOCK_MONOTONIC) as wall-clock instants (time.time_ns()), with a difference
    between the two clocks that changes only when the wall clock is stepped."""

    def __init__(self, wall: Callable[[], int] = time.time_ns, kernel: Callable[[], int] = ktime_ns) -> None:
        self._wall = wall
        self._kernel = kernel
        self._offset: int | None = None

    def wall_ns(self, ktime: int) -> int:
        """The wall-clock time of kernel instant `ktime`."""
        measured = self._measure()
        if self._offset is None or abs(measured - self._offset) > _STEP_NS:
            self._offset = measured
        return ktime + self._offset

    def _measure(self) -> int:
        best: tuple[int, int] | None = None  # (width of the kernel reads around the wall read, offset)
        for _ in range(_ATTEMPTS):
            before = self._kernel()
            wall = self._wall()
            after = self._kernel()
            reading = (after - before, wall - (before + after) // 2)
            if best is None or reading < best:
                best = reading
            if reading[0] <= _CLOSE_READS_NS:
                break
        assert best is not None
        return best[1]


_WALL_CLOCK = WallClock()


def wall_ns_at(ktime: int) -> int:
    """The wall-clock time of kernel instant `ktime`, on the clock every part of the exporter shares."""
    return _WALL_CLOCK.wall_ns(ktime)
