"""One object for equal immutable values (frames, stacks) made over and over, per process.

A node runs the same programs in many processes, and what names their stacks is made per process
(the address spaces may differ): 2,000 copies of one program held 2,000 equal frames for each of
its addresses, and 2,000 equal stacks. Values are interchangeable with their equals, so the first
is kept and handed out for the others. The table is bounded: when full it starts again (what was
handed out stays valid; later equals are simply not shared with it).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Interned"]

T = TypeVar("T", bound=Hashable)


class Interned(Generic[T]):
    def __init__(self, limit: int = 1 << 17) -> None:
        self._limit = limit
        self._values: dict[T, T] = {}

    def __len__(self) -> int:
        return len(self._values)

    def one(self, value: T) -> T:
        """The value kept for those equal to `value` (`value` itself the first time)."""
        kept = self._values.get(value)
        if kept is not None:
            return kept
        if len(self._values) >= self._limit:
            self._values.clear()
        self._values[value] = value
        return value
