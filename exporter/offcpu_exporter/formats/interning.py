"""The lookup tables of pprof and OTLP profiles: each distinct string, function, mapping or location
is written once and referred to by its index (pprof: its id)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, MutableSequence
from typing import Generic, TypeVar

__all__ = ["Interner", "StringTable"]

K = TypeVar("K", bound=Hashable)


class Interner(Generic[K]):
    """Index of each distinct key, counting from `first` in the order keys are first seen.

    `index(key, write)` calls `write(key, index)` once, the first time a key is seen, to append its
    entry to the message's table; the index is taken before, so that `write` may intern other keys."""

    __slots__ = ("_first", "_indexes")

    def __init__(self, first: int = 0) -> None:
        self._first = first
        self._indexes: dict[K, int] = {}

    def index(self, key: K, write: Callable[[K, int], object]) -> int:
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = len(self._indexes) + self._first
            write(key, index)
        return index


class StringTable:
    """A profile's string table: index 0 is the empty string, as both formats require."""

    __slots__ = ("_indexes", "_table")

    def __init__(self, table: MutableSequence[str]) -> None:
        self._table = table
        self._indexes: dict[str, int] = {}
        if not table:
            table.append("")
        self._indexes[""] = 0

    def __call__(self, value: str) -> int:
        index = self._indexes.get(value)
        if index is None:
            index = self._indexes[value] = len(self._table)
            self._table.append(value)
        return index
