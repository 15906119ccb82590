"""First-fit allocation of index ranges in a fixed-size BPF array (the rows and pages of the
tables), with freed ranges merged back so that a table of a library that was unloaded leaves room
for the next one."""

from __future__ import annotations

from bisect import insort

__all__ = ["RangeAllocator"]


class RangeAllocator:
    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[tuple[int, int]] = [(0, size)] if size > 0 else []  # (start, length), sorted
        self.used = 0

    def allocate(self, length: int) -> int | None:
        """The start of a free range of ``length`` entries, or None when no free range is that long."""
        if length <= 0:
            return None
        for i, (start, free) in enumerate(self._free):
            if free >= length:
                if free == length:
                    del self._free[i]
                else:
                    self._free[i] = (start + length, free - length)
                self.used += length
                return start
        return None

    def release(self, start: int, length: int) -> None:
        insort(self._free, (start, length))
        self.used -= length
        merged: list[tuple[int, int]] = []
        for s, n in self._free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self._free = merged
